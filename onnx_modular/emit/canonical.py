"""One structural key for ONNX graphs: equal keys mean interchangeable graphs.

The key covers op types, domains, overloads, attributes (constant tensors by value), the
wiring between nodes, inputs and outputs, and the input types and shapes; it ignores value
and node names and metadata. The outliner keys function bodies with :func:`graph_key`
(node order counts: bodies are built in a deterministic order, and the key is cheap);
``compare`` keys whole inlined models with :func:`structural_key`'s other options (node order,
constant folding and weight values do not count), so that there is one notion of "same
structure" in the package.
"""

from __future__ import annotations

import hashlib
from collections import ChainMap
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np
import onnx_ir as ir

#: How a graph's own inputs enter the key: full type and shape, element type and rank, or
#: not at all.
Signature = Literal["shape", "rank"] | None

_CONSTANT_SCALARS = {"value_float": np.float32, "value_int": np.int64,
                     "value_floats": np.float32, "value_ints": np.int64}


def _digest(content: Any) -> str:
    return hashlib.blake2b(repr(content).encode(), digest_size=20).hexdigest()


def _tensor_key(tensor: Any) -> tuple[Any, ...]:
    array = tensor.numpy()
    digest = hashlib.blake2b(array.tobytes(), digest_size=16).hexdigest()
    return (str(tensor.dtype), tuple(array.shape), digest)


def _is_constant(node: ir.Node) -> bool:
    return node.op_type == "Constant" and node.domain in ("", "ai.onnx") and not node.inputs


def _is_identity(node: ir.Node) -> bool:
    return node.op_type == "Identity" and node.domain in ("", "ai.onnx") and bool(node.inputs)


