"""Checking ONNX models: against torch (validate), against each other (compare), and reading
them back (inspect). One job per module:

- ``validate``: ``validate`` and the ``Validation`` session that owns what a check keeps
  alive (models, sessions, the probe, the localization's values) and hands out records
- ``options``: what a check is asked (tolerances, providers, when to localize), frozen
- ``runners``: one shape for what a check runs (torch eager, an ORT session, chained parts)
- ``localize``: which module call is the first whose ONNX outputs leave torch's, start to
  end: ``recorder`` (torch's calls), ``probe`` (the ONNX calls' outputs exposed), ``judge``
- ``calls``: the one record of a module call, built on ``CallInfo``
- ``call_stats``: every compared call's error in execution order, and where it grows
- ``extract``: one module call as a standalone repro (model, torch's inputs and outputs)
- ``compare_io``: a model on saved inputs against saved outputs (the repro's check)
- ``overlay``: the errors as Model Explorer node data
- ``wire``: protobuf splicing, so the localization probe never re-encodes the weights
- ``compare``: two models' structure after inlining, outputs on the same inputs, and cost
- ``inputs``: torch inputs bound to ONNX inputs; given or random inputs for ONNX models
- ``numerics``: dtype names, tolerances by dtype, the diff, the one per-output check
- ``report``: what every report shares (text, Markdown, HTML, saving)
- ``validation_report``, ``compare_report``, ``io_report``: the reports' data and renderings
- ``inspect``: an ONNX file's module tree, functions and call counts

The command line prints the reports and picks exit codes; nothing here prints.
"""
