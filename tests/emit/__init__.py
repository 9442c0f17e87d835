"""Fast tests of ``onnx_modular/emit``: one test module per code module, small hand-built
graphs (see ``graphs.py``)."""
