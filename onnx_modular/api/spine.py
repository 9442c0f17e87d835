"""The spine every entry point shares: lower a model once, then emit.

Lowering is capture (``lower/``), marker removal, translation (``lower/``) and the
Modularize pass (``passes/``), done here once per call of ``om.export``, ``om.split``,
``om.split_stages`` / ``om.split_by`` and, from torch.onnx's own program, ``om.hook``. Its
result, :class:`Lowered`, is handed on as data (the module calls of every FX node included),
so ``emit/`` never calls back into ``passes/``: the walk is lower -> passes -> emit.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir
import torch

from onnx_modular.api.arguments import DynamicShapes, ExampleArgs, ExampleKwargs, Model
from onnx_modular.diagnostics import DiagnosticContext
from onnx_modular.emit.pipeline import Chains, EmitOptions, EmitReport, emit_model, program_weights
from onnx_modular.leaves._checkpoint import Checkpoint
from onnx_modular.leaves._log import timed
from onnx_modular.lower.capture import capture
from onnx_modular.lower.markers import without_markers
from onnx_modular.lower.translate import (
    Translation,
    inline_translator_functions,
    pin_fixed_dims,
    stable_stack_traces,
    translate,
)
from onnx_modular.passes.modularize import modularize, module_call_chains


@dataclasses.dataclass(frozen=True)
class Subject:
    """The model as an entry point was given it, with what capturing it takes: the example
    inputs (``args`` None: none given), ``dynamic_shapes`` and the checkpoint of a model
    built on the meta device. Built once by the entry point and passed whole."""

    model: Model
    args: ExampleArgs | None = None
    kwargs: ExampleKwargs | None = None
    dynamic_shapes: DynamicShapes | None = None
    weights: Checkpoint | None = None

    def capture(self, ctx: DiagnosticContext, *,
                meta_ok: bool = False) -> torch.export.ExportedProgram:
        """:func:`~onnx_modular.lower.capture.capture` (an ExportedProgram passes through)."""
        return capture(self.model, self.args if self.args is not None else (),
                       dict(self.kwargs) if self.kwargs is not None else None,
                       self.dynamic_shapes, ctx, weights=self.weights, meta_ok=meta_ok)


@dataclasses.dataclass(frozen=True)
class Lowered:
    """A model lowered once: the unoptimized translation and what Modularize made of it."""

    translation: Translation  # the torch.onnx model and the decomposed program it came from
    #: the program's module hierarchy (None where not asked for: a flat, unoptimized export)
    graph_module: torch.fx.GraphModule | None
    chains: Chains  # FX node name -> the module calls it ran in, outermost first
    weights: frozenset[str]  # initializer names of the program's weights

    @property
    def model(self) -> ir.Model:
        return self.translation.model

    @property
    def program(self) -> torch.export.ExportedProgram:
        """The decomposed program, as translated."""
        return self.translation.program


def lower(subject: Subject, opset: int | None = None, ctx: DiagnosticContext | None = None,
          *, with_calls: bool = True) -> Lowered:
    """Capture ``subject`` (an ExportedProgram passes through), drop ``pipe_split()``
    markers, translate with torch.onnx (unoptimized) and, unless ``with_calls`` is False,
    Modularize.

    The opset is checked by the caller first: what it allows depends on the output.
    """
    ctx = ctx if ctx is not None else DiagnosticContext()
    with timed("capture (torch.export)") as log:
        captured = subject.capture(ctx)
        log["fx_nodes"] = len(captured.graph.nodes)
    # pipe_split() markers cut stages; they are no operator torch.onnx could translate
    with timed("translate (torch.onnx, unoptimized)") as log:
        translation = translate(without_markers(captured), opset=opset, ctx=ctx)
        log["onnx_nodes"] = len(translation.model.graph)
    return _with_calls(translation, ctx) if with_calls else _without_calls(translation)


def lower_onnx_program(onnx_program: torch.onnx.ONNXProgram, ctx: DiagnosticContext, *,
                       with_calls: bool = True) -> Lowered:
    """What torch.onnx already lowered (``om.hook``: an unoptimized ``ONNXProgram``)."""
    stable_stack_traces(onnx_program.model)  # byte-identical, as om.export
    inline_translator_functions(onnx_program.model)
    assert onnx_program.exported_program is not None  # the dynamo path keeps its program
    pin_fixed_dims(onnx_program.model, onnx_program.exported_program, ctx)
    translation = Translation(onnx_program.model, onnx_program.exported_program)
    return _with_calls(translation, ctx) if with_calls else _without_calls(translation)


def _with_calls(translation: Translation, ctx: DiagnosticContext) -> Lowered:
    graph_module = modularize(translation.program, ctx, eager_code=False)
    return Lowered(translation, graph_module, module_call_chains(graph_module),
                   program_weights(translation.program))


def _without_calls(translation: Translation) -> Lowered:
    return Lowered(translation, None, {}, program_weights(translation.program))


def needs_calls(options: EmitOptions) -> bool:
    """Only a flat, unoptimized model is emitted without the module calls."""
    return options.optimize or not options.flat


def emit_whole(lowered: Lowered, options: EmitOptions, ctx: DiagnosticContext) -> EmitReport:
    """The emit pipeline on the whole translation, in place (``om.export``, ``om.hook``)."""
    return emit_model(lowered.model, lowered.chains, lowered.weights, options, ctx)
