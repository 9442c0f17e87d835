"""The forms the entry points accept, named once so every signature says what it takes.

They depend on no stage, so every stage may name them (``capture`` takes a :data:`Model`,
``EmitOptions`` a :data:`FunctionSelection`); ``onnx_modular.api.arguments`` re-exports
them with :data:`~onnx_modular.support.operator_support.SupportSpec`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, TypeAlias

import torch

__all__ = ["DynamicShapes", "ExampleArgs", "ExampleKwargs", "FunctionSelection", "Model",
           "SplitPoints"]

#: an ``nn.Module`` (captured with the example inputs) or a program captured elsewhere
Model: TypeAlias = torch.nn.Module | torch.export.ExportedProgram
#: positional example inputs; a single value stands for a one-element tuple
ExampleArgs: TypeAlias = tuple[Any, ...] | list[Any] | torch.Tensor
#: keyword example inputs
ExampleKwargs: TypeAlias = Mapping[str, Any]
#: ``torch.export``'s ``dynamic_shapes``: per input, by position or by name
DynamicShapes: TypeAlias = Mapping[str, Any] | tuple[Any, ...] | list[Any]
#: which module calls become functions: all, none (flat), or classes, class names and paths
FunctionSelection: TypeAlias = Literal["all", "none"] | Iterable[type[torch.nn.Module] | str]
#: module path -> "beginning" / "end" (or a PiPPy-like enum), or (path, where) pairs
SplitPoints: TypeAlias = Mapping[str, Any] | Sequence[tuple[str, Any]]
