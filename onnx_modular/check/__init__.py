"""Checking ONNX models: against torch (validate), against each other (compare), and reading
them back (inspect). One job per module:

- ``validate``: runs torch eager and ONNX Runtime on each provider, and localizes a mismatch
- ``localize``: which module call is the first whose ONNX outputs leave torch's
- ``wire``: protobuf splicing, so the localization probe never re-encodes the weights
- ``compare``: two models' structure after inlining, outputs on the same inputs, and cost
- ``inputs``: torch inputs bound to ONNX inputs; given or random inputs for ONNX models
- ``numerics``: dtype names, tolerances by dtype, the diff, the one per-output check
- ``report``: what every report shares (text, Markdown, HTML, saving)
- ``validation_report``, ``compare_report``: the two reports' data and renderings
- ``inspect``: an ONNX file's module tree, functions and call counts

The command line prints the reports and picks exit codes; nothing here prints.
"""
