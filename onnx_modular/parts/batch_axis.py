"""Whether a model's candidate batch axis is a batch: every row of every output depends only
on the same row of the inputs, for any number of rows.

Triton's dynamic batcher concatenates requests along axis 0 of every input, runs the model
once and hands each request its rows of every output. That gives each request the answer
it would get alone only when the model treats that axis as a batch: no op reduces, sorts,
attends, concatenates or slices along it, and nothing uses the number of rows as a value.
A dynamic first dimension alone says nothing of that (a sequence-first transformer's first
dimension is the sequence, and attention runs across it).

:func:`analyze` propagates, from the model inputs through every node, which axis of each
tensor carries the batch (:class:`Batch`), or that a tensor depends on no request
(``FREE``: weights, constants, sizes of non-batch dimensions, which batched requests share)
or on the batch size (``SIZE``: shape arithmetic, fine where it only shapes a result). Each
op has a rule; an op with no rule, or a rule that cannot decide (a reshape whose result
shape is unknown), is *unproven*; an op that provably combines rows is *mixing*. Shapes come
from the model and from ONNX shape inference on a copy (without the weights' data).
"""

from __future__ import annotations

import ast
import dataclasses
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from onnx_modular.leaves.metadata import CLASS_HIERARCHY, META_PATH, META_TYPE, NAME_SCOPES

#: a size as a product: (integer factor, symbols), ``2*s28`` -> ``(2, ("s28",))``
Mono = tuple[int, tuple[str, ...]]
ONE: Mono = (1, ())


@dataclasses.dataclass(frozen=True)
class Batch:
    """The batch is axis ``axis`` of a tensor of rank ``rank``: that axis has ``inner``
    times the batch size elements, a request's rows in one block of ``inner`` (``ONE``:
    the batch alone; ``x.flatten(0, 1)`` of ``[batch, seq, d]`` has ``inner`` ``seq``)."""

    axis: int
    rank: int
    inner: Mono = ONE


@dataclasses.dataclass(frozen=True)
class Sizes:
    """A 1-D shape vector whose elements ``mask`` marks depend on the batch size."""

    mask: tuple[bool, ...]


FREE = "free"  # depends on no request's rows (weights, constants, non-batch sizes)
SIZE = "size"  # depends on the batch size (a shape, a count), not on any row
LOST = "lost"  # after an op already reported: not followed further
State = Batch | Sizes | str


def _is_size(state: State) -> bool:
    return state == SIZE or isinstance(state, Sizes)


def _sizes(mask: Sequence[bool]) -> State:
    return Sizes(tuple(mask)) if any(mask) else FREE


def _ops(names: str) -> frozenset[str]:
    return frozenset(names.split())


_UNARY = _ops("""
Abs Acos Acosh Asin Asinh Atan Atanh BitwiseNot Cast Ceil Celu Cos Cosh Elu Erf Exp Floor
Gelu HardSigmoid HardSwish Identity IsInf IsNaN LeakyRelu Log Mish Neg Not Reciprocal Relu
Round Selu Shrink Sigmoid Sign Sin Sinh Softplus Softsign Sqrt Tan Tanh ThresholdedRelu
""")
_ELEMENTWISE = _ops("""
Add And BitShift BitwiseAnd BitwiseOr BitwiseXor Clip Div Equal Greater GreaterOrEqual
Less LessOrEqual Max Mean Min Mod Mul Or Pow PRelu Sub Sum Where Xor
""")
_REDUCE = _ops("""
ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd
ReduceSum ReduceSumSquare
""")
#: ops over N, C, spatial...: a batch at axis 0 stays there; any other axis is mixed
_NCHW = _ops("""
AveragePool BatchNormalization Conv ConvTranspose DepthToSpace GlobalAveragePool
GlobalLpPool GlobalMaxPool GroupNormalization InstanceNormalization LpNormalization LpPool
LRN MaxPool MaxRoiPool SpaceToDepth
""")


@dataclasses.dataclass(frozen=True)
class Finding:
    """An op that mixes rows (``mixing``) or whose rows the analysis cannot follow."""

    op: str
    node: str
    module: str  # "path (Class)" from the node's labels, or ""
    why: str
    mixing: bool

    def __str__(self) -> str:
        where = f" in {self.module}" if self.module else ""
        return f"{self.op} '{self.node}'{where} {self.why}"


@dataclasses.dataclass
class BatchAnalysis:
    """What :func:`analyze` found for ``symbol``: every value's state, and the findings."""

    symbol: str
    states: dict[str, State]
    mixing: list[Finding]
    unproven: list[Finding]

    @property
    def proven(self) -> bool:
        return not self.mixing and not self.unproven

    def summary(self, limit: int = 3) -> str:
        """One line: the first findings, mixing first."""
        found = [*self.mixing, *self.unproven]
        text = "; ".join(str(f) for f in found[:limit])
        return text + (f" (and {len(found) - limit} more)" if len(found) > limit else "")


