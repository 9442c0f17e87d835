"""``om.export``: model -> hierarchical (or flat) ONNX.

Lower once (:func:`onnx_modular.api.spine.lower`: capture, translate unoptimized so that every
node still names its FX node, Modularize), then the emit pipeline on the whole translation.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import onnx
import onnx_ir as ir
import torch

from onnx_modular.api.arguments import (
    DynamicShapes,
    ExampleArgs,
    ExampleKwargs,
    FunctionSelection,
    Model,
)
from onnx_modular.api.spine import Subject, emit_whole, lower, needs_calls
from onnx_modular.diagnostics import Diagnostic, DiagnosticContext, records_failures, to_sarif
from onnx_modular.emit.dim_names import name_dims
from onnx_modular.emit.io_names import check_io_names, name_inputs_and_outputs
from onnx_modular.emit.outline import OutlineReport
from onnx_modular.emit.pipeline import EmitOptions
from onnx_modular.leaves._checkpoint import Checkpoint
from onnx_modular.leaves._compat import declared_nonzero, dim_names, generate_code, names_of_axes
from onnx_modular.leaves._io import TWO_GB, save_model
from onnx_modular.leaves._util import gc_paused
from onnx_modular.leaves.metadata import DIFFERS_FROM
from onnx_modular.lower.translate import check_opset


@dataclasses.dataclass(frozen=True)
class FunctionInfo:
    """One function of a hierarchical model and the module calls it serves."""

    name: str
    domain: str
    module_type: str  # the qualified class (the function's doc_string)
    nodes: int  # in its body, nested call nodes included
    calls: tuple[str, ...]  # call ids of the module calls it stands for, in execution order
    differs_from: str = ""  # for a class's extra function: "BasicBlock: extra ..., ..."


@dataclasses.dataclass
class ExportResult:
    """The exported model, its diagnostics and what it came from."""

    model: ir.Model
    diagnostics: list[Diagnostic]
    exported_program: torch.export.ExportedProgram | None  # decomposed (None: om.outline)
    # the modularized program, its Python code not generated yet (export reads its graphs)
    _graph_module: torch.fx.GraphModule | None = dataclasses.field(repr=False)
    report: OutlineReport | None
    _code_generated: bool = dataclasses.field(default=False, repr=False, compare=False)

    @property
    def graph_module(self) -> torch.fx.GraphModule | None:
        """The modularized program (None when flat), its code generated on first read: a
        result is compiled (``torch.compile``) as it comes."""
        if self._graph_module is not None and not self._code_generated:
            generate_code(self._graph_module)
            self._code_generated = True
        return self._graph_module

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
                             tuple(calls.get(f.name, ())),
                             f.metadata_props.get(DIFFERS_FROM, ""))
                for f in self.model.functions.values()]

    def save(self, path: str | os.PathLike[str], *,
             external_data_threshold: int = TWO_GB) -> None:
        """Write atomically; weights go to ``<name>.data`` beside it above the threshold."""
        save_model(self.model, path, external_data_threshold=external_data_threshold)

    def to_sarif(self) -> dict[str, Any]:
        return to_sarif(self.diagnostics)


def _module_kinds(model: Model) -> tuple[tuple[str, str], ...]:
    """(path, qualified type) of each submodule: explains a ``functions=`` selection's name
    that matched no recorded call (:class:`~onnx_modular.emit.pipeline.EmitOptions`)."""
    if not isinstance(model, torch.nn.Module):
        return ()
    return tuple((path, f"{type(module).__module__}.{type(module).__qualname__}")
                 for path, module in model.named_modules() if path)


@records_failures
def export(model: Model, args: ExampleArgs = (), kwargs: ExampleKwargs | None = None, *,
           functions: FunctionSelection = "all", dedupe: bool = True,
           dynamic_shapes: DynamicShapes | None = None,
           opset: int | None = None, optimize_model: bool = True,
           weights: Checkpoint | None = None,
           input_names: Sequence[str] | None = None,
           output_names: Sequence[str] | None = None,
           ctx: DiagnosticContext | None = None) -> ExportResult:
    """Export ``model`` to ONNX with one local function per module call.

    ``functions``: ``"all"``, ``"none"`` (flat), or an iterable of module classes, class
    names or module paths (only those become functions; the rest is inlined into the parent).
    ``dedupe``: structurally identical calls share one function.
    ``weights``: a safetensors file, a directory of shards with
    ``model.safetensors.index.json``, or a mapping name -> tensor, for a ``model`` built on
    the meta device: each weight is read from its mapped file only when it is written
    (:mod:`onnx_modular.leaves._checkpoint`); the same file as exporting the materialized model.
    ``input_names`` / ``output_names``: names of the file's first inputs and outputs, as
    ``torch.onnx.export`` takes them (torch's node names otherwise).
    """
    assert ctx is not None  # made by @records_failures when the caller gives none
    if not isinstance(args, tuple):
        args = (args,)
    options = EmitOptions(functions, dedupe, optimize_model,
                          modules=() if isinstance(functions, str) else _module_kinds(model))
    # Export builds millions of small objects and keeps them to the end: full cyclic
    # collections meanwhile rescan the model again and again (10-20% of the export time).
    with gc_paused():
        options.selection()  # a bad selection fails now, not after seconds of export
        check_opset(opset, flat=options.flat)
        check_io_names(input_names, output_names)
        subject = Subject(model, args, kwargs, dynamic_shapes, weights)
        lowered = lower(subject, opset, ctx, with_calls=needs_calls(options))
        options = dataclasses.replace(  # sizes a computed shape may end in -1 beside
            options, nonzero_sizes=declared_nonzero(dynamic_shapes, lowered.program))
        report = emit_whole(lowered, options, ctx)
        name_dims(lowered.model, dim_names(lowered.program))  # as torch.onnx names them
        name_dims(lowered.model, names_of_axes(lowered.model.graph.inputs, dynamic_shapes))
        name_inputs_and_outputs(lowered.model, input_names, output_names)
    return ExportResult(lowered.model, ctx.diagnostics, lowered.program,
                        None if options.flat else lowered.graph_module, report.outline)
