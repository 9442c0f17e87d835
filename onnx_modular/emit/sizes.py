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

After the optimizer, :class:`SimplifyOwnSizes` makes those sizes cheap for the runtime: one
``Shape`` slice per run of dimensions, and a ``Reshape`` whose computed shape repeats its
own input's leading dimensions takes a constant with 0s instead (ONNX Runtime drops a
function's value_info when it inlines, and infers shapes through a constant only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import onnx_ir as ir

from onnx_modular.emit.infra import EmitPass
from onnx_modular.emit.symbolic import by_value

#: Operators of shape arithmetic a size may be computed with.
SHAPE_ARITHMETIC = frozenset({
    "Shape", "Constant", "Gather", "Squeeze", "Unsqueeze", "Concat", "Cast", "Reshape",
    "Slice", "Add", "Sub", "Mul", "Div", "Mod", "Max", "Min", "Neg", "Identity", "Abs",
    "ReduceProd", "ReduceSum", "Sqrt", "Reciprocal"})
_INTEGER = frozenset({ir.DataType.INT64, ir.DataType.INT32})
_FLOAT = frozenset({ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16,
                    ir.DataType.BFLOAT16})
#: A size is a scalar or a short vector; its arithmetic a handful of nodes.
_MAX_LENGTH, _MAX_NODES, _MAX_CONSTANT = 8, 48, 64


