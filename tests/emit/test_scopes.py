"""Module calls read back from node labels: labelled, placed by neighbours, repeated, moved."""

from __future__ import annotations

import onnx_ir as ir

from onnx_modular.emit.scopes import labelled_frames, node_chains, weights_next_to_readers
from onnx_modular.leaves.metadata import CLASS_HIERARCHY, NAME_SCOPES
from tests.emit.graphs import model, value, weight

ROOT = "pkg.Net"


def labelled(op: str, inputs: list[ir.Value], name: str, *scopes: tuple[str, str]) -> ir.Node:
    """A node as torch.onnx labels it: module paths and classes root first, FX name last."""
    meta = {NAME_SCOPES: repr(["", *(p for p, _ in scopes), name]),
            CLASS_HIERARCHY: repr([ROOT, *(c for _, c in scopes), f"aten.{op.lower()}"])}
    node = ir.node(op, inputs, name=f"n_{name}", metadata_props=meta)
    node.outputs[0].name = name
    return node


def plain(op: str, inputs: list[ir.Value], name: str) -> ir.Node:
    """A node a tool added: no labels."""
    node = ir.node(op, inputs, name=name)
    node.outputs[0].name = name
    return node


def ids(chains: list[tuple]) -> list[list[str]]:
    return [[c.call_id for c in chain] for chain in chains]


A, B = ("a", "pkg.A"), ("b", "pkg.B")
A_FC, B_FC = ("a.fc", "pkg.Fc"), ("b.fc", "pkg.Fc")


def test_labels_are_read_root_and_fx_node_left_out() -> None:
    x = value("x")
    node = labelled("Relu", [x], "relu", A, A_FC)
    assert labelled_frames(node) == (A, A_FC)
    assert labelled_frames(plain("Relu", [x], "r")) is None
    node.metadata_props[CLASS_HIERARCHY] = repr([ROOT])  # lengths differ: not trusted
    assert labelled_frames(node) is None


def test_an_added_node_takes_the_module_of_its_reader() -> None:
    """quantize_dynamic's DynamicQuantizeLinear belongs with the MatMul it feeds, not with
    the LayerNorm it reads from: a chain of new nodes follows the labelled node at its end."""
    x = value("x")
    n0 = labelled("Relu", [x], "r0", A)
    q = plain("Neg", [n0.outputs[0]], "q")
    q2 = plain("Abs", [q.outputs[0]], "q2")
    n1 = labelled("Relu", [q2.outputs[0]], "r1", B, B_FC)
    chains, report = node_chains([n0, q, q2, n1])
    assert ids(chains) == [["a"], ["b", "b.fc"], ["b", "b.fc"], ["b", "b.fc"]]
    assert (report.labelled, report.inferred) == (2, 2)


def test_a_fusion_read_by_two_modules_goes_to_their_common_ancestor() -> None:
    x = value("x")
    n0 = labelled("Relu", [x], "r0", A, A_FC)
    fused = plain("Add", [n0.outputs[0], x], "fused")
    r1 = labelled("Relu", [fused.outputs[0]], "r1", A, ("a.g", "pkg.G"))
    r2 = labelled("Abs", [fused.outputs[0]], "r2", A, ("a.h", "pkg.H"))
    chains, _ = node_chains([n0, fused, r1, r2])
    assert ids(chains)[1] == ["a"]


def test_a_node_writing_a_model_output_takes_its_producers_module() -> None:
    x = value("x")
    n0 = labelled("Relu", [x], "r0", A, A_FC)
    last = plain("Neg", [n0.outputs[0]], "y")
    model([x], [last.outputs[0]], [n0, last])  # graph outputs are known through the graph
    chains, _ = node_chains([n0, last])
    assert ids(chains)[1] == ["a", "a.fc"]


def test_a_module_called_twice_is_two_calls_in_execution_order() -> None:
    """The labels name the module, not the call: a path through another module between
    two of its nodes makes them two calls (a function cannot be left and re-entered)."""
    x = value("x")
    first = labelled("Relu", [x], "r0", A)
    between = labelled("Neg", [first.outputs[0]], "n", B)
    second = labelled("Relu", [between.outputs[0]], "r1", A)
    chains, report = node_chains([first, between, second])
    assert ids(chains) == [["a"], ["b"], ["a@1"]]
    assert report.repeated == ["a"]


def test_nested_calls_of_a_repeated_module_inherit_its_call_number() -> None:
    x = value("x")
    first = labelled("Relu", [x], "r0", A, A_FC)
    between = labelled("Neg", [first.outputs[0]], "n", B)
    second = labelled("Relu", [between.outputs[0]], "r1", A, A_FC)
    chains, _ = node_chains([first, between, second])
    assert ids(chains) == [["a", "a.fc"], ["b"], ["a@1", "a.fc@1"]]


def test_an_unlabelled_node_inside_one_call_moves_into_it() -> None:
    """A fusion placed by its readers outside a call it sits inside of (its producer and
    a reader in ``a.fc``) moves in, instead of splitting ``a.fc`` into two calls."""
    x = value("x")
    n0 = labelled("Relu", [x], "r0", A, A_FC)
    fused = plain("Neg", [n0.outputs[0]], "fused")
    n1 = labelled("Relu", [fused.outputs[0]], "r1", A, A_FC)
    other = labelled("Abs", [fused.outputs[0]], "r2", A, ("a.g", "pkg.G"))
    chains, report = node_chains([n0, fused, n1, other])
    assert ids(chains)[:3] == [["a", "a.fc"]] * 3
    assert report.moved == 1 and not report.repeated


def test_weights_move_next_to_their_first_reader() -> None:
    """A quantizer puts every weight's DequantizeLinear at the top; next to its reader,
    each layer lists its nodes, and so its function inputs, alike."""
    x = value("x")
    w0, w1 = weight("w0"), weight("w1", seed=1)
    d0 = plain("Neg", [w0], "d0")
    d1 = plain("Neg", [w1], "d1")
    m0 = plain("MatMul", [x, d0.outputs[0]], "m0")
    m1 = plain("MatMul", [m0.outputs[0], d1.outputs[0]], "m1")
    net = model([x], [m1.outputs[0]], [d0, d1, m0, m1], initializers=[w0, w1])
    weights_next_to_readers(net.graph)
    assert [n.name for n in net.graph] == ["d0", "m0", "d1", "m1"]


def test_a_fusion_two_calls_sit_around_is_taken_in_once() -> None:
    """``u = a1 + b1`` (a tool's fused node) read by ``a2`` in A and ``b2`` in B: A takes it
    in; B, which it also sits inside, does not take it again (that left A non-convex: a
    cycle) but becomes two calls."""
    x = value("x")
    a1 = labelled("Relu", [x], "a1", A)
    b1 = labelled("Neg", [x], "b1", B)
    u = plain("Add", [a1.outputs[0], b1.outputs[0]], "u")
    a2 = labelled("Sigmoid", [u.outputs[0]], "a2", A)
    b2 = labelled("Tanh", [u.outputs[0]], "b2", B)
    chains, report = node_chains([a1, b1, u, a2, b2])
    assert ids(chains) == [["a"], ["b"], ["a"], ["a"], ["b@1"]]
    assert report.moved == 1 and report.repeated == ["b"]
