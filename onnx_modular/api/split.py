"""``om.split``: accelerator/CPU regions of a model, as a runnable GraphModule and ONNX files.

The program is captured and translated to ONNX once; the Split pass decides regions on the
decomposed FX graph; each ONNX node follows its FX node into a region, and every region
model goes through the same emit pipeline as ``om.export`` (folded, outlined into module
functions, optimized, equal functions merged). ``save`` writes one standalone model per
region plus ``manifest.json`` (the format :class:`SplitRunner` reads, shared with pipeline
stages); ``save_single`` writes one model of region functions.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import onnx_ir as ir
import torch

from onnx_modular._checkpoint import Checkpoint
from onnx_modular._io import atomic_write_bytes
from onnx_modular.api.spine import modularized
from onnx_modular.diagnostics import Diagnostic, DiagnosticContext
from onnx_modular.emit.pipeline import EmitOptions, emit_model, program_weights
from onnx_modular.emit.regions import (
    RegionGraph,
    op_types_in,
    partition,
    region_chains,
    single_model,
)
from onnx_modular.errors import rules
from onnx_modular.lower.capture import capture
from onnx_modular.lower.translate import Translation, check_opset, translate
from onnx_modular.parts.manifest import build_manifest, save_parts
from onnx_modular.parts.triton import TritonRepository, save_triton
from onnx_modular.passes.infra import PassManager
from onnx_modular.passes.split import (
    Region,
    SplitPass,
    SplitPassResult,
    SplitPlan,
    check_limits,
)
from onnx_modular.support.matching import forbidden_onnx_ops
from onnx_modular.support.onnx_index import SupportContext, fx_to_onnx_nodes
from onnx_modular.support.operator_support import (
    CALLABLE_OPS,
    OnnxOp,
    OpEntry,
    OperatorSupport,
    onnx_display,
    onnx_op_types,
    resolve_support,
)


def translate_for_parts(program: torch.export.ExportedProgram, opset: int | None,
                        ctx: DiagnosticContext) -> Translation:
    """The shared translation of splits and stages: every ONNX node must name its FX node,
    which torch.onnx drops below opset 18."""
    check_opset(opset, flat=False, ctx=ctx, what="a split model")
    return translate(program, opset=opset, ctx=ctx)


class SplitResult:
    """Regions of a model: ``regions``, ``graph_module`` (runs in torch), ``save``."""

    def __init__(self, plan: SplitPlan, graph_module: torch.fx.GraphModule,
                 translation: Translation, source: torch.fx.GraphModule,
                 ctx: DiagnosticContext, hierarchical: bool = True,
                 forbidden_ops: frozenset[OnnxOp] = frozenset(),
                 entries: tuple[OpEntry, ...] = ()) -> None:
        self.plan = plan
        #: ONNX ops no accelerator model may hold (what the support kept off it)
        self.forbidden_ops = forbidden_ops
        self._entries = entries  # the support's allow/deny names
        self.hierarchical = hierarchical
        self.graph_module = graph_module
        self.onnx_model = translation.model  # the unoptimized translation regions are cut from
        self.program = translation.program
        self._ctx = ctx
        self._source = source
        self._region_graphs: list[RegionGraph] | None = None

    @property
    def diagnostics(self) -> list[Diagnostic]:
        return self._ctx.diagnostics

    @property
    def regions(self) -> list[Region]:
        return self.plan.regions

    def __repr__(self) -> str:
        kinds = " ".join(f"{r.name}({len(r.node_names)})" for r in self.regions)
        return f"{type(self).__name__}({kinds})"

    # ONNX
    def region_graphs(self) -> list[RegionGraph]:
        """One standalone, emitted ``onnx_ir`` model per region (built once, then cached)."""
        if self._region_graphs is None:
            index = {n: i for i, r in enumerate(self.regions) for n in r.node_names}
            meta = {n.name: n.meta.get("val") for n in self._source.graph.nodes}
            graphs = partition(self.onnx_model, [(r.name, r.kind) for r in self.regions],
                               index, meta.get, self._ctx)
            _, chains = modularized(self.program, self._ctx)
            options = EmitOptions("all" if self.hierarchical else "none")
            acc_options = dataclasses.replace(
                options, avoid_ops=frozenset(op for _, op in self.forbidden_ops))
            weights = program_weights(self.program)
            for graph, chain in zip(graphs, region_chains(chains, index, len(graphs)),
                                    strict=True):
                with self._ctx.scope(graph.name):
                    emit_model(graph.model, chain, weights,
                               acc_options if graph.is_acc else options, self._ctx)
                    if graph.is_acc:
                        self._check_acc_model(graph)
            self._region_graphs = graphs
        return self._region_graphs

    def _check_acc_model(self, graph: RegionGraph) -> None:
        """The final word on a denied op: the emitted acc model, function bodies included."""
        held = op_types_in(graph.model)
        for op in sorted(self.forbidden_ops & set(held)):
            denied = any(e.onnx == op and e.kind == "deny" for e in self._entries)
            why = (f"'{onnx_display(op)}' is denied" if denied else
                   "only nodes the support keeps off the accelerator emit it")
            raise self._ctx.error(rules.DENIED_ON_ACC, reason=(
                f"accelerator region '{graph.name}' holds {op[1]} ({held[op][0]}) although "
                f"{why}; the emit pipeline made it from supported nodes — this is a bug, "
                "please report it (workaround: deny the ops it was made from)"))

    def region_protos(self) -> dict[str, Any]:
        """Region name -> ``onnx.ModelProto``."""
        return {g.name: ir.serde.serialize_model(g.model) for g in self.region_graphs()}

    def single_model(self) -> ir.Model:
        return single_model(self.onnx_model.graph, self.region_graphs())

    def manifest(self) -> dict[str, Any]:
        """The JSON the runner reads: model I/O, pytree specs, regions in order and their links."""
        spec = self.program.call_spec
        return build_manifest(self.onnx_model.graph, self.region_graphs(), kind=self.kind,
                              in_spec=spec.in_spec, out_spec=spec.out_spec,
                              fx_nodes={r.name: len(r.node_names) for r in self.regions})

    kind = "split"

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """``<region>.onnx`` per region, then ``manifest.json`` (written last, atomically)."""
        return save_parts(directory, self.region_graphs(), self.manifest())

    def save_single(self, path: str | os.PathLike[str]) -> Path:
        """One ONNX model in which each region is a local function, called in order."""
        target = Path(path)
        atomic_write_bytes(target, ir.serde.serialize_model(self.single_model())
                           .SerializeToString())
        return target

    def save_triton(self, repo: str | os.PathLike[str], *, name: str = "model",
                    instances: int = 1, gpus: Any = None, kind: str | None = None,
                    max_batch_size: int | None = None, max_queue_delay_us: int = 0,
                    external_data: bool | None = None) -> TritonRepository:
        """A Triton model repository: one onnxruntime model per part and the ensemble
        ``name`` that chains them, saved as one set; serve it with ``tritonserver
        --model-repository repo``.

        ``kind``: accelerator parts' instances, ``auto`` (default; ``gpu`` where ``gpus``
        is given) or ``cpu`` (CPU regions are always ``KIND_CPU``); ``instances``: instances
        per part; ``gpus``: GPU ids the accelerator parts are spread over in turn (or part
        name -> ids); ``max_batch_size``: ``None`` batches where the parts keep the model's
        dynamic batch dimension (``max_queue_delay_us``: how long a request waits for others
        to batch with); ``external_data``: weights beside each model in
        ``model.onnx.<id>.data`` (``None``: only above 2 GB). See :func:`save_triton`.
        """
        return save_triton(repo, self.onnx_model.graph, self.region_graphs(), name=name,
                           instances=instances, gpus=gpus, kind=kind,
                           max_batch_size=max_batch_size,
                           max_queue_delay_us=max_queue_delay_us, external_data=external_data)

    def preview(self, console: Any = None) -> None:
        """Print the operator-support and region tables."""
        print_preview(self.plan, console)


def print_preview(plan: SplitPlan, console: Any = None) -> None:
    """The support and region tables of a split plan (rich)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    support = Table(title="Operator support")
    for col in ("operator", "nodes", "supported", "why"):
        support.add_column(col, justify="right" if col == "nodes" else "left")
    rows: Iterable[tuple[str, bool, int]] = sorted(
        [(k, True, v) for k, v in plan.supported_ops.items()]
        + [(k, False, v) for k, v in plan.unsupported_ops.items()],
        key=lambda t: (t[1], -t[2], t[0]))
    for op, ok, count in rows:
        support.add_row(op, str(count), "yes" if ok else "[red]no[/red]",
                        escape(plan.reasons.get((op, ok), "")))
    console.print(support)
    regions = Table(title="Regions")
    for col in ("region", "kind", "nodes", "inputs", "outputs", "input bytes", "output bytes"):
        regions.add_column(col, justify="left" if col in ("region", "kind") else "right")
    for r in plan.regions:
        regions.add_row(r.name, r.kind, str(len(r.node_names)), str(len(r.inputs)),
                        str(len(r.outputs)), str(r.input_bytes), str(r.output_bytes))
    console.print(regions)