def is_size(value: ir.Value) -> bool:
    """An integer scalar or short vector computed by some node (a size, or a shape), or a
    float scalar computed from sizes alone (``1.0 / x.shape[1]``)."""
    shape = value.shape
    if shape is None or value.producer() is None:
        return False
    if value.dtype in _FLOAT:
        return tuple(shape) in ((), (1,)) and _cone(value) is not None
    return value.dtype in _INTEGER and (len(shape) == 0 or (
        len(shape) == 1 and isinstance(shape[0], int) and shape[0] <= _MAX_LENGTH))


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
            if made is None:  # a dimension no activation has: maybe the size's value has
                return by_value(size, cone, activations, name)
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
        if (producer.domain not in ("", "ai.onnx") or producer.op_type not in SHAPE_ARITHMETIC
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
    """A constant of shape arithmetic: a few integers, or one float (``1.0`` of ``1.0 / n``)."""
    tensor = value.const_value
    return value.is_initializer() and tensor is not None and (
        (value.dtype in _INTEGER and tensor.size <= _MAX_CONSTANT)
        or (value.dtype in _FLOAT and tensor.size == 1))


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
        if not _named(dim):  # an unknown dimension equals nothing, not another unknown one
            return None
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


def retarget_shape(shape: ir.Node, candidates: Sequence[ir.Value]) -> bool:
    """``Shape(x)`` (with its start and end) made to read the same dimensions, in one run,
    of one of ``candidates`` instead of ``x``; False, unchanged, where none has them."""
    source = shape.inputs[0]
    if source is None or source.shape is None:
        return False
    dims = list(source.shape)
    start = shape.attributes.get_int("start", 0)
    end = shape.attributes.get_int("end", len(dims))
    wanted = dims[slice(start, end)]
    if not wanted or not all(isinstance(d, int) or _named(d) for d in wanted):
        return False
    keys = [d if isinstance(d, int) else str(d) for d in wanted]
    for value in candidates:
        have = [d if isinstance(d, int) else str(d) if _named(d) else None
                for d in (value.shape or ())]
        for at in range(len(have) - len(keys) + 1):
            if have[at:at + len(keys)] == keys:
                shape.replace_input_with(0, value)
                shape.attributes["start"] = ir.AttrInt64("start", at)
                shape.attributes["end"] = ir.AttrInt64("end", at + len(keys))
                return True
    return False


def _axis_with(dim: str, activations: Iterable[tuple[ir.Value, ir.Value]]
               ) -> tuple[ir.Value, int] | None:
    """The first activation (the body's input) and axis whose dimension is ``dim``."""
    for outer, inner in activations:
        for axis, d in enumerate(outer.shape or ()):
            if not isinstance(d, int) and _named(d) and str(d) == dim:
                return inner, axis
    return None


def _named(dim: object) -> bool:
    """A symbolic dimension torch.export named (``s72``): equal names are equal sizes. An
    unknown one (no name, or inference's ``unk__N``) says nothing."""
    value = getattr(dim, "value", dim)
    return isinstance(value, str) and bool(value) and not value.startswith("unk__")


def activations_of(values: Iterable[ir.Value]) -> list[ir.Value]:
    """The values a call reads that can lend their shape: computed tensors or model
    inputs, with a known rank (weights and sizes excluded)."""
    return [v for v in values if v.shape is not None and not v.is_initializer()
            and v.const_value is None and not is_size(v) and len(v.shape) > 0]


def merge_shape_slices(graph: ir.Graph) -> int:
    """``Concat(Shape(a, 0, 1), Shape(a, 1, 2), ...)`` -> ``Concat(Shape(a, 0, 2), ...)``:
    the sizes a body computes for itself, one dimension each, read as one slice where a
    shape is assembled from them and nothing else reads them (fewer nodes for ONNX Runtime
    to run, and equal slices of one tensor left for its common-subexpression pass to
    share). Returns how many pairs were merged."""
    plans: list[tuple[ir.Node, list[ir.Value | None], list[tuple[int, ir.Value, ir.Value]]]] = []
    merged_uses: dict[ir.Value, int] = {}
    for node in graph:
        if node.op_type != "Concat" or node.domain not in ("", "ai.onnx"):
            continue
        pairs = []
        pieces = list(node.inputs)
        k = 0
        while k + 1 < len(pieces):
            first, second = _shape_span(pieces[k]), _shape_span(pieces[k + 1])
            if first is not None and second is not None and first[0] is second[0] \
                    and first[2] == second[1]:
                pairs.append((k, pieces[k], pieces[k + 1]))
                for v in (pieces[k], pieces[k + 1]):
                    merged_uses[v] = merged_uses.get(v, 0) + 1  # type: ignore[index]
                k += 2
            else:
                k += 1
        if pairs:
            plans.append((node, pieces, pairs))
    # only where nothing else reads a slice: a merge that leaves it in place adds a node
    whole_uses = {v for v, n in merged_uses.items() if len(v.uses()) == n
                  and not v.is_graph_output()}
    made: dict[tuple[int, int, int], ir.Value] = {}  # one node per slice, for every Concat
    merged = 0
    for node, pieces, pairs in plans:
        out = list(pieces)
        for k, first, second in reversed(pairs):
            if first not in whole_uses or second not in whole_uses:
                continue
            source, start, _ = _shape_span(first)  # type: ignore[misc]
            _, _, end = _shape_span(second)  # type: ignore[misc]
            key = (id(source), start, end)
            if key not in made:
                whole = ir.node("Shape", [source], attributes={"start": start, "end": end})
                whole.outputs[0].name = f"{first.name}_to_{end}"  # type: ignore[union-attr]
                whole.outputs[0].type = ir.TensorType(ir.DataType.INT64)
                whole.outputs[0].shape = ir.Shape([end - start])
                graph.insert_before(node, whole)
                made[key] = whole.outputs[0]
            out[k:k + 2] = [made[key]]
            merged += 1
        if len(out) == len(pieces):
            continue
        replacement = ir.node("Concat", out, attributes={"axis": 0}, name=node.name)
        old = node.outputs[0]
        new = replacement.outputs[0]
        new.name, new.type, new.shape = old.name, old.type, old.shape
        graph.insert_before(node, replacement)
        old.replace_all_uses_with(new)
        for i, output in enumerate(graph.outputs):
            if output is old:
                graph.outputs[i] = new
        graph.remove(node, safe=True)
    if merged:
        remove_dead_size_nodes(graph)  # the one-dimension slices no one reads now
    return merged


def _shape_span(value: ir.Value | None) -> tuple[ir.Value, int, int] | None:
    """(tensor, start, end) of a ``Shape`` slice with explicit non-negative bounds."""
    producer = value.producer() if value is not None else None
    if producer is None or producer.op_type != "Shape" or producer.domain not in ("", "ai.onnx"):
        return None
    start = producer.attributes.get_int("start", 0)
    end = producer.attributes.get_int("end", None)
    source = producer.inputs[0]
    if end is None or start < 0 or end < 0 or source is None:
        return None
    return source, start, end


def copy_own_dims(graph: ir.Graph) -> int:
    """Computed shapes that repeat the input's own dimensions become constants:
    ``Reshape(x, Concat(Shape(a, 0, 2), [4, 8]))`` -> ``Reshape(x, [0, 0, 4, 8])``
    (``allowzero=0``: a 0 copies the input's dimension) and
    ``Expand(x, Concat(Shape(a, 0, 1), [2, 2], Shape(a, 1, 2), [8]))`` ->
    ``Expand(x, [1, 2, 2, 1, 8])`` (a 1 keeps it), where ``a``'s dimensions are ``x``'s at
    the same positions (same symbolic names).

    A body that computes its sizes for itself reshapes and expands with computed shapes;
    ONNX Runtime, which drops a function's value_info when it inlines, cannot infer the
    results' shapes and then skips fusions that need them, and it keeps a ``Shape`` and a
    ``Concat`` per call. The constants mean the same for every size (an empty one too), and
    shape inference reads them. Returns the number of nodes rewritten.
    """
    rewritten = 0
    made: dict[tuple[int, ...], ir.Value] = {}  # one Constant per shape, shared by its users
    for node in list(graph):
        target = _constant_own_dims(node)
        if target is None:
            continue
        if tuple(target) not in made:
            name = f"{node.name or node.op_type}_own_dims"
            constant = ir.node("Constant", [], attributes={
                "value": ir.tensor(np.array(target, dtype=np.int64), name=name)}, name=name)
            constant.outputs[0].name = name
            constant.outputs[0].dtype = ir.DataType.INT64
            constant.outputs[0].shape = ir.Shape([len(target)])
            graph.insert_before(node, constant)
            made[tuple(target)] = constant.outputs[0]
        node.replace_input_with(1, made[tuple(target)])
        if node.op_type == "Reshape":
            node.attributes["allowzero"] = ir.AttrInt64("allowzero", 0)
        rewritten += 1
    if rewritten:
        remove_dead_size_nodes(graph)
    return rewritten


def _constant_own_dims(node: ir.Node) -> list[int] | None:
    """The constant a Reshape's or Expand's computed shape equals (or, for a Reshape with
    a constant shape, the one that says its -1), or None."""
    if (node.op_type not in ("Reshape", "Expand") or node.domain not in ("", "ai.onnx")
            or len(node.inputs) < 2 or node.inputs[0] is None or node.inputs[1] is None
            or node.inputs[0].shape is None):
        return None
    dims = list(node.inputs[0].shape)
    constant = ir.convenience.get_const_tensor(node.inputs[1])
    if constant is not None:
        if node.op_type != "Reshape" or constant.numpy().ndim != 1:
            return None
        return _minus_one_as_copy([int(v) for v in constant.numpy()], dims,
                                  node.attributes.get_int("allowzero", 0))
    entries = _shape_entries(node.inputs[1])
    if entries is None:
        return None
    if node.op_type == "Expand":
        return _expand_own_dims(entries, dims)
    return _reshape_own_dims(entries, dims, node.attributes.get_int("allowzero", 0))


def _minus_one_as_copy(target: list[int], dims: list[object], allowzero: int
                       ) -> list[int] | None:
    """``[-1, 17, 4, 8]`` of a ``[b, 17, 32]`` input -> ``[0, 17, 4, 8]``: the -1 stands
    for the input's one symbolic dimension at its position, the other sizes being static
    and accounting for every other element. ONNX shape inference cannot name a -1 of a
    symbolic size (ViT's heads split loses the batch name, and with it ORT's last
    ``SkipLayerNormalization`` fusion); a copy it can, and an empty batch reshapes too."""
    if target.count(-1) != 1 or (allowzero == 1 and 0 in target):
        return None
    i = target.index(-1)
    symbolic = [j for j, d in enumerate(dims) if not isinstance(d, int)]
    rest = [e for j, e in enumerate(target) if j != i]
    if symbolic != [i] or not _named(dims[i]) or any(e <= 0 for e in rest):
        return None
    others = [d for j, d in enumerate(dims) if j != i]
    if int(np.prod(others, dtype=np.int64)) != int(np.prod(rest, dtype=np.int64)):
        return None
    return [0 if j == i else e for j, e in enumerate(target)]


def _same_dim(entry: int | str, dim: object) -> bool:
    return isinstance(entry, str) and _named(dim) and str(dim) == entry


def _reshape_own_dims(entries: list[int | str], dims: list[object], allowzero: int
                      ) -> list[int] | None:
    """0 where the entry is the input's dimension at its position; literals stay, none of
    them a 0 under ``allowzero=1`` (an empty axis, which the 0 would turn into a copy)."""
    target: list[int] = []
    for position, entry in enumerate(entries):
        if isinstance(entry, int):
            if entry == 0 and allowzero == 1:
                return None
            target.append(entry)
        elif position < len(dims) and _same_dim(entry, dims[position]):
            target.append(0)
        else:
            return None
    if 0 not in target:
        return None
    return _resolve_minus_one(target, dims)


def _resolve_minus_one(target: list[int], dims: list[object]) -> list[int]:
    """A -1 replaced by the size it stands for where the dimensions not copied are static
    (``[0, 0, -1, 8]`` of a ``[b, s, 32]`` input is ``[0, 0, 4, 8]``): the whole output
    shape is then inferable, and an empty input reshapes as well (-1 of zero elements is
    ambiguous)."""
    if -1 not in target:
        return target
    copied = {i for i, entry in enumerate(target) if entry == 0}
    rest = [d for i, d in enumerate(dims) if i not in copied]
    known = [entry for entry in target if entry > 0]
    if not all(isinstance(d, int) for d in rest):
        return target
    total, part = int(np.prod(rest, dtype=np.int64)), int(np.prod(known, dtype=np.int64))
    if part == 0 or total % part:
        return target
    return [total // part if entry == -1 else entry for entry in target]


def _expand_own_dims(entries: list[int | str], dims: list[object]) -> list[int] | None:
    """1 where the entry is the input's dimension it broadcasts with (shapes align at
    their last axis): ``max(d, 1)`` broadcasting gives back ``d``, 0 included."""
    offset = len(entries) - len(dims)
    if offset < 0:
        return None
    target: list[int] = []
    for position, entry in enumerate(entries):
        if isinstance(entry, int):
            target.append(entry)
        elif position >= offset and _same_dim(entry, dims[position - offset]):
            target.append(1)
        else:
            return None
    return target if any(isinstance(e, str) for e in entries) else None


def _shape_entries(shape: ir.Value, piece_entries: Callable[
        [ir.Value | None], list[int | str] | None] | None = None) -> list[int | str] | None:
    """A computed shape's entries: integers and symbolic dimension names, from a Concat of
    constants and ``Shape`` slices (or one slice), each piece read by ``piece_entries``
    (:func:`_piece_entries` by default); None for anything else."""
    piece_entries = piece_entries or _piece_entries
    producer = shape.producer()
    if producer is None or producer.domain not in ("", "ai.onnx"):
        return None
    if producer.op_type == "Concat":
        pieces = list(producer.inputs)
    elif producer.op_type == "Shape":
        pieces = [shape]
    else:
        return None
    entries: list[int | str] = []
    for piece in pieces:
        found = piece_entries(piece)
        if found is None:
            return None
        entries.extend(found)
    return entries


def _piece_entries(piece: ir.Value | None) -> list[int | str] | None:
    """One piece of a computed shape: integers (a constant, or a static dimension) and
    symbolic dimension names (from a ``Shape`` slice); None when it is neither."""
    if piece is None:
        return None
    constant = ir.convenience.get_const_tensor(piece)
    if constant is not None:
        array = constant.numpy()
        return [int(v) for v in array.reshape(-1)] if array.ndim <= 1 else None
    span = _shape_span(piece)
    if span is None:
        return None
    source, start, end = span
    if source.shape is None:
        return None
    return _dim_entries(list(source.shape)[start:end])


def _dim_entries(dims: Sequence[object]) -> list[int | str] | None:
    """Dimensions as shape entries: integers and symbolic names (None for an unnamed one)."""
    entries: list[int | str] = []
    for dim in dims:
        if isinstance(dim, int):
            entries.append(dim)
        elif _named(dim):
            entries.append(str(dim))
        else:
            return None
    return entries


def share_unflatten_shapes(graph: ir.Graph, nonzero: frozenset[str]) -> int:
    """Computed ``Reshape`` shapes that differ only in their last, constant entry share one
    shape ending in -1: ``Concat(Shape(a, 0, 2), [192])`` and ``Concat(Shape(a, 0, 2),
    [64])`` -> one ``Concat(Shape(a, 0, 2), [-1])`` (GPT-2's ``Conv1D`` outputs, unflattened
    after a 2-D ``Gemm``: three widths per layer, so three ``Concat`` nodes a flat file shares
    across layers). The -1 stands for the entry it replaces wherever the other entries
    multiply to at least 1: each is a positive literal or a symbol the user declared at 1
    or more (``nonzero``); where a size may be 0 the shapes stay as they were.
    Returns the number of ``Reshape`` nodes rewritten."""
    groups: dict[tuple[object, ...], list[tuple[ir.Node, int]]] = {}
    for node in graph:
        found = _unflatten_prefix(node, nonzero)
        if found is not None:
            groups.setdefault(found[0], []).append((node, found[1]))
    rewritten = 0
    for members in groups.values():
        if len({last for _, last in members}) < 2:
            continue  # equal shapes: ONNX Runtime's common-subexpression pass shares them
        nodes = [node for node, _ in members]
        first = nodes[0]  # graph order: its pieces are defined before every other user
        name = f"{first.name or 'Reshape'}_unflatten"
        minus_one = ir.node("Constant", [], attributes={
            "value": ir.tensor(np.array([-1], dtype=np.int64), name=f"{name}_rest")},
            name=f"{name}_rest")
        minus_one.outputs[0].name = f"{name}_rest"
        minus_one.outputs[0].dtype, minus_one.outputs[0].shape = ir.DataType.INT64, ir.Shape([1])
        shape = ir.node("Concat", [*_pieces(first)[:-1], minus_one.outputs[0]],
                        attributes={"axis": 0}, name=name)
        shape.outputs[0].name = name
        shape.outputs[0].dtype = ir.DataType.INT64
        shape.outputs[0].shape = first.inputs[1].shape  # type: ignore[union-attr]
        graph.insert_before(first, [minus_one, shape])
        for node in nodes:
            node.replace_input_with(1, shape.outputs[0])
            rewritten += 1
    if rewritten:
        remove_dead_size_nodes(graph)
    return rewritten


def _pieces(node: ir.Node) -> list[ir.Value]:
    """The inputs of the ``Concat`` that computes a ``Reshape``'s shape."""
    return list(node.inputs[1].producer().inputs)  # type: ignore[union-attr]


def _unflatten_prefix(node: ir.Node, nonzero: frozenset[str]
                      ) -> tuple[tuple[object, ...], int] | None:
    """What a ``Reshape``'s computed shape says before its last, constant, positive entry,
    where those entries multiply to at least 1 (with its ``allowzero``), and that entry;
    None otherwise."""
    if (node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2
            or node.inputs[1] is None or node.inputs[1].is_graph_output()):
        return None
    concat = node.inputs[1].producer()
    if concat is None or concat.op_type != "Concat" or concat.domain not in ("", "ai.onnx") \
            or len(concat.inputs) < 2:
        return None
    last = ir.convenience.get_const_tensor(concat.inputs[-1]) \
        if concat.inputs[-1] is not None else None
    entries = _shape_entries(node.inputs[1])
    if last is None or last.numpy().size != 1 or entries is None or entries[-1] != \
            int(last.numpy().reshape(-1)[0]) or entries[-1] <= 0:
        return None
    prefix = entries[:-1]
    if not all(e > 0 if isinstance(e, int) else e in nonzero for e in prefix):
        return None
    return (*prefix, node.attributes.get_int("allowzero", 0)), int(entries[-1])


def transpose_through_reshapes(graph: ir.Graph) -> int:
    """``Reshape(Transpose(Reshape(k, [-1, a, b]), [0, 2, 1]), [*lead, b, a])`` of a
    ``[*lead, a, b]`` tensor ``k`` -> ``Transpose(k)`` of its last two axes.

    torchlib's ``scaled_dot_product_attention`` (the default attention of BERT-like
    transformers models) transposes the key this way, its shapes computed from
    ``Shape(key)``. In the flat file torch's value_info names the result; ONNX Runtime
    drops a function's value_info when it inlines and cannot infer through computed shapes,
    so the scores, and every value after them, lost their names and each layer's
    Add + LayerNormalization stayed unfused (BERT under dynamic shapes: 0 of 4
    ``SkipLayerNormalization``). A Transpose says the same for every size (an empty one
    too, which the -1 could not reshape) and its shape is inferable. Returns how many."""
    rewritten = 0
    for node in list(graph):
        found = _transposed_by_reshapes(node)
        if found is None:
            continue
        key, removed = found
        rank = len(key.shape)  # type: ignore[arg-type]
        perm = [*range(rank - 2), rank - 1, rank - 2]
        transpose = ir.node("Transpose", [key], attributes={"perm": perm}, name=node.name,
                            metadata_props=dict(node.metadata_props))
        old, new = node.outputs[0], transpose.outputs[0]
        graph.insert_before(node, transpose)
        old.replace_all_uses_with(new, replace_graph_outputs=True)
        new.name, new.type, new.shape = old.name, old.type, old.shape
        for dead in removed:
            graph.remove(dead, safe=True)
        rewritten += 1
    if rewritten:
        remove_dead_size_nodes(graph)
    return rewritten


def _transposed_by_reshapes(node: ir.Node) -> tuple[ir.Value, list[ir.Node]] | None:
    """(k, the three nodes) where ``node`` ends the pattern of
    :func:`transpose_through_reshapes`, else None."""
    if not _is_onnx(node, "Reshape") or len(node.inputs) < 2 or node.inputs[0] is None:
        return None
    transpose = node.inputs[0].producer()
    if not _is_onnx(transpose, "Transpose") or len(node.inputs[0].uses()) != 1 \
            or node.inputs[0].is_graph_output() or transpose.inputs[0] is None \
            or list(transpose.attributes.get_ints("perm", [])) != [0, 2, 1]:
        return None
    inner = transpose.inputs[0].producer()
    if not _is_onnx(inner, "Reshape") or len(transpose.inputs[0].uses()) != 1 \
            or transpose.inputs[0].is_graph_output() or len(inner.inputs) < 2 \
            or inner.inputs[0] is None or inner.inputs[0].shape is None:
        return None
    key = inner.inputs[0]
    dims = _dim_entries(list(key.shape))
    if dims is None or len(dims) < 2 or any(isinstance(d, int) and d <= 0 for d in dims):
        return None
    first = _reshape_target_entries(inner.inputs[1])
    second = _reshape_target_entries(node.inputs[1])
    if first != [-1, dims[-2], dims[-1]] or second != [*dims[:-2], dims[-1], dims[-2]]:
        return None
    return key, [node, transpose, inner]


def _is_onnx(node: ir.Node | None, op_type: str) -> bool:
    return node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx")


def _reshape_target_entries(shape: ir.Value | None) -> list[int | str] | None:
    """A shape's entries (:func:`_shape_entries`), its pieces also ``Slice``s of a
    ``Shape`` by constant bounds (torchlib's ``shape[-2:-1]``)."""
    if shape is None:
        return None
    constant = ir.convenience.get_const_tensor(shape)
    if constant is not None:
        array = constant.numpy()
        return [int(v) for v in array.reshape(-1)] if array.ndim == 1 else None
    return _shape_entries(shape, _piece_or_sliced_entries)


def _piece_or_sliced_entries(piece: ir.Value | None) -> list[int | str] | None:
    found = _piece_entries(piece)
    return _sliced_shape_entries(piece) if found is None else found


def _sliced_shape_entries(piece: ir.Value | None) -> list[int | str] | None:
    """``Slice(Shape(x), [start], [end])`` (axis 0, step 1): those dims of ``x``."""
    producer = piece.producer() if piece is not None else None
    if not _is_onnx(producer, "Slice") or len(producer.inputs) not in (3, 4, 5):
        return None
    source = producer.inputs[0].producer() if producer.inputs[0] is not None else None
    if not _is_onnx(source, "Shape") or source.attributes.get_int("start", 0) != 0 \
            or source.attributes.get_int("end", None) is not None \
            or source.inputs[0] is None or source.inputs[0].shape is None:
        return None
    bounds = [ir.convenience.get_const_tensor(v) if v is not None else None
              for v in producer.inputs[1:]]
    if any(b is None or b.numpy().size != 1 for b in bounds[:2]):
        return None
    for b, default in zip(bounds[2:], (0, 1)):  # axes, steps
        if b is None or b.numpy().reshape(-1).tolist() != [default]:
            return None
    start, end = (int(b.numpy().reshape(-1)[0]) for b in bounds[:2])  # type: ignore[union-attr]
    return _dim_entries(list(source.inputs[0].shape)[slice(start, end)])


def remove_dead_size_nodes(graph: ir.Graph, among: Sequence[ir.Node] | None = None
                           ) -> set[ir.Node]:
    """The shape arithmetic no one reads after a rewrite (a Concat, its Shape and Constants),
    of ``graph`` or only ``among`` its nodes (in graph order); returns the nodes removed."""
    removed: set[ir.Node] = set()
    for node in reversed(list(graph) if among is None else among):
        if node.op_type in SHAPE_ARITHMETIC and node.domain in ("", "ai.onnx") and not any(
                v.uses() or v.is_graph_output() for v in node.outputs):
            graph.remove(node, safe=True)
            removed.add(node)
    return removed


def drop_unused_inputs(model: ir.Model) -> int:
    """Function inputs no body reads any more (a size the body now takes from its own
    activation's shape: :func:`copy_own_dims`) leave the signature, and every call stops
    passing them; to a fixpoint, since a caller may have read that value only to pass it
    down. Returns how many inputs went."""
    dropped = 0
    while True:
        unused = {function.identifier(): [i for i, v in enumerate(function.inputs)
                                          if not v.uses() and not v.is_graph_output()]
                  for function in model.functions.values()}
        unused = {k: v for k, v in unused.items() if v}
        if not unused:
            return dropped
        for graph in [model.graph, *model.functions.values()]:
            for node in graph.all_nodes():
                positions = unused.get(node.op_identifier())
                if positions:
                    _drop_arguments(node, positions)
        for identifier, positions in unused.items():
            function = model.functions[identifier]
            kept = [v for i, v in enumerate(function.inputs) if i not in positions]
            function.inputs.clear()
            function.inputs.extend(kept)
            dropped += len(positions)


def _drop_arguments(node: ir.Node, positions: list[int]) -> None:
    dropped = [v for i, v in enumerate(node.inputs) if i in positions]
    kept = [v for i, v in enumerate(node.inputs) if i not in positions]
    for i, value in enumerate(kept):
        node.replace_input_with(i, value)
    node.resize_inputs(len(kept))
    graph = node.graph
    for value in dropped:  # a weight only this argument passed: ORT would warn about it
        if (value is not None and value.is_initializer() and not value.uses()
                and graph is not None and value.name in graph.initializers):
            del graph.initializers[value.name]


class SimplifyOwnSizes(EmitPass):
    """In every function body (where the sizes are computed):
    :func:`transpose_through_reshapes`, :func:`merge_shape_slices`, then
    :func:`copy_own_dims`, then :func:`share_unflatten_shapes` (``nonzero``: the
    symbols the user declared at 1 or more); then the inputs no body reads leave the
    signatures (:func:`drop_unused_inputs`)."""

    def __init__(self, nonzero: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.nonzero = nonzero

    def run(self, model: ir.Model) -> None:
        for function in model.functions.values():
            transpose_through_reshapes(function.graph)
            merge_shape_slices(function.graph)
            copy_own_dims(function.graph)
            share_unflatten_shapes(function.graph, self.nonzero)
        drop_unused_inputs(model)
