"""``om.split_stages`` / ``om.split_by``: a model cut into pipeline stages, one ONNX model each.

Stages come from ``pipe_split()`` markers, split points at module boundaries, or a
``node -> int`` callback (:mod:`onnx_modular.passes.stages` decides them on the captured
program). Everything after that is the acc/CPU split's machinery: the program is translated
once, ONNX nodes follow their FX node into a stage, stage models are outlined into module
functions, and ``save`` writes the same parts format, so :class:`SplitRunner` chains stages.

Parameters live in the stage that reads them. A parameter several stages read (tied
embedding and output weights) is **copied** into each of those stages, so every stage model is
self-contained and runs on its own device; the manifest lists each such copy under
``shared_parameters``. Nothing else is duplicated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx

from onnx_modular._checkpoint import Checkpoint
from onnx_modular.api.split import SplitResult, translate_for_parts
from onnx_modular.diagnostics import DiagnosticContext
from onnx_modular.errors import rules
from onnx_modular.lower.capture import capture
from onnx_modular.passes import stages as stage_pass
from onnx_modular.passes.balance import StagePlan, balanced_plan
from onnx_modular.passes.split import Region, SplitPlan, build_split_module, describe_regions
from onnx_modular.support.operator_support import CALLABLE_OPS

STAGE_PREFIX = "stage_"
SHARED_HANDLING = "copied"


@dataclasses.dataclass
class Stage(Region):
    """One pipeline stage; runs on the accelerator providers like an acc region."""

    @property
    def kind(self) -> str:
        return "stage"


class StagesResult(SplitResult):
    """Pipeline stages of a model: ``stages``, ``graph_module`` (runs in torch), ``save``."""

    def __init__(self, *args: Any, how: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.how = how
        #: the balanced plan (``num_stages`` / ``max_stage_bytes``), else None
        self.stage_plan: StagePlan | None = None

    kind = "stages"

    @property
    def stages(self) -> list[Region]:
        return self.plan.regions

    def __repr__(self) -> str:
        parts = " ".join(f"{r.name}({len(r.node_names)})" for r in self.regions)
        return f"StagesResult({self.how}: {parts})"

    def parameters_of(self) -> dict[str, dict[str, int]]:
        """Stage name -> {weight name: bytes} of the program's weights the stage reads."""
        return {g.name: dict(g.weights) for g in self.region_graphs()}

    def shared_parameters(self) -> dict[str, dict[str, Any]]:
        """Initializers read by more than one stage: each such stage holds a copy."""
        stages_of: dict[str, list[str]] = {}
        size: dict[str, int] = {}
        for stage, params in self.parameters_of().items():
            for name, nbytes in params.items():
                stages_of.setdefault(name, []).append(stage)
                size[name] = nbytes
        return {name: {"stages": where, "bytes": size[name], "handling": SHARED_HANDLING}
                for name, where in stages_of.items() if len(where) > 1}

    def manifest(self) -> dict[str, Any]:
        """The parts manifest (``kind: "stages"``) plus where each stage's weights went."""
        manifest = super().manifest()
        params = self.parameters_of()
        for entry in manifest["regions"]:
            entry["parameters"] = len(params[entry["name"]])
            entry["parameter_bytes"] = sum(params[entry["name"]].values())
        manifest["split_by"] = self.how
        manifest["shared_parameters"] = self.shared_parameters()
        return manifest

    def preview(self, console: Any = None) -> None:
        """Print one row per stage: nodes, border values, weights."""
        from rich.console import Console
        from rich.table import Table

        console = console or Console()
        table = Table(title=f"Stages ({self.how})")
        for col in ("stage", "nodes", "inputs", "outputs", "output bytes", "weight bytes"):
            table.add_column(col, justify="left" if col == "stage" else "right")
        params = self.parameters_of()
        for r in self.regions:
            table.add_row(r.name, str(len(r.node_names)), str(len(r.inputs)),
                          str(len(r.outputs)), str(r.output_bytes),
                          str(sum(params[r.name].values())))
        console.print(table)


