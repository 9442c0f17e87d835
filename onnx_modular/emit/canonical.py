"""A structural key for a function body: equal keys mean interchangeable bodies.

The key covers op types, domains, overloads, attributes (constant tensors by value), the
wiring between nodes, inputs and outputs, and the input types and shapes; it ignores value
and node names and metadata.
"""

from __future__ import annotations

import hashlib
from typing import Any

import onnx_ir as ir


def _attr_key(attr: ir.Attr) -> Any:
    if attr.is_ref():
        return ("ref", attr.ref_attr_name)
    value = attr.value
    if attr.type in (ir.AttributeType.TENSOR, ir.AttributeType.SPARSE_TENSOR):
        return ("tensor", _tensor_key(value))
    if attr.type == ir.AttributeType.TENSORS:
        return ("tensors", tuple(_tensor_key(t) for t in value))
    if attr.type == ir.AttributeType.GRAPH:
        return ("graph", graph_key(value))
    if attr.type == ir.AttributeType.GRAPHS:
        return ("graphs", tuple(graph_key(g) for g in value))
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return value if isinstance(value, (int, float, str, bytes)) else repr(value)


def _tensor_key(tensor: Any) -> tuple[Any, ...]:
    array = tensor.numpy()
    digest = hashlib.blake2b(array.tobytes(), digest_size=16).hexdigest()
    return (str(tensor.dtype), tuple(array.shape), digest)


def _is_constant(node: ir.Node) -> bool:
    return node.op_type == "Constant" and node.domain in ("", "ai.onnx") and not node.inputs


def graph_key(graph: ir.Graph, signature: bool = True) -> str:
    """Canonical digest of a graph (or function body) in its node order, constants by value.

    ``signature=False`` leaves the input types and shapes out: for bodies already optimized,
    equal keys then mean the same computation whatever the shapes.
    """
    tokens: dict[ir.Value, tuple[Any, ...]] = {}
    for i, value in enumerate(graph.inputs):
        tokens[value] = ("in", i)
    parts: list[Any] = []
    for node in graph:
        if _is_constant(node):  # where a constant sits does not matter, only its value
            key = ("const", tuple(sorted((k, _attr_key(a)) for k, a in node.attributes.items())))
            tokens[node.outputs[0]] = key
            continue
        # Numbered among non-constant nodes only: a constant placed elsewhere in one body
        # (torch.onnx shares constants; the first user's call keeps the original) must not
        # shift the references of every node after it.
        n = len(parts)
        inputs = tuple(
            None if v is None else tokens.get(v, ("outer", v.name)) for v in node.inputs)
        attrs = tuple(sorted((name, _attr_key(a)) for name, a in node.attributes.items()))
        parts.append((node.domain, node.op_type, node.overload, inputs, attrs,
                      len(node.outputs)))
        for k, out in enumerate(node.outputs):
            tokens[out] = ("n", n, k)
    outputs = tuple(tokens.get(v, ("outer", v.name)) for v in graph.outputs)
    # Input types and shapes belong to the key: the optimizer specializes a body to the
    # shapes it sees, so one body must not serve calls of different shapes.
    types = tuple((str(v.type), str(v.shape)) for v in graph.inputs) if signature else ()
    return hashlib.blake2b(repr((parts, outputs, types)).encode(),
                           digest_size=20).hexdigest()
