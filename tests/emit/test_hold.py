"""hold.py directly: which computed constants entering a call are held while folding, and
releasing them again."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnx_modular.emit.hold import _call_inputs, _constants, hold_varying_inputs, release

from . import graphs


def _layers(first_input: str = "computed", second_path: str = "layers.1",
            second_type: str = "pkg.Block"):
    """``layers.0`` and ``layers.1``, each ``Add(input, x)`` (``x``: the query, a graph
    input); ``layers.1`` reads ``layers.0``'s result; ``layers.0`` reads ``first_input``: a
    value computed from a weight alone (``Neg(c)``), a ``Constant`` node's output, or ``x``."""
    x = graphs.value("x")
    c, w = graphs.weight("c", (2, 4)), graphs.weight("w", (2, 4), 1)
    nodes: list[ir.Node] = []
    if first_input == "computed":
        nodes.append(graphs.fx("Neg", [c], "neg"))
        source = nodes[-1].outputs[0]
    elif first_input == "constant":
        nodes.append(ir.node("Constant", [], attributes={
            "value": ir.tensor(np.ones((2, 4), np.float32))}, name="const"))
        source = nodes[-1].outputs[0]
    else:
        source = x
    add0 = graphs.fx("Add", [source, x], "add0")
    add1 = graphs.fx("Add", [add0.outputs[0], x], "add1")
    out = graphs.fx("Mul", [add1.outputs[0], w], "out")
    nodes += [add0, add1, out]
    model = graphs.model([x], out.outputs, nodes, [c, w])
    first = graphs.call("layers.0")
    second = graphs.call(second_path, second_type)
    chain = {"add0": (first,), "add1": (second,)}
    per_node = [chain.get(n.name[2:], ()) for n in nodes]
    return model, nodes, per_node


def test_constants_are_initializers_and_what_only_they_compute() -> None:
    model, _, _ = _layers()
    constant = _constants(model.graph)
    names = {v.name for v in constant}
    assert names == {"c", "w", "neg"}  # Neg(c): weights only; the Adds read the input x


def test_a_custom_domain_or_a_subgraph_stops_the_constants() -> None:
    c = graphs.weight("c", (2, 4))
    custom = ir.node("Op", [c], domain="pkg", name="custom")
    inner = ir.node("Constant", [], attributes={"value": ir.tensor(np.ones(2, np.float32))})
    branch = ir.Graph([], inner.outputs, nodes=[inner], name="b")
    cond = ir.Value(name="cond", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]),
                    const_value=ir.tensor(np.array(True)))
    with_graph = ir.node("If", [cond], attributes={"then_branch": branch,
                                                   "else_branch": branch})
    model = graphs.model([], [*custom.outputs, *with_graph.outputs], [custom, with_graph],
                         [c, cond])
    constant = _constants(model.graph)
    assert custom.outputs[0] not in constant and with_graph.outputs[0] not in constant


def test_call_inputs_are_the_values_read_from_outside_the_call() -> None:
    _, nodes, per_node = _layers()
    inputs = _call_inputs(nodes, per_node)
    first, second = graphs.call("layers.0"), graphs.call("layers.1")
    assert [v.name for v in inputs[first]] == ["neg", "x"]
    assert [v.name for v in inputs[second]] == ["add0", "x"]
    use = inputs[second][nodes[1].outputs[0]]
    assert use == [(nodes[2], 0)]


def test_a_computed_constant_entering_one_call_of_a_class_is_held() -> None:
    model, nodes, per_node = _layers()
    holds = hold_varying_inputs(model.graph, nodes, per_node)
    assert len(holds) == 1
    hold = holds[0]
    assert (hold.domain, hold.op_type, hold.name) == ("onnx_modular.fold", "Hold", "neg_hold")
    assert hold.inputs[0] is nodes[0].outputs[0]
    assert nodes[1].inputs[0] is hold.outputs[0]
    assert hold.outputs[0].name == "neg_held" and hold.outputs[0].shape == ir.Shape((2, 4))
    order = list(model.graph)
    assert order.index(hold) == order.index(nodes[1]) - 1  # just before its first use


def test_nothing_is_held_for_inputs_or_other_places() -> None:
    for kwargs in ({"first_input": "x"}, {"second_path": "other.1"},
                   {"second_type": "pkg.Other"}):
        model, nodes, per_node = _layers(**kwargs)
        assert hold_varying_inputs(model.graph, nodes, per_node) == [], kwargs


def test_no_calls_nothing_held() -> None:
    model, nodes, _ = _layers()
    assert hold_varying_inputs(model.graph, nodes, [()] * len(nodes)) == []


