"""emit/parametrize: bodies of one class that differ only in float scalars become one
function with attributes, each call setting its own values."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch

import onnx_modular as om
from onnx_modular.emit.merge import merge_equal_functions
from onnx_modular.emit.parametrize import merge_scalar_variants

from .graphs import FLOAT, OPSET, calling, run, value

X = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)


def _celu(name: str, alpha: float, scale: float, doc: str = "pkg.CELU") -> ir.Function:
    """``Celu(x, alpha) * scale``, the scale a one-element Constant."""
    x = value("x")
    c = ir.node("Constant", [], attributes={"value": ir.tensor(np.array(scale, np.float32))})
    celu = ir.node("Celu", [x], attributes={"alpha": alpha})
    mul = ir.node("Mul", [celu.outputs[0], c.outputs[0]])
    graph = ir.Graph([x], mul.outputs, nodes=[c, celu, mul], opset_imports={"": OPSET},
                     name=name)
    function = ir.Function("pkg", name, graph=graph, attributes=[])
    function.doc_string = doc
    return function


def _celu_reference(x: np.ndarray, alpha: float, scale: float) -> np.ndarray:
    return (np.maximum(0, x) + np.minimum(0, alpha * (np.exp(x / alpha) - 1))) * scale


def test_scalar_variants_become_one_parametrized_function() -> None:
    m = calling([_celu("CELU", 1.0, 2.0), _celu("CELU_1", 0.5, 3.0)])
    merged = merge_scalar_variants(m)
    assert [(gone.name, kept.name) for gone, kept in merged] == [("CELU_1", "CELU")]
    (kept,) = m.functions.values()
    assert sorted(kept.attributes) == ["alpha", "scalar"]
    celu = next(n for n in kept if n.op_type == "Celu")
    assert celu.attributes["alpha"].is_ref()
    first, second = m.graph
    assert first.op_type == second.op_type == "CELU"
    assert first.attributes["alpha"].value == 1.0
    assert second.attributes["alpha"].value == 0.5
    np.testing.assert_allclose(second.attributes["scalar"].value.numpy(), 3.0)
    onnx.checker.check_model(ir.serde.serialize_model(m), full_check=True)
    expected = _celu_reference(_celu_reference(X, 1.0, 2.0), 0.5, 3.0)
    np.testing.assert_allclose(run(m, x=X)[0], expected, rtol=1e-5, atol=1e-6)


def test_other_classes_and_other_structures_are_not_parametrized() -> None:
    other_class = calling([_celu("CELU", 1.0, 2.0), _celu("Act", 0.5, 3.0, doc="pkg.Act")])
    assert merge_scalar_variants(other_class) == []
    relu = _celu("CELU_1", 0.5, 3.0)
    celu_node = next(n for n in relu if n.op_type == "Celu")
    celu_node.op_type = "Elu"
    assert merge_scalar_variants(calling([_celu("CELU", 1.0, 2.0), relu])) == []


def test_equal_bodies_are_left_to_the_plain_merge() -> None:
    m = calling([_celu("CELU", 1.0, 2.0), _celu("CELU_1", 1.0, 2.0)])
    assert merge_scalar_variants(m) == []
    assert merge_equal_functions(m) == 1
    assert not next(iter(m.functions.values())).attributes


def test_merge_equal_functions_falls_back_to_parametrizing() -> None:
    m = calling([_celu("CELU", 1.0, 2.0), _celu("CELU_1", 0.5, 3.0), _celu("CELU_2", 1.0, 2.0)])
    assert merge_equal_functions(m) == 2
    assert [f.name for f in m.functions.values()] == ["CELU"]
    assert {n.op_type for n in m.graph} == {"CELU"}


def test_a_parametrized_function_takes_further_variants() -> None:
    """Layers 0 and 1 share an ``eps`` and merge first; layers 2 and 3 must still join them,
    not stay a second function because the first one has attributes."""
    m = calling([_celu("CELU", 1.0, 2.0), _celu("CELU_1", 0.5, 2.0)])
    assert len(merge_scalar_variants(m)) == 1
    (kept,) = m.functions.values()
    assert sorted(kept.attributes) == ["alpha"]
    later = [_celu("CELU_2", 0.25, 3.0), _celu("CELU_3", 1.0, 0.5)]
    x = m.graph.outputs[0]
    for i, f in enumerate(later):
        m.functions[f.identifier()] = f
        call = ir.node(f.name, [x], domain=f.domain, name=f"later_{i}")
        call.outputs[0].type, call.outputs[0].shape = x.type, x.shape
        m.graph.append(call)
        x = call.outputs[0]
    m.graph.outputs[0] = x
    assert [(g.name, k.name) for g, k in merge_scalar_variants(m)] == \
        [("CELU_2", "CELU"), ("CELU_3", "CELU")]
    (kept,) = m.functions.values()
    assert sorted(kept.attributes) == ["alpha", "scalar"]
    alphas = [n.attributes["alpha"].value for n in m.graph]
    assert alphas == [1.0, 0.5, 0.25, 1.0]
    onnx.checker.check_model(ir.serde.serialize_model(m), full_check=True)
    expected = X
    for alpha, scale in [(1.0, 2.0), (0.5, 2.0), (0.25, 3.0), (1.0, 0.5)]:
        expected = _celu_reference(expected, alpha, scale)
    np.testing.assert_allclose(run(m, x=X)[0], expected, rtol=1e-5, atol=1e-6)


def test_a_value_passed_on_from_the_caller_stays_a_reference() -> None:
    """A parametrized parent passes its own attribute to its child: merged with a sibling,
    the child's call keeps reading the parent's attribute."""
    child = _celu("CELU", 1.0, 2.0)
    celu = next(n for n in child if n.op_type == "Celu")
    celu.attributes["alpha"] = ir.RefAttr("alpha", "alpha", ir.AttributeType.FLOAT)
    child.attributes.add(ir.Attr("alpha", ir.AttributeType.FLOAT, 1.0))
    x = value("x")
    inner = ir.Node("pkg", "CELU", [x], name="inner",
                    attributes=[ir.RefAttr("alpha", "outer_alpha", ir.AttributeType.FLOAT)])
    parent = ir.Function("pkg", "Parent", graph=ir.Graph(
        [x], inner.outputs, nodes=[inner], opset_imports={"": OPSET, "pkg": 1}),
        attributes=[ir.Attr("outer_alpha", ir.AttributeType.FLOAT, None)])
    parent.doc_string = "pkg.Parent"
    m = calling([parent, _celu("CELU_1", 0.5, 3.0)])
    m.functions[child.identifier()] = child
    m.graph.node(0).attributes["outer_alpha"] = ir.Attr("outer_alpha",
                                                         ir.AttributeType.FLOAT, 0.25)
    assert [(g.name, k.name) for g, k in merge_scalar_variants(m)] == [("CELU", "CELU_1")]
    assert inner.op_type == "CELU_1"
    assert inner.attributes["alpha"].ref_attr_name == "outer_alpha"
    assert inner.attributes["scalar"].value.numpy() == 2.0
    second = m.graph.node(1)
    assert second.op_type == "CELU_1" and second.attributes["alpha"].value == 0.5
    onnx.checker.check_model(ir.serde.serialize_model(m), full_check=True)
    expected = _celu_reference(_celu_reference(X, 0.25, 2.0), 0.5, 3.0)
    np.testing.assert_allclose(run(m, x=X)[0], expected, rtol=1e-5, atol=1e-6)


def _scaled_sum(name: str, a: float, b: float) -> ir.Function:
    """``x * a + sigmoid(x) * b``; where ``a == b`` one Constant serves both products, as
    the translation's optimizer leaves a body whose two literals happen to agree."""
    x = value("x")
    ca = ir.node("Constant", [], attributes={"value": ir.tensor(np.array(a, np.float32))})
    cb = ca if a == b else \
        ir.node("Constant", [], attributes={"value": ir.tensor(np.array(b, np.float32))})
    sig = ir.node("Sigmoid", [x])
    left = ir.node("Mul", [x, ca.outputs[0]])
    right = ir.node("Mul", [sig.outputs[0], cb.outputs[0]])
    add = ir.node("Add", [left.outputs[0], right.outputs[0]])
    constants = [ca] if cb is ca else [ca, cb]
    graph = ir.Graph([x], add.outputs, nodes=[*constants, sig, left, right, add],
                     opset_imports={"": OPSET}, name=name)
    function = ir.Function("pkg", name, graph=graph, attributes=[])
    function.doc_string = "pkg.ScaledSum"
    return function


