"""Lowering: a model to an ExportedProgram (torch.export), and that to ONNX once (torch.onnx)."""
