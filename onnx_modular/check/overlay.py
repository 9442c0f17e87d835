"""The errors on the graph: a node-data overlay for Google's Model Explorer.

``model-explorer model.onnx --extensions model_explorer_onnx --node_data_paths errors.json``
colors each node by a value (Model Explorer's "node data" JSON: per graph id, per node id,
a value, and a gradient from the smallest to the largest value). Here the value is
``log10`` of a module call's max abs error against torch, so decades read as steps of color
and the diverging module, and the ones its error flows into, light up.

Ids follow Model Explorer's ONNX adapter (``model-explorer-onnx``): a graph is the main
graph's name or ``[function]domain::name``; a node is its name, or ``<node_i>`` by
position. A hierarchical model's values sit on the call nodes: the main graph's and those
inside bodies. A body several calls share (24 decoder layers) is one graph, so it shows
the instance nearest the first mismatch (inside the diverging layer), else its worst call.
A flat model's values sit on the nodes that make a call's outputs (the innermost call wins
where calls share one), and Model Explorer rolls them up on the module groups its
``namespace`` metadata draws. Either way a value is where the error was measured: the
values a module call returns, never a node inside it that was not compared.
"""

from __future__ import annotations

import math
from typing import Any

from onnx_modular.check.call_stats import CallError
from onnx_modular.check.judge import Localization
from onnx_modular.check.probe import node_id

#: Zero error has no logarithm: it shows as this many decades.
FLOOR = -12.0
GRADIENT = [{"stop": 0.0, "bgColor": "#c8e6c9"}, {"stop": 0.5, "bgColor": "#fff176"},
            {"stop": 1.0, "bgColor": "#e53935"}]
NAME = "log10 max abs error vs torch"


def _value(error: CallError) -> float:
    return log_error(error.max_abs)


def log_error(x: float) -> float:
    """A max abs error as the overlay draws it: decades, floored, NaN/inf worst."""
    if math.isnan(x) or x == math.inf:
        return 10.0  # worse than any finite error worth drawing
    return round(max(FLOOR, math.log10(x)) if x > 0 else FLOOR, 3)


def node_data(localization: Localization) -> dict[str, Any]:
    """Model Explorer node data (a dict of graph id -> graph data) for the localized model."""
    evidence = localization.evidence
    if evidence is None:
        return {}
    probe = evidence.probe
    errors = {e.order: e for e in localization.errors}
    calls = evidence.torch_calls
    chain: set[int] = set()
    if localization.first is not None:
        j = next((i for i, c in enumerate(calls) if c.call_id == localization.first.call_id),
                 None)
        while j is not None:
            chain.add(j)
            j = calls[j].parent

    def anchor(j: int | None) -> int:
        """Depth of the call's nearest ancestor (or itself) on the first mismatch's chain:
        a shared body shows the instance drawn where the chain passes."""
        while j is not None and j not in chain:
            j = calls[j].parent
        return -1 if j is None else calls[j].depth

    # (graph, node) -> (anchor on the first mismatch's chain, value, depth)
    picked: dict[tuple[str, str], tuple[int, float, int]] = {}
    main = (probe.graph.name if probe.graph is not None else "") or "<main>"
    for k, j in evidence.mapping.items():
        error = errors.get(j)
        if error is None:
            continue
        call = probe.calls[k]
        value = _value(error)
        if call.site is not None:
            sites = [call.site]
        elif probe.graph is not None and call.nodes and not probe.inlined:
            results = set(call.results)
            sites = [(main, node_id(probe.graph.node[i], i)) for i in call.nodes
                     if results.intersection(probe.graph.node[i].output)]
        else:
            continue
        key = (anchor(j), value, error.depth)
        for site in sites:
            old = picked.get(site)
            if call.site is None:  # flat: the innermost call colors a node
                if old is None or error.depth > old[2]:
                    picked[site] = key
            elif old is None or key[:2] > old[:2]:
                picked[site] = key

    data: dict[str, Any] = {}
    for (graph, node), (_, value, _) in sorted(picked.items()):
        entry = data.setdefault(graph, {"name": NAME, "results": {}, "gradient": GRADIENT})
        entry["results"][node] = {"value": value}
    return data