def split(model: Any, args: Sequence[Any] = (), *, support: Any, min_acc_module_size: int = 1,
          max_acc_splits: int = -1, allow_non_tensor: bool = False, skip_fusion: bool = False,
          kwargs: dict[str, Any] | None = None, opset: int | None = None,
          hierarchical: bool = True, weights: Checkpoint | None = None,
          ctx: DiagnosticContext | None = None) -> SplitResult:
    """Split ``model`` into alternating accelerator/CPU regions (splitter_base semantics).

    ``support``: an :class:`OperatorSupport`, a callable ``fx.Node -> bool``, an iterable of
    op names (allow list), ``{"allow": [...], "deny": [...]}`` or ``"ort:<ExecutionProvider>"``.
    ``max_acc_splits`` > 0 caps the number of regions (acc and CPU, as splitter_base counts).
    ``hierarchical``: module calls lying wholly in a region become functions of its model.
    ``weights``: the checkpoint of a model built on the meta device (as for ``om.export``):
    each region's weights are read from their mapped files as its model is written.
    """
    ctx = ctx or DiagnosticContext()
    check_limits(min_acc_module_size, max_acc_splits)
    op_support = resolve_support(support)
    program = capture(model, args, kwargs, ctx=ctx, weights=weights)
    translation = translate_for_parts(program, opset, ctx)
    source = translation.program.module()
    context = SupportContext(fx_to_onnx_nodes(translation.model),
                             dict(translation.model.opset_imports))
    split_pass = SplitPass(op_support, context=context, min_acc_module_size=min_acc_module_size,
                           max_acc_splits=max_acc_splits, allow_non_tensor=allow_non_tensor,
                           skip_fusion=skip_fusion)
    result = PassManager([split_pass], ctx)(source).of(SplitPassResult)
    assert result.plan is not None
    forbidden = _forbidden_ops(op_support, result.plan, source, context)
    return SplitResult(result.plan, result.graph_module, translation, source, ctx,
                       hierarchical, forbidden, op_support.entries)


def _forbidden_ops(support: OperatorSupport, plan: SplitPlan, source: torch.fx.GraphModule,
                   context: SupportContext) -> frozenset[OnnxOp]:
    nodes = [n for n in source.graph.nodes if n.op in CALLABLE_OPS]
    acc_names = {name for r in plan.regions if r.is_acc for name in r.node_names}
    acc_ops: set[OnnxOp] = set()
    for n in nodes:
        if n.name in acc_names:
            acc_ops |= onnx_op_types(n, context)
    unsupported = set(plan.unsupported_nodes)
    return forbidden_onnx_ops(support, nodes, {n for n in nodes if n.name in unsupported},
                              context, acc_ops)
