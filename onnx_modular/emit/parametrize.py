"""Functions parametrized by attributes: ``CELU(1.0)`` and ``CELU(2.0)`` are one ``CELU``
function whose ``alpha`` each call sets, as TorchScript's ``export_modules_as_functions``
made them.

Bodies of one class that differ only in float scalars (an op's float attribute such as
``alpha`` or ``epsilon``, a one-element float Constant such as a clamp bound or a scale)
become the first body with those values as attribute references (``ref_attr_name``); every
call names its own values. Weights are inputs already and stay so. A parent whose children
were merged this way then differs from its siblings in its call nodes' attributes only, and
is parametrized in turn (``merge_equal_functions`` runs this to a fixpoint).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx_ir as ir

from onnx_modular.emit.canonical import (
    graph_key,
    is_scalar_attr,
    is_scalar_constant,
    structural_key,
)

#: ("attr", node index, attribute name) or ("const", node index, input index); node indices
#: count the body's nodes that are not Constant nodes (keys align those, not constants).
Slot = tuple[str, int, Any]


def _is_constant(node: ir.Node) -> bool:
    return node.op_type == "Constant" and node.domain in ("", "ai.onnx") and not node.inputs


def _computing(function: ir.Function) -> list[ir.Node]:
    return [n for n in function if not _is_constant(n)]


def _plain(value: Any) -> Any:
    """A comparable form of an attribute value."""
    if isinstance(value, ir.TensorProtocol):
        return (str(value.dtype), tuple(value.shape), value.numpy().tolist())
    return value


def _candidates(function: ir.Function) -> list[Slot]:
    slots: list[Slot] = []
    for i, node in enumerate(_computing(function)):
        for name, attr in node.attributes.items():
            if is_scalar_attr(attr):
                slots.append(("attr", i, name))
        for j, value in enumerate(node.inputs):
            producer = value.producer() if value is not None else None
            if producer is not None and producer.graph is function.graph \
                    and is_scalar_constant(producer):
                slots.append(("const", i, j))
    return slots


def _value(nodes: list[ir.Node], slot: Slot) -> tuple[ir.Attr, ir.Node | None]:
    """The attribute holding ``slot``'s value, and the Constant node of a "const" slot."""
    kind, i, where = slot
    if kind == "attr":
        return nodes[i].attributes[where], None
    producer = nodes[i].inputs[where].producer()  # type: ignore[union-attr]
    assert producer is not None
    return producer.attributes["value"], producer


def _parameters(group: Sequence[ir.Function]
                ) -> list[tuple[list[Slot], ir.AttributeType, list[ir.Attr]]] | None:
    """The values that differ: per parameter, its slots, type and value in each function;
    None when one Constant of the first body would need two values in another."""
    bodies = [_computing(f) for f in group]
    by_source: dict[Any, tuple[list[Slot], ir.AttributeType, list[ir.Attr]]] = {}
    order: list[Any] = []
    for slot in _candidates(group[0]):
        found = [_value(nodes, slot) for nodes in bodies]
        if len({repr(_plain(attr.value)) for attr, _ in found}) == 1:
            continue
        constant = found[0][1]
        source = slot if constant is None else ("const", id(constant))  # one per Constant
        if source not in by_source:
            by_source[source] = ([], found[0][0].type, [attr for attr, _ in found])
            order.append(source)
        slots, _, values = by_source[source]
        if any(_plain(v.value) != _plain(a.value) for v, (a, _) in zip(values, found,
                                                                      strict=True)):
            return None  # a constant shared by two uses with values that differ apart
        slots.append(slot)
    return [by_source[s] for s in order]


def _name(slots: list[Slot], taken: set[str]) -> str:
    """The attribute's name: the op attribute's (``alpha``), ``scalar`` for a Constant."""
    kind, _, where = slots[0]
    base = str(where) if kind == "attr" else "scalar"
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


def _parametrize(group: Sequence[ir.Function], model: ir.Model) -> None:
    parameters = _parameters(group)
    assert parameters is not None
    base = group[0]
    nodes = _computing(base)
    taken: set[str] = set()
    calls: dict[ir.OperatorIdentifier, list[ir.Attr]] = {f.identifier(): [] for f in group}
    for slots, kind, values in parameters:
        name = _name(slots, taken)
        for slot in slots:
            attr, constant = _value(nodes, slot)
            if constant is not None:  # the Constant's value comes from the call
                constant.attributes["value"] = ir.RefAttr("value", name, kind)
                constant.outputs[0].const_value = None
            else:
                nodes[slot[1]].attributes[slot[2]] = ir.RefAttr(slot[2], name, kind)
        base.attributes.add(ir.Attr(name, kind, values[0].value))
        for function, value in zip(group, values, strict=True):
            calls[function.identifier()].append(ir.Attr(name, kind, value.value))
    for node in (*model.graph.all_nodes(),
                 *(n for f in model.functions.values() for n in f.all_nodes())):
        attrs = calls.get(node.op_identifier())
        if attrs is None:
            continue
        node.domain, node.op_type = base.domain, base.name
        for attr in attrs:
            node.attributes[attr.name] = attr


def merge_scalar_variants(model: ir.Model) -> list[tuple[ir.Function, ir.Function]]:
    """Merge the functions of each class whose bodies differ only in float scalars into the
    first of them, parametrized. Returns (merged away, kept) pairs; the merged-away functions
    are no longer in ``model``."""
    groups: dict[tuple[Any, ...], list[ir.Function]] = {}
    for function in model.functions.values():
        if len(function.attributes):
            continue  # parametrized already: its calls set values a literal cannot match
        key = (function.domain, function.doc_string, len(function.inputs),
               len(function.outputs), structural_key(function.graph, signature=None,
                                                    scalars=True))
        groups.setdefault(key, []).append(function)
    merged: list[tuple[ir.Function, ir.Function]] = []
    for group in groups.values():
        if len(group) < 2 or _parameters(group) is None:
            continue
        exact = {graph_key(f.graph, signature=False) for f in group}
        if len(exact) < len(group):
            continue  # equal bodies merge as they are first
        _parametrize(group, model)
        for function in group[1:]:
            del model.functions[function.identifier()]
            merged.append((function, group[0]))
    return merged
