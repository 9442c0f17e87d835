"""Keep weight folding from reaching into one call of a class but not its siblings.

Folding before outlining computes whatever depends on weights and constants only. When a
call's input is a constant in one call and an activation in the others of its class (DETR's
first decoder layer reads a zero target plus the query embeddings, the next layers read the
previous layer's output), the first call's body folds to something else and that layer
becomes a function of its own. Such an input is held behind an opaque node while folding, so
every call of the class keeps the same computation; the holds go again right after.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import onnx_ir as ir

from onnx_modular.metadata import CallInfo

_DOMAIN = "onnx_modular.fold"
_HOLD = "Hold"
_NUMBER = re.compile(r"(?<![^.])\d+(?![^.])")  # a whole path component of digits


def _has_subgraph(node: ir.Node) -> bool:
    return any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
               for a in node.attributes.values() if not a.is_ref())


def _constants(graph: ir.Graph) -> set[ir.Value]:
    """Values a folder could compute: from initializers and Constant nodes alone."""
    constant: set[ir.Value] = set(graph.initializers.values())
    for node in graph:
        if _has_subgraph(node) or node.domain not in ("", "ai.onnx"):
            continue
        if all(v is None or v in constant for v in node.inputs):
            constant.update(node.outputs)
    return constant


def _call_inputs(nodes: Sequence[ir.Node], per_node: Sequence[tuple[CallInfo, ...]]
                 ) -> dict[CallInfo, dict[ir.Value, list[tuple[ir.Node, int]]]]:
    """Per call, the values it reads from outside it (in first-use order) and their uses."""
    chain_of = dict(zip(nodes, per_node, strict=True))
    inputs: dict[CallInfo, dict[ir.Value, list[tuple[ir.Node, int]]]] = {}
    for node, chain in zip(nodes, per_node, strict=True):
        for idx, value in enumerate(node.inputs):
            if value is None:
                continue
            producer = value.producer()
            inner = chain_of.get(producer, ()) if producer is not None else ()
            for call in chain:
                if call not in inner:
                    inputs.setdefault(call, {}).setdefault(value, []).append((node, idx))
    return inputs


def hold_varying_inputs(graph: ir.Graph, nodes: Sequence[ir.Node],
                        per_node: Sequence[tuple[CallInfo, ...]]) -> list[ir.Node]:
    """Hold every computed constant that enters a call where the same input of another call
    of its class and place (``layers.0`` and ``layers.1``: paths equal up to indices; same
    number of inputs, same position) is not a constant. Calls elsewhere may play another
    part (``wpe`` and ``wte`` are both Embeddings; positions fold, ids do not). Returns the
    holds, for :func:`release`."""
    constant = _constants(graph)
    by_class: dict[tuple[str, str, int],
                   list[list[tuple[ir.Value, list[tuple[ir.Node, int]]]]]] = {}
    for call, reads in _call_inputs(nodes, per_node).items():
        items = list(reads.items())
        key = (call.module_type, _NUMBER.sub("#", call.module_path), len(items))
        by_class.setdefault(key, []).append(items)
    holds: list[ir.Node] = []
    for calls in by_class.values():
        if len(calls) < 2:
            continue
        for position in range(len(calls[0])):
            flags = [items[position][0] in constant for items in calls]
            if all(flags) or not any(flags):
                continue
            for items, flag in zip(calls, flags, strict=True):
                value, uses = items[position]
                producer = value.producer()
                if not flag or producer is None or producer.op_type == "Constant":
                    continue  # weights and plain constants are the same in every call
                holds.append(_hold(graph, value, uses))
    return holds


def _hold(graph: ir.Graph, value: ir.Value, uses: list[tuple[ir.Node, int]]) -> ir.Node:
    hold = ir.Node(_DOMAIN, _HOLD, [value], name=f"{value.name}_hold")
    out = hold.outputs[0]
    out.name, out.type, out.shape = f"{value.name}_held", value.type, value.shape
    graph.insert_before(uses[0][0], hold)
    for node, idx in uses:
        if node.inputs[idx] is value:
            node.replace_input_with(idx, out)
    return hold


def release(graph: ir.Graph, holds: list[ir.Node]) -> set[str]:
    """Remove the holds: their users read the held values again. Returns the names of the
    held values that folded to initializers: they stay call inputs, however small (GPT-2's
    position ids enter ``wpe`` as the token ids enter ``wte``: one ``Embedding``)."""
    kept: set[str] = set()
    for hold in holds:
        if hold.graph is not graph:  # nothing read it: dead-code removal took it
            continue
        value = hold.inputs[0]
        assert value is not None
        if value.is_initializer() and value.name:
            kept.add(value.name)
        hold.outputs[0].replace_all_uses_with(value)
        graph.remove(hold, safe=True)
    return kept
