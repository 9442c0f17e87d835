"""Emit: the one pipeline from an unoptimized translation to the ONNX models users get."""
