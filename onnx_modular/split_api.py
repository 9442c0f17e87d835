"""``om.split``: accelerator/CPU regions of a model, as a runnable GraphModule and ONNX files.

The program is captured and translated to ONNX once; the Split pass decides regions on the
decomposed FX graph; each ONNX node follows its FX node into a region. ``save`` writes one
standalone ONNX model per region plus ``manifest.json`` (the format :class:`SplitRunner`
reads, shared with pipeline stages); ``save_single`` writes one model of region functions.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx_ir as ir
import torch

from onnx_modular._io import atomic_write_bytes
from onnx_modular.capture import capture
from onnx_modular.diagnostics import (
    Diagnostic,
    DiagnosticContext,
    Level,
    rules,
)
from onnx_modular.emit.translate import MIN_HIERARCHICAL_OPSET, Translation, translate
from onnx_modular.manifest import build_manifest, save_parts
from onnx_modular.operator_support import SupportContext, fx_to_onnx_nodes, resolve_support
from onnx_modular.passes.split import Region, SplitPass, SplitPlan, print_preview
from onnx_modular.region_models import RegionGraph, partition, region_chains, single_model

# ---- capture and translation -----------------------------------------------------------------

def translate_program(program: torch.export.ExportedProgram, opset: int | None = None,
                      ctx: DiagnosticContext | None = None) -> Translation:
    """The shared translation step (hook-free, unoptimized: every ONNX node names its FX node).

    Below opset 18 torch.onnx converts the model down and drops each node's FX origin, so
    every ONNX node would land in the first region, unsupported ones included: refused.
    """
    ctx = ctx or DiagnosticContext()
    if opset is not None and opset < MIN_HIERARCHICAL_OPSET:
        raise ctx.error(rules.BAD_INPUT, reason=(
            f"opset {opset} cannot be split: below opset {MIN_HIERARCHICAL_OPSET} torch.onnx "
            "drops the FX node each ONNX node comes from; use opset "
            f">= {MIN_HIERARCHICAL_OPSET}"))
    return translate(program, opset=opset, ctx=ctx)


# ---- the result ------------------------------------------------------------------------------

class SplitResult:
    """Regions of a model: ``regions``, ``graph_module`` (runs in torch), ``save``."""

    def __init__(self, plan: SplitPlan, graph_module: torch.fx.GraphModule, onnx_model: ir.Model,
                 source: torch.fx.GraphModule, program: torch.export.ExportedProgram,
                 diagnostics: list[Diagnostic], hierarchical: bool = True) -> None:
        self.plan = plan
        self.hierarchical = hierarchical
        self.graph_module = graph_module
        self.onnx_model = onnx_model
        self.program = program
        self.diagnostics = diagnostics
        self._source = source
        self._region_graphs: list[RegionGraph] | None = None

    @property
    def regions(self) -> list[Region]:
        return self.plan.regions

    def __repr__(self) -> str:
        kinds = " ".join(f"{r.name}({len(r.node_names)})" for r in self.regions)
        return f"SplitResult({kinds})"

    # ONNX
    def region_graphs(self) -> list[RegionGraph]:
        """One standalone ``onnx_ir`` model per region (built once, then cached)."""
        if self._region_graphs is None:
            index = {n: i for i, r in enumerate(self.regions) for n in r.node_names}
            meta = {n.name: n.meta.get("val") for n in self._source.graph.nodes}
            graphs = partition(
                self.onnx_model, [(r.name, r.kind) for r in self.regions], index, meta.get)
            if self.hierarchical:
                self._outline(graphs, index)
            self._region_graphs = graphs
        return self._region_graphs

    def _outline(self, graphs: list[RegionGraph], index: dict[str, int]) -> None:
        """Module functions inside each region, where the outliner is installed."""
        try:
            from onnx_modular.emit import outline  # type: ignore[attr-defined]
        except ImportError:
            return
        from onnx_modular.passes.modularize import modularize, module_call_chains

        ctx = DiagnosticContext()
        chains = module_call_chains(modularize(self.program, ctx))
        for graph, region_chain in zip(graphs, region_chains(chains, index, len(graphs))):
            try:
                outlined = outline(graph.model, region_chain)
            except Exception as e:  # the flat region model stays valid
                self.diagnostics.append(ctx.log(
                    rules.UNOUTLINED, Level.WARNING, reason=(
                        f"{graph.name} stays flat: {type(e).__name__}: {e}")))
                continue
            if isinstance(outlined, ir.Model):
                graph.model = outlined

    def region_protos(self) -> dict[str, Any]:
        """Region name -> ``onnx.ModelProto``."""
        return {g.name: ir.serde.serialize_model(g.model) for g in self.region_graphs()}

    def single_model(self) -> ir.Model:
        return single_model(self.onnx_model, self.region_graphs())

    def manifest(self) -> dict[str, Any]:
        """The JSON the runner reads: model I/O, pytree specs, regions in order and their links."""
        spec = self.program.call_spec
        return build_manifest(self.onnx_model.graph, self.region_graphs(), kind="split",
                              in_spec=spec.in_spec, out_spec=spec.out_spec,
                              fx_nodes={r.name: len(r.node_names) for r in self.regions})

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """``<region>.onnx`` per region, then ``manifest.json`` (written last, atomically)."""
        return save_parts(directory, self.region_graphs(), self.manifest())

    def save_single(self, path: str | os.PathLike[str]) -> Path:
        """One ONNX model in which each region is a local function, called in order."""
        target = Path(path)
        atomic_write_bytes(target, ir.serde.serialize_model(self.single_model())
                           .SerializeToString())
        return target

    # previews
    def preview(self, console: Any = None) -> None:
        """Print the operator-support and region tables."""
        print_preview(self.plan, console)


def split(model: Any, args: Sequence[Any] = (), *, support: Any, min_acc_module_size: int = 1,
          max_acc_splits: int = -1, allow_non_tensor: bool = False, skip_fusion: bool = False,
          kwargs: dict[str, Any] | None = None, opset: int | None = None,
          hierarchical: bool = True, ctx: DiagnosticContext | None = None) -> SplitResult:
    """Split ``model`` into alternating accelerator/CPU regions (splitter_base semantics).

    ``support``: an :class:`OperatorSupport`, a callable ``fx.Node -> bool``, an iterable of
    op names (allow list), ``{"allow": [...], "deny": [...]}`` or ``"ort:<ExecutionProvider>"``.
    ``max_acc_splits`` > 0 caps the number of regions (acc and CPU, as splitter_base counts).
    ``hierarchical``: module calls lying wholly in a region become functions of its model.
    """
    ctx = ctx or DiagnosticContext()
    op_support = resolve_support(support)
    program = capture(model, args, kwargs, ctx=ctx)
    translation = translate_program(program, opset, ctx)
    decomposed = translation.program
    source = decomposed.module()
    context = SupportContext(fx_to_onnx_nodes(translation.model),
                             dict(translation.model.opset_imports))
    split_pass = SplitPass(op_support, context=context, min_acc_module_size=min_acc_module_size,
                           max_acc_splits=max_acc_splits, allow_non_tensor=allow_non_tensor,
                           skip_fusion=skip_fusion)
    result = split_pass(source, ctx)
    assert split_pass.plan is not None
    return SplitResult(split_pass.plan, result.graph_module, translation.model, source,
                       decomposed, ctx.diagnostics, hierarchical)