def module_of(node: ir.Node) -> str:
    """The module a node belongs to, from our call labels or torch.onnx's name scopes."""
    meta = node.metadata_props
    if meta.get(META_PATH):
        kind = meta.get(META_TYPE, "")
        return f"'{meta[META_PATH]}'" + (f" ({kind.rsplit('.', 1)[-1]})" if kind else "")
    try:
        scopes = ast.literal_eval(meta.get(NAME_SCOPES, "[]"))[:-1]
        classes = ast.literal_eval(meta.get(CLASS_HIERARCHY, "[]"))[:-1]
    except (ValueError, SyntaxError):
        return ""
    if not scopes or not scopes[-1]:
        return ""
    kind = classes[-1].rsplit(".", 1)[-1] if len(classes) == len(scopes) else ""
    return f"'{scopes[-1]}'" + (f" ({kind})" if kind else "")


# --- shapes --------------------------------------------------------------------------------

def _inferred_shapes(graph: ir.Graph) -> dict[str, ir.Shape]:
    """Value name -> shape from ONNX shape inference (with data propagation, so reshapes
    computed from ``Shape`` get their symbolic result) on a copy whose large initializers
    are inputs without data. Empty where inference fails."""
    copy = graph.clone()
    for name, init in list(copy.initializers.items()):
        tensor = init.const_value
        if tensor is None or tensor.size > 64:
            copy.initializers.pop(name)
            init.const_value = None
            copy.inputs.append(init)
    model = ir.Model(copy, ir_version=10)
    try:
        proto = ir.serde.serialize_model(model)
        inferred = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except Exception:  # inference is a help, not a requirement
        return {}
    out: dict[str, ir.Shape] = {}
    for info in [*inferred.graph.value_info, *inferred.graph.output]:
        if info.type.HasField("tensor_type") and info.type.tensor_type.HasField("shape"):
            dims: list[int | str | None] = []
            for d in info.type.tensor_type.shape.dim:
                dims.append(d.dim_value if d.HasField("dim_value")
                            else d.dim_param if d.HasField("dim_param") else None)
            out[info.name] = ir.Shape(dims)
    return out


_FACTOR = re.compile(r"^\s*(\d+|[A-Za-z_][A-Za-z0-9_]*)\s*$")


def _mono(dim: Any) -> Mono | None:
    """A dimension as a product (``None``: unknown)."""
    if isinstance(dim, int):
        return (dim, ())
    if not isinstance(dim, str) or not dim:
        return None
    factor, symbols = 1, []
    for piece in dim.split("*"):
        match = _FACTOR.match(piece)
        if match is None:
            return (1, (dim,))  # an expression kept whole
        if match[1].isdigit():
            factor *= int(match[1])
        else:
            symbols.append(match[1])
    return (factor, tuple(sorted(symbols)))


def _product(dims: Sequence[Any]) -> Mono | None:
    monos = [_mono(d) for d in dims]
    if any(m is None for m in monos):
        return None
    factor = math.prod(m[0] for m in monos if m is not None)
    return (factor, tuple(sorted(s for m in monos if m is not None for s in m[1])))


def _times(a: Mono, b: Mono) -> Mono:
    return (a[0] * b[0], tuple(sorted(a[1] + b[1])))


def _solve_one(before: list[Any], after: list[Any]) -> list[Any]:
    """``after`` with its one unknown size (a reshape's ``-1`` that inference left unnamed:
    ``None`` or ``unk__3``) computed from the element count, where it divides."""
    unknown = [k for k, d in enumerate(after)
               if d is None or (isinstance(d, str) and d.startswith("unk__"))]
    total, known = _product(before), _product([d for d in after if d not in (None,)
                                               and not (isinstance(d, str)
                                                        and d.startswith("unk__"))])
    if len(unknown) != 1 or total is None or known is None or known[0] == 0 or \
            total[0] % known[0]:
        return after
    symbols = list(total[1])
    for symbol in known[1]:
        if symbol not in symbols:
            return after
        symbols.remove(symbol)
    factor = total[0] // known[0]
    dim = "*".join([str(factor)] * (factor != 1) + symbols) if symbols else factor
    return [dim if k == unknown[0] else d for k, d in enumerate(after)]


# --- the analysis ---------------------------------------------------------------------------

