"""Keep weight folding from reaching into one call of a class but not its siblings.

Folding before outlining computes whatever depends on weights and constants only. When a
call's input is a constant in one call and an activation in the others of its class (DETR's
first decoder layer reads a zero target plus the query embeddings, the next layers read the
previous layer's output), the first call's body folds to something else and that layer
becomes a function of its own. Such an input is held behind an opaque node while folding, so
every call of the class keeps the same computation; the holds go again right after.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import onnx_ir as ir

from onnx_modular.leaves.metadata import CallInfo

_DOMAIN = "onnx_modular.fold"
_HOLD = "Hold"
_NUMBER = re.compile(r"(?<![^.])\d+(?![^.])")  # a whole path component of digits


def _has_subgraph(node: ir.Node) -> bool:
    return any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
               for a in node.attributes.values() if not a.is_ref())


def _is_constant(node: ir.Node) -> bool:
    return node.op_type == "Constant" and not node.inputs and node.domain in ("", "ai.onnx")


def _constants(graph: ir.Graph) -> set[ir.Value]:
    """Values a folder could compute: from initializers and Constant nodes alone."""
    constant: set[ir.Value] = set(graph.initializers.values())
    for node in graph:
        if _has_subgraph(node) or node.domain not in ("", "ai.onnx"):
            continue
        if all(v is None or v in constant or _read_for_metadata(node, i, v)
               for i, v in enumerate(node.inputs)):
            constant.update(node.outputs)
    return constant


def _read_for_metadata(node: ir.Node, idx: int, value: ir.Value) -> bool:
    """Is only ``value``'s type or static shape read here, which a folder knows without
    its values (``zeros_like(x)``: ``Expand(CastLike(0, x), Shape(x))``)?"""
    if node.op_type == "CastLike":
        return idx == 1
    if node.op_type in ("Shape", "Size"):
        return value.shape is not None and value.shape.is_static()
    return False


#: Where a call reads a value from outside it: (its k-th node, input index).
Site = tuple[int, int]


@dataclasses.dataclass
class _Call:
    """One module call as the flat graph holds it: its nodes' ops in order (children's nodes
    included) and, per site, the outside value read there."""

    ops: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    reads: dict[Site, ir.Value] = dataclasses.field(default_factory=dict)
    uses: dict[ir.Value, list[tuple[ir.Node, int]]] = dataclasses.field(default_factory=dict)


def _calls(nodes: Sequence[ir.Node], per_node: Sequence[tuple[CallInfo, ...]]
           ) -> dict[CallInfo, _Call]:
    """Per call, its ops and the values it reads from outside it, by site."""
    chain_of = dict(zip(nodes, per_node, strict=True))
    calls: dict[CallInfo, _Call] = {}
    for node, chain in zip(nodes, per_node, strict=True):
        if _is_constant(node):
            continue  # torch.onnx's shared constants sit in one call only
        for call in chain:
            record = calls.setdefault(call, _Call())
            k = len(record.ops)
            record.ops.append((node.domain, node.op_type))
            for idx, value in enumerate(node.inputs):
                if value is None:
                    continue
                producer = value.producer()
                if producer is not None and call in chain_of.get(producer, ()):
                    continue
                record.reads[(k, idx)] = value
                record.uses.setdefault(value, []).append((node, idx))
    return calls


def _call_inputs(nodes: Sequence[ir.Node], per_node: Sequence[tuple[CallInfo, ...]]
                 ) -> dict[CallInfo, dict[ir.Value, list[tuple[ir.Node, int]]]]:
    """Per call, the values it reads from outside it (in first-use order) and their uses."""
    return {call: record.uses for call, record in _calls(nodes, per_node).items()}


def hold_varying_inputs(graph: ir.Graph, nodes: Sequence[ir.Node],
                        per_node: Sequence[tuple[CallInfo, ...]]) -> list[ir.Node]:
    """Hold every constant that enters a call where another call of its class and place
    (``layers.0`` and ``layers.1``: paths equal up to indices; the same ops in the same
    order) reads a value that is not a constant, at the same node and input. Calls elsewhere
    may play another part (``wpe`` and ``wte`` are both Embeddings; positions fold, ids do
    not). Sites are compared rather than the inputs' order: torch.onnx shares one Constant
    among the calls of a loop (the first call makes it, the next ones read it from there),
    so the calls' input lists differ while their sites align. Returns the holds, for
    :func:`release`."""
    constant = _constants(graph)
    by_class: dict[tuple[str, str, tuple[tuple[str, str], ...]], list[_Call]] = {}
    for call, record in _calls(nodes, per_node).items():
        key = (call.module_type, _NUMBER.sub("#", call.module_path), tuple(record.ops))
        by_class.setdefault(key, []).append(record)
    held: dict[ir.Value, list[tuple[ir.Node, int]]] = {}
    for records in by_class.values():
        if len(records) < 2:
            continue
        sites = set(records[0].reads).intersection(*(r.reads for r in records[1:]))
        for site in sorted(sites):
            flags = [r.reads[site] in constant for r in records]
            if all(flags) or not any(flags):
                continue
            for record, flag in zip(records, flags, strict=True):
                value = record.reads[site]
                if not flag:
                    continue
                uses = held.setdefault(value, [])
                uses.extend(u for u in record.uses[value] if u not in uses)
    position = {node: i for i, node in enumerate(graph)}
    return [_hold(graph, value, sorted(uses, key=lambda use: position[use[0]]))
            for value, uses in held.items()]


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
        producer = value.producer()
        if producer is not None and _is_constant(producer) and hold.outputs[0].uses():
            value = _lift(graph, producer, hold)
        if value.is_initializer() and value.name:
            kept.add(value.name)
        hold.outputs[0].replace_all_uses_with(value)
        graph.remove(hold, safe=True)
        if producer is not None and producer.graph is graph and not any(
                v.uses() or v in graph.outputs for v in producer.outputs):
            graph.remove(producer, safe=True)
    return kept


def _lift(graph: ir.Graph, constant: ir.Node, hold: ir.Node) -> ir.Value:
    """The Constant node's value as an initializer for the held uses: a Constant entering
    a call would be copied into that call's body (``outline``), where the siblings of the
    call read an input."""
    tensor = ir.convenience.get_const_tensor(constant.outputs[0])
    if tensor is None:
        return constant.outputs[0]
    held = hold.outputs[0]
    lifted = ir.Value(name=held.name, type=ir.TensorType(tensor.dtype),
                      shape=ir.Shape(tensor.shape), const_value=tensor)
    held.name = None
    graph.register_initializer(lifted)
    return lifted
