"""The FX PassManager on the partition pipeline: a planner records its plan on the flat
module, one CutRegions cuts along it (acc/CPU regions and stages alike), and every pass is
held to its requires/ensures in its own scope."""

from __future__ import annotations

import models
import pytest
import torch

import onnx_modular as om
from onnx_modular.leaves.errors import rules
from onnx_modular.leaves.metadata import FX_SPLIT_PLAN
from onnx_modular.passes import PassBase, PassManager, PassResult
from onnx_modular.passes.split import (
    CutRegions,
    PlanRegions,
    SplitPassResult,
    SplitPlan,
    describe_regions,
)
from onnx_modular.passes.stages import PlanStages, from_split_points

DENY_RELU = om.OperatorSupport.deny(["aten.relu"])


def _flat() -> tuple[torch.export.ExportedProgram, torch.fx.GraphModule]:
    program = torch.export.export(models.Stack(3).eval(), models.x8())
    return program, program.module()


def _calls(graph_module: torch.fx.GraphModule) -> list[str]:
    return [str(n.target) for n in graph_module.graph.nodes if n.op == "call_module"
            and not str(n.target).startswith("_guards_fn")]


class _AddsNeg(PassBase):
    """Appends a negation before the output: an operator no earlier plan knows."""

    def call(self, graph_module: torch.fx.GraphModule, ctx: om.DiagnosticContext) -> PassResult:
        output = next(n for n in graph_module.graph.nodes if n.op == "output")
        value = output.args[0][0]
        with graph_module.graph.inserting_before(output):
            neg = graph_module.graph.call_function(torch.ops.aten.neg.default, (value,))
        output.replace_input_with(value, neg)
        graph_module.recompile()
        return PassResult(graph_module, modified=True)


class _LosesANode(PlanRegions):
    """A planner whose plan leaves the last operator out."""

    def plan(self, graph_module: torch.fx.GraphModule, ctx: om.DiagnosticContext) -> SplitPlan:
        plan = super().plan(graph_module, ctx)
        plan.regions[-1].node_names = plan.regions[-1].node_names[:-1]
        return plan


class _TwoAccRegions(PlanRegions):
    """A planner that puts the operators in two acc regions side by side."""

    def plan(self, graph_module: torch.fx.GraphModule, ctx: om.DiagnosticContext) -> SplitPlan:
        nodes = list(graph_module.graph.nodes)
        operators = [n for n in nodes if n.op == "call_function"]
        index = {n: i for i, n in enumerate(nodes)}
        return SplitPlan(describe_regions([(True, operators[:4]), (True, operators[4:])], index))


def test_the_manager_plans_then_cuts_checking_each_pass() -> None:
    _, module = _flat()
    ctx = om.DiagnosticContext()
    result = PassManager([PlanRegions(DENY_RELU), CutRegions()], ctx)(module)
    plan_step, cut_step = result.steps
    assert not plan_step.modified and plan_step.graph_module is module  # an analysis
    assert module.meta[FX_SPLIT_PLAN] is plan_step.plan  # recorded for the cut
    cut = result.of(SplitPassResult)
    assert cut is cut_step and cut.modified and result.modified
    assert cut.plan is plan_step.plan and cut.graph_module.meta[FX_SPLIT_PLAN] is cut.plan
    assert _calls(cut.graph_module) == [r.name for r in cut.plan.regions]
    assert [r.kind for r in cut.plan.regions] == ["acc", "cpu"] * 3 + ["acc"]
    x = models.x8()
    torch.testing.assert_close(cut.graph_module(*x), module(*x), rtol=0, atol=0)
    assert {d.scope for d in ctx.diagnostics} == {"SplitPass"}  # the planner's notes


def test_cut_regions_without_a_plan_fails_its_precondition() -> None:
    _, module = _flat()
    ctx = om.DiagnosticContext()
    with pytest.raises(om.OnnxModularError, match=r"OM0002 precondition-failed: Pass "
                       r"CutRegions requires: a plan recorded on the module"):
        PassManager([CutRegions()], ctx)(module)
    assert [(d.rule, d.scope) for d in ctx.diagnostics] == [(rules.PRECONDITION, "CutRegions")]


def test_a_plan_the_module_outgrew_is_refused_by_the_cut() -> None:
    _, module = _flat()
    with pytest.raises(om.OnnxModularError, match=r"OM0002 .*CutRegions requires: a plan of "
                       r"the module's operators \('neg_default' is in no region"):
        PassManager([PlanRegions(DENY_RELU), _AddsNeg(), CutRegions()])(module)


def test_a_plan_missing_a_node_fails_the_planners_postcondition() -> None:
    _, module = _flat()
    with pytest.raises(om.OnnxModularError, match=r"OM0003 postcondition-failed: Pass "
                       r"SplitPass ensures: every operator in exactly one region "
                       r"\('add_2' is in no region \(1 operator\(s\) left out\)\)"):
        PassManager([_LosesANode(DENY_RELU), CutRegions()])(module)


def test_the_cut_holds_acc_cpu_plans_to_alternation_and_stage_plans_not() -> None:
    program, module = _flat()
    cut = CutRegions()
    with pytest.raises(om.OnnxModularError, match=r"OM0003 .*CutRegions ensures: alternating "
                       r"regions \(_run_on_acc_0 and _run_on_acc_1 are of one kind\)"):
        PassManager([_TwoAccRegions(DENY_RELU), cut])(module)
    assignment = from_split_points(program, {"layers.1": "beginning"})
    ctx = om.DiagnosticContext()
    stages = PassManager([PlanStages(assignment), cut], ctx)(module).of(SplitPassResult)
    assert [(r.name, r.kind) for r in stages.plan.regions] == [("stage_0", "stage"),
                                                               ("stage_1", "stage")]
    assert _calls(stages.graph_module) == ["stage_0", "stage_1"]
    x = models.x8()
    torch.testing.assert_close(stages.graph_module(*x), module(*x), rtol=0, atol=0)
    assert [d.scope for d in ctx.diagnostics] == ["split (split_points)"] * 2