class _Analysis:
    def __init__(self, graph: ir.Graph, symbol: str) -> None:
        self.graph = graph
        self.symbol = symbol
        self.mentions = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(symbol)}(?![A-Za-z0-9_])")
        self.inferred = _inferred_shapes(graph)
        self.states: dict[str, State] = {}
        self.folded: dict[str, np.ndarray | None] = {}
        self.mixing: list[Finding] = []
        self.unproven: list[Finding] = []
        opsets = graph.opset_imports
        self.opset = opsets.get("", opsets.get("ai.onnx", 18))

    # helpers
    def shape(self, value: ir.Value | None) -> ir.Shape | None:
        if value is None:
            return None
        if value.shape is not None and all(
                isinstance(d, int) or (d.value is not None) for d in value.shape):
            return value.shape
        return self.inferred.get(value.name or "", value.shape)

    def dims(self, value: ir.Value | None) -> list[int | str | None] | None:
        shape = self.shape(value)
        if shape is None:
            return None
        return [d if isinstance(d, int) else d.value for d in shape]

    def rank(self, value: ir.Value | None) -> int | None:
        shape = self.shape(value)
        return None if shape is None else len(shape)

    def is_batch_dim(self, dim: Any) -> bool:
        return dim == self.symbol

    def inner(self, dim: Any) -> Mono | None:
        """``dim`` over the batch size, where ``dim`` is a product holding it once."""
        mono = _mono(dim)
        if mono is None or mono[1].count(self.symbol) != 1:
            return None
        rest = list(mono[1])
        rest.remove(self.symbol)
        return (mono[0], tuple(rest))

    def batch_axes_of(self, dims: Sequence[Any]) -> list[int] | None:
        """The axes whose size holds the batch size as a factor; None where another size
        mentions it otherwise (``s0 + 1``, ``s0**2``)."""
        axes = []
        for k, dim in enumerate(dims):
            if isinstance(dim, str) and self.mentions.search(dim):
                if self.inner(dim) is None:
                    return None
                axes.append(k)
        return axes

    def batch_of(self, value: ir.Value) -> Batch | None:
        """The batch of a tensor shaped by the batch size alone (``ConstantOfShape``), from
        its shape: the one axis whose size holds it."""
        dims = self.dims(value)
        axes = None if dims is None else self.batch_axes_of(dims)
        if dims is None or axes is None or len(axes) != 1:
            return None
        inner = self.inner(dims[axes[0]])
        assert inner is not None
        return Batch(axes[0], len(dims), inner)

    def state(self, value: ir.Value | None) -> State:
        if value is None:
            return FREE
        return self.states.get(value.name or "", FREE)

    def const(self, value: ir.Value | None, depth: int = 0) -> np.ndarray | None:
        """A small value computed from constants alone (axes, pads, repeats), folded here
        as the unoptimized translation leaves them (``Reshape(Constant, [-1])``)."""
        if value is None:
            return None
        if value.const_value is not None:
            return np.asarray(value.const_value.numpy())
        name = value.name or ""
        if name in self.folded:
            return self.folded[name]
        node = value.producer()
        result = None
        if node is not None and node.domain in ("", "ai.onnx") and depth < 8 and not any(
                a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
                for a in node.attributes.values()):
            inputs = [self.const(v, depth + 1) if v is not None else None
                      for v in node.inputs]
            if all(x is not None or v is None for x, v in zip(inputs, node.inputs)) and \
                    sum(x.size for x in inputs if x is not None) <= 1024:
                result = _evaluate(node, inputs, value)
        self.folded[name] = result
        return result

    def report(self, node: ir.Node, why: str, *, mixing: bool) -> None:
        finding = Finding(node.op_type, node.name or (node.outputs[0].name or "?"),
                          module_of(node), why, mixing)
        (self.mixing if mixing else self.unproven).append(finding)

    def set_outputs(self, node: ir.Node, states: Iterable[State]) -> None:
        for out, state in zip(node.outputs, states, strict=False):
            self.states[out.name or ""] = state

    def give_up(self, node: ir.Node, why: str, *, mixing: bool = False) -> None:
        """Report ``node`` and go on from its outputs' shapes (so later findings still
        show), or stop following them."""
        self.report(node, why, mixing=mixing)
        self.set_outputs(node, [LOST] * len(node.outputs))

    # the walk
    def run(self, inputs: Sequence[ir.Value]) -> None:
        for value in inputs:
            dims = self.dims(value)
            batched = dims is not None and bool(dims) and self.is_batch_dim(dims[0])
            self.states[value.name or ""] = Batch(0, len(dims)) if dims and batched else FREE
        for node in self.graph:
            self.visit(node)

    def visit(self, node: ir.Node) -> None:
        states = [self.state(v) for v in node.inputs]
        outer = _outer_states(node, self)
        if LOST in states or LOST in outer:
            self.set_outputs(node, [LOST] * len(node.outputs))
            return
        batched = [s for s in [*states, *outer] if isinstance(s, Batch)]
        if not batched and not any(_is_size(s) for s in [*states, *outer]):
            self.set_outputs(node, [FREE] * len(node.outputs))
            return
        if node.domain not in ("", "ai.onnx"):
            self.give_up(node, f"is an op of domain '{node.domain}', which the analysis "
                         "cannot follow")
            return
        if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
               for a in node.attributes.values()):
            self.give_up(node, "runs a subgraph, which the analysis cannot follow")
            return
        if not batched:
            self.sizes(node, states)
            return
        rule = getattr(self, f"op_{node.op_type}", None)
        if rule is None:
            if node.op_type in _UNARY:
                rule = self.op_unary
            elif node.op_type in _ELEMENTWISE:
                rule = self.op_elementwise
            elif node.op_type in _REDUCE:
                rule = self.op_reduce
            elif node.op_type in _NCHW:
                rule = self.op_nchw
            else:
                self.give_up(node, "has no batching rule")
                return
        rule(node, states)
        self.batch_only_on_its_axis(node)

    def batch_only_on_its_axis(self, node: ir.Node) -> None:
        """A result batched at one axis whose other axes grow with the batch size too
        (``expand(b, b)``, a top-k of k = b) holds each row's values computed from the
        others' count: not a batch Triton may stack."""
        for out in node.outputs:
            state = self.states.get(out.name or "")
            dims = self.dims(out) if isinstance(state, Batch) else None
            if dims is None or not isinstance(state, Batch):
                continue
            axes = self.batch_axes_of(dims)
            if axes is None or any(a != state.axis for a in axes):
                self.give_up(node, f"makes {list(dims)}: a dimension besides the batch's "
                             "grows with the batch size", mixing=True)
                return

    def sizes(self, node: ir.Node, states: list[State]) -> None:
        """No row goes in, the batch size does: a shape computation, or a tensor shaped
        by it (rows of a constant, the same in every row)."""
        op = node.op_type
        if op in ("ConstantOfShape", "Expand", "Reshape", "Tile") and states[0] == FREE:
            batch = self.batch_of(node.outputs[0])
            if batch is not None:
                self.set_outputs(node, [batch])
                return
        masks = [self.mask(s, v) for s, v in zip(states, node.inputs)]
        out: State = SIZE
        if op in ("Cast", "Identity", "CastLike") and masks[0] is not None:
            out = _sizes(masks[0])
        elif op in ("Squeeze", "Unsqueeze", "Reshape") and masks[0] is not None and \
                self.rank(node.outputs[0]) in (0, 1):
            out = _sizes(masks[0]) if self.rank(node.outputs[0]) == 1 else \
                (SIZE if any(masks[0]) else FREE)
        elif op == "Concat" and all(m is not None for m in masks):
            out = _sizes([b for m in masks if m is not None for b in m])
        elif op == "Gather" and masks[0] is not None and states[1] == FREE:
            index = self.const(node.inputs[1])
            if index is not None:
                picked = [masks[0][int(i)] for i in index.reshape(-1)]
                out = _sizes(picked) if index.ndim == 1 else (SIZE if any(picked) else FREE)
        elif op == "Slice" and masks[0] is not None and all(s == FREE for s in states[1:]):
            bounds = [self.const(v) if v is not None else None for v in node.inputs[1:]]
            if bounds[0] is not None and bounds[1] is not None:
                step = int(bounds[3].reshape(-1)[0]) if len(bounds) > 3 and \
                    bounds[3] is not None else 1
                start, end = (int(b.reshape(-1)[0]) for b in bounds[:2])
                out = _sizes(masks[0][slice(start, end, step)])
        self.set_outputs(node, [out] * len(node.outputs))

    def mask(self, state: State, value: ir.Value | None) -> list[bool] | None:
        """Which elements of a (0-d or 1-d) shape vector depend on the batch size."""
        if isinstance(state, Sizes):
            return list(state.mask)
        dims = self.dims(value)
        if dims is None or len(dims) > 1 or (dims and not isinstance(dims[0], int)):
            return None
        length = dims[0] if dims else 1
        assert isinstance(length, int)
        return [state == SIZE] * length

    # rules: each sets the outputs' states, or reports
    def op_unary(self, node: ir.Node, states: list[State]) -> None:
        self.set_outputs(node, [states[0]] * len(node.outputs))

    op_Dropout = op_unary  # noqa: N815 - ONNX op names
    op_QuantizeLinear = op_unary  # noqa: N815
    op_DequantizeLinear = op_unary  # noqa: N815

    def op_CastLike(self, node: ir.Node, states: list[State]) -> None:  # noqa: N802
        # the data's state carries over: a batch, or a size (``clamp(x, max=b)``)
        if _is_size(states[0]) or isinstance(states[0], Batch):
            self.set_outputs(node, [states[0]])
        else:
            self.set_outputs(node, [FREE])

    def op_elementwise(self, node: ir.Node, states: list[State]) -> None:
        ranks = [self.rank(v) if v is not None else 0 for v in node.inputs]
        out_rank = self.rank(node.outputs[0])
        if out_rank is None:
            known = [r for r in ranks if r is not None]
            out_rank = max(known) if len(known) == len(ranks) else None
        axes = set()
        for state in states:
            if isinstance(state, Batch):
                if out_rank is None:
                    self.give_up(node, "has inputs of unknown rank")
                    return
                axes.add((state.axis + out_rank - state.rank, state.inner))
        if any(_is_size(s) for s in states):
            self.give_up(node, "uses the batch size as a value (a request's result would "
                         "depend on how many rows are batched with it)", mixing=True)
            return
        if len(axes) > 1:
            self.give_up(node, "broadcasts the batch of one input against another axis of "
                         "another (rows of different requests meet)", mixing=True)
            return
        assert out_rank is not None
        axis, inner = axes.pop()
        self.set_outputs(node, [Batch(axis, out_rank, inner)])

    def op_Shape(self, node: ir.Node, states: list[State]) -> None:  # noqa: N802
        state = states[0]
        assert isinstance(state, Batch)
        start = node.attributes.get_int("start", 0)
        end = node.attributes.get_int("end", state.rank)
        start, end = (min(max(k + state.rank if k < 0 else k, 0), state.rank)
                      for k in (start, end))
        self.set_outputs(node, [_sizes([k == state.axis for k in range(start, end)])])

    def op_Size(self, node: ir.Node, states: list[State]) -> None:  # noqa: N802
        self.set_outputs(node, [SIZE])

    def only_first(self, node: ir.Node, states: list[State]) -> Batch | None:
        """The first input's batch, every other input free of rows and sizes (a weight)."""
        if any(s != FREE for s in states[1:]) or not isinstance(states[0], Batch):
            self.give_up(node, "reads the batch in an input other than its data")
            return None
        return states[0]

    def mixed_along(self, node: ir.Node, what: str) -> None:
        self.give_up(node, f"{what} along the batch axis (rows of different requests "
                     "are combined)", mixing=True)

    def normalized(self, axis: int, rank: int) -> int:
        return axis + rank if axis < 0 else axis

    def op_reduce(self, node: ir.Node, states: list[State]) -> None:
        state = self.only_first(node, states)
        if state is None:
            return
        keep = node.attributes.get_int("keepdims", 1)
        if "axes" in node.attributes:
            axes: Any = list(node.attributes.get_ints("axes", []))
        elif len(node.inputs) > 1 and node.inputs[1] is not None:
            axes = self.const(node.inputs[1])
            if axes is None:
                self.give_up(node, "reduces over axes computed at run time")
                return
            axes = [int(a) for a in axes.reshape(-1)]
        else:
            axes = []
        if not axes:
            if node.attributes.get_int("noop_with_empty_axes", 0):
                self.set_outputs(node, [state])
                return
            axes = list(range(state.rank))
        axes = [self.normalized(a, state.rank) for a in axes]
        if state.axis in axes:
            self.mixed_along(node, "reduces")
            return
        if keep:
            self.set_outputs(node, [state])
        else:
            below = sum(a < state.axis for a in axes)
            self.set_outputs(node, [dataclasses.replace(state, axis=state.axis - below,
                                                 rank=state.rank - len(set(axes)))])

    def op_ArgMax(self, node: ir.Node, states: list[State]) -> None:  # noqa: N802
        state = self.only_first(node, states)
        if state is None:
            return
        axis = self.normalized(node.attributes.get_int("axis", 0), state.rank)
        if axis == state.axis:
            self.mixed_along(node, "takes the arg max/min")
        elif node.attributes.get_int("keepdims", 1):
            self.set_outputs(node, [state])
        else:
            self.set_outputs(node, [dataclasses.replace(
                state, axis=state.axis - (axis < state.axis), rank=state.rank - 1)])

    op_ArgMin = op_ArgMax  # noqa: N815

    def along_axis(self, node: ir.Node, states: list[State], axis: int | None,
                   what: str) -> None:
        """An op along ``axis`` that keeps the shape elsewhere (softmax, top-k, cumsum)."""
        state = self.only_first(node, states)
        if state is None:
            return
        if axis is None:
            self.give_up(node, f"{what} along an axis computed at run time")
        elif self.normalized(axis, state.rank) == state.axis:
            self.mixed_along(node, what)
        else:
            self.set_outputs(node, [state] * len(node.outputs))

    def op_Softmax(self, node: ir.Node, states: list[State]) -> None:  # noqa: N802
        state = states[0]
        if self.opset < 13 and isinstance(state, Batch):
            axis = self.normalized(node.attributes.get_int("axis", 1), state.rank)
            if state.axis >= axis:
                self.mixed_along(node, "normalizes")
                return
        self.along_axis(node, states, node.attributes.get_int("axis", -1), "normalizes")

    op_LogSoftmax = op_Softmax  # noqa: N815
    op_Hardmax = op_Softmax  # noqa: N815

    def op_TopK(self, node: ir.Node, states: list[State]) -> None:  # noqa: N802
        if _is_size(states[1]):  # sorts the batch (argsort), or each row's k grows with it
            self.give_up(node, "takes k from the batch size", mixing=True)
            return
        self.along_axis(node, [states[0], FREE if states[1] != LOST else LOST],
                        node.attributes.get_int("axis", -1), "sorts (top-k)")

    def op_CumSum(self, node: ir.Node, states: list[State]) -> None:  # noqa: N802
        if any(_is_size(s) for s in states[1:]):
            self.give_up(node, "sums along an axis computed from the batch size")
            return
        axis = self.const(node.inputs[1])
        self.along_axis(node, [states[0], *(FREE for _ in states[1:])],
                        None if axis is None else int(axis.reshape(-1)[0]), "sums cumulatively")

    def op_LayerNormalization(self, node: ir.Node, states: list[State]) -> None:  # noqa: N802
        state = self.only_first(node, states)
        if state is None:
            return
        axis = self.normalized(node.attributes.get_int("axis", -1), state.rank)
        if state.axis >= axis:
            self.mixed_along(node, "normalizes")
        else:
            self.set_outputs(node, [state] * len(node.outputs))

    op_RMSNormalization = op_LayerNormalization  # noqa: N815

    def op_nchw(self, node: ir.Node, states: list[State]) -> None:
        state = self.only_first(node, states)
        if state is None:
            return
        if node.op_type == "BatchNormalization" and node.attributes.get_int("training_mode", 0):
            self.mixed_along(node, "takes batch statistics")
        elif state.axis != 0:
            self.mixed_along(node, "convolves, pools or normalizes")
        else:
            rank = self.rank(node.outputs[0]) or state.rank
            self.set_outputs(node, [dataclasses.replace(state, rank=rank)]
                             + [LOST] * (len(node.outputs) - 1))

    def op_Trilu(self, node: ir.Node, states: list[State]) -> None:  # noqa: N802
        state = self.only_first(node, states)
        if state is not None:
            if state.axis >= state.rank - 2:
                self.mixed_along(node, "masks by row index")
            else:
                self.set_outputs(node, [state])

    def op_Transpose(self, node: ir.Node, states: list[State]) -> None:  # noqa: N802
        state = states[0]
        assert isinstance(state, Batch)
        perm = list(node.attributes.get_ints("perm", list(range(state.rank))[::-1]))
        self.set_outputs(node, [dataclasses.replace(state, axis=perm.index(state.axis))])

    def op_Squeeze(self, node: ir.Node, states: list[State]) -> None:  # noqa: N802
        state = states[0]
        if not isinstance(state, Batch) or any(s != FREE for s in states[1:]):
            self.give_up(node, "squeezes by axes that depend on the batch")
            return
        axes = self._axes(node)
        if axes is None:
            dims = self.dims(node.inputs[0])
            if dims is None or any(d is None or isinstance(d, str) for d in dims):
                self.give_up(node, "squeezes axes the analysis cannot tell")
                return
            axes = [k for k, d in enumerate(dims) if d == 1]
        axes = [self.normalized(a, state.rank) for a in axes]
        if state.axis in axes:
            self.mixed_along(node, "squeezes")
            return
        self.set_outputs(node, [dataclasses.replace(
            state, axis=state.axis - sum(a < state.axis for a in axes),
            rank=state.rank - len(axes))])

    def op_Unsqueeze(self, node: ir.Node, states: list[State]) -> None:  # noqa: N802
        state = states[0]
        axes = self._axes(node)
        if not isinstance(state, Batch) or axes is None or any(s != FREE for s in states[1:]):
            self.give_up(node, "unsqueezes by axes the analysis cannot tell")
            return
        rank = state.rank + len(axes)
        inserted = {self.normalized(a, rank) for a in axes}
        kept = [k for k in range(rank) if k not in inserted]
        self.set_outputs(node, [dataclasses.replace(state, axis=kept[state.axis], rank=rank)])

    def _axes(self, node: ir.Node) -> list[int] | None:
        if "axes" in node.attributes:
            return list(node.attributes.get_ints("axes", []))
        if len(node.inputs) > 1 and node.inputs[1] is not None:
            axes = self.const(node.inputs[1])
            return None if axes is None else [int(a) for a in axes.reshape(-1)]
        return None

    def op_Reshape(self, node: ir.Node, states: list[State]) -> None:  # noqa: N802
        """The batch survives a reshape where the result has one axis holding the batch
        size as a factor, with as many elements before it as the input (or as many after
        the batch index): a request's rows stay one block, at the same place."""
        state = states[0]
        if not isinstance(state, Batch) or isinstance(states[1], Batch):
            self.give_up(node, "reshapes by a shape read from the rows")
            return
        before, after = self.dims(node.inputs[0]), self.dims(node.outputs[0])
        if before is not None and after is not None:
            after = _solve_one(before, after)
        axes = None if after is None else self.batch_axes_of(after)
        k = state.axis
        if before is None or after is None or axes is None or \
                self.inner(before[k]) != state.inner:
            self.give_up(node, "reshapes to a shape the analysis cannot tell")
            return
        head, tail = _product(before[:k]), _product(before[k + 1:])
        tail = None if tail is None else _times(tail, state.inner)
        for j in axes if len(axes) == 1 else ():
            inner = self.inner(after[j])
            rest = _product(after[j + 1:])
            assert inner is not None
            if (head is not None and head == _product(after[:j])) or \
                    (tail is not None and rest is not None and tail == _times(rest, inner)):
                self.set_outputs(node, [Batch(j, len(after), inner)])
                return
        self.give_up(node, f"reshapes {before} to {after}: a request's rows no longer "
                     "stay one block (rows of different requests may be merged)")

    op_Flatten = op_Reshape  # noqa: N815

    def op_Expand(self, node: ir.Node, states: list[State]) -> None:  # noqa: N802
        state = states[0]
        if not isinstance(state, Batch) or isinstance(states[1], Batch):
            self.give_up(node, "expands to a shape read from the rows")
            return
        rank = self.rank(node.outputs[0])
        if rank is None:
            self.give_up(node, "expands to a shape of unknown rank")
            return
        self.set_outputs(node, [dataclasses.replace(state, axis=state.axis + rank - state.rank,
                                                 rank=rank)])

    def op_Tile(self, node: ir.Node, states: list[State]) -> None:  # noqa: N802
        state = states[0]
        repeats = self.const(node.inputs[1])
        if isinstance(state, Batch) and repeats is not None and \
                int(repeats.reshape(-1)[state.axis]) == 1:
            self.set_outputs(node, [state])
        else:
            self.mixed_along(node, "repeats")

    def op_Concat(self, node: ir.Node, states: list[State]) -> None:  # noqa: N802
        batches = {s for s in states if isinstance(s, Batch)}
        if any(_is_size(s) for s in states):
            self.give_up(node, "concatenates rows with values computed from the batch size "
                         "(row positions, for indices)")
            return
        if len(batches) != 1:
            self.give_up(node, "concatenates tensors batched at different axes",
                         mixing=True)
            return
        state = batches.pop()
        if self.normalized(node.attributes.get_int("axis", 0), state.rank) == state.axis:
            self.mixed_along(node, "concatenates")
            return
        self.set_outputs(node, [state])

    def op_Split(self, node: ir.Node, states: list[State]) -> None:  # noqa: N802
        if any(_is_size(s) for s in states[1:]):
            self.give_up(node, "splits in parts computed from the batch size")
            return
        self.along_axis(node, [states[0], *(FREE for _ in states[1:])],
                        node.attributes.get_int("axis", 0), "splits")

    def op_Slice(self, node: ir.Node, states: list[State]) -> None:  # noqa: N802
        state = states[0]
        if not isinstance(state, Batch):
            self.give_up(node, "slices by bounds read from the rows")
            return
        starts = self.const(node.inputs[1])
        axes_value = node.inputs[3] if len(node.inputs) > 3 else None
        axes = self.const(axes_value) if axes_value is not None else (
            None if starts is None else np.arange(starts.size))
        if axes is None:
            self.give_up(node, "slices axes computed at run time")
            return
        axes_list = [self.normalized(int(a), state.rank) for a in axes.reshape(-1)]
        if any(_is_size(s) for s in states[1:]) and not self._sized_bounds(
                node, states, state, axes_list):
            return
        if state.axis in axes_list:
            steps_value = node.inputs[4] if len(node.inputs) > 4 else None
            steps = self.const(steps_value) if steps_value is not None else \
                np.ones(len(axes_list), np.int64)
            whole = self.dims(node.outputs[0])
            if steps is None or int(steps.reshape(-1)[axes_list.index(state.axis)]) != 1 or \
                    whole is None or not self.is_batch_dim(whole[state.axis]):
                self.mixed_along(node, "slices")
                return
        if any(isinstance(s, Batch) for s in states[1:]):
            self.give_up(node, "slices by bounds read from the rows")
            return
        self.set_outputs(node, [state])

    def _sized_bounds(self, node: ir.Node, states: list[State], state: Batch,
                      axes: list[int]) -> bool:
        """Slice bounds computed from the batch size: on the batch axis the slice must keep
        all of it (``x[:b]``; ``roll``'s ``x[-1:]``, ``x[:-1]`` do not), which
        :meth:`op_Slice` checks of every slice of that axis; another axis cut to the batch
        size mixes requests. False: reported."""
        if any(_is_size(s) for s in states[3:]):
            self.give_up(node, "slices axes or steps computed from the batch size")
            return False
        masks = [self.mask(s, v) for s, v in zip(states[1:3], node.inputs[1:3])]
        for k, axis in enumerate(axes):
            sized = [m[k] if m is not None and k < len(m) else _is_size(s)
                     for m, s in zip(masks, states[1:3])]
            if any(sized) and axis != state.axis:
                self.give_up(node, "slices by bounds computed from the batch size",
                             mixing=True)
                return False
        return True

    def op_Pad(self, node: ir.Node, states: list[State]) -> None:  # noqa: N802
        state = states[0]
        pads = self.const(node.inputs[1]) if len(node.inputs) > 1 else None
        axes = self.const(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] else None
        if not isinstance(state, Batch) or pads is None or any(
                isinstance(s, Batch) or _is_size(s) for s in states[1:]):
            self.give_up(node, "pads by amounts computed at run time")
            return
        axes_list = [self.normalized(int(a), state.rank) for a in axes.reshape(-1)] \
            if axes is not None else list(range(state.rank))
        pads = pads.reshape(-1)
        n = len(axes_list)
        if state.axis in axes_list:
            k = axes_list.index(state.axis)
            if pads[k] != 0 or pads[k + n] != 0:
                self.mixed_along(node, "pads")
                return
        self.set_outputs(node, [state])

    def op_Gather(self, node: ir.Node, states: list[State]) -> None:  # noqa: N802
        data, indices = states
        rank = self.rank(node.inputs[0])
        q = self.rank(node.inputs[1])
        if rank is None or q is None:
            self.give_up(node, "gathers with operands of unknown rank")
            return
        axis = self.normalized(node.attributes.get_int("axis", 0), rank)
        if isinstance(data, Batch) and indices == FREE:
            if data.axis == axis:
                self.mixed_along(node, "gathers")
            else:
                shift = q - 1 if data.axis > axis else 0
                self.set_outputs(node, [dataclasses.replace(data, axis=data.axis + shift,
                                                     rank=rank + q - 1)])
        elif data == FREE and isinstance(indices, Batch):  # a lookup (embedding)
            self.set_outputs(node, [dataclasses.replace(indices, axis=axis + indices.axis,
                                                 rank=rank + q - 1)])
        else:
            self.give_up(node, "gathers by indices that depend on the batch")

    def op_GatherElements(self, node: ir.Node, states: list[State]) -> None:  # noqa: N802
        data, indices = states
        if isinstance(data, Batch) and data == indices:
            axis = self.normalized(node.attributes.get_int("axis", 0), data.rank)
            if axis == data.axis:
                self.mixed_along(node, "gathers")
            else:
                self.set_outputs(node, [data])
        else:
            self.give_up(node, "gathers by indices that depend on the batch")

    def op_OneHot(self, node: ir.Node, states: list[State]) -> None:  # noqa: N802
        state = states[0]
        if not isinstance(state, Batch) or any(s != FREE for s in states[1:]):
            self.give_up(node, "reads the batch in its depth or values")
            return
        axis = self.normalized(node.attributes.get_int("axis", -1), state.rank + 1)
        self.set_outputs(node, [dataclasses.replace(state, axis=state.axis + (axis <= state.axis),
                                                 rank=state.rank + 1)])

    def op_MatMul(self, node: ir.Node, states: list[State]) -> None:  # noqa: N802
        """``[..., M, K] @ [..., K, N]``: a batch in the leading (broadcast) dims or at M of
        the first operand or N of the second stays; at K it is contracted; one at M and
        one at N would pair every row with every other."""
        ra, rb = self.rank(node.inputs[0]), self.rank(node.inputs[1])
        if any(_is_size(s) for s in states):  # ``ones(b, b).tril() @ x``
            self.give_up(node, "multiplies the rows by a tensor shaped by the batch size",
                         mixing=True)
            return
        if ra is None or rb is None:
            self.give_up(node, "multiplies operands of unknown rank")
            return
        r = max(ra, rb) if ra > 1 and rb > 1 else max(ra, rb) - 1
        lead = r - 2 if ra > 1 and rb > 1 else r - 1  # broadcast dims in the result
        found: list[tuple[str, int, Mono]] = []
        for state, rank, own in ((states[0], ra, "m"), (states[1], rb, "n")):
            if not isinstance(state, Batch):
                continue
            contracted = rank - 1 if own == "m" else rank - 2
            if rank == 1 or state.axis == contracted:
                self.mixed_along(node, "contracts (a matrix product)")
                return
            if state.axis == (rank - 2 if own == "m" else rank - 1):
                found.append((own, r - 1 if own == "n" or rb == 1 else r - 2, state.inner))
            else:
                found.append(("lead", state.axis + lead - (rank - 2), state.inner))
        if len(found) == 2 and (found[0] != found[1] or found[0][0] != "lead"):
            self.give_up(node, "multiplies rows of its operands by each other (the batch of "
                         "one meets the batch of the other)", mixing=True)
            return
        self.set_outputs(node, [Batch(found[0][1], r, found[0][2])])

    def op_Gemm(self, node: ir.Node, states: list[State]) -> None:  # noqa: N802
        a, b = states[0], states[1]
        c = states[2] if len(states) > 2 else FREE
        out: set[tuple[int, Mono]] = set()
        if isinstance(a, Batch):
            if a.axis != node.attributes.get_int("transA", 0):
                self.mixed_along(node, "contracts (a matrix product)")
                return
            out.add((0, a.inner))
        if isinstance(b, Batch):
            if b.axis == node.attributes.get_int("transB", 0):
                self.mixed_along(node, "contracts (a matrix product)")
                return
            out.add((1, b.inner))
        if isinstance(c, Batch):
            out.add((c.axis + 2 - c.rank, c.inner))
        if any(_is_size(s) for s in states) or len(out) != 1:
            self.give_up(node, "multiplies rows of its operands by each other (the batch of "
                         "one meets the batch of the other)", mixing=True)
            return
        axis, inner = out.pop()
        self.set_outputs(node, [Batch(axis, 2, inner)])


