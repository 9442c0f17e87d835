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
