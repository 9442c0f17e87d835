"""The emit pipeline's steps as onnx_ir passes: each says truthfully whether it changed the
model, and a failing step is named from the error object."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
import torch

import onnx_modular as om
from onnx_modular.diagnostics import DiagnosticContext, OnnxModularError
from onnx_modular.emit import optimize as optimize_module
from onnx_modular.emit.explain import ExplainDifferences
from onnx_modular.emit.infra import EmitPassError
from onnx_modular.emit.inline import InlineAll
from onnx_modular.emit.optimize import FoldWeights, Optimize
from onnx_modular.emit.outline import Outline
from onnx_modular.emit.pipeline import EmitReport
from onnx_modular.metadata import DIFFERS_FROM

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
