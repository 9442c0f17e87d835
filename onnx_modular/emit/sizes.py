"""Sizes a function body needs, computed in the body from its own activations.

Under dynamic shapes torch.export computes a size once (``sym_size(input_ids, 1)``) and
every module call reads it: outlined as it is, the size would be a function input, computed
in the parent and passed down through every level. A compiler that compiles a layer once
(Qualcomm's ``qaic-compile -sub-functions``) wants a body whose ``Range``, ``Reshape`` and
``Expand`` sizes come from its own activations' shapes, not from an argument, and a layer
whose signature is activations and weights alone. So a size read by a call is recomputed
inside its body: the shape arithmetic that made it is copied in, each ``Shape(x)`` it starts
from replaced by the shape of one of the call's own activations that has the same
(symbolic) dimensions. A size that cannot be so derived stays an input.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import onnx_ir as ir

#: Operators of shape arithmetic a size may be computed with.
_SHAPE_ARITHMETIC = frozenset({
    "Shape", "Constant", "Gather", "Squeeze", "Unsqueeze", "Concat", "Cast", "Reshape",
    "Slice", "Add", "Sub", "Mul", "Div", "Mod", "Max", "Min", "Neg", "Identity", "Abs",
    "ReduceProd", "ReduceSum"})
_INTEGER = frozenset({ir.DataType.INT64, ir.DataType.INT32})
#: A size is a scalar or a short vector; its arithmetic a handful of nodes.
_MAX_LENGTH, _MAX_NODES, _MAX_CONSTANT = 8, 48, 64


def is_size(value: ir.Value) -> bool:
    """An integer scalar or short vector computed by some node (a size, or a shape)."""
    shape = value.shape
    return (value.dtype in _INTEGER and shape is not None and value.producer() is not None
            and (len(shape) == 0 or (len(shape) == 1 and isinstance(shape[0], int)
                                     and shape[0] <= _MAX_LENGTH)))


def derive(size: ir.Value, activations: Sequence[tuple[ir.Value, ir.Value]], name: str
           ) -> list[ir.Node] | None:
    """Nodes computing ``size`` from the shapes of ``activations`` ((outer value, the
    body's input standing for it)), the last one's first output being it; None when the
    size's arithmetic starts from anything but shapes and constants, or reads a dimension
    no activation has."""
    cone = _cone(size)
    if cone is None:
        return None
    clones: dict[ir.Value, ir.Value] = {}
    nodes: list[ir.Node] = []
    for node in cone:
        if node.op_type == "Shape":
            made = _shape_from(node, activations, f"{name}_{len(nodes)}")
            if made is None:
                return None
            nodes.extend(made)
            clones[node.outputs[0]] = made[-1].outputs[0]
            continue
        inputs = []
        for value in node.inputs:
            if value is None or value in clones:
                inputs.append(clones.get(value) if value is not None else None)
                continue
            constant = _constant(value, f"{name}_{len(nodes)}")  # a small initializer
            nodes.append(constant)
            clones[value] = constant.outputs[0]
            inputs.append(constant.outputs[0])
        clone = ir.Node(node.domain, node.op_type, inputs,
                        attributes=list(node.attributes.values()),
                        num_outputs=len(node.outputs), name=f"{name}_{len(nodes)}")
        for old, new in zip(node.outputs, clone.outputs, strict=True):
            new.name = f"{name}_{len(nodes)}_{old.index()}"
            new.type, new.shape = old.type, old.shape
            clones[old] = new
        nodes.append(clone)
    result = clones[size]
    if nodes[-1].outputs[0] is not result:  # the size is not the last node's first output
        nodes.append(ir.node("Identity", [result], name=f"{name}_{len(nodes)}"))
        nodes[-1].outputs[0].type, nodes[-1].outputs[0].shape = size.type, size.shape
    nodes[-1].outputs[0].name = name
    return nodes


def _cone(size: ir.Value) -> list[ir.Node] | None:
    """The shape arithmetic ``size`` is computed by, producers first; None where it reads
    anything but shapes, constants and small integer initializers."""
    order: list[ir.Node] = []
    seen: set[ir.Node] = set()

    def visit(value: ir.Value) -> bool:
        producer = value.producer()
        if producer is None:
            return _small_initializer(value)
        if producer in seen:
            return True
        if (producer.domain not in ("", "ai.onnx") or producer.op_type not in _SHAPE_ARITHMETIC
                or len(seen) >= _MAX_NODES):
            return False
        seen.add(producer)
        if producer.op_type != "Shape":
            for value_in in producer.inputs:
                if value_in is not None and not visit(value_in):
                    return False
        order.append(producer)
        return True

    return order if visit(size) else None


def _small_initializer(value: ir.Value) -> bool:
    tensor = value.const_value
    return (value.is_initializer() and tensor is not None and tensor.size <= _MAX_CONSTANT
            and value.dtype in _INTEGER)


def _constant(value: ir.Value, name: str) -> ir.Node:
    """A copy of a small integer initializer, as a Constant of the body."""
    assert value.const_value is not None
    node = ir.node("Constant", [], attributes={
        "value": ir.tensor(value.const_value.numpy(), name=name)}, name=name)
    node.outputs[0].name, node.outputs[0].type = name, value.type
    node.outputs[0].shape = value.shape
    return node


def _shape_from(shape: ir.Node, activations: Sequence[tuple[ir.Value, ir.Value]], name: str
                ) -> list[ir.Node] | None:
    """``Shape(x)`` (with its start and end) as the shape of the body's own activations:
    each dimension from an activation with the same symbolic dimension, or a constant."""
    source = shape.inputs[0]
    dims = list(source.shape) if source is not None and source.shape is not None else None
    if dims is None:
        return None
    start = shape.attributes.get_int("start", 0)
    end = shape.attributes.get_int("end", len(dims))
    wanted = dims[slice(start, end)]
    parts: list[tuple[ir.Value, int, int] | int] = []  # (activation, from, to) or a size
    for dim in wanted:
        if isinstance(dim, int):
            parts.append(dim)
            continue
        found = _axis_with(str(dim), activations)
        if found is None:
            return None
        value, axis = found
        last = parts[-1] if parts else None
        if isinstance(last, tuple) and last[0] is value and last[2] == axis:
            parts[-1] = (value, last[1], axis + 1)  # the next axis of the same activation
        else:
            parts.append((value, axis, axis + 1))
    nodes: list[ir.Node] = []
    pieces: list[ir.Value] = []
    for part in parts:
        k = f"{name}_{len(nodes)}"
        if isinstance(part, int):
            node = ir.node("Constant", [], attributes={
                "value": ir.tensor(np.array([part], dtype=np.int64), name=k)}, name=k)
        else:
            node = ir.node("Shape", [part[0]], attributes={"start": part[1], "end": part[2]},
                           name=k)
        node.outputs[0].name = k
        nodes.append(node)
        pieces.append(node.outputs[0])
    if len(pieces) != 1 or not nodes:
        k = f"{name}_{len(nodes)}"
        nodes.append(ir.node("Concat", pieces, attributes={"axis": 0}, name=k))
        nodes[-1].outputs[0].name = k
    out = nodes[-1].outputs[0]
    out.dtype, out.shape = ir.DataType.INT64, ir.Shape([len(wanted)])
    return nodes


def _axis_with(dim: str, activations: Iterable[tuple[ir.Value, ir.Value]]
               ) -> tuple[ir.Value, int] | None:
    """The first activation (the body's input) and axis whose dimension is ``dim``."""
    for outer, inner in activations:
        for axis, d in enumerate(outer.shape or ()):
            if not isinstance(d, int) and str(d) == dim:
                return inner, axis
    return None


def activations_of(values: Iterable[ir.Value]) -> list[ir.Value]:
    """The values a call reads that can lend their shape: computed tensors or model
    inputs, with a known rank (weights and sizes excluded)."""
    return [v for v in values if v.shape is not None and not v.is_initializer()
            and v.const_value is None and not is_size(v) and len(v.shape) > 0]