def test_a_constant_the_first_body_shares_is_parametrized_apart_per_use() -> None:
    """The first body's one 0.5 fed both products; the second layer's 0.7 went to both and
    it computed ``x*0.7 + sigmoid(x)*0.7`` (|diff| 0.15 on an export). Each use whose value
    varies reads a Constant of its own; the use whose value does not keeps the literal."""
    scales = [(0.5, 0.5), (0.7, 0.5), (0.5, 0.9), (0.7, 0.9)]
    m = calling([_scaled_sum(f"S_{i}" if i else "S", a, b) for i, (a, b) in enumerate(scales)])
    merge_scalar_variants(m)
    (kept,) = m.functions.values()
    assert sorted(kept.attributes) == ["scalar", "scalar_1"]
    onnx.checker.check_model(ir.serde.serialize_model(m), full_check=True)
    expected = X
    for a, b in scales:
        expected = expected * a + 1 / (1 + np.exp(-expected)) * b
    np.testing.assert_allclose(run(m, x=X)[0], expected, rtol=1e-5, atol=1e-6)


def test_a_shared_constant_whose_uses_vary_alike_stays_one() -> None:
    scales = [(0.5, 0.5), (0.7, 0.7)]
    m = calling([_scaled_sum(f"S_{i}" if i else "S", a, b) for i, (a, b) in enumerate(scales)])
    merge_scalar_variants(m)
    (kept,) = m.functions.values()
    assert sorted(kept.attributes) == ["scalar"]
    assert sum(n.op_type == "Constant" for n in kept) == 1
    expected = X
    for a, b in scales:
        expected = expected * a + 1 / (1 + np.exp(-expected)) * b
    np.testing.assert_allclose(run(m, x=X)[0], expected, rtol=1e-5, atol=1e-6)


