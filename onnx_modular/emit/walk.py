"""Every graph of a model: the main graph, then each local function.

A pass that rewrites "the model" has to visit the main graph and every function body, in a
fixed order (reports, names and counts depend on it): :func:`graphs` and :func:`all_nodes`
are that walk, written once.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx_ir as ir


def graphs(model: ir.Model) -> Iterator[ir.Graph | ir.Function]:
    """The main graph, then every local function in the model's order. A function is
    iterated, inserted into and removed from as its body graph; If branches and Loop bodies
    are not items of their own (:func:`all_nodes` reaches their nodes)."""
    yield model.graph
    yield from model.functions.values()


def all_nodes(model: ir.Model, *, subgraphs: bool = True) -> Iterator[ir.Node]:
    """Every node of the main graph, then of each function (in the model's order); with
    ``subgraphs``, the nodes of If branches and Loop bodies too, each after the node that
    holds them. Lazy: a caller that adds or removes nodes takes a ``list`` first."""
    for graph in graphs(model):
        yield from (graph.all_nodes() if subgraphs else graph)


def is_read(node: ir.Node) -> bool:
    """Some output of ``node`` is used (by a node, a subgraph, or as a graph output)."""
    return any(out.uses() or out.is_graph_output() for out in node.outputs)


def remove_unread(graph: ir.Graph | ir.Function, keep: set[ir.Node] | frozenset[ir.Node]
                  = frozenset()) -> None:
    """Remove the nodes of ``graph`` nothing reads, last first (a chain goes at once);
    ``keep`` stays whatever reads it."""
    for node in reversed(list(graph)):
        if node not in keep and not is_read(node):
            graph.remove(node, safe=True)
