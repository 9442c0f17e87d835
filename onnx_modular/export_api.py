"""``om.export``: model -> hierarchical (or flat) ONNX; and ``om.hook`` for existing pipelines.

Capture once, translate once (torch.onnx, unoptimized so that every node still names its FX
node), fold weight-only nodes, outline module calls into deduplicated functions following
the modularized program, then optimize each unique body once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir
import onnx_ir.passes.common
import torch

from onnx_modular._io import atomic_path
from onnx_modular._util import gc_paused
from onnx_modular.capture import capture
from onnx_modular.diagnostics import Diagnostic, DiagnosticContext, Location, rules, to_sarif
from onnx_modular.emit.inline import RebasingInlinePass
from onnx_modular.emit.optimize import (
    finish_inlined,
    fold_weights,
    optimize,
    remove_unused_initializers,
)
from onnx_modular.emit.outline import (
    OutlineReport,
    Selection,
    merge_shape_variants,
    outline,
    selector,
)
from onnx_modular.emit.translate import MIN_HIERARCHICAL_OPSET, stable_stack_traces, translate
from onnx_modular.passes.modularize import modularize, module_call_chains

TWO_GB = 2 * 1024**3


@dataclasses.dataclass(frozen=True)
class FunctionInfo:
    """One function of a hierarchical model and the module calls it serves."""

    name: str
    domain: str
    module_type: str  # the qualified class (the function's doc_string)
    nodes: int  # in its body, nested call nodes included
    calls: tuple[str, ...]  # call ids of the module calls it stands for, in execution order


@dataclasses.dataclass
class ExportResult:
    """The exported model, its diagnostics and what it came from."""

    model: ir.Model
    diagnostics: list[Diagnostic]
    exported_program: torch.export.ExportedProgram  # decomposed, as translated
    graph_module: torch.fx.GraphModule | None  # the modularized program (None when flat)
    report: OutlineReport | None

    @property
    def model_proto(self) -> onnx.ModelProto:
        return ir.serde.serialize_model(self.model)

    @property
    def function_names(self) -> list[str]:
        return [f.name for f in self.model.functions.values()]

    @property
    def functions(self) -> list[FunctionInfo]:
        """What was deduplicated into what: e.g. one ``GPT2Block`` for 48 calls."""
        calls: dict[str, list[str]] = {}
        if self.report is not None:
            for call_id, name in self.report.function_of_call.items():
                calls.setdefault(name, []).append(call_id)
        return [FunctionInfo(f.name, f.domain, f.doc_string or "", len(f),
                             tuple(calls.get(f.name, ())))
                for f in self.model.functions.values()]

    def save(self, path: str | os.PathLike[str], *,
             external_data_threshold: int = TWO_GB) -> None:
        """Write atomically; weights go to ``<name>.data`` beside it above the threshold."""
        save_model(self.model, path, external_data_threshold=external_data_threshold)

    def to_sarif(self) -> dict[str, Any]:
        return to_sarif(self.diagnostics)


def _initializer_bytes(model: ir.Model) -> int:
    return sum(v.const_value.nbytes for v in model.graph.initializers.values()
               if v.const_value is not None)


def save_model(model: ir.Model, path: str | os.PathLike[str], *,
               external_data_threshold: int = TWO_GB) -> None:
    """Atomic save: a failure leaves neither the model nor its data file behind."""
    target = Path(path)
    if _initializer_bytes(model) <= external_data_threshold:
        with atomic_path(target) as tmp:
            ir.save(model, tmp)
        return
    data_name = f"{target.name}.data"
    # The data file's name is recorded inside the model, so write both in a private folder
    # beside the target and move the data first, the model last.
    with atomic_path(target) as tmp, tempfile.TemporaryDirectory(
            dir=tmp.parent, prefix=".om-") as folder:
        staged = Path(folder) / target.name
        ir.save(model, staged, external_data=data_name)
        os.replace(Path(folder) / data_name, target.parent / data_name)
        os.replace(staged, tmp)


def export(model: Any, args: Any = (), kwargs: dict[str, Any] | None = None, *,
           functions: Any = "all", dedupe: bool = True, dynamic_shapes: Any = None,
           opset: int | None = None, optimize_model: bool = True,
           ctx: DiagnosticContext | None = None) -> ExportResult:
    """Export ``model`` to ONNX with one local function per module call.

    ``functions``: ``"all"``, ``"none"`` (flat), or an iterable of module classes, class
    names or module paths (only those become functions; the rest is inlined into the parent).
    ``dedupe``: structurally identical calls share one function.
    """
    ctx = ctx if ctx is not None else DiagnosticContext()
    if not isinstance(args, tuple):
        args = (args,)
    _selector(functions, ctx)  # a bad selection fails now, not after seconds of export
    if opset is not None and opset < MIN_HIERARCHICAL_OPSET and functions != "none":
        # torch.onnx translates at opset 18 and converts down with onnx's C converter, which
        # neither knows functions nor keeps the node metadata the outliner follows.
        raise ctx.error(rules.UNSUPPORTED_INPUT, reason=(
            f"opset {opset} is below {MIN_HIERARCHICAL_OPSET}, the lowest a hierarchical model "
            f"can be emitted at; use opset >= {MIN_HIERARCHICAL_OPSET}, or functions='none' "
            "for a flat model converted down"))
    # Export builds millions of small objects and keeps them to the end: full cyclic
    # collections meanwhile rescan the model again and again (10-20% of the export time).
    with gc_paused():
        program = capture(model, args, kwargs, dynamic_shapes, ctx)
        translation = translate(program, opset=opset, ctx=ctx)
        return emit(translation.model, translation.program, functions=functions,
                    dedupe=dedupe, optimize_model=optimize_model, ctx=ctx)


def emit(model: ir.Model, program: torch.export.ExportedProgram, *, functions: Any = "all",
         dedupe: bool = True, optimize_model: bool = True,
         ctx: DiagnosticContext | None = None) -> ExportResult:
    """Outline and optimize an unoptimized torch.onnx translation of ``program``, in place."""
    ctx = ctx if ctx is not None else DiagnosticContext()
    flat = functions == "none"
    # The flat model is the hierarchical one with every function inlined: same ops, same
    # topology, bit-identical outputs (invariant 2), and each unique body optimized once.
    select = _selector("all" if flat else functions, ctx)
    gm: torch.fx.GraphModule | None = None
    report = None
    if optimize_model:
        fold_weights(model, _weight_names(program))
    if optimize_model or not flat:
        gm = modularize(program, ctx)
        with ctx.scope("Outline"):
            report = outline(model, module_call_chains(gm), select=select,
                                         dedupe=dedupe)
        if isinstance(select, Selection) and select.unmatched():
            ctx.warn(rules.UNOUTLINED, reason=(
                f"functions={select.unmatched()} matched no module call (by class, class "
                "name or module path)"))
        for call_id in report.skipped:
            ctx.note(rules.UNOUTLINED, Location(module_path=call_id),
                     reason=f"module call '{call_id}' has no output used outside it; "
                     "its nodes stay in the parent")
    if optimize_model:
        with ctx.scope("Optimize"):
            optimize(model)
            if dedupe and not flat and report is not None:  # flat: inlined right after
                merge_shape_variants(model, report)
    if report is not None:
        ctx.note(rules.FUNCTION_SUMMARY, functions=report.functions, calls=report.calls)
    if flat:
        RebasingInlinePass()(model)
        if optimize_model:
            finish_inlined(model)
        remove_unused_initializers(model.graph)
        for domain in {f.domain for f in model.functions.values()} | set(model.opset_imports):
            if domain not in ("", "ai.onnx") and not any(
                    n.domain == domain for n in model.graph.all_nodes()):
                model.opset_imports.pop(domain, None)
        gm = None
    return ExportResult(model, ctx.diagnostics, program, gm, report)


def _weight_names(program: torch.export.ExportedProgram) -> set[str]:
    """Initializer names of the model's parameters, buffers and lifted constants."""
    return {spec.target for spec in program.graph_signature.input_specs
            if spec.target is not None}