def _branching(name: str, top: float, branch: float, shared: bool) -> ir.Function:
    """``y = x * top``, then ``y * branch`` if ``sum(x) > 0`` else ``y``; with ``shared``
    one Constant (``top``) serves the product and the branch."""
    x = value("x")
    c = ir.node("Constant", [], attributes={"value": ir.tensor(np.array(top, np.float32))})
    cb = c if shared else \
        ir.node("Constant", [], attributes={"value": ir.tensor(np.array(branch, np.float32))})
    y = ir.node("Mul", [x, c.outputs[0]])
    total = ir.node("ReduceSum", [x], attributes={"keepdims": 0})
    zero = ir.node("Constant", [], attributes={"value": ir.tensor(np.array(0.0, np.float32))})
    positive = ir.node("Greater", [total.outputs[0], zero.outputs[0]])
    scaled = ir.node("Mul", [y.outputs[0], cb.outputs[0]])
    scaled.outputs[0].name, scaled.outputs[0].type = f"{name}_then", FLOAT
    kept = ir.node("Identity", [y.outputs[0]])
    kept.outputs[0].name, kept.outputs[0].type = f"{name}_else", FLOAT
    branches = {"then_branch": ir.Graph([], scaled.outputs, nodes=[scaled], name="then"),
                "else_branch": ir.Graph([], kept.outputs, nodes=[kept], name="else")}
    choice = ir.node("If", [positive.outputs[0]], attributes=branches)
    nodes = [c, *([] if shared else [cb]), y, total, zero, positive, choice]
    graph = ir.Graph([x], choice.outputs, nodes=nodes, opset_imports={"": OPSET}, name=name)
    function = ir.Function("pkg", name, graph=graph, attributes=[])
    function.doc_string = "pkg.Branching"
    return function


@pytest.mark.parametrize("specs", [
    [(0.5, 0.5, True), (0.7, 0.5, False)],  # one Constant at top and in the branch, then two
    [(0.5, 0.5, True), (0.7, 0.7, True)],  # one Constant each: the copy kept 0.5 in the branch
    [(0.5, 0.3, False), (0.5, 0.9, False)],  # only the branch's differs: no slot reaches it
])
def test_a_scalar_a_branch_reads_is_not_parametrized(specs) -> None:
    """Slots reach a body's own nodes only: a scalar an ``If`` branch reads kept the first
    body's value in every call (|diff| 0.05-0.06, silently). Such bodies stay apart."""
    m = calling([_branching(f"B_{i}" if i else "B", *s) for i, s in enumerate(specs)])
    assert merge_scalar_variants(m) == []
    x = np.abs(X)
    expected = x
    for top, branch, _ in specs:
        y = expected * top
        expected = y * branch if expected.sum() > 0 else y
    np.testing.assert_allclose(run(m, x=x)[0], expected, rtol=1e-6)


class _Scaled(torch.nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.fc, self.scale = torch.nn.Linear(8, 8), scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(x) * self.scale


@pytest.mark.parametrize("scales", [[1.0, 2.0, 1.0, 3.0], [2.0, 1.0], [0.5, 0.0, 2.0]])
def test_layers_scaled_by_one_share_the_function_of_those_scaled_otherwise(
        scales: list[float]) -> None:
    """The optimizer drops ``x * 1.0``; the layers are parametrized before it runs, so the
    scale stays a per-call attribute and the Mul stays in the one body."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[_Scaled(s) for s in scales]).eval()
    x = torch.randn(2, 8)
    result = om.export(model, (x,))
    assert [f.name for f in result.functions if f.name.startswith("_Scaled")] == ["_Scaled"]
    session = ort.InferenceSession(result.model_proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-5, atol=1e-6)