def test_release_puts_the_held_value_back_and_names_those_folded_to_weights() -> None:
    model, nodes, per_node = _layers()
    holds = hold_varying_inputs(model.graph, nodes, per_node)
    neg = nodes[0].outputs[0]
    assert release(model.graph, holds) == set()  # still computed: nothing kept
    assert nodes[1].inputs[0] is neg and all(n.op_type != "Hold" for n in model.graph)


def test_release_keeps_the_name_of_a_value_folded_into_an_initializer() -> None:
    model, nodes, per_node = _layers()
    holds = hold_varying_inputs(model.graph, nodes, per_node)
    folded = ir.Value(name="neg_folded", type=graphs.FLOAT, shape=ir.Shape((2, 4)),
                      const_value=ir.tensor(np.zeros((2, 4), np.float32)))
    model.graph.register_initializer(folded)
    holds[0].replace_input_with(0, folded)  # as a folder does
    assert release(model.graph, holds) == {"neg_folded"}
    assert nodes[1].inputs[0] is folded


def test_release_skips_a_hold_dead_code_removal_took() -> None:
    model, nodes, per_node = _layers()
    holds = hold_varying_inputs(model.graph, nodes, per_node)
    held = holds[0].outputs[0]
    held.replace_all_uses_with(nodes[0].outputs[0])
    model.graph.remove(holds[0], safe=True)
    assert release(model.graph, holds) == set()


def test_a_plain_constant_in_only_one_call_is_held_and_released_as_an_initializer() -> None:
    """A Constant node entering ``layers.0`` where ``layers.1`` reads an activation would be
    copied into ``layers.0``'s body; released, the call reads it as an initializer."""
    model, nodes, per_node = _layers("constant")
    holds = hold_varying_inputs(model.graph, nodes, per_node)
    assert len(holds) == 1
    kept = release(model.graph, holds)
    source = nodes[1].inputs[0]
    assert source.is_initializer() and kept == {source.name}
    np.testing.assert_array_equal(source.const_value.numpy(), np.ones((2, 4), np.float32))
    assert all(n.op_type not in ("Constant", "Hold") for n in model.graph)


def _loop(start: str = "zeros") -> tuple[ir.Model, list[ir.Node], list[tuple]]:
    """``h = zeros; for _ in range(3): h = step(x, h)``, ``step`` is ``x + h * 0.5``; as
    torch.onnx writes it, the 0.5 is one Constant the first call makes and the next ones
    read from there. ``start``: the zero state a Constant, or ``zeros_like(x)``."""
    x = graphs.value("x")
    nodes: list[ir.Node] = []
    if start == "zeros":
        nodes.append(ir.node("Constant", [], attributes={
            "value": ir.tensor(np.zeros((2, 4), np.float32))}, name="zeros"))
    else:
        zero = ir.node("Constant", [], attributes={"value": ir.tensor(np.float32(0))})
        cast = graphs.fx("CastLike", [zero.outputs[0], x], "cast", ())
        shape = graphs.fx("Shape", [x], "shape", (2,))
        nodes += [zero, cast, shape, graphs.fx("Expand", [cast.outputs[0], shape.outputs[0]],
                                               "zeros_like")]
    chains: list[tuple] = [()] * len(nodes)
    half = ir.node("Constant", [], attributes={"value": ir.tensor(np.float32(0.5))})
    h = nodes[-1].outputs[0]
    for i in range(3):
        step = graphs.call("step", "pkg.Step", "step" if i == 0 else f"step@{i}")
        if i == 0:
            nodes.append(half)
            chains.append((step,))
        mul = graphs.fx("Mul", [h, half.outputs[0]], f"mul{i}")
        add = graphs.fx("Add", [x, mul.outputs[0]], f"add{i}")
        nodes += [mul, add]
        chains += [(step,), (step,)]
        h = add.outputs[0]
    return graphs.model([x], [h], nodes), nodes, chains


def test_sites_align_where_torch_onnx_shares_a_constant_from_the_first_call() -> None:
    """The first call makes the 0.5 its siblings read: their input lists differ, their
    sites (node, input) do not, and the zero state entering the first call is held."""
    model, nodes, chains = _loop()
    (hold,) = hold_varying_inputs(model.graph, nodes, chains)
    assert hold.inputs[0] is nodes[0].outputs[0]  # the zeros, not the shared 0.5


def test_zeros_like_a_static_input_is_a_constant() -> None:
    """``Expand(CastLike(0, x), Shape(x))``: a folder knows it without ``x``'s values."""
    model, nodes, chains = _loop("zeros_like")
    assert nodes[3].outputs[0] in _constants(model.graph)
    (hold,) = hold_varying_inputs(model.graph, nodes, chains)
    assert hold.inputs[0].name == "zeros_like"
