"""The shared leaves: what every stage uses and nothing of a stage.

Each module here imports only other leaves (``tests/test_layout.py`` checks it), so any
stage may import any of them: file writing and crash recovery (``_io``), the one place
private library APIs are touched (``_compat``), ONNX Runtime sessions (``runtime``), the
metadata keys of the labels (``metadata``), errors and their rules (``errors``), the
package logger (``_log``), checkpoints, weights and small utilities.
"""