def _module_names(model: Any) -> set[str] | None:
    if isinstance(model, torch.nn.Module):
        return {name for name, _ in model.named_modules()}
    return None


def _capture(model: Any, args: Sequence[Any] | None, kwargs: dict[str, Any] | None,
             ctx: DiagnosticContext, entry: str, weights: Checkpoint | None = None,
             meta_ok: bool = False) -> torch.export.ExportedProgram:
    """The program, refused up front (as ``om.split`` refuses it) when it has no operator:
    its one stage would be empty, a parts directory SplitRunner rejects."""
    if isinstance(model, torch.nn.Module) and args is None and not kwargs:
        raise ctx.error(rules.BAD_INPUT, reason=(
            f"example inputs are needed to capture {type(model).__name__}: pass args= "
            "(or an ExportedProgram)"))
    program = capture(model, args if args is not None else (), kwargs, ctx=ctx,
                      weights=weights, meta_ok=meta_ok)
    if not stage_pass.has_operators(program):
        raise _nothing_to_split(ctx, entry)
    return program


def _nothing_to_split(ctx: DiagnosticContext, entry: str) -> Exception:
    return ctx.error(rules.PRECONDITION, pass_name=entry,
                     reason="a graph with at least one operator (nothing to split)")


def plan_stages(model: Any, args: Sequence[Any] | None = None, *,
                num_stages: int | None = None, max_stage_bytes: int | None = None,
                kwargs: dict[str, Any] | None = None, weights: Checkpoint | None = None,
                ctx: DiagnosticContext | None = None) -> StagePlan:
    """The balanced plan alone (capture only, no translation): which modules go to which
    stage and the weight bytes of each; ``print(plan)`` shows it. See :func:`split_stages`."""
    ctx = ctx or DiagnosticContext()
    program = _capture(model, args, kwargs, ctx, "plan_stages", weights,
                       meta_ok=True)  # shapes suffice
    return balanced_plan(stage_pass.without_markers(program), num_stages, max_stage_bytes, ctx)


def split_stages(model: Any, args: Sequence[Any] | None = None,
                 split_points: Mapping[str, Any] | None = None, *,
                 num_stages: int | None = None, max_stage_bytes: int | None = None,
                 kwargs: dict[str, Any] | None = None, opset: int | None = None,
                 hierarchical: bool = True, weights: Checkpoint | None = None,
                 ctx: DiagnosticContext | None = None) -> StagesResult:
    """Pipeline stages at ``pipe_split()`` markers and/or ``split_points``, or balanced.

    ``split_points``: module path -> ``"beginning"`` (cut before the module's call) or
    ``"end"`` (after it), as in PiPPy. Markers in ``forward`` cut too, whether or not
    split points are given. ``model``: an ``nn.Module`` (with ``args``) or an ExportedProgram.

    ``num_stages`` / ``max_stage_bytes``: stages balanced by the weight bytes they hold (a
    tied weight counts in every stage that holds a copy), cut only between the calls of
    the model's repeated block list (``h.0 .. h.N``); ``num_stages`` as even as possible,
    ``max_stage_bytes`` as few as keep every stage within the budget, both: ``num_stages``
    stages within the budget. The plan is a diagnostic (``stage-plan``) and
    ``result.stage_plan``; a budget no cut can meet names the largest indivisible module.
    """
    ctx = ctx or DiagnosticContext()
    program = _capture(model, args, kwargs, ctx, "split_stages", weights)
    if num_stages is not None or max_stage_bytes is not None:
        if split_points:
            raise ctx.error(rules.SPLIT_POINT, reason=(
                "give split_points or num_stages/max_stage_bytes, not both"))
        if stage_pass.from_markers(program).count > 1:
            raise ctx.error(rules.SPLIT_POINT, reason=(
                "the model has om.pipe_split() markers; num_stages/max_stage_bytes cut by "
                "themselves (remove the markers, or leave both out)"))
        plan = balanced_plan(program, num_stages, max_stage_bytes, ctx)
        assignment = stage_pass.from_split_points(program, plan.cuts, ctx)
        assignment.how = plan.how
        result = _build(program, assignment, ctx, opset, hierarchical)
        result.stage_plan = plan
        return result
    assignment = stage_pass.from_markers(program)
    if split_points:
        points = stage_pass.from_split_points(program, split_points, ctx,
                                              module_names=_module_names(model))
        assignment = points if assignment.count == 1 else stage_pass.combined(assignment, points)
    return _build(program, assignment, ctx, opset, hierarchical)