class _Keyer:
    """The options of one :func:`structural_key` call, applied to a graph and its subgraphs."""

    def __init__(self, signature: Signature, order_free: bool, fold: bool,
                 constant_limit: int | None, scalars: bool = False) -> None:
        self.signature = signature
        self.order_free = order_free
        self.fold = fold
        self.constant_limit = constant_limit
        self.scalars = scalars

    # -- constants ---------------------------------------------------------------------------

    def _value_key(self, dtype: np.dtype, shape: tuple[int, ...],
                   data: Callable[[], np.ndarray]) -> tuple[Any, ...]:
        """A folded constant: by value up to ``constant_limit`` elements, else dtype and shape.

        ``data`` gives the array; it is called only when the value counts, so a large
        initializer is never read.
        """
        size = int(np.prod(shape, dtype=np.int64))
        if self.constant_limit is not None and size > self.constant_limit:
            return ("value", str(dtype), shape)
        array = np.ascontiguousarray(data())
        return ("value", str(dtype), shape,
                hashlib.blake2b(array.tobytes(), digest_size=16).hexdigest())

    def _initializer_key(self, value: ir.Value) -> tuple[Any, ...]:
        tensor = value.const_value
        if tensor is None:  # declared but not stored: its type is all there is
            return ("initializer", str(value.dtype),
                    None if value.shape is None else tuple(value.shape))
        return self._value_key(np.dtype(tensor.dtype.numpy()), tuple(tensor.shape),
                               tensor.numpy)

    def _folded_constant(self, node: ir.Node) -> tuple[Any, ...] | None:
        """A Constant node keyed as an initializer holding its value would be."""
        if len(node.attributes) != 1:
            return None
        ((name, attr),) = node.attributes.items()
        if attr.is_ref():
            return None
        if name == "value" and attr.type == ir.AttributeType.TENSOR:
            tensor = attr.as_tensor()
            return self._value_key(np.dtype(tensor.dtype.numpy()), tuple(tensor.shape),
                                   tensor.numpy)
        if name in _CONSTANT_SCALARS:
            array = np.asarray(attr.value, dtype=_CONSTANT_SCALARS[name])
            return self._value_key(array.dtype, tuple(array.shape), lambda: array)
        return None

    # -- attributes --------------------------------------------------------------------------

    def _attr_key(self, attr: ir.Attr, outer: Mapping[ir.Value, Any],
                  scalars: bool | None = None) -> Any:
        """``scalars`` (default: the key's own): a float scalar counts by kind only, where
        :mod:`.parametrize` can give each call its own value."""
        if (self.scalars if scalars is None else scalars) \
                and (is_scalar_attr(attr) or _is_scalar_ref(attr)):
            return ("scalar", attr.type)
        if attr.is_ref():
            return ("ref", attr.ref_attr_name)
        value = attr.value
        if attr.type in (ir.AttributeType.TENSOR, ir.AttributeType.SPARSE_TENSOR):
            return ("tensor", _tensor_key(value))
        if attr.type == ir.AttributeType.TENSORS:
            return ("tensors", tuple(_tensor_key(t) for t in value))
        if attr.type == ir.AttributeType.GRAPH:
            return ("graph", self._subgraph(value, outer))
        if attr.type == ir.AttributeType.GRAPHS:
            return ("graphs", tuple(self._subgraph(g, outer) for g in value))
        if isinstance(value, (list, tuple)):
            return tuple(value)
        return value if isinstance(value, (int, float, str, bytes)) else repr(value)

    def _subgraph(self, graph: ir.Graph, outer: Mapping[ir.Value, Any]) -> str:
        # A subgraph's inputs are part of the attribute, never the call's shapes: they count
        # even where the enclosing graph's signature is left out. A subgraph's references to
        # enclosing values resolve by their keys there, not by names (an If branch of one
        # block reads `linear`, the same branch of the next block `linear_1`).
        # Scalars count by value there: parametrizing reaches a body's own nodes only, and
        # two bodies differing in an If branch's scale are two functions.
        sub = _Keyer(self.signature or "shape", self.order_free, self.fold,
                     self.constant_limit, scalars=False)
        return sub.key(graph, outer, nested=True)

    # -- graphs ------------------------------------------------------------------------------

    def _signature(self, graph: ir.Graph) -> tuple[Any, ...]:
        if self.signature == "shape":
            return tuple((str(v.type), str(v.shape)) for v in graph.inputs)
        if self.signature == "rank":
            return tuple((str(v.dtype), None if v.shape is None else len(v.shape))
                         for v in graph.inputs)
        return ()

    def key(self, graph: ir.Graph, outer: Mapping[ir.Value, Any], nested: bool = False) -> str:
        tokens: dict[ir.Value, Any] = {}
        for i, value in enumerate(graph.inputs):
            tokens[value] = ("in", i)
        if self.fold or nested:  # a subgraph's initializers are its constants (If branches)
            for value in graph.initializers.values():
                tokens.setdefault(value, self._initializer_key(value))

        scope = ChainMap(tokens, outer)  # what a subgraph of this graph can refer to

        def token(v: ir.Value | None) -> Any:
            if v is None:
                return None
            if v in tokens:
                return tokens[v]
            if self.order_free:
                return outer.get(v, ("outer",))
            return ("outer", outer[v]) if v in outer else ("outer", v.name)

        parts: list[Any] = []
        for node in graph:
            if self.fold and _is_identity(node):  # passes its input on unchanged
                tokens[node.outputs[0]] = token(node.inputs[0])
                continue
            if _is_constant(node):  # where a constant sits does not matter, only its value
                if self.scalars and (is_scalar_constant(node) or _is_ref_constant(node)):
                    # by kind only: a parametrized body's reference carries no dtype, and
                    # each call sets its value with its own
                    tokens[node.outputs[0]] = ("scalar",)
                    continue
                folded = self._folded_constant(node) if self.fold else None
                # by value: a scalar in another form (``value_float``) is no slot to
                # parametrize
                tokens[node.outputs[0]] = folded if folded is not None else (
                    "const", tuple(sorted((k, self._attr_key(a, scope, scalars=False))
                                          for k, a in node.attributes.items())))
                continue
            inputs = tuple(token(v) for v in node.inputs)
            attrs = tuple(sorted((name, self._attr_key(a, scope))
                                 for name, a in node.attributes.items()))
            content = (node.domain, node.op_type, node.overload, inputs, attrs,
                       len(node.outputs))
            if self.order_free:
                # a node is its content and its inputs' keys: order and position do not count
                node_key = _digest(content)
                parts.append(node_key)
                for k, out in enumerate(node.outputs):
                    tokens[out] = ("n", node_key, k)
                continue
            # Numbered among non-constant nodes only: a constant placed elsewhere in one body
            # (torch.onnx shares constants; the first user's call keeps the original) must not
            # shift the references of every node after it.
            n = len(parts)
            parts.append(content)
            for k, out in enumerate(node.outputs):
                tokens[out] = ("n", n, k)
        if self.order_free:
            parts.sort()
        outputs = tuple(token(v) for v in graph.outputs)
        # Input types and shapes belong to the key: the optimizer specializes a body to the
        # shapes it sees, so one body must not serve calls of different shapes.
        return _digest((parts, outputs, self._signature(graph)))


