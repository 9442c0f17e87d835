"""The FX -> ONNX index: which ONNX nodes each FX node became, on a hand-built model."""

from __future__ import annotations

import dataclasses

import onnx_ir as ir
import pytest

from onnx_modular.leaves.metadata import FX_NODE
from onnx_modular.support.onnx_index import SupportContext, fx_to_onnx_nodes


def _node(op: str, inputs: list, fx: str | None) -> ir.Node:
    meta = {FX_NODE: fx} if fx is not None else None
    return ir.node(op, inputs, metadata_props=meta)


def test_each_fx_node_maps_to_its_onnx_nodes_in_graph_order() -> None:
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
    a = _node("Shape", [x], "%linear : [num_users=1] = call_function[...]")
    b = _node("Reshape", [x, a.outputs[0]], "%linear : [num_users=1] = call_function[...]")
    c = _node("Relu", [b.outputs[0]], "%relu")
    untagged = _node("Neg", [c.outputs[0]], None)
    not_fx = _node("Abs", [untagged.outputs[0]], "linear")  # no leading %: not an FX name
    empty = _node("Sin", [not_fx.outputs[0]], "")
    graph = ir.Graph([x], empty.outputs, nodes=[a, b, c, untagged, not_fx, empty],
                     opset_imports={"": 18})
    index = fx_to_onnx_nodes(ir.Model(graph, ir_version=10))
    assert index == {"linear": [a, b], "relu": [c]}
    assert index["linear"][0] is a


def test_subgraph_nodes_count_for_their_enclosing_node() -> None:
    cond = ir.Value(name="c", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    inner = _node("Constant", [], "%inner")
    inner.attributes["value_float"] = ir.AttrFloat32("value_float", 1.0)
    branch = ir.Graph([], inner.outputs, nodes=[inner], name="then")
    node = _node("If", [cond], "%cond_op")
    node.attributes["then_branch"] = ir.AttrGraph("then_branch", branch)
    node.attributes["else_branch"] = ir.AttrGraph("else_branch", branch)
    graph = ir.Graph([cond], node.outputs, nodes=[node], opset_imports={"": 18})
    assert fx_to_onnx_nodes(ir.Model(graph, ir_version=10)) == {"cond_op": [node]}


def test_the_support_context_is_empty_by_default_and_frozen() -> None:
    ctx = SupportContext()
    assert dict(ctx.onnx_nodes) == {} and dict(ctx.opset_imports) == {}
    assert SupportContext().onnx_nodes is not ctx.onnx_nodes  # no shared default
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.opset_imports = {"": 18}  # type: ignore[misc]
