"""What every FX pass is held to: a well-formed output graph (linted after each pass) and
its own requires/ensures; StagesPass cuts a flat module into stages in order."""

from __future__ import annotations

import models
import pytest
import torch

import onnx_modular as om
from onnx_modular.passes import PassBase, PassResult
from onnx_modular.passes.stages import StageAssignment, StagesPass, from_split_points


class _UseBeforeDefinition(PassBase):
    """Moves the output's producer after the output: a graph no interpreter can run."""

    def call(self, graph_module: torch.fx.GraphModule, ctx: om.DiagnosticContext) -> PassResult:
        graph = graph_module.graph
        output = next(n for n in graph.nodes if n.op == "output")
        producer = output.all_input_nodes[0]
        output.append(producer)  # now defined after its use
        return PassResult(graph_module, modified=True)


def _flat() -> tuple[torch.export.ExportedProgram, torch.fx.GraphModule]:
    program = torch.export.export(models.Stack(3).eval(), models.x8())
    return program, program.module()


def test_a_pass_leaving_an_ill_formed_graph_fails_its_postcondition() -> None:
    _, module = _flat()
    with pytest.raises(om.OnnxModularError,
                       match=r"OM0003 .*_UseBeforeDefinition ensures: a well-formed graph "
                       r"\(Argument '\w+' of Node 'output' was used before it has been "
                       r"defined"):
        _UseBeforeDefinition()(module)


def test_stages_pass_cuts_a_flat_module_into_stages_in_order() -> None:
    program, module = _flat()
    assignment = from_split_points(program, {"layers.1": "beginning", "layers.2": "end"})
    ctx = om.DiagnosticContext()
    result = StagesPass(assignment)(module, ctx)
    plan = result.plan  # type: ignore[attr-defined]
    assert [s.name for s in plan.regions] == ["stage_0", "stage_1"]
    assert {s.kind for s in plan.regions} == {"stage"}
    calls = [str(n.target) for n in result.graph_module.graph.nodes if n.op == "call_module"
             and not str(n.target).startswith("_guards_fn")]
    assert calls == ["stage_0", "stage_1"]
    x = models.x8()
    torch.testing.assert_close(result.graph_module(*x), module(*x), rtol=0, atol=0)
    assert [d.scope for d in ctx.diagnostics] == ["split (split_points)"] * 2


def test_stages_pass_requires_a_flat_graph_with_operators() -> None:
    _, module = _flat()
    split = StagesPass(StageAssignment({}, 1, "markers"))(module).graph_module
    with pytest.raises(om.OnnxModularError, match=r"OM0002 .*requires: a flat graph"):
        StagesPass(StageAssignment({}, 1, "markers"))(split)
    empty = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    empty.graph.output(empty.graph.placeholder("x"))
    with pytest.raises(om.OnnxModularError,
                       match=r"OM0002 precondition-failed: Pass split \(callback\) requires: "
                       r"a graph with at least one operator \(nothing to split\)"):
        StagesPass(StageAssignment({}, 1, "callback"))(empty)
