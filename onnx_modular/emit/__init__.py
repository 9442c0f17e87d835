"""Emit ONNX: translate once, outline module calls into deduplicated functions, optimize."""

from onnx_modular.emit.metadata import fx_name
from onnx_modular.emit.outline import OutlineReport, outline
from onnx_modular.emit.translate import Translation, translate

__all__ = ["OutlineReport", "Translation", "fx_name", "outline", "translate"]
