"""``om.split_stages`` / ``om.split_by``: a model cut into pipeline stages, one ONNX model each.

Stages come from ``pipe_split()`` markers, split points at module boundaries, or a
``node -> int`` callback (:mod:`onnx_modular.passes.stages` decides them on the captured
program). Everything after that is the acc/CPU split's machinery: the model is lowered once
(:func:`onnx_modular.api.spine.lower`), the stages are carried to the decomposed nodes,
planned (:class:`~onnx_modular.passes.stages.PlanStages`) and cut (the split's
``CutRegions``, the two under a PassManager), ONNX nodes follow their FX node into a stage,
stage models are outlined into module functions, and ``save`` writes the same parts format,
so :class:`SplitRunner` chains stages.

Parameters live in the stage that reads them. A parameter several stages read (tied
embedding and output weights) is **copied** into each of those stages, so every stage model is
self-contained and runs on its own device; the manifest lists each such copy under
``shared_parameters``. Nothing else is duplicated.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx

from onnx_modular.api.arguments import ExampleArgs, ExampleKwargs, Model, SplitPoints
from onnx_modular.api.result import StagesResult, emitted_result
from onnx_modular.api.spine import Subject, lower
from onnx_modular.diagnostics import DiagnosticContext, records_failures
from onnx_modular.emit.regions import RegionEmission
from onnx_modular.leaves._checkpoint import Checkpoint
from onnx_modular.leaves.errors import fail, rules
from onnx_modular.lower.markers import without_markers
from onnx_modular.lower.translate import check_opset
from onnx_modular.passes import stages as stage_pass
from onnx_modular.passes.balance import StagePlan, balanced_plan
from onnx_modular.passes.stages import Stage

__all__ = ["Stage", "StagesResult", "plan_stages", "split_by", "split_stages"]


def _module_names(model: Model) -> set[str] | None:
    if isinstance(model, torch.nn.Module):
        return {name for name, _ in model.named_modules()}
    return None


def _capture(subject: Subject, ctx: DiagnosticContext, entry: str,
             meta_ok: bool = False) -> torch.export.ExportedProgram:
    """The program, refused up front (as ``om.split`` refuses it) when it has no operator:
    its one stage would be empty, a parts directory SplitRunner rejects."""
    model = subject.model
    if isinstance(model, torch.nn.Module) and subject.args is None and not subject.kwargs:
        raise fail(rule=rules.BAD_INPUT, reason=(
            f"example inputs are needed to capture {type(model).__name__}: pass args= "
            "(or an ExportedProgram)"))
    program = subject.capture(ctx, meta_ok=meta_ok)
    if not stage_pass.has_operators(program):
        raise fail(rule=rules.PRECONDITION, pass_name=entry,
                        reason="a graph with at least one operator (nothing to split)")
    return program


@records_failures
def plan_stages(model: Model, args: ExampleArgs | None = None, *,
                num_stages: int | None = None, max_stage_bytes: int | None = None,
                kwargs: ExampleKwargs | None = None, weights: Checkpoint | None = None,
                ctx: DiagnosticContext | None = None) -> StagePlan:
    """The balanced plan alone (capture only, no translation): which modules go to which
    stage and the weight bytes of each; ``print(plan)`` shows it. See :func:`split_stages`."""
    assert ctx is not None  # made by @records_failures when the caller gives none
    program = _capture(Subject(model, args, kwargs, weights=weights), ctx, "plan_stages",
                       meta_ok=True)  # shapes suffice
    return balanced_plan(without_markers(program), num_stages, max_stage_bytes, ctx)


@records_failures
def split_stages(model: Model, args: ExampleArgs | None = None,
                 split_points: SplitPoints | None = None, *,
                 num_stages: int | None = None, max_stage_bytes: int | None = None,
                 kwargs: ExampleKwargs | None = None, opset: int | None = None,
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
    assert ctx is not None  # made by @records_failures when the caller gives none
    check_opset(opset, flat=False, what="a split model")
    program = _capture(Subject(model, args, kwargs, weights=weights), ctx, "split_stages")
    if num_stages is not None or max_stage_bytes is not None:
        if split_points:
            raise fail(rule=rules.SPLIT_POINT, reason=(
                "give split_points or num_stages/max_stage_bytes, not both"))
        if stage_pass.from_markers(program).count > 1:
            raise fail(rule=rules.SPLIT_POINT, reason=(
                "the model has om.pipe_split() markers; num_stages/max_stage_bytes cut by "
                "themselves (remove the markers, or leave both out)"))
        plan = balanced_plan(program, num_stages, max_stage_bytes, ctx)
        assignment = stage_pass.from_split_points(program, plan.cuts)
        assignment.how = plan.how
        return _cut(program, assignment, ctx, opset, hierarchical, plan)
    assignment = stage_pass.from_markers(program)
    if split_points:
        points = stage_pass.from_split_points(program, split_points,
                                              module_names=_module_names(model))
        assignment = points if assignment.count == 1 else stage_pass.combined(assignment, points)
    return _cut(program, assignment, ctx, opset, hierarchical)


@records_failures
def split_by(model_or_program: Model, callback: Callable[[torch.fx.Node], int],
             args: ExampleArgs | None = None, kwargs: ExampleKwargs | None = None, *,
             opset: int | None = None, hierarchical: bool = True,
             weights: Checkpoint | None = None,
             ctx: DiagnosticContext | None = None) -> StagesResult:
    """Stages from ``callback(node) -> partition id`` over the captured program's nodes.

    ``split_module`` semantics: ids are any ints; stages are ordered so data only flows
    forward (first appearance breaking ties); partitions that depend on each other in a
    cycle are an error.
    """
    assert ctx is not None  # made by @records_failures when the caller gives none
    check_opset(opset, flat=False, what="a split model")
    subject = Subject(model_or_program, args, kwargs, weights=weights)
    program = without_markers(_capture(subject, ctx, "split_by"))
    assignment = stage_pass.from_callback(program, callback)
    return _cut(program, assignment, ctx, opset, hierarchical)


def _cut(program: torch.export.ExportedProgram, assignment: stage_pass.StageAssignment,
         ctx: DiagnosticContext, opset: int | None, hierarchical: bool,
         stage_plan: StagePlan | None = None) -> StagesResult:
    """Lower the captured program once, carry the stages to its decomposed nodes, cut, and
    emit every stage's model."""
    lowered = lower(Subject(program), opset, ctx)
    carried = stage_pass.decomposed_assignment(assignment, lowered.program)
    flat_module = lowered.program.module()
    result = stage_pass.StagesPass(carried)(flat_module, ctx)  # PlanStages, then CutRegions
    return emitted_result(result, flat_module, lowered, ctx, RegionEmission(hierarchical),
                          kind="stages", how=assignment.how, stage_plan=stage_plan)
