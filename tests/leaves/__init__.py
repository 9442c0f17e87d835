"""Fast tests of the shared leaves of ``onnx_modular`` (runtime, metadata, errors, ...)."""
