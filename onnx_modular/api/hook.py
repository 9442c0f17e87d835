"""``om.hook``: unchanged ``torch.onnx.export(..., dynamo=True)`` calls return hierarchical models.

torch.onnx builds its model in one step (replaced through :mod:`onnx_modular._compat`); while
a hook is active that step runs unoptimized, so every node still names its FX node, and the
result goes through the same emit pipeline as :func:`onnx_modular.export`.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from onnx_modular._compat import replaced_torch_onnx_export
from onnx_modular.diagnostics import DiagnosticContext
from onnx_modular.emit.pipeline import EmitOptions, emit_program
from onnx_modular.lower.translate import MIN_HIERARCHICAL_OPSET, stable_stack_traces

_lock = threading.Lock()
_settings: list[EmitOptions] = []  # innermost last; the replacement reads the top
_installed = contextlib.ExitStack()


def _hierarchical(original: Callable[..., Any]) -> Callable[..., Any]:
    def export_hierarchical(*args: Any, optimize: bool = True,
                            opset_version: int | None = None, **kwargs: Any) -> Any:
        if opset_version is not None and opset_version < MIN_HIERARCHICAL_OPSET:
            warnings.warn(
                f"onnx_modular.hook: opset {opset_version} < {MIN_HIERARCHICAL_OPSET} "
                "cannot hold the module functions; this export stays flat", stacklevel=2)
            return original(*args, optimize=optimize, opset_version=opset_version, **kwargs)
        onnx_program = original(*args, optimize=False, opset_version=opset_version, **kwargs)
        options = _settings[-1] if _settings else EmitOptions()
        stable_stack_traces(onnx_program.model)  # byte-identical, as om.export
        emit_program(onnx_program.model, onnx_program.exported_program,
                     EmitOptions(options.functions, options.dedupe, optimize),
                     DiagnosticContext())
        return onnx_program

    return export_hierarchical


@contextlib.contextmanager
def hook(functions: Any = "all", dedupe: bool = True) -> Iterator[None]:
    """Make unchanged ``torch.onnx.export(..., dynamo=True)`` calls return hierarchical models.

    The returned ``ONNXProgram`` and anything it saves carry the hierarchical model; it is
    optimized per function when the caller asked for optimization (the default). Hooks
    nest: the innermost settings apply; leaving the outermost restores torch.onnx.
    """
    # A bad selection fails here, at the ``with``, not inside torch.onnx.export after
    # seconds of capture and translation (where torch would wrap it in its own report).
    options = EmitOptions(functions, dedupe)
    options.selection(DiagnosticContext())
    with _lock:
        if not _settings:
            _installed.enter_context(replaced_torch_onnx_export(_hierarchical))
        _settings.append(options)
    try:
        yield
    finally:
        with _lock:
            _settings.pop()
            if not _settings:
                _installed.close()
