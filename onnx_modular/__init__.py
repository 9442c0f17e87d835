"""onnx_modular: torch.export -> module hierarchy -> hierarchical ONNX, split and validated."""

# First, before anything else is imported: under ``python -m onnx_modular`` the current
# directory must not shadow the libraries (importing _safepath drops it from sys.path).
from onnx_modular.leaves import _safepath as _safepath  # isort: skip
# Then, for the command line only: Ctrl-C while torch imports exits quietly (130).
from onnx_modular.leaves import _interrupt as _interrupt  # isort: skip
# An older torch says so in one line rather than failing inside some import.
from onnx_modular.leaves import _torch_guard as _torch_guard  # isort: skip
from onnx_modular.api.export import ExportResult, export
from onnx_modular.api.hook import HookedExport, HookSession, HookWarning, hook
from onnx_modular.api.outline import outline
from onnx_modular.api.split import SplitResult, split
from onnx_modular.api.stages import Stage, StagesResult, plan_stages, split_by, split_stages
from onnx_modular.check.compare import CompareReport, compare
from onnx_modular.check.compare_io import IOReport, compare_io
from onnx_modular.check.extract import Extraction
from onnx_modular.check.validate import Validation, ValidationReport, validate
from onnx_modular.diagnostics import (
    Diagnostic,
    DiagnosticContext,
    Level,
    Location,
    OnnxModularError,
    OnnxModularWarning,
    Rule,
    to_sarif,
)
from onnx_modular.leaves._version import __version__ as __version__
from onnx_modular.leaves.metadata import CallInfo
from onnx_modular.lower.capture import capture
from onnx_modular.lower.markers import pipe_split
from onnx_modular.parts.runner import SplitRunner
from onnx_modular.parts.triton_runner import TritonRunner
from onnx_modular.passes.modularize import modularize, module_call_chains
from onnx_modular.support.operator_support import OperatorSupport

__all__ = [
    "ExportResult",
    "capture",
    "export",
    "hook",
    "HookedExport",
    "HookSession",
    "HookWarning",
    "CallInfo",
    "CompareReport",
    "Extraction",
    "IOReport",
    "Diagnostic",
    "DiagnosticContext",
    "Level",
    "Location",
    "OnnxModularError",
    "OnnxModularWarning",
    "OperatorSupport",
    "Rule",
    "SplitResult",
    "SplitRunner",
    "TritonRunner",
    "modularize",
    "outline",
    "module_call_chains",
    "split",
    "pipe_split",
    "plan_stages",
    "split_by",
    "split_stages",
    "Stage",
    "StagesResult",
    "Validation",
    "ValidationReport",
    "compare",
    "compare_io",
    "to_sarif",
    "validate",
]
