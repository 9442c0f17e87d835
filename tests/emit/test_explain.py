"""emit/explain: every extra function of a class says why it is not the class's first."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnx_modular.emit.explain import MAX_REASONS, annotate_differences, differences
from onnx_modular.leaves.metadata import DIFFERS_FROM

from .graphs import OPSET, calling, function, value


def _with_attr(name: str, axis: int, constant: float = 1.0) -> ir.Function:
    x = value("x")
    c = ir.node("Constant", [], attributes={"value": ir.tensor(np.float32(constant))})
    soft = ir.node("Softmax", [x], attributes={"axis": axis})
    mul = ir.node("Mul", [soft.outputs[0], c.outputs[0]])
    graph = ir.Graph([x], mul.outputs, nodes=[c, soft, mul], opset_imports={"": OPSET},
                     name=name)
    f = ir.Function("pkg", name, graph=graph, attributes=[])
    f.doc_string = "pkg.Block"
    return f


def test_extra_and_missing_ops_are_named() -> None:
    base, other = function("Block", ["Relu"]), function("Block_1", ["Relu", "Neg", "Neg"])
    assert differences(other, base, {}) == ["extra Neg x2"]
    assert differences(base, other, {}) == ["no Neg x2"]


def test_attribute_and_constant_differences_are_named() -> None:
    base, other = _with_attr("Block", 1), _with_attr("Block_1", 0, constant=2.0)
    assert differences(other, base, {}) == ["Softmax axis=0 (vs 1)", "constants 2.0"]


def test_calls_are_named_by_their_function() -> None:
    act = function("Act", ["Relu"], doc="pkg.Act")
    x = value("x")
    node = ir.node("Act", [x], domain="pkg")
    graph = ir.Graph([x], node.outputs, nodes=[node], opset_imports={"": OPSET, "pkg": 1})
    with_call = ir.Function("pkg", "Block_1", graph=graph, attributes=[])
    base = function("Block", ["Relu"])
    reasons = differences(with_call, base, {act.identifier(): act})
    assert reasons == ["extra Act call", "no Relu"]


def test_only_shapes_or_wiring_left() -> None:
    small, large = function("Block", ["Relu"]), function("Block_1", ["Relu"], shape=(3, 4))
    assert differences(large, small, {}) == ["input shapes ['[3,4]'] (vs ['[2,4]'])"]
    assert differences(small, function("Block_2", ["Relu"]), {}) == \
        ["how the same ops are wired"]


def test_an_attribute_each_call_gives_is_no_reason() -> None:
    """A merged body's ``@axis`` against a literal 1 read ``axis=1 (vs None)``: the reason
    left is the one that holds (here the input shapes)."""
    base, other = _with_attr("Block", 1), _with_attr("Block_1", 1)
    base.attributes["axis"] = ir.Attr("axis", ir.AttributeType.INT, 1)
    softmax = next(n for n in base if n.op_type == "Softmax")
    softmax.attributes["axis"] = ir.RefAttr("axis", "axis", ir.AttributeType.INT)
    other.inputs[0].shape = ir.Shape([3, 4])
    assert differences(other, base, {}) == ["input shapes ['[3,4]'] (vs ['[2,4]'])"]
    assert differences(base, other, {}) == ["input shapes ['[2,4]'] (vs ['[3,4]'])"]


def test_reasons_are_capped() -> None:
    base = _with_attr("Block", 1)
    x, y = value("x"), value("y")
    nodes = [ir.node("Softmax", [x], attributes={"axis": 0}), ir.node("Abs", [x]),
             ir.node("Constant", [], attributes={"value": ir.tensor(np.float32(5.0))})]
    graph = ir.Graph([x, y], [n.outputs[0] for n in nodes] + [y], nodes=nodes,
                     opset_imports={"": OPSET})
    other = ir.Function("pkg", "Block_1", graph=graph, attributes=[])
    assert len(differences(other, base, {})) == MAX_REASONS


def test_annotate_marks_only_extra_functions_of_a_class() -> None:
    functions = [function("Block", ["Relu"]), function("Block_1", ["Neg"]),
                 function("Mlp", ["Abs"], doc="pkg.Mlp")]
    m = calling(functions)
    explained = annotate_differences(m)
    assert explained == {"Block_1": "Block: extra Neg; no Relu"}
    notes = {f.name: f.metadata_props.get(DIFFERS_FROM) for f in m.functions.values()}
    assert notes == {"Block": None, "Block_1": "Block: extra Neg; no Relu", "Mlp": None}


def test_annotate_clears_a_stale_note_on_a_first_function() -> None:
    first = function("Block", ["Relu"])
    first.metadata_props[DIFFERS_FROM] = "Block_0: left from before"
    m = calling([first])
    assert annotate_differences(m) == {}
    assert DIFFERS_FROM not in first.metadata_props


def _scaled(name: str, seed: int) -> ir.Function:
    """``x * c``, ``c`` a 16-element Constant (a GroupNorm weight baked into the body)."""
    x = value("x", (16, 1, 1))
    array = np.random.default_rng(seed).standard_normal((16, 1, 1)).astype(np.float32)
    c = ir.node("Constant", [], attributes={"value": ir.tensor(array)})
    mul = ir.node("Mul", [x, c.outputs[0]])
    graph = ir.Graph([x], mul.outputs, nodes=[c, mul], opset_imports={"": OPSET}, name=name)
    f = ir.Function("pkg", name, graph=graph, attributes=[])
    f.doc_string = "pkg.Block"
    return f


def test_large_constants_with_other_values_are_named() -> None:
    """Too large to show, they differ in values: not "how the same ops are wired"."""
    assert differences(_scaled("Block_1", 1), _scaled("Block", 0), {}) == \
        ["other values in constant float32[16, 1, 1]"]
