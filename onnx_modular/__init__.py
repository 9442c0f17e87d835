"""onnx_modular: torch.export -> module hierarchy -> hierarchical ONNX, split and validated."""

__version__ = "0.1.0"

from onnx_modular.compare import CompareReport, compare
from onnx_modular.diagnostics import (
    Diagnostic,
    DiagnosticContext,
    Level,
    Location,
    OnnxModularError,
    Rule,
    to_sarif,
)
from onnx_modular.export_api import ExportResult, capture, export, hook
from onnx_modular.operator_support import OperatorSupport
from onnx_modular.passes.modularize import CallInfo, modularize, module_call_chains
from onnx_modular.passes.stages import pipe_split
from onnx_modular.runner import SplitRunner
from onnx_modular.split_api import SplitResult, split
from onnx_modular.stages_api import Stage, StagesResult, split_by, split_stages
from onnx_modular.validate import ValidationReport, validate

__all__ = [
    "ExportResult",
    "capture",
    "export",
    "hook",
    "CallInfo",
    "CompareReport",
    "Diagnostic",
    "DiagnosticContext",
    "Level",
    "Location",
    "OnnxModularError",
    "OperatorSupport",
    "Rule",
    "SplitResult",
    "SplitRunner",
    "modularize",
    "module_call_chains",
    "split",
    "pipe_split",
    "split_by",
    "split_stages",
    "Stage",
    "StagesResult",
    "ValidationReport",
    "compare",
    "to_sarif",
    "validate",
]
