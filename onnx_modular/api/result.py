"""What ``om.split``, ``om.split_stages`` and ``om.split_by`` return: one frozen record.

Acc/CPU regions and pipeline stages are the same data (a plan of parts cut from one lowered
model), so one type holds both (``kind``: ``"split"`` or ``"stages"``; ``om.StagesResult``
is another name for it). The work lives with its stage: region models are emitted by
:func:`onnx_modular.emit.regions.emit_regions` when the entry point makes the record
(:func:`emitted_result`), so every diagnostic of the emission, a denied op on an accelerator
included, is in ``diagnostics`` when ``om.split`` returns; the manifest and the files are
written by ``parts/``, the tables printed by :mod:`onnx_modular.api.render`. No method adds
a diagnostic or emits anything.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx
import onnx_ir as ir
import torch

from onnx_modular.api import render
from onnx_modular.api.spine import Lowered
from onnx_modular.diagnostics import Diagnostic, DiagnosticContext
from onnx_modular.emit.dim_names import name_dims
from onnx_modular.emit.regions import (
    AccLimits,
    RegionEmission,
    RegionGraph,
    emit_regions,
    single_model,
)
from onnx_modular.leaves._compat import dim_names
from onnx_modular.parts import manifest as parts_manifest
from onnx_modular.parts.triton import TritonOptions, TritonRepository, save_triton
from onnx_modular.passes.balance import StagePlan
from onnx_modular.passes.split import Region, SplitPassResult, SplitPlan
from onnx_modular.support.operator_support import OnnxOp

if TYPE_CHECKING:
    from rich.console import Console


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class SplitResult:
    """Regions or stages of a model: ``regions``, ``graph_module`` (runs in torch), ``save``."""

    plan: SplitPlan
    graph_module: torch.fx.GraphModule  # one submodule per part: runs in torch
    flat_module: torch.fx.GraphModule  # the decomposed program's module() the plan was made on
    lowered: Lowered
    ctx: DiagnosticContext  # every diagnostic of the split, its parts' emission included
    parts: tuple[RegionGraph, ...]  # one standalone, emitted model per part, in order
    emission: RegionEmission  # how they were emitted: hierarchical, acc limits
    kind: str = "split"  # "split" (acc/CPU regions) or "stages"
    how: str = ""  # stages: "markers", "split_points", "callback" or the balanced plan's
    stage_plan: StagePlan | None = None  # the balanced plan (num_stages / max_stage_bytes)

    @property
    def diagnostics(self) -> list[Diagnostic]:
        return self.ctx.diagnostics

    @property
    def regions(self) -> list[Region]:
        return self.plan.regions

    @property
    def stages(self) -> list[Region]:
        return self.plan.regions

    @property
    def hierarchical(self) -> bool:
        """Module calls wholly in a part are functions of its model."""
        return self.emission.hierarchical

    @property
    def acc_limits(self) -> AccLimits:
        return self.emission.limits

    @property
    def forbidden_ops(self) -> frozenset[OnnxOp]:
        """ONNX ops no accelerator model may hold (what the support kept off it)."""
        return self.emission.limits.forbidden_ops

    @property
    def onnx_model(self) -> ir.Model:
        """The unoptimized translation the parts are cut from."""
        return self.lowered.model

    @property
    def program(self) -> torch.export.ExportedProgram:
        """The decomposed program, as translated."""
        return self.lowered.program

    def __repr__(self) -> str:
        parts = " ".join(f"{r.name}({len(r.node_names)})" for r in self.regions)
        if self.kind == "stages":
            return f"StagesResult({self.how}: {parts})"
        return f"SplitResult({parts})"

    # ONNX
    def region_graphs(self) -> list[RegionGraph]:
        """One standalone, emitted ``onnx_ir`` model per part (emitted by the split): the
        same list each call, as before (the record's own field is a tuple)."""
        return self._listed_parts

    @functools.cached_property
    def _listed_parts(self) -> list[RegionGraph]:
        return list(self.parts)

    def region_protos(self) -> dict[str, onnx.ModelProto]:
        """Part name -> ``onnx.ModelProto``."""
        return {g.name: ir.serde.serialize_model(g.model) for g in self.region_graphs()}

    def single_model(self) -> ir.Model:
        """One model in which each part is a local function, called in order."""
        return single_model(self.onnx_model.graph, self.region_graphs())

    def parameters_of(self) -> dict[str, dict[str, int]]:
        """Part name -> {weight name: bytes} of the program's weights the part reads."""
        return {g.name: dict(g.weights) for g in self.region_graphs()}

    def shared_parameters(self) -> dict[str, dict[str, Any]]:
        """Weights read by more than one part: each such part holds a copy."""
        return parts_manifest.shared_parameters(self.region_graphs())

    def manifest(self) -> dict[str, Any]:
        """The JSON the runner reads: model I/O, pytree specs, parts in order and their links
        (stages: how they were cut and where each stage's weights went)."""
        spec = self.program.call_spec
        return parts_manifest.build_manifest(
            self.onnx_model.graph, self.region_graphs(), kind=self.kind,
            in_spec=spec.in_spec, out_spec=spec.out_spec,
            fx_nodes={r.name: len(r.node_names) for r in self.regions},
            split_by=self.how if self.kind == "stages" else None)

    # files
    def save(self, directory: str | os.PathLike[str]) -> Path:
        """``<part>.onnx`` per part, then ``manifest.json``, swapped in as one set."""
        return parts_manifest.save_parts(directory, self.region_graphs(), self.manifest())

    def save_single(self, path: str | os.PathLike[str]) -> Path:
        """One ONNX model in which each part is a local function, called in order."""
        return parts_manifest.save_single(path, self.single_model())

    def save_triton(self, repo: str | os.PathLike[str], *, name: str = "model",
                    instances: int = 1,
                    gpus: Sequence[int] | Mapping[str, Sequence[int]] | None = None,
                    kind: str | None = None, max_batch_size: int | None = None,
                    max_queue_delay_us: int = 0,
                    external_data: bool | None = None,
                    batch_dim: str | None = None) -> TritonRepository:
        """A Triton model repository: one onnxruntime model per part and the ensemble
        ``name`` that chains them, saved as one set; serve it with ``tritonserver
        --model-repository repo``.

        ``kind``: accelerator parts' instances, ``auto`` (default; ``gpu`` where ``gpus``
        is given) or ``cpu`` (CPU regions are always ``KIND_CPU``); ``instances``: instances
        per part; ``gpus``: GPU ids the accelerator parts are spread over in turn (or part
        name -> ids); ``max_batch_size``: ``None`` batches where the parts keep the model's
        dynamic batch dimension (``max_queue_delay_us``: how long a request waits for others
        to batch with), where a graph analysis proves no op mixes rows along it (else 0,
        ``note`` says why); ``batch_dim``: states that the dimension of that name (the ``Dim``
        the program was exported with, or its ``s<N>`` symbol), axis 0 of every input, is
        the batch where the analysis cannot prove it; ``external_data``: weights beside
        each model in ``model.onnx.<id>.data`` (``None``: only above 2 GB). See
        :func:`save_triton`.
        """
        options = TritonOptions(name=name, instances=instances, gpus=gpus, kind=kind,
                                max_batch_size=max_batch_size,
                                max_queue_delay_us=max_queue_delay_us,
                                external_data=external_data, batch_dim=batch_dim,
                                dim_names=dim_names(self.program))
        return save_triton(repo, self.onnx_model.graph, self.region_graphs(), options)

    def preview(self, console: Console | None = None) -> None:
        """Print the operator-support and region tables (stages: one row per stage)."""
        if self.kind == "stages":
            weight_bytes = {name: sum(w.values()) for name, w in self.parameters_of().items()}
            render.print_stages(self.plan, self.how, weight_bytes, console)
        else:
            render.print_preview(self.plan, console)


#: Pipeline stages are the same record (``kind == "stages"``).
StagesResult = SplitResult


def emitted_result(cut: SplitPassResult, flat_module: torch.fx.GraphModule, lowered: Lowered,
                   ctx: DiagnosticContext, emission: RegionEmission,
                   **fields: Any) -> SplitResult:
    """Emit one model per part of the plan ``cut`` carries out (its regions or stages) as
    ``emission`` says (its diagnostics, and a denied op held by an accelerator model, land
    in ``ctx`` now), then the record holding them. ``fields``: the record's other fields
    (``kind``, ``how``, ``stage_plan``)."""
    plan, graph_module = cut.plan, cut.graph_module
    assert plan is not None  # the planner put it there
    meta = {n.name: n.meta.get("val") for n in flat_module.graph.nodes}
    parts = emit_regions(lowered, plan.regions, meta.get, emission, ctx)
    names = dim_names(lowered.program)  # the Dims' names on every part's axes, as om.export
    for model in [lowered.model, *(part.model for part in parts)]:  # puts them on its file
        name_dims(model, names)
    return SplitResult(plan, graph_module, flat_module, lowered, ctx, tuple(parts), emission,
                       **fields)
