"""onnx_modular: torch.export -> module hierarchy -> hierarchical ONNX, split and validated."""

__version__ = "0.1.0"
