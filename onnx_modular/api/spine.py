"""What every entry point does once a program is translated: Modularize it once, then emit.

The FX stage (``passes/``) runs here, before ``emit/``: its result, each FX node's module
calls, is handed to the emit pipeline as data, so the walk goes lower -> passes -> emit and
never back up. ``om.export`` and ``om.hook`` emit the whole translation
(:func:`emit_program`); ``om.split`` and the stages cut it into regions first and emit each
with its share of the same chains (:func:`modularized`).
"""

from __future__ import annotations

import onnx_ir as ir
import torch

from onnx_modular.diagnostics import DiagnosticContext
from onnx_modular.emit.pipeline import Chains, EmitOptions, EmitReport, emit_model, program_weights
from onnx_modular.passes.modularize import modularize, module_call_chains


def modularized(program: torch.export.ExportedProgram, ctx: DiagnosticContext
                ) -> tuple[torch.fx.GraphModule, Chains]:
    """Modularize the (decomposed) program: the nested GraphModule and each node's calls."""
    graph_module = modularize(program, ctx)
    return graph_module, module_call_chains(graph_module)


def emit_program(model: ir.Model, program: torch.export.ExportedProgram,
                 options: EmitOptions, ctx: DiagnosticContext) -> EmitReport:
    """The emit pipeline on a whole translation of ``program`` (``om.export``, ``om.hook``)."""
    options.selection(ctx)  # a bad selection fails before modularizing
    graph_module: torch.fx.GraphModule | None = None
    chains: Chains = {}
    if options.optimize or not options.flat:  # a flat unoptimized model needs no chains
        graph_module, chains = modularized(program, ctx)
    report = emit_model(model, chains, program_weights(program), options, ctx)
    report.graph_module = None if options.flat else graph_module
    return report
