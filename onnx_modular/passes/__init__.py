"""FX passes: the framework, Modularize and the splitters."""

from onnx_modular.passes.infra import PassBase, PassConditionError, PassManager, PassResult

__all__ = ["PassBase", "PassConditionError", "PassManager", "PassResult"]
