"""The forms the entry points accept, named once so every signature says what it takes.

Defined where the earliest stage needing them can import them (``leaves/arguments.py``;
``SupportSpec`` beside :class:`OperatorSupport`), and re-exported here under the same names.
"""

from __future__ import annotations

from onnx_modular.leaves.arguments import (
    DynamicShapes,
    ExampleArgs,
    ExampleKwargs,
    FunctionSelection,
    Model,
    SplitPoints,
)
from onnx_modular.support.operator_support import SupportSpec

__all__ = ["DynamicShapes", "ExampleArgs", "ExampleKwargs", "FunctionSelection", "Model",
           "SplitPoints", "SupportSpec"]