def _evaluate(node: ir.Node, inputs: list[np.ndarray | None], wanted: ir.Value
              ) -> np.ndarray | None:
    """One output of one node on constant inputs, by ONNX's reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    try:
        proto = ir.serde.serialize_node(node)
        feeds = {v.name: x for v, x in zip(node.inputs, inputs) if v is not None}
        results = ReferenceEvaluator(proto).run(None, feeds)
        out = results[[o.name for o in node.outputs].index(wanted.name)]
    except Exception:  # an op the evaluator lacks: not a constant to us
        return None
    return np.asarray(out)


def _outer_states(node: ir.Node, analysis: _Analysis) -> list[State]:
    """States of the values a node's subgraphs read from outside them."""
    found: list[State] = []
    for attr in node.attributes.values():
        graphs = [attr.value] if attr.type == ir.AttributeType.GRAPH else (
            list(attr.value) if attr.type == ir.AttributeType.GRAPHS else [])
        for graph in graphs:
            inner = {v.name for n in ir.traversal.RecursiveGraphIterator(graph)
                     for v in n.outputs} | {v.name for v in graph.inputs}
            for n in ir.traversal.RecursiveGraphIterator(graph):
                for v in n.inputs:
                    if v is not None and v.name not in inner:
                        found.append(analysis.state(v))
    return found


def analyze(graph: ir.Graph, symbol: str) -> BatchAnalysis:
    """Follow the batch (the model inputs' axis 0 of size ``symbol``) through ``graph``:
    what mixes rows, what the analysis cannot follow, and whether every output carries the
    batch at axis 0."""
    walk = _Analysis(graph, symbol)
    walk.run(list(graph.inputs))
    for value in graph.outputs:
        state = walk.state(value)
        if state == LOST or (isinstance(state, Batch) and state.axis == 0):
            continue
        producer = value.producer()
        what = ("depends on the batch size" if state == SIZE else "depends on no request"
                if state == FREE else f"has the batch at axis {state.axis}")
        finding = Finding(producer.op_type if producer else "output", value.name or "?",
                          module_of(producer) if producer else "",
                          f"makes output '{value.name}', which {what}, not at axis 0",
                          mixing=state != FREE)
        (walk.mixing if finding.mixing else walk.unproven).append(finding)
    return BatchAnalysis(symbol, walk.states, walk.mixing, walk.unproven)
