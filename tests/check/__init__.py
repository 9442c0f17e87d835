"""Fast tests of ``onnx_modular/check``: one test module per code module."""