def split_by(model_or_program: Any, callback: Callable[[torch.fx.Node], int],
             args: Sequence[Any] | None = None, kwargs: dict[str, Any] | None = None, *,
             opset: int | None = None, hierarchical: bool = True,
             weights: Checkpoint | None = None,
             ctx: DiagnosticContext | None = None) -> StagesResult:
    """Stages from ``callback(node) -> partition id`` over the captured program's nodes.

    ``split_module`` semantics: ids are any ints; stages are ordered so data only flows
    forward (first appearance breaking ties); partitions that depend on each other in a
    cycle are an error.
    """
    ctx = ctx or DiagnosticContext()
    program = stage_pass.without_markers(_capture(model_or_program, args, kwargs, ctx,
                                                  "split_by", weights))
    assignment = stage_pass.from_callback(program, callback, ctx)
    return _build(program, assignment, ctx, opset, hierarchical)


def _build(program: torch.export.ExportedProgram, assignment: stage_pass.StageAssignment,
           ctx: DiagnosticContext, opset: int | None, hierarchical: bool) -> StagesResult:
    """Translate once, carry stages to the decomposed nodes, and describe each stage."""
    translation = translate_for_parts(stage_pass.without_markers(program), opset, ctx)
    decomposed = translation.program
    carried = stage_pass.decomposed_assignment(assignment, decomposed)
    source = decomposed.module()
    stage_of = _stage_of_module_nodes(source, carried.stage_of)
    index = {n: i for i, n in enumerate(source.graph.nodes)}
    members: list[list[torch.fx.Node]] = [[] for _ in range(assignment.count)]
    for node, stage in stage_of.items():
        members[stage].append(node)
    # a stage may vanish in decomposition (it held only nodes that fold away)
    members = [ns for ns in members if ns]
    if not members:  # every operator folded away
        raise _nothing_to_split(ctx, f"split ({assignment.how})")
    described = describe_regions([(True, ns) for ns in members], index)
    stages: list[Region] = [Stage(**{**dataclasses.asdict(r), "name": f"{STAGE_PREFIX}{i}"})
                            for i, r in enumerate(described)]
    plan = SplitPlan(stages, regions_before_merge=(len(stages), 0))
    for stage in stages:
        ctx.note(rules.SPLIT_PREVIEW, reason=(
            f"{stage.name}: {len(stage.node_names)} node(s), {len(stage.inputs)} input(s) "
            f"({stage.input_bytes} bytes), {len(stage.outputs)} output(s) "
            f"({stage.output_bytes} bytes)"))
    return StagesResult(plan, build_split_module(source, plan), translation, source, ctx,
                        hierarchical, how=assignment.how)


def _stage_of_module_nodes(source: torch.fx.GraphModule,
                           stage_of: Mapping[str, int]) -> dict[torch.fx.Node, int]:
    """Stage of every compute node of ``program.module()``; nodes it adds join their inputs."""
    result: dict[torch.fx.Node, int] = {}
    for node in source.graph.nodes:
        if node.op not in CALLABLE_OPS or str(node.target).startswith("_guards_fn"):
            continue
        stage = stage_of.get(node.name)
        if stage is None:
            stage = max((result.get(a, 0) for a in node.all_input_nodes), default=0)
        result[node] = stage
    return result