def is_scalar_attr(attr: ir.Attr) -> bool:
    """A float attribute (an activation's alpha, a norm's epsilon) or a one-element float
    tensor attribute: a value a function may take as its own attribute."""
    if attr.is_ref():
        return False
    if attr.type == ir.AttributeType.FLOAT:
        return True
    if attr.type != ir.AttributeType.TENSOR:
        return False
    tensor = attr.value
    return tensor.size == 1 and tensor.dtype.is_floating_point()


def _is_scalar_ref(attr: ir.Attr) -> bool:
    """A reference to a function's attribute of a scalar's type (a parametrized body)."""
    return attr.is_ref() and attr.type in (ir.AttributeType.FLOAT, ir.AttributeType.TENSOR)


def _is_ref_constant(node: ir.Node) -> bool:
    """A Constant whose value the call sets (a parametrized body's scalar)."""
    attr = node.attributes.get("value")
    return _is_constant(node) and len(node.attributes) == 1 and attr is not None \
        and _is_scalar_ref(attr)


def is_scalar_constant(node: ir.Node) -> bool:
    """A Constant node holding one floating-point value (a clamp bound, a scale)."""
    attr = node.attributes.get("value")
    return (_is_constant(node) and len(node.attributes) == 1 and attr is not None
            and attr.type == ir.AttributeType.TENSOR and is_scalar_attr(attr))


def structural_key(graph: ir.Graph, *, signature: Signature = "shape",
                   order_free: bool = False, fold: bool = False,
                   constant_limit: int | None = None, scalars: bool = False) -> str:
    """Canonical digest of a graph (or function body); value and node names never count.

    ``signature``: how the graph's inputs enter ("shape": type and shape; "rank": element
    type and rank; None: not at all). ``order_free``: each node is keyed by its content and
    its inputs' keys and the nodes form a multiset, so two topological orders of one graph
    key alike; otherwise nodes are numbered in graph order (cheaper; enough for bodies built
    deterministically). ``fold``: an Identity passes its input's key on, and initializers and
    Constant nodes are keyed by value alike, so a model and its constant-folded twin key
    alike. ``constant_limit``: folded constants with more elements (weights) count by dtype
    and shape only. ``scalars``: float attributes and one-element float constants count by
    type only, references to a function's attributes like them (bodies that differ in such
    values alone key alike, parametrized already or not).
    """
    return _Keyer(signature, order_free, fold, constant_limit, scalars).key(graph, {})


def graph_key(graph: ir.Graph, signature: bool = True) -> str:
    """The outliner's key of a function body: in node order, constants by value.

    ``signature=False`` leaves the input types and shapes out: for bodies already optimized,
    equal keys then mean the same computation whatever the shapes.
    """
    return structural_key(graph, signature="shape" if signature else None)
