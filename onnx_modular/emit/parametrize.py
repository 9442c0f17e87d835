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

from collections.abc import Mapping, Sequence
from typing import Any

import onnx_ir as ir

from onnx_modular.emit.canonical import (
    graph_key,
    is_scalar_attr,
    is_scalar_constant,
    structural_key,
)
from onnx_modular.emit.walk import all_nodes

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


def _is_scalar_slot(attr: ir.Attr) -> bool:
    """A float scalar: a literal, or a reference to the function's own attribute (a body
    parametrized already; only this module writes references)."""
    if attr.is_ref():
        return attr.type in (ir.AttributeType.FLOAT, ir.AttributeType.TENSOR)
    return is_scalar_attr(attr)


def _is_scalar_source(node: ir.Node) -> bool:
    """A Constant node holding one float value, or its parametrized form."""
    attr = node.attributes.get("value")
    return _is_constant(node) and len(node.attributes) == 1 and attr is not None \
        and attr.type == ir.AttributeType.TENSOR and (attr.is_ref() or is_scalar_constant(node))


def _candidates(function: ir.Function) -> list[Slot]:
    slots: list[Slot] = []
    for i, node in enumerate(_computing(function)):
        for name, attr in node.attributes.items():
            if _is_scalar_slot(attr):
                slots.append(("attr", i, name))
        for j, value in enumerate(node.inputs):
            producer = value.producer() if value is not None else None
            if producer is not None and producer.graph is function.graph \
                    and _is_scalar_source(producer):
                slots.append(("const", i, j))
    return slots


def _read_elsewhere(function: ir.Function) -> bool:
    """A float scalar Constant of the body read where no slot reaches it: inside an
    ``If``/``Loop`` branch, or returned as the function's output. Its value in the other
    bodies would be lost (the branch kept the first body's), so the group is not merged."""
    outputs = set(function.outputs)
    for node in function:
        if not _is_scalar_source(node):
            continue
        value = node.outputs[0]
        if value in outputs or any(use.graph is not function.graph
                                   for use, _ in value.uses()):
            return True
    return False


def _value(nodes: list[ir.Node], slot: Slot) -> tuple[ir.Attr, ir.Node | None]:
    """The attribute holding ``slot``'s value, and the Constant node of a "const" slot."""
    kind, i, where = slot
    if kind == "attr":
        return nodes[i].attributes[where], None
    producer = nodes[i].inputs[where].producer()  # type: ignore[union-attr]
    assert producer is not None
    return producer.attributes["value"], producer


def _resolve(attr: ir.Attr, call: ir.Node, function: ir.Function) -> ir.Attr | None:
    """What ``attr`` of ``function``'s body is in ``call``: a literal, or a reference to the
    attribute of the function the call sits in (passed on); None if nothing sets it."""
    if not attr.is_ref():
        return attr
    assert attr.ref_attr_name is not None
    given = call.attributes.get(attr.ref_attr_name)
    if given is not None:
        return given
    default = function.attributes.get(attr.ref_attr_name)
    return default if default is not None and default.value is not None else None


def _comparable(attr: ir.Attr) -> Any:
    return ("ref", attr.ref_attr_name) if attr.is_ref() else repr(_plain(attr.value))


#: Per parameter: its slots, type, and its value in each call of the group's functions.
Parameter = tuple[list[Slot], ir.AttributeType, list[ir.Attr]]


def _parameters(group: Sequence[ir.Function],
                calls: Mapping[ir.OperatorIdentifier, list[ir.Node]]
                ) -> list[Parameter] | None:
    """The values that differ: per parameter, its slots, type and value in every call of
    the group's functions, in order; None when a call leaves a value unset.

    The first body may share one Constant between uses that other bodies keep apart (its
    ``x * 0.5`` and ``sigmoid(x) * 0.5`` where the next layer has ``x * 0.7``): uses join one
    parameter only where their values agree in every call, whichever Constant they read."""
    if any(_read_elsewhere(f) for f in group):
        return None
    bodies = [_computing(f) for f in group]
    by_source: dict[Any, Parameter] = {}
    order: list[Any] = []
    for slot in _candidates(group[0]):
        found = [_value(nodes, slot) for nodes in bodies]
        if not any(attr.is_ref() for attr, _ in found) \
                and len({repr(_plain(attr.value)) for attr, _ in found}) == 1:
            continue  # one literal everywhere
        values: list[ir.Attr] = []
        for function, (attr, _) in zip(group, found, strict=True):
            for call in calls.get(function.identifier(), ()):
                resolved = _resolve(attr, call, function)
                if resolved is None:
                    return None
                values.append(resolved)
        constant = found[0][1]
        source = slot if constant is None else \
            ("const", id(constant), tuple(_comparable(v) for v in values))
        if source not in by_source:
            by_source[source] = ([], found[0][0].type, values)
            order.append(source)
        by_source[source][0].append(slot)
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


