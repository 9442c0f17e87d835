"""emit/walk: the main graph first, then every function in the model's order; nodes of
subgraphs (If branches) when asked."""

from __future__ import annotations

import onnx_ir as ir

from onnx_modular.emit.walk import all_nodes, graphs

from . import graphs as g


def _model_with_branches() -> tuple[ir.Model, ir.Node, list[ir.Node]]:
    """Calls of ``Block`` (Relu) and ``Mlp`` (Neg, Abs); the main graph ends in an If whose
    branches hold a Sigmoid and a Tanh. Returns the model, the If and the branches' nodes."""
    m = g.calling([g.function("Block", ["Relu"]), g.function("Mlp", ["Neg", "Abs"])])
    x = m.graph.outputs[0]
    inner = [ir.node(op, [x], name=op.lower()) for op in ("Sigmoid", "Tanh")]
    then, otherwise = (ir.Graph([], n.outputs, nodes=[n], name=n.name) for n in inner)
    cond = g.value("c", (), ir.DataType.BOOL)
    m.graph.inputs.append(cond)
    branching = ir.node("If", [cond], attributes={"then_branch": then, "else_branch": otherwise},
                        name="if")
    m.graph.append(branching)
    return m, branching, inner


def test_graphs_are_the_main_graph_then_every_function_in_order() -> None:
    m, _, _ = _model_with_branches()
    assert list(graphs(m)) == [m.graph, *m.functions.values()]
    assert [f.name for f in list(graphs(m))[1:]] == ["Block", "Mlp"]


def test_all_nodes_walks_the_main_graph_first_then_each_body() -> None:
    m, branching, inner = _model_with_branches()
    block, mlp = m.functions.values()
    top = [*m.graph, *block, *mlp]
    assert list(all_nodes(m, subgraphs=False)) == top
    assert not set(inner) & set(top)
    # the branches' nodes follow the node holding them
    assert list(m.graph)[-1] is branching
    assert list(all_nodes(m)) == [*m.graph, *inner, *block, *mlp]
    assert [n.op_type for n in all_nodes(m)] == [
        "Block", "Mlp", "If", "Sigmoid", "Tanh", "Relu", "Neg", "Abs"]


def test_a_model_without_functions_is_its_main_graph() -> None:
    x = g.value("x")
    node = g.fx("Relu", [x], "y")
    m = g.model([x], node.outputs, [node])
    assert list(graphs(m)) == [m.graph]
    assert list(all_nodes(m)) == [node]
