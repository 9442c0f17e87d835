"""A size by its value: where the shape arithmetic of a size reads a dimension no activation
of the body has, the size itself may still be one of theirs.

diffusers' attention flattens a feature map, ``h' * w'``; torch.export computes
``h' = (h - 1) // 2 + 1`` once at the root from the model input's height, which no block
below the downsampler sees: derived node by node, the size stays a function input. Its
value, ``((h - 1)//2 + 1) * ((w - 1)//2 + 1)``, is the product of two dimensions of the
block's own activation (``(((h - 1)//2)) + 1``), so the body computes it from that shape.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
import sympy

#: Elementwise shape arithmetic, as sympy sees it (integer division floors: sizes are >= 0).
_BINARY = {
    "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
    "Div": lambda a, b: sympy.floor(a / b), "Mod": lambda a, b: sympy.Mod(a, b),
    "Max": sympy.Max, "Min": sympy.Min,
}
_PASS = frozenset({"Squeeze", "Unsqueeze", "Identity", "Reshape", "Cast"})
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


@functools.lru_cache(maxsize=4096)
def _parsed(dim: str) -> sympy.Expr | None:
    """A symbolic dimension's text (``(((h - 1)//2)) + 1``) as an expression; every name a
    symbol (``S`` or ``N`` are not sympy's constants here)."""
    names = {n: sympy.Symbol(n, integer=True, nonnegative=True)
             for n in _IDENTIFIER.findall(dim)}
    try:
        return sympy.sympify(dim, locals=names)
    except (sympy.SympifyError, SyntaxError, TypeError, ValueError):
        return None


def _dim(dim: object) -> sympy.Expr | None:
    if isinstance(dim, int):
        return sympy.Integer(dim)
    text = getattr(dim, "value", None)
    if not isinstance(text, str) or not text or text.startswith("unk__"):
        return None
    return _parsed(text)


Values = dict[ir.Value, list[sympy.Expr]]


def _values(cone: Sequence[ir.Node]) -> Values | None:
    """Each value of ``cone`` (shape arithmetic, producers first) as a list of expressions
    (a scalar: one); None where an op or an operand is beyond this reading."""
    known: Values = {}
    for node in cone:
        result = _evaluated(node, known)
        if result is None:
            return None
        for output in node.outputs:
            known[output] = result
    return known


def _operand(value: ir.Value | None, known: Values) -> list[sympy.Expr] | None:
    """An operand computed earlier in the cone, or a small constant tensor."""
    if value is None:
        return None
    if value in known:
        return known[value]
    tensor = value.const_value
    if tensor is None or tensor.size > 64:
        return None
    return [sympy.Integer(int(v)) if float(v).is_integer() else sympy.Float(float(v))
            for v in np.asarray(tensor.numpy()).ravel()]


def _evaluated(node: ir.Node, known: Values) -> list[sympy.Expr] | None:
    """What ``node`` computes, from its operands' expressions."""
    operands = [_operand(v, known) for v in node.inputs]
    if node.op_type == "Constant":
        tensor = ir.convenience.get_const_tensor(node.outputs[0])
        return None if tensor is None else _operand(ir.Value(const_value=tensor), known)
    if node.op_type == "Shape":
        return _shape_dims(node)
    if any(o is None for o in operands) or not operands:
        return None
    first = operands[0]
    assert first is not None
    if node.op_type in _PASS:
        return first
    if node.op_type in _BINARY and len(operands) == 2:
        second = operands[1]
        assert second is not None
        return _broadcast(node.op_type, first, second)
    if node.op_type in ("Neg", "Abs"):
        return [-x if node.op_type == "Neg" else sympy.Abs(x) for x in first]
    if node.op_type == "Concat":
        return [x for o in operands if o is not None for x in o]
    if node.op_type == "Gather" and node.attributes.get_int("axis", 0) == 0:
        index = operands[1] if len(operands) == 2 else None
        return None if index is None or len(index) != 1 else [first[int(index[0])]]
    if node.op_type in ("ReduceProd", "ReduceSum") and len(operands) == 1:
        return [sympy.Mul(*first) if node.op_type == "ReduceProd" else sympy.Add(*first)]
    return None


def _broadcast(op: str, first: list[sympy.Expr], second: list[sympy.Expr]
               ) -> list[sympy.Expr] | None:
    """``op`` element by element, a one-element side broadcast."""
    if len(first) != len(second) and 1 not in (len(first), len(second)):
        return None
    return [_BINARY[op](first[k if len(first) > 1 else 0], second[k if len(second) > 1 else 0])
            for k in range(max(len(first), len(second)))]


def _shape_dims(node: ir.Node) -> list[sympy.Expr] | None:
    """``Shape(x)`` (its start and end) as the expressions of x's dimensions."""
    source = node.inputs[0]
    if source is None or source.shape is None:
        return None
    dims = [_dim(d) for d in source.shape]
    start = node.attributes.get_int("start", 0)
    end = node.attributes.get_int("end", len(dims))
    result = dims[slice(start, end)]
    return None if any(d is None for d in result) else result  # type: ignore[return-value]


def _equal(a: sympy.Expr, b: sympy.Expr) -> bool:
    if a == b:
        return True
    if a.free_symbols != b.free_symbols:
        return False
    try:
        return sympy.simplify(a - b) == 0
    except (TypeError, ValueError):
        return False


def _run_with(target: sympy.Expr, activations: Sequence[tuple[ir.Value, ir.Value]]
              ) -> tuple[ir.Value, int, int] | None:
    """(the body's activation, start, end): a run of its dimensions whose product is
    ``target``."""
    for outer, inner in activations:
        dims = [_dim(d) for d in (outer.shape or [])]
        for start in range(len(dims)):
            product: sympy.Expr = sympy.Integer(1)
            for end in range(start, len(dims)):
                if dims[end] is None:
                    break
                product = product * dims[end]
                if _equal(product, target):
                    return inner, start, end + 1
    return None


def by_value(size: ir.Value, cone: Sequence[ir.Node],
             activations: Sequence[tuple[ir.Value, ir.Value]], name: str
             ) -> list[ir.Node] | None:
    """Nodes computing the int64 ``size`` (a scalar or a short vector) from runs of the
    activations' dimensions with its value, element by element; None where an element is
    no such product (or the arithmetic is beyond :func:`_values`)."""
    if size.dtype != ir.DataType.INT64 or size.shape is None or len(size.shape) > 1:
        return None
    known = _values(cone)
    target = known.get(size) if known is not None else None
    if not target or (len(size.shape) == 0 and len(target) != 1):
        return None
    nodes: list[ir.Node] = []
    pieces: list[ir.Value] = []
    for k, element in enumerate(target):
        tag = f"{name}_v{k}"
        if element.is_Integer:
            node = ir.node("Constant", [], attributes={
                "value": ir.tensor(np.array([int(element)], dtype=np.int64), name=tag)},
                name=tag)
            nodes.append(node)
        else:
            run = _run_with(element, activations)
            if run is None:
                return None
            shape = ir.node("Shape", [run[0]], attributes={"start": run[1], "end": run[2]},
                            name=f"{tag}_shape")
            shape.outputs[0].name = f"{tag}_shape"
            node = ir.node("ReduceProd", [shape.outputs[0]], attributes={"keepdims": 1},
                           name=tag)
            nodes += [shape, node]
        node.outputs[0].name = tag
        node.outputs[0].dtype, node.outputs[0].shape = ir.DataType.INT64, ir.Shape([1])
        pieces.append(node.outputs[0])
    last = pieces[0]
    if len(pieces) > 1:
        nodes.append(ir.node("Concat", pieces, attributes={"axis": 0}, name=f"{name}_cat"))
        last = nodes[-1].outputs[0]
    if len(size.shape) == 0:
        axes = ir.node("Constant", [], attributes={
            "value": ir.tensor(np.array([0], dtype=np.int64), name=f"{name}_axes")},
            name=f"{name}_axes")
        nodes += [axes, ir.node("Squeeze", [last, axes.outputs[0]], name=f"{name}_sq")]
    else:
        nodes.append(ir.node("Identity", [last], name=f"{name}_id"))
    nodes[-1].outputs[0].type, nodes[-1].outputs[0].shape = size.type, size.shape
    nodes[-1].outputs[0].name = name
    return nodes
