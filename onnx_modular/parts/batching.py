"""Give every tensor the parts exchange the batch dimension, so that Triton can batch them.

Triton's dynamic batcher gathers requests along the first dimension of every input and
output of a model. Parts cut from a model exported with a dynamic batch dimension often
pass tensors without it across a cut: the batch size itself (a 0-d ``sym_size``), or a
table every request shares (rotary ``cos``/``sin`` of shape ``[1, seq, d]``). For Triton
those are rewritten, in place and undone afterwards (:func:`batched_parts`):

- a 0-d batch size (``Shape(x)[0]`` of a model input ``x`` batched at dim 0) is no longer
  passed: the reading part takes it from the first dimension of one of its own batched
  inputs (what the batched execution really holds);
- a tensor that depends on no model input (only on weights and constants) is passed
  repeated along a new first dimension (``Expand``) and read back as its row 0 (``Gather``);
- anything else (a tensor that depends on a request's data and has no batch dimension)
  cannot be batched: :func:`plan_batching` says which, and the parts stay unbatched.

Unbatched, Triton takes no 0-d tensor at all: those crossing a cut are passed as ``[1]``
(:func:`plan_scalars`).

A dynamic first dimension is not yet a batch: :func:`prove_batching` follows it through
the model (:mod:`onnx_modular.parts.batch_axis`) and keeps the plan only where no op mixes
rows along it (or, where the analysis cannot tell, the caller states the batch).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from onnx_modular.emit.regions import RegionGraph
from onnx_modular.leaves.errors import fail
from onnx_modular.parts.batch_axis import Batch, analyze
from onnx_modular.parts.manifest import shape_of

_PASS_THROUGH = frozenset({"Squeeze", "Reshape", "Cast", "Identity", "CastLike"})


@dataclasses.dataclass
class BatchPlan:
    """Where the batch dimension is, and which tensors crossing a cut need a rewrite."""

    symbol: str | None  # the batch dimension's name; None: cannot batch (``reason`` says why)
    reason: str = ""
    batch_sizes: set[str] = dataclasses.field(default_factory=set)  # recomputed by readers
    shared: set[str] = dataclasses.field(default_factory=set)  # passed repeated, row 0 read
    scalars: set[str] = dataclasses.field(default_factory=set)  # passed as [1] (unbatched)
    note: str = ""  # batched as stated, with ops the analysis could not follow
    mixing: bool = False  # refused because an op provably mixes rows (``reason`` names it)


def _first_dim(value: Any) -> str | int | None:
    shape = shape_of(value)
    return shape[0] if shape else None


def plan_batching(model_graph: ir.Graph, parts: Sequence[RegionGraph], symbol: str | None = None
                  ) -> BatchPlan:
    """The batch dimension every model input and output has first (``symbol``, or the first
    input's first), and the cut tensors without it that can be rewritten; or why the parts
    cannot be batched. Whether the model treats it as a batch is :func:`prove_batching`'s."""
    inputs = list(model_graph.inputs)
    if symbol is None:
        symbol = _first_dim(inputs[0]) if inputs else None
    if not isinstance(symbol, str):
        return BatchPlan(None, "the model's first input has no dynamic first dimension "
                         "(export with dynamic_shapes to batch)")
    for v in [*model_graph.inputs, *model_graph.outputs]:
        if _first_dim(v) != symbol:
            return BatchPlan(None, f"the model's '{v.name}' has shape {shape_of(v)}, without "
                             f"the batch dimension '{symbol}' first")
    producers = {o.name: n for n in model_graph for o in n.outputs}
    model_inputs = {v.name for v in inputs}
    plan = BatchPlan(symbol)
    for part in parts:
        graph = part.model.graph
        for v in [*graph.inputs, *graph.outputs]:
            if _first_dim(v) == symbol or v.name in plan.batch_sizes | plan.shared:
                continue
            if v.name in model_inputs:
                return BatchPlan(None, f"'{v.name}' has no batch dimension first")
            if _is_batch_size(v.name, producers, model_graph, symbol):
                plan.batch_sizes.add(v.name)
            elif not _reads_inputs(v.name, producers, model_inputs):
                plan.shared.add(v.name)
            else:
                return BatchPlan(None, f"'{v.name}' of part '{part.name}' has shape "
                                 f"{shape_of(v)}, without the batch dimension '{symbol}' "
                                 "first, and depends on the request")
    for part in parts:
        graph = part.model.graph
        through = {v.name for v in graph.inputs} & {v.name for v in graph.outputs}
        if through & (plan.batch_sizes | plan.shared):
            return BatchPlan(None, f"part '{part.name}' passes "
                             f"'{sorted(through)[0]}' on unchanged")
        if not any(_first_dim(v) == symbol for v in graph.inputs):
            return BatchPlan(None, f"part '{part.name}' reads no tensor with the batch "
                             "dimension to take the batch size from")
        kept = [v for v in part.model.graph.outputs if v.name not in plan.batch_sizes]
        if not kept:
            return BatchPlan(None, f"part '{part.name}' only passes the batch size on")
    return plan


def batch_symbol(model_graph: ir.Graph, batch_dim: str,
                 dim_names: Mapping[str, str] | None = None) -> str | None:
    """The model's symbolic dimension ``batch_dim`` names: itself where the model has a
    dimension of that name, else the one made for ``Dim(batch_dim)`` (torch.export renames
    ``Dim("batch")`` to ``s<N>``; ``dim_names`` maps them back; a symbol names the Dim the
    files call it by), else, where the program kept no names, the first input's first
    dimension (naming the batch states it is axis 0). None where nothing fits;
    :class:`ValueError` where the program's names are known and none is ``batch_dim`` (a
    guess could batch along the sequence)."""
    names = {d for v in [*model_graph.inputs, *model_graph.outputs]
             for d in (shape_of(v) or []) if isinstance(d, str)}
    if batch_dim in names:
        return batch_dim
    dim_names = dim_names or {}
    if dim_names.get(batch_dim) in names:  # a symbol whose Dim's name the files carry
        return dim_names[batch_dim]
    known = {name: symbol if symbol in names else name for symbol, name in dim_names.items()
             if symbol in names or name in names}
    if batch_dim in known:
        return known[batch_dim]
    if known:
        unnamed = sorted(names - set(known.values()))
        listed = [n if n == s else f"{n} ({s})" for n, s in sorted(known.items())] + \
            [f"{s} (unnamed)" for s in unnamed]
        raise ValueError(f"the model's dynamic dimensions are {', '.join(listed)}; none is "
                         f"named {batch_dim!r} (give a Dim's name or a dimension's symbol)")
    inputs = list(model_graph.inputs)
    first = _first_dim(inputs[0]) if inputs else None
    return first if isinstance(first, str) else None


def prove_batching(model_graph: ir.Graph, parts: Sequence[RegionGraph], plan: BatchPlan, *,
                   stated: bool = False) -> BatchPlan:
    """``plan`` where the model treats its batch dimension as a batch: no op mixes rows
    along it and every tensor crossing a cut carries it at axis 0. Ops the analysis cannot
    follow refuse the plan, unless the batch is ``stated`` (then ``note`` lists them)."""
    if plan.symbol is None:
        return plan
    analysis = analyze(model_graph, plan.symbol)
    if analysis.mixing:
        return BatchPlan(None, f"{analysis.summary()}; Triton would batch requests along "
                         f"'{plan.symbol}' and give them each other's rows", mixing=True)
    for part in parts:
        for v in [*part.model.graph.inputs, *part.model.graph.outputs]:
            state = analysis.states.get(v.name or "")
            if _first_dim(v) == plan.symbol and isinstance(state, Batch) and (
                    state.axis != 0 or state.inner != (1, ())):
                return BatchPlan(None, f"'{v.name}' of part '{part.name}' has "
                                 f"'{plan.symbol}' first but the batch at axis {state.axis}",
                                 mixing=True)
    if not analysis.unproven:
        return plan
    if not stated:
        return BatchPlan(None, f"the analysis cannot prove that '{plan.symbol}' is a batch: "
                         f"{analysis.summary()} (state it with batch_dim= to batch anyway)")
    plan.note = (f"batched along '{plan.symbol}' as batch_dim states; not proven: "
                 f"{analysis.summary()}")
    return plan


def plan_scalars(model_graph: ir.Graph, parts: Sequence[RegionGraph]) -> BatchPlan:
    """Unbatched parts: the 0-d tensors crossing a cut (Triton takes no scalar tensor in a
    model without batching), passed as ``[1]`` and squeezed back by the reader; a 0-d model
    input or output is refused (its clients would have to send and read ``[1]``)."""
    ends = {v.name for v in [*model_graph.inputs, *model_graph.outputs]}
    scalar = next((v.name for v in [*model_graph.inputs, *model_graph.outputs]
                   if v.shape is not None and len(v.shape) == 0), None)
    if scalar is not None:
        raise fail(f"'{scalar}' is a 0-d model input or output: Triton takes no scalar "
                   "tensor in a model without batching (return or take it as a 1-element "
                   "tensor, or export with a dynamic batch)")
    plan = BatchPlan(None)
    for part in parts:
        graph = part.model.graph
        for v in [*graph.inputs, *graph.outputs]:
            if v.shape is not None and len(v.shape) == 0 and v.name not in ends:
                plan.scalars.add(v.name or "")
    return plan


def _is_batch_size(name: str, producers: dict[str, Any], graph: Any, symbol: str) -> bool:
    """``Shape(x, start=0, end=1)`` (or ``Gather(Shape(x), 0)``) of a model input ``x``
    batched at dim 0, through squeezes, reshapes and casts."""
    batched = {v.name for v in graph.inputs if _first_dim(v) == symbol}
    node = producers.get(name)
    while node is not None and node.op_type in _PASS_THROUGH and node.domain == "":
        source = node.inputs[0]
        node = producers.get(source.name) if source is not None else None
    if node is None or node.domain != "":
        return False
    if node.op_type == "Gather":
        index = node.inputs[1].const_value if node.inputs[1] is not None else None
        if index is None or int(np.asarray(index.numpy()).reshape(-1)[0]) != 0:
            return False
        node = producers.get(node.inputs[0].name) if node.inputs[0] is not None else None
        start, end = 0, None
    elif node.op_type == "Shape":
        start = node.attributes.get_int("start", 0)
        end = node.attributes.get_int("end", None)
        if end != 1:
            return False
    else:
        return False
    return (node is not None and node.op_type == "Shape" and start == 0
            and node.inputs[0] is not None and node.inputs[0].name in batched)


def _reads_inputs(name: str, producers: dict[str, Any], model_inputs: set[str]) -> bool:
    """Whether any model input is among the value's ancestors."""
    stack, seen = [name], set()
    while stack:
        current = stack.pop()
        if current in model_inputs:
            return True
        if current in seen:
            continue
        seen.add(current)
        node = producers.get(current)
        if node is not None:
            stack.extend(v.name for v in node.inputs if v is not None)
    return False


@contextlib.contextmanager
def batched_parts(parts: Sequence[RegionGraph], plan: BatchPlan) -> Iterator[None]:
    """The parts rewritten as the plan says while inside, restored on the way out."""
    undo: list[Any] = []
    try:
        for part in parts:
            _rewrite(part.model.graph, plan, undo)
        yield
    finally:
        for step in reversed(undo):
            step()


@dataclasses.dataclass
class _Edits:
    """What batching adds to one part: nodes before every node (they read only graph
    inputs), nodes after every node (they read the part's results), and the values the
    new nodes stand in for."""

    first: list[ir.Node] = dataclasses.field(default_factory=list)
    last: list[ir.Node] = dataclasses.field(default_factory=list)
    replaced: list[tuple[ir.Value, ir.Value]] = dataclasses.field(default_factory=list)

    def add(self, into: list[ir.Node], op: str, args: list[ir.Value], name: str,
            **attributes: Any) -> ir.Value:
        node = ir.node(op, args, attributes=attributes or None, outputs=[ir.Value(name=name)])
        into.append(node)
        return node.outputs[0]

    def constant(self, into: list[ir.Node], name: str, array: np.ndarray) -> ir.Value:
        return self.add(into, "Constant", [], name, value=ir.tensor(array))


def _rewrite(graph: ir.Graph, plan: BatchPlan, undo: list[Any]) -> None:
    inputs, outputs = list(graph.inputs), list(graph.outputs)
    batched = next((v for v in inputs if _first_dim(v) == plan.symbol), None)
    edits = _Edits()
    new_inputs = [_batched_input(v, plan, batched, edits) for v in inputs]
    new_outputs = [_batched_output(v, plan, batched, edits) for v in outputs]
    if not edits.first and not edits.last and new_outputs == outputs:
        return
    _apply(graph, edits, new_inputs, new_outputs)

    def restore() -> None:
        graph.outputs.clear()
        graph.outputs.extend(outputs)
        graph.inputs.clear()
        graph.inputs.extend(inputs)
        for old, new in edits.replaced:
            new.replace_all_uses_with(old)
        graph.remove([*edits.first, *edits.last], safe=False)

    undo.append(restore)


def _batched_input(value: ir.Value, plan: BatchPlan, batched: ir.Value | None,
                   edits: _Edits) -> ir.Value | None:
    """The input a batched part takes instead of ``value`` (None: no input any more)."""
    name, first = value.name or "", edits.first
    if name in plan.scalars:
        one = ir.Value(name=f"{name}__om_1", type=value.type, shape=ir.Shape([1]))
        axes = edits.constant(first, f"{name}__om_axes", np.array([0], dtype=np.int64))
        edits.replaced.append((value, edits.add(first, "Squeeze", [one, axes],
                                                f"{name}__om_0d")))
        return one
    if name in plan.batch_sizes:
        assert batched is not None
        size = edits.add(first, "Shape", [batched], f"{name}__om_shape", start=0, end=1)
        scalar = edits.add(first, "Squeeze", [size], f"{name}__om_size")
        if value.dtype is not None and value.dtype != ir.DataType.INT64:
            scalar = edits.add(first, "Cast", [scalar], f"{name}__om_cast", to=value.dtype)
        edits.replaced.append((value, scalar))
        return None
    if name in plan.shared:
        rows = ir.Value(name=f"{name}__om_rows", type=value.type,
                        shape=ir.Shape([plan.symbol, *(value.shape or [])]))
        zero = edits.constant(first, f"{name}__om_zero", np.array(0, dtype=np.int64))
        edits.replaced.append((value, edits.add(first, "Gather", [rows, zero],
                                                f"{name}__om_row0", axis=0)))
        return rows
    return value


def _batched_output(value: ir.Value, plan: BatchPlan, batched: ir.Value | None,
                    edits: _Edits) -> ir.Value | None:
    """The output a batched part gives instead of ``value`` (None: no output any more)."""
    name, last = value.name or "", edits.last
    if name in plan.scalars:
        axes = edits.constant(last, f"{name}__om_axes", np.array([0], dtype=np.int64))
        one = edits.add(last, "Unsqueeze", [value, axes], f"{name}__om_1")
        one.dtype, one.shape = value.dtype, ir.Shape([1])
        return one
    if name in plan.batch_sizes:
        return None
    if name in plan.shared:
        assert batched is not None
        size = edits.add(last, "Shape", [batched], f"{name}__om_batch", start=0, end=1)
        dims = edits.add(last, "Shape", [value], f"{name}__om_dims")
        shape = edits.add(last, "Concat", [size, dims], f"{name}__om_rowshape", axis=0)
        axes = edits.constant(last, f"{name}__om_axes", np.array([0], dtype=np.int64))
        one = edits.add(last, "Unsqueeze", [value, axes], f"{name}__om_one")
        rows = edits.add(last, "Expand", [one, shape], f"{name}__om_rows")
        rows.dtype, rows.shape = value.dtype, ir.Shape([plan.symbol, *(value.shape or [])])
        return rows
    return value


def _apply(graph: ir.Graph, edits: _Edits, new_inputs: list[ir.Value | None],
           new_outputs: list[ir.Value | None]) -> None:
    for old, new in edits.replaced:
        old.replace_all_uses_with(new)
        new.dtype, new.shape = old.dtype, old.shape
    if edits.first:
        head = next(iter(graph), None)
        if head is None:
            graph.extend(edits.first)
        else:
            graph.insert_before(head, edits.first)
    graph.extend(edits.last)
    graph.inputs.clear()
    graph.inputs.extend(v for v in new_inputs if v is not None)
    graph.outputs.clear()
    graph.outputs.extend(v for v in new_outputs if v is not None)
