"""Fast tests of ``onnx_modular/lower``: capture and translation of tiny modules."""
