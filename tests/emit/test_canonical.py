"""emit/canonical: one structural key; names and metadata never count, structure does."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnx_modular.emit.canonical import (
    graph_key,
    is_scalar_attr,
    is_scalar_constant,
    structural_key,
)

from .graphs import OPSET, value


def _graph(ops: list[tuple[str, dict[str, object]]], shape: tuple[int, ...] = (2, 4),
           names: str = "v", constant: float | None = None) -> ir.Graph:
    """A chain of unary ops on one input; optionally ``Mul`` by a Constant at the end."""
    x = value(f"{names}_x", shape)
    nodes: list[ir.Node] = []
    for i, (op, attrs) in enumerate(ops):
        node = ir.node(op, [nodes[-1].outputs[0] if nodes else x], attributes=attrs or None,
                       name=f"{names}_{i}", metadata_props={"note": names})
        node.outputs[0].name = f"{names}_out{i}"
        nodes.append(node)
    if constant is not None:
        c = ir.node("Constant", [], attributes={"value": ir.tensor(np.float32(constant))})
        nodes += [c, ir.node("Mul", [nodes[-1].outputs[0], c.outputs[0]])]
    return ir.Graph([x], nodes[-1].outputs, nodes=nodes, opset_imports={"": OPSET},
                    name=names)


def test_names_and_metadata_do_not_count() -> None:
    ops = [("Relu", {}), ("Softmax", {"axis": 1})]
    assert graph_key(_graph(ops, names="a")) == graph_key(_graph(ops, names="b"))


def test_op_types_attributes_and_constants_count() -> None:
    base = graph_key(_graph([("Softmax", {"axis": 1})], constant=2.0))
    assert graph_key(_graph([("LogSoftmax", {"axis": 1})], constant=2.0)) != base
    assert graph_key(_graph([("Softmax", {"axis": 0})], constant=2.0)) != base
    assert graph_key(_graph([("Softmax", {"axis": 1})], constant=3.0)) != base


def test_input_shapes_count_unless_the_signature_is_left_out() -> None:
    small, large = _graph([("Relu", {})], (2, 4)), _graph([("Relu", {})], (3, 4))
    assert graph_key(small) != graph_key(large)
    assert graph_key(small, signature=False) == graph_key(large, signature=False)
    assert structural_key(small, signature="rank") == structural_key(large, signature="rank")
    flat = _graph([("Relu", {})], (8,))
    assert structural_key(small, signature="rank") != structural_key(flat, signature="rank")


def _two_branches(first: str, second: str) -> ir.Graph:
    x = value("x")
    a, b = ir.node(first, [x]), ir.node(second, [x])
    add = ir.node("Add", [a.outputs[0], b.outputs[0]])
    return ir.Graph([x], add.outputs, nodes=[a, b, add], opset_imports={"": OPSET})


def test_node_order_counts_unless_order_free() -> None:
    one, other = _two_branches("Relu", "Neg"), _two_branches("Neg", "Relu")
    # Add(Relu, Neg) vs Add(Neg, Relu): the wiring differs in either mode ...
    assert structural_key(one, order_free=True) != structural_key(other, order_free=True)
    # ... but the same graph, nodes listed in another topological order, keys alike when
    # order_free
    x = value("x")
    a, b = ir.node("Relu", [x]), ir.node("Neg", [x])
    add = ir.node("Add", [a.outputs[0], b.outputs[0]])
    swapped = ir.Graph([x], add.outputs, nodes=[b, a, add], opset_imports={"": OPSET})
    assert structural_key(one) != structural_key(swapped)
    assert structural_key(one, order_free=True) == structural_key(swapped, order_free=True)


def test_fold_keys_an_initializer_like_the_constant_node_holding_it() -> None:
    array = np.arange(4, dtype=np.float32)
    x = value("x", (4,))
    c = ir.node("Constant", [], attributes={"value": ir.tensor(array)})
    ident = ir.node("Identity", [c.outputs[0]])
    add = ir.node("Add", [x, ident.outputs[0]])
    as_node = ir.Graph([x], add.outputs, nodes=[c, ident, add], opset_imports={"": OPSET})
    x2 = value("x", (4,))
    w = ir.Value(name="w", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape((4,)),
                 const_value=ir.tensor(array, name="w"))
    add2 = ir.node("Add", [x2, w])
    as_initializer = ir.Graph([x2], add2.outputs, nodes=[add2], initializers=[w],
                              opset_imports={"": OPSET})
    assert structural_key(as_node) != structural_key(as_initializer)
    assert structural_key(as_node, fold=True) == structural_key(as_initializer, fold=True)


def test_constants_over_the_limit_count_by_dtype_and_shape() -> None:
    def with_weight(seed: int) -> ir.Graph:
        array = np.random.default_rng(seed).standard_normal(64).astype(np.float32)
        x = value("x", (64,))
        w = ir.Value(name="w", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape((64,)),
                     const_value=ir.tensor(array, name="w"))
        add = ir.node("Add", [x, w])
        return ir.Graph([x], add.outputs, nodes=[add], initializers=[w],
                        opset_imports={"": OPSET})

    a, b = with_weight(0), with_weight(1)
    assert structural_key(a, fold=True) != structural_key(b, fold=True)
    assert structural_key(a, fold=True, constant_limit=16) == \
        structural_key(b, fold=True, constant_limit=16)


def test_scalars_mode_ignores_float_scalar_values() -> None:
    a = _graph([("LeakyRelu", {"alpha": 0.1})], constant=2.0)
    b = _graph([("LeakyRelu", {"alpha": 0.2})], constant=3.0)
    assert structural_key(a) != structural_key(b)
    assert structural_key(a, scalars=True) == structural_key(b, scalars=True)
    # an integer attribute is no scalar parameter: it still counts
    c, d = _graph([("Softmax", {"axis": 0})]), _graph([("Softmax", {"axis": 1})])
    assert structural_key(c, scalars=True) != structural_key(d, scalars=True)


def test_subgraph_references_resolve_by_key_not_by_name() -> None:
    def with_branch(outer_name: str) -> ir.Graph:
        x = value("x")
        cond = value("cond", (), ir.DataType.BOOL)
        relu = ir.node("Relu", [x])
        relu.outputs[0].name = outer_name
        branch_node = ir.node("Neg", [relu.outputs[0]])
        branch = ir.Graph([], branch_node.outputs, nodes=[branch_node],
                          opset_imports={"": OPSET})
        other_node = ir.node("Abs", [relu.outputs[0]])
        other = ir.Graph([], other_node.outputs, nodes=[other_node],
                         opset_imports={"": OPSET})
        if_node = ir.node("If", [cond], attributes={"then_branch": branch,
                                                    "else_branch": other})
        return ir.Graph([x, cond], if_node.outputs, nodes=[relu, if_node],
                        opset_imports={"": OPSET})

    assert graph_key(with_branch("linear")) == graph_key(with_branch("linear_1"))


def test_scalar_predicates() -> None:
    assert is_scalar_attr(ir.AttrFloat32("alpha", 0.5))
    assert not is_scalar_attr(ir.AttrInt64("axis", 1))
    assert is_scalar_attr(ir.AttrTensor("value", ir.tensor(np.float32(1.0))))
    assert not is_scalar_attr(ir.AttrTensor("value", ir.tensor(np.array([1.0, 2.0],
                                                                         np.float32))))
    assert not is_scalar_attr(ir.AttrTensor("value", ir.tensor(np.int64(1))))
    c = ir.node("Constant", [], attributes={"value": ir.tensor(np.float32(1.0))})
    i = ir.node("Constant", [], attributes={"value": ir.tensor(np.int64(1))})
    assert is_scalar_constant(c) and not is_scalar_constant(i)
