"""The emit pipeline's steps as onnx_ir passes: each says truthfully whether it changed the
model, and a failing step is named from the error object."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
import torch

import onnx_modular as om
from onnx_modular.diagnostics import Diagnostic, DiagnosticContext, Level, OnnxModularError
from onnx_modular.emit import infra
from onnx_modular.emit import inline as inline_module
from onnx_modular.emit import optimize as optimize_module
from onnx_modular.emit import outline as outline_module
from onnx_modular.emit.explain import ExplainDifferences
from onnx_modular.emit.infra import EmitPassError
from onnx_modular.emit.inline import InlineAll
from onnx_modular.emit.merge import MergeEqualFunctions, MergeRound, merge_equal_functions
from onnx_modular.emit.optimize import FoldWeights, Optimize
from onnx_modular.emit.outline import Outline, OutlineReport
from onnx_modular.emit.pipeline import EmitOptions, EmitReport, emit_model
from onnx_modular.emit.verify import Verify
from onnx_modular.leaves.errors import rules
from onnx_modular.leaves.metadata import (
    DIFFERS_FROM,
    FX_NODE,
    META_CALL,
    META_FX_OUTPUTS,
    META_PATH,
    CallInfo,
)

FLOAT = ir.TensorType(ir.DataType.FLOAT)


def _value(name: str, shape: tuple[int, ...] = (2, 3)) -> ir.Value:
    return ir.Value(name=name, type=FLOAT, shape=ir.Shape(shape))


def _model(graph: ir.Graph, functions: tuple[ir.Function, ...] = ()) -> ir.Model:
    return ir.Model(graph, ir_version=10, functions=functions)


def relu_model() -> ir.Model:
    """Nothing to fold, optimize, outline or inline: ``y = Relu(x)``."""
    x = _value("x")
    relu = ir.node("Relu", [x], name="relu")
    relu.outputs[0].name, relu.outputs[0].type = "y", FLOAT
    relu.outputs[0].shape = ir.Shape((2, 3))
    graph = ir.Graph([x], relu.outputs, nodes=[relu], opset_imports={"": 18}, name="g")
    return _model(graph)


def foldable_model() -> ir.Model:
    """``y = x + Transpose(w)``: the transpose of a weight folds into an initializer."""
    x = _value("x")
    w = ir.Value(name="w", type=FLOAT, shape=ir.Shape((3, 2)),
                 const_value=ir.tensor(np.arange(6, dtype=np.float32).reshape(3, 2), name="w"))
    t = ir.node("Transpose", [w], attributes={"perm": [1, 0]}, name="t")
    add = ir.node("Add", [x, t.outputs[0]], name="add")
    add.outputs[0].name, add.outputs[0].type = "y", FLOAT
    graph = ir.Graph([x], add.outputs, nodes=[t, add], initializers=[w],
                     opset_imports={"": 18}, name="g")
    return _model(graph)


def _relu_function(name: str, extra: bool) -> ir.Function:
    x = _value("x")
    nodes = [ir.node("Relu", [x])]
    if extra:
        nodes.append(ir.node("Neg", [nodes[-1].outputs[0]]))
    graph = ir.Graph([x], nodes[-1].outputs, nodes=nodes, opset_imports={"": 18}, name=name)
    return ir.Function("pkg.test", name, graph=graph, attributes=[])


def two_functions_model() -> ir.Model:
    """Two functions of one class (same doc string) that differ: the second is explained."""
    first, second = _relu_function("Block", False), _relu_function("Block_1", True)
    first.doc_string = second.doc_string = "Block"
    x = _value("x")
    a = ir.node("Block", [x], domain="pkg.test", name="a")
    b = ir.node("Block_1", [a.outputs[0]], domain="pkg.test", name="b")
    graph = ir.Graph([x], b.outputs, nodes=[a, b],
                     opset_imports={"": 18, "pkg.test": 1}, name="g")
    return _model(graph, (first, second))


def test_nothing_to_do_is_reported_unmodified() -> None:
    for step in (FoldWeights(frozenset(), {}, None), Optimize(),
                 Outline({}, None, True, EmitReport()), InlineAll(optimized=True),
                 ExplainDifferences()):
        assert step(relu_model()).modified is False, type(step).__name__


def test_folding_a_weight_is_reported_modified() -> None:
    model = foldable_model()
    assert FoldWeights(frozenset({"w"}), {}, None)(model).modified
    assert "Transpose" not in [n.op_type for n in model.graph]
    assert Optimize()(foldable_model()).modified


def test_inlining_functions_is_reported_modified() -> None:
    model = two_functions_model()
    assert InlineAll(optimized=False)(model).modified
    assert not model.functions and [n.op_type for n in model.graph] == ["Relu", "Relu", "Neg"]


def test_explaining_a_difference_is_reported_modified() -> None:
    model = two_functions_model()
    assert ExplainDifferences()(model).modified
    explained = [f.metadata_props.get(DIFFERS_FROM) for f in model.functions.values()]
    assert explained[0] is None and explained[1] and explained[1].startswith("Block: ")
    assert ExplainDifferences()(model).modified is False  # the same note again


class _Exploding(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) + 1


def test_a_failing_step_is_named_from_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(model: ir.Model, avoid: frozenset[str] = frozenset()) -> None:
        raise ValueError("boom")

    monkeypatch.setattr(optimize_module, "optimize", broken)
    ctx = DiagnosticContext()
    with pytest.raises(OnnxModularError, match=r"OM0001 .*Optimize failed: ValueError: boom") as e:
        om.export(_Exploding(), (torch.randn(2, 3),), ctx=ctx)
    chain = []
    cause: BaseException | None = e.value
    while cause is not None:
        chain.append(cause)
        cause = cause.__cause__
    step = next(c for c in chain if isinstance(c, EmitPassError)).step
    assert isinstance(step, Optimize)


# ---- every pass: modified is the truth, conditions name the pass --------------------------------

def _named(node: ir.Node, fx: str) -> ir.Node:
    node.metadata_props[FX_NODE] = f"%{fx} : [num_users=1] = call_function[target=x](args = ())"
    return node


def fx_named_model() -> tuple[ir.Model, dict[str, tuple[CallInfo, ...]]]:
    """``y = Neg(Relu(x))`` translated from FX nodes ``relu`` (in call ``act``) and ``neg``."""
    x = _value("x")
    relu = _named(ir.node("Relu", [x], name="relu"), "relu")
    relu.outputs[0].name, relu.outputs[0].type = "relu", FLOAT
    neg = _named(ir.node("Neg", [relu.outputs[0]], name="neg"), "neg")
    neg.outputs[0].name, neg.outputs[0].type = "y", FLOAT
    graph = ir.Graph([x], neg.outputs, nodes=[relu, neg], opset_imports={"": 18}, name="g")
    chains = {"relu": (CallInfo("act", "act", "pkg.test.Act"),), "neg": ()}
    return _model(graph), chains


def _call(function: ir.Function, inputs: list[ir.Value], name: str) -> ir.Node:
    return ir.node(function.name, inputs, domain=function.domain, name=name)


def nested_equal_functions_model() -> ir.Model:
    """``Block`` calls ``Lin``, ``Block_1`` calls ``Lin_1``; the two ``Lin`` bodies are equal,
    so the blocks become equal once the ``Lin`` functions merged: two rounds of merging."""
    lin, lin_1 = _relu_function("Lin", False), _relu_function("Lin_1", False)
    lin.doc_string = lin_1.doc_string = "Lin"
    blocks = []
    for name, inner in (("Block", lin), ("Block_1", lin_1)):
        x = _value("x")
        call = _call(inner, [x], "fc")
        body = ir.Graph([x], call.outputs, nodes=[call],
                        opset_imports={"": 18, "pkg.test": 1}, name=name)
        block = ir.Function("pkg.test", name, graph=body, attributes=[])
        block.doc_string = "Block"
        blocks.append(block)
    x = _value("x")
    a = _call(blocks[0], [x], "a")
    b = _call(blocks[1], [a.outputs[0]], "b")
    graph = ir.Graph([x], b.outputs, nodes=[a, b], opset_imports={"": 18, "pkg.test": 1},
                     name="g")
    return _model(graph, (lin, lin_1, *blocks))


def _report() -> EmitReport:
    return EmitReport(outline=OutlineReport(calls=4, functions=4, function_of_call={
        "a": "Block", "b": "Block_1", "a.fc": "Lin", "b.fc": "Lin_1"}))


def test_outlining_a_call_is_reported_modified_and_labels_the_call() -> None:
    model, chains = fx_named_model()
    report = EmitReport()
    assert Outline(chains, None, True, report)(model).modified
    call = next(n for n in model.graph if n.op_identifier() in model.functions)
    assert call.metadata_props[META_PATH] == "act" and call.metadata_props[META_CALL] == "act"
    assert report.outline is not None and report.outline.functions == 1


def test_merging_runs_rounds_to_a_fixpoint_through_the_manager(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rounds: list[bool] = []
    original = MergeRound.call

    def counted(self: MergeRound, model: ir.Model) -> ir.passes.PassResult:
        result = original(self, model)
        rounds.append(result.modified)
        return result

    monkeypatch.setattr(MergeRound, "call", counted)
    model, report = nested_equal_functions_model(), _report()
    assert merge_equal_functions(model, report.outline) == 2
    assert rounds == [True, True, False]  # children, then parents, then nothing: stop
    assert [f.name for f in model.functions.values()] == ["Lin", "Block"]
    assert report.outline is not None and report.outline.functions == 2
    assert report.outline.function_of_call == {"a": "Block", "b": "Block", "a.fc": "Lin",
                                               "b.fc": "Lin"}
    assert [n.op_type for n in model.graph] == ["Block", "Block"]


def test_merge_and_verify_report_modified_truthfully() -> None:
    """They say themselves whether they changed the model: what the model says agrees."""
    model = nested_equal_functions_model()
    for step, changes in ((MergeEqualFunctions(_report()), True),
                          (MergeEqualFunctions(_report()), False),  # nothing left to merge
                          (MergeRound(), False), (Verify(), False)):
        alive, before = infra._shape(model)
        assert step(model).modified is changes, type(step).__name__
        assert (infra._shape(model)[1] != before) is changes, type(step).__name__
        del alive
    assert Verify()(relu_model()).modified is False


def _condition_error(step: ir.passes.PassBase, model: ir.Model) -> Diagnostic:
    with pytest.raises(OnnxModularError) as e:
        step(model)
    assert not isinstance(e.value.__cause__, ir.passes.InvariantError)  # not onnx_ir's wrapper
    return e.value.diagnostic


def test_outline_requires_a_model_without_functions() -> None:
    diagnostic = _condition_error(Outline({}, None, True, EmitReport()), two_functions_model())
    assert diagnostic.rule is rules.PRECONDITION
    assert diagnostic.message.startswith("Pass Outline requires: a model without local")


def test_outline_ensures_every_call_is_labelled(monkeypatch: pytest.MonkeyPatch) -> None:
    real = outline_module.outline

    def forgetful(model: ir.Model, *args: object, **kwargs: object) -> OutlineReport:
        report = real(model, *args, **kwargs)  # type: ignore[arg-type]
        for node in model.graph:
            node.metadata_props.pop(META_FX_OUTPUTS, None)
        return report

    monkeypatch.setattr(outline_module, "outline", forgetful)
    model, chains = fx_named_model()
    diagnostic = _condition_error(Outline(chains, None, True, EmitReport()), model)
    assert diagnostic.rule is rules.POSTCONDITION
    assert diagnostic.message.startswith("Pass Outline ensures: every call node labelled")
    assert META_FX_OUTPUTS in diagnostic.message


def test_inline_all_ensures_no_function_is_left(monkeypatch: pytest.MonkeyPatch) -> None:
    class Nothing(ir.passes.InPlacePass):
        def call(self, model: ir.Model) -> ir.passes.PassResult:
            return ir.passes.PassResult(model, modified=False)

    monkeypatch.setattr(inline_module, "RebasingInlinePass", Nothing)
    diagnostic = _condition_error(InlineAll(optimized=False), two_functions_model())
    assert diagnostic.rule is rules.POSTCONDITION
    assert diagnostic.message.startswith("Pass InlineAll ensures: no local function")


def test_verify_and_merge_require_every_called_function() -> None:
    model = two_functions_model()
    del model.functions[("pkg.test", "Block_1", "")]
    diagnostic = _condition_error(Verify(), model)
    assert diagnostic.rule is rules.PRECONDITION and "Pass Verify requires" in diagnostic.message
    assert "b (pkg.test::Block_1)" in diagnostic.message


def test_a_failed_condition_is_recorded_once_under_the_emit_scope() -> None:
    model = two_functions_model()
    ctx = DiagnosticContext()
    with pytest.raises(OnnxModularError, match="OM0002 .*Pass Outline requires"):
        emit_model(model, {}, frozenset(), EmitOptions(optimize=False), ctx)
    errors = [d for d in ctx.diagnostics if d.level == Level.ERROR]
    assert len(errors) == 1 and errors[0].scope == "Emit"
    assert errors[0].rule is rules.PRECONDITION