def _named(name: str, kind: ir.AttributeType, value: ir.Attr) -> ir.Attr:
    """A call's value under the parameter's name: a literal, or the caller's reference."""
    if value.is_ref():
        assert value.ref_attr_name is not None
        return ir.RefAttr(name, value.ref_attr_name, kind)
    return ir.Attr(name, kind, value.value)


def _parametrize(group: Sequence[ir.Function], parameters: list[Parameter],
                 calls: Mapping[ir.OperatorIdentifier, list[ir.Node]]) -> None:
    base = group[0]
    nodes = _computing(base)
    taken: set[str] = set()
    given: dict[int, list[ir.Attr]] = {}  # id(call node) -> its values
    base.attributes.clear()
    for slots, kind, values in parameters:
        name = _name(slots, taken)
        if slots[0][0] == "const":  # the Constant's value comes from the call
            _own_constant(base, nodes, slots).attributes["value"] = \
                ir.RefAttr("value", name, kind)
        for slot in slots:
            if slot[0] == "attr":
                nodes[slot[1]].attributes[slot[2]] = ir.RefAttr(slot[2], name, kind)
        default = next((v.value for v in values if not v.is_ref()), None)
        base.attributes.add(ir.Attr(name, kind, default))
        at = iter(values)
        for function in group:
            for call in calls.get(function.identifier(), ()):
                given.setdefault(id(call), []).append(_named(name, kind, next(at)))
    for function in group:
        for call in calls.get(function.identifier(), ()):
            call.domain, call.op_type = base.domain, base.name
            call.attributes.clear()
            for attr in given.get(id(call), ()):
                call.attributes[attr.name] = attr


def _own_constant(function: ir.Function, nodes: list[ir.Node], slots: list[Slot]) -> ir.Node:
    """The Constant the parameter's uses (``slots``, all reading one Constant) read alone:
    the one they read when nothing else does, else a copy of it that they read instead (the
    other uses keep the literal, or take another parameter)."""
    constant = _value(nodes, slots[0])[1]
    assert constant is not None
    uses = {(id(node), index) for node, index in constant.outputs[0].uses()}
    mine = {(id(nodes[i]), j) for _, i, j in slots}
    if uses != mine:
        taken = {v.name for node in function for v in node.outputs} \
            | {v.name for v in function.inputs}
        name, n = f"{constant.outputs[0].name}_own", 0
        while name in taken:
            n += 1
            name = f"{constant.outputs[0].name}_own{n}"
        copy = ir.Node("", "Constant", [], attributes=[constant.attributes["value"]],
                       name=name, num_outputs=1)
        copy.outputs[0].name = name
        copy.outputs[0].type, copy.outputs[0].shape = \
            constant.outputs[0].type, constant.outputs[0].shape
        function.graph.insert_after(constant, copy)
        for _, i, j in slots:
            nodes[i].replace_input_with(j, copy.outputs[0])
        constant = copy
    constant.outputs[0].const_value = None
    return constant


def _calls(model: ir.Model) -> dict[ir.OperatorIdentifier, list[ir.Node]]:
    """Every call node (main graph, bodies, subgraphs) per function it calls."""
    calls: dict[ir.OperatorIdentifier, list[ir.Node]] = {}
    for node in all_nodes(model):
        if node.op_identifier() in model.functions:
            calls.setdefault(node.op_identifier(), []).append(node)
    return calls


def merge_scalar_variants(model: ir.Model, *, one_signature: bool = False
                          ) -> list[tuple[ir.Function, ir.Function]]:
    """Merge the functions of each class whose bodies differ only in float scalars into the
    first of them, parametrized. A body parametrized already takes part like any other (its
    references count as scalars, each call's values resolved): which layers happened to
    merge first (the two whose ``eps`` agreed) must not keep the others apart. Returns
    (merged away, kept) pairs; the merged-away functions are no longer in ``model``.

    ``one_signature``: only bodies outlined for the same input types and shapes, whose
    recorded types then still hold (before the optimizer, which specializes a body to them).
    """
    groups: dict[tuple[Any, ...], list[ir.Function]] = {}
    for function in model.functions.values():
        key = (function.domain, function.doc_string, len(function.inputs),
               len(function.outputs), structural_key(function.graph, signature=None,
                                                    scalars=True))
        if one_signature:
            if any(value.type is None for value in function.inputs):
                continue
            key += tuple((str(v.type), str(v.shape)) for v in function.inputs)
        groups.setdefault(key, []).append(function)
    merged: list[tuple[ir.Function, ir.Function]] = []
    for group in groups.values():
        if len(group) < 2:
            continue
        exact = {graph_key(f.graph, signature=False) for f in group}
        if len(exact) < len(group):
            continue  # equal bodies merge as they are first
        calls = _calls(model)  # as the groups merged before left them
        parameters = _parameters(group, calls)
        if parameters is None:
            continue
        _parametrize(group, parameters, calls)
        for function in group[1:]:
            del model.functions[function.identifier()]
            merged.append((function, group[0]))
    return merged