def _selector(functions: Any, ctx: DiagnosticContext) -> Any:
    """``selector(functions)``, or one clear error for what it cannot read."""
    try:
        return selector(functions)
    except TypeError:
        raise ctx.error(rules.UNSUPPORTED_INPUT, reason=(
            "functions= takes 'all', 'none', or an iterable of module classes, class names "
            f"or module paths, got {functions!r}")) from None


# ---- the pre-export hook ---------------------------------------------------------------------

_hook_lock = threading.Lock()
_hook_settings: list[tuple[Any, bool]] = []  # innermost last; the wrapper reads the top
_hook_original: list[Any] = []


@contextlib.contextmanager
def hook(functions: Any = "all", dedupe: bool = True) -> Iterator[None]:
    """Make unchanged ``torch.onnx.export(..., dynamo=True)`` calls return hierarchical models.

    torch.onnx's exporter builds the program in ``_core.export``; while the hook is active,
    that step runs unoptimized (so every node still names its FX node), then the result is
    outlined and, if the caller asked for optimization (the default), optimized per function.
    The returned ``ONNXProgram`` and anything it saves carry the hierarchical model. Hooks
    nest: the innermost settings apply; leaving the outermost restores torch.onnx.
    """
    from torch.onnx._internal.exporter import _core

    # A bad selection fails here, at the ``with``, not inside torch.onnx.export after
    # seconds of capture and translation (where torch would wrap it in its own report).
    _selector(functions, DiagnosticContext())
    with _hook_lock:
        if not _hook_settings:
            original = _core.export
            _hook_original.append(original)

            def export_hierarchical(*args: Any, optimize: bool = True,
                                    opset_version: int | None = None, **kwargs: Any) -> Any:
                if opset_version is not None and opset_version < MIN_HIERARCHICAL_OPSET:
                    warnings.warn(
                        f"onnx_modular.hook: opset {opset_version} < {MIN_HIERARCHICAL_OPSET} "
                        "cannot hold the module functions; this export stays flat",
                        stacklevel=2)
                    return original(*args, optimize=optimize, opset_version=opset_version,
                                    **kwargs)
                onnx_program = original(*args, optimize=False, opset_version=opset_version,
                                        **kwargs)
                chosen, dedup = _hook_settings[-1] if _hook_settings else ("all", True)
                stable_stack_traces(onnx_program.model)  # byte-identical, as om.export
                emit(onnx_program.model, onnx_program.exported_program, functions=chosen,
                     dedupe=dedup, optimize_model=optimize)
                return onnx_program

            _core.export = export_hierarchical
        _hook_settings.append((functions, dedupe))
    try:
        yield
    finally:
        with _hook_lock:
            _hook_settings.pop()
            if not _hook_settings:
                _core.export = _hook_original.pop()
