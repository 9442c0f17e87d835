"""Inputs of a check: which tensor feeds which ONNX input, and inputs made up when none are given.

``validate`` binds the tensors a torch model takes to the ONNX model's declared inputs
(:func:`bind_inputs`), checking count, dtype and rank so a mismatch is one clear line rather
than an ORT traceback. ``compare`` feeds two models the same given or random inputs
(:func:`feeds`, :func:`random_inputs`).
"""

from __future__ import annotations

import ast
import inspect
import math
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import torch

from onnx_modular.check.numerics import dtype_name, onnx_elem_name
from onnx_modular.leaves import runtime
from onnx_modular.leaves._compat import module_in_spec, tree_leaves
from onnx_modular.leaves._util import check_allocation
from onnx_modular.leaves.arguments import ExampleArgs
from onnx_modular.leaves.errors import fail
from onnx_modular.parts.runner import ordered_kwargs

#: The size a dynamic dimension gets in generated inputs.
DEFAULT_DIM = 4

#: An input tensor and the model parameter it was passed as (None inside a pytree).
Leaf = tuple[str | None, torch.Tensor]


def declared_inputs(proto: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs a caller feeds (initializers listed as inputs are not)."""
    initializers = {i.name for i in proto.graph.initializer}
    return [i for i in proto.graph.input if i.name not in initializers]


def input_signature(proto: onnx.ModelProto) -> list[tuple[str, int]]:
    """(dtype, rank) of every declared input: what two models fed alike must agree on."""
    return [(onnx_elem_name(i.type.tensor_type.elem_type), len(i.type.tensor_type.shape.dim))
            for i in declared_inputs(proto)]


# ---- torch inputs ------------------------------------------------------------------------------

def as_args(args: ExampleArgs) -> tuple[Any, ...]:
    """Positional inputs as a tuple: one tensor alone is one argument."""
    if isinstance(args, tuple):
        return args
    if isinstance(args, list):
        return tuple(args)
    return (args,)


def _signature_names(model: Any) -> list[str]:
    try:
        forward = model.forward if isinstance(model, torch.nn.Module) else model
        return [p.name for p in inspect.signature(forward).parameters.values()
                if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    except (TypeError, ValueError):
        return []


def leaves(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Leaf]:
    """Input tensors in the order torch.export flattens them, each with its parameter name:
    keywords in the order of the call, or of the one a program (a module with an input
    spec: ``ExportedProgram.module()``, ``om.modularize``'s) was captured with."""
    kwargs = ordered_kwargs(kwargs, module_in_spec(model))
    names = _signature_names(model)
    found: list[Leaf] = []

    def add(name: str | None, value: Any) -> None:
        flat = [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]
        for t in flat:
            found.append((name if len(flat) == 1 else None, t))

    for i, a in enumerate(args):
        add(names[i] if i < len(names) else None, a)
    for key, value in kwargs.items():
        add(key, value)
    return found


def bind_inputs(proto: onnx.ModelProto, given: list[Leaf],
                label: str = "the ONNX model") -> dict[str, np.ndarray]:
    """Feeds by name where every name matches, else by position; count/dtype/rank checked."""
    declared = declared_inputs(proto)
    if len(declared) != len(given):
        names = ", ".join(i.name for i in declared)
        raise fail(f"{label} takes {len(declared)} input(s) ({names}) but "
                   f"{len(given)} tensor(s) were given")
    by_name = {n: t for n, t in given if n is not None}
    if all(i.name in by_name for i in declared) and len(by_name) == len(declared):
        pairs = [(i, by_name[i.name]) for i in declared]
    else:
        pairs = [(i, t) for i, (_, t) in zip(declared, given, strict=True)]
    bound: dict[str, np.ndarray] = {}
    for k, (info, tensor) in enumerate(pairs):
        where = f"input #{k} '{info.name}'"
        ttype = info.type.tensor_type
        if not info.type.HasField("tensor_type"):
            raise fail(f"{where} of {label} is not a tensor; only tensor inputs are supported")
        want = onnx_elem_name(ttype.elem_type)
        got = dtype_name(tensor)
        if want != got:
            raise fail(f"{where}: {label} expects {want}, got a {got} tensor")
        if ttype.HasField("shape"):
            dims = ttype.shape.dim
            if len(dims) != tensor.dim():
                raise fail(f"{where}: {label} expects rank {len(dims)}, got a tensor of "
                           f"shape {list(tensor.shape)} (rank {tensor.dim()})")
            for d, (dim, size) in enumerate(zip(dims, tensor.shape, strict=True)):
                if dim.HasField("dim_value") and dim.dim_value != size:
                    raise fail(f"{where}: {label} expects dimension {d} to be "
                               f"{dim.dim_value}, got shape {list(tensor.shape)}")
        bound[info.name] = runtime.to_feed(tensor)
    return bound


# ---- given or random inputs for ONNX models ------------------------------------------------------

def feeds(model: onnx.ModelProto, inputs: Any,
          kwargs: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
    """Feeds for ``model``'s declared inputs: ``inputs`` (a sequence in input order or a
    mapping by name; numpy arrays or torch tensors) and ``kwargs`` (keyword inputs: by name
    where an input has that name, else in order after the positional ones); with neither,
    see :func:`random_inputs`."""
    names = [i.name for i in declared_inputs(model)]
    if isinstance(inputs, Mapping):
        if kwargs:
            inputs, kwargs = (), {**inputs, **kwargs}
        else:  # by name, every one of them
            missing = [n for n in names if n not in inputs]
            if missing:
                raise fail(f"inputs lack {', '.join(missing)} (the models take "
                           f"{', '.join(names)})")
            return {n: runtime.to_feed(inputs[n]) for n in names}
    if inputs is None:
        inputs = ()
    if not isinstance(inputs, Sequence) or isinstance(inputs, (str, bytes)):
        inputs = (inputs,)
    positional = _arrays(inputs) if kwargs else list(inputs)
    named = {k: v for k, v in (kwargs or {}).items() if k in names}
    rest = _arrays([v for k, v in (kwargs or {}).items() if k not in named])
    free = [n for n in names if n not in named]
    values = positional + rest
    if len(values) != len(free):
        given = f"{len(values) + len(named)} were given"
        raise fail(f"the models take {len(names)} input(s) ({', '.join(names)}) but {given}")
    bound = {**dict(zip(free, values, strict=True)), **named}
    return {n: runtime.to_feed(bound[n]) for n in names}


def _arrays(values: Sequence[Any]) -> list[Any]:
    """The tensors and arrays of a pytree of inputs, in order (None and constants left out,
    as torch.export leaves them out of the graph's inputs)."""
    return [v for v in tree_leaves(list(values))
            if isinstance(v, (torch.Tensor, np.ndarray, np.generic))]


#: Symbolic sizes longer than this are not evaluated (torch writes ``s0 + 1``, ``2*s1``).
MAX_DIM_EXPRESSION = 200
#: No evaluated size (or step of one) may exceed this; sizes are checked against memory too.
MAX_DIM_VALUE = 2**40


def _dim_value(dim: onnx.TensorShapeProto.Dimension, symbols: dict[str, int],
               where: str) -> int:
    if dim.HasField("dim_value"):
        return dim.dim_value
    text = dim.dim_param if dim.HasField("dim_param") else ""
    if not text:
        return DEFAULT_DIM
    if text.isidentifier():
        return symbols.setdefault(text, DEFAULT_DIM)
    if len(text) > MAX_DIM_EXPRESSION:
        return DEFAULT_DIM  # no exporter writes such a size; any value fits a symbol
    try:  # torch writes expressions such as "s0 + 1" or "2*s1"
        return max(1, int(_eval_dim(ast.parse(text, mode="eval").body, symbols)))
    except (SyntaxError, ValueError, TypeError, ZeroDivisionError, RecursionError,
            MemoryError):
        return DEFAULT_DIM
    except OverflowError as e:
        raise fail(f"{where} has the symbolic size '{text[:60]}', which evaluates beyond "
                   f"{MAX_DIM_VALUE:,} with every symbol at {DEFAULT_DIM}; give inputs "
                   "explicitly") from e


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.FloorDiv: operator.floordiv, ast.Div: operator.floordiv, ast.Mod: operator.mod}


def _eval_dim(node: ast.AST, symbols: dict[str, int]) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) \
            and not isinstance(node.value, bool):
        value = node.value
    elif isinstance(node, ast.Name):
        value = symbols.setdefault(node.id, DEFAULT_DIM)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = -_eval_dim(node.operand, symbols)
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        value = _BINOPS[type(node.op)](_eval_dim(node.left, symbols),
                                       _eval_dim(node.right, symbols))
    else:
        raise ValueError(ast.dump(node)[:80])
    if abs(value) > MAX_DIM_VALUE:
        raise OverflowError(value)
    return value


#: Ops an index passes through unchanged in value on its way to the table it indexes.
_INDEX_PASS_THROUGH = frozenset({"Cast", "CastLike", "Identity", "Unsqueeze", "Squeeze",
                                 "Reshape", "Flatten", "Expand"})


def index_ranges(model: ir.Model) -> dict[str, tuple[int, str]]:
    """Integer graph inputs that index a table: ``{input: (rows, table name)}``.

    An input is the indices of a ``Gather`` (directly or through ops that keep its values,
    such as Cast and Unsqueeze) whose data has a static size on the gathered axis: an
    embedding's vocabulary. With several tables, the smallest bounds the input. ``model``
    is inlined (local functions hide their bodies' Gathers).
    """
    found: dict[str, tuple[int, str]] = {}
    for value in model.graph.inputs:
        todo, seen = [value], {id(value)}
        while todo:
            for node, index in todo.pop().uses():
                if node.domain not in ("", "ai.onnx"):
                    continue
                if node.op_type in _INDEX_PASS_THROUGH and index == 0:
                    for out in node.outputs:
                        if id(out) not in seen:
                            seen.add(id(out))
                            todo.append(out)
                elif node.op_type == "Gather" and index == 1 and node.inputs[0] is not None:
                    data = node.inputs[0]
                    axis = node.attributes.get_int("axis", 0)
                    shape = data.shape
                    if shape is None or not -len(shape) <= axis < len(shape):
                        continue
                    rows = shape[axis]
                    if isinstance(rows, int) and rows > 0 and (
                            value.name not in found or rows < found[value.name][0]):
                        found[str(value.name)] = (rows, str(data.name))
    return found


#: Integers that index no table are drawn from [0, DEFAULT_INT_HIGH): masks and flags.
DEFAULT_INT_HIGH = 2


def feeding_names(names_a: list[str], names_b: list[str]) -> list[str]:
    """For each input of model b, the input of model a whose value it takes: the one of its
    name where both models name the same inputs (in whatever order they declare them), else
    the one at its position."""
    if sorted(names_a) == sorted(names_b):
        return list(names_b)
    return list(names_a[:len(names_b)])


def _twins(model: onnx.ModelProto, other: onnx.ModelProto | None) -> list[Any]:
    """For each of ``model``'s declared inputs, the input of ``other`` it pairs with (as
    :func:`feeding_names` pairs them), or None."""
    theirs = declared_inputs(other) if other is not None else []
    mine = [i.name for i in declared_inputs(model)]
    partner = dict(zip(feeding_names(mine, [i.name for i in theirs]), theirs, strict=False))
    return [partner.get(name) for name in mine]


def random_inputs(model: onnx.ModelProto, seed: int = 0,
                  other: onnx.ModelProto | None = None,
                  ranges: Mapping[str, tuple[int, str]] | None = None,
                  drawn: list[str] | None = None) -> dict[str, np.ndarray]:
    """Inputs from the declared types and shapes; dynamic dims get ``DEFAULT_DIM``.

    A dimension dynamic in ``model`` but static in ``other`` takes ``other``'s size, so one
    set of inputs fits both (inputs pair by name where both name them alike, else by
    position, as ``compare`` feeds them). Floats are standard normal; integers that index a table
    (``ranges``, from :func:`index_ranges`: an embedding's token ids) are uniform over its
    rows, so every row can be hit; other integers are 0 or 1 (masks, flags); bool is
    either. ``drawn`` receives one line per input saying what was drawn.
    """
    ranges = ranges or {}
    rng = np.random.default_rng(seed)
    twins = _twins(model, other)
    symbols: dict[str, int] = {}
    shapes: list[tuple[str, list[int], Any]] = []
    for k, info in enumerate(declared_inputs(model)):
        where = f"input '{info.name}'"
        if not info.type.HasField("tensor_type"):
            raise fail(f"{where} is not a tensor; give inputs explicitly")
        ttype = info.type.tensor_type
        try:
            np_type = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(ttype.elem_type))
        except Exception as e:  # UNDEFINED or a number no ONNX type has
            raise fail(f"{where} has element type {ttype.elem_type}, of which random "
                       "inputs cannot be made; give inputs explicitly") from e
        twin = list(twins[k].type.tensor_type.shape.dim) if twins[k] is not None else []
        shape = []
        for d, dim in enumerate(ttype.shape.dim):
            if not dim.HasField("dim_value") and d < len(twin) and twin[d].HasField("dim_value"):
                dim = twin[d]
            shape.append(_dim_value(dim, symbols, f"{where} dimension {d}"))
        check_allocation(shape, np_type.itemsize, f"random {where}")
        shapes.append((info.name, shape, np_type))
    check_allocation([sum(math.prod(s) * t.itemsize for _, s, t in shapes)], 1,
                     "the random inputs together")
    made = {}
    for name, shape, np_type in shapes:
        size = "x".join(map(str, shape)) or "scalar"
        if np.issubdtype(np_type, np.floating) or "float" in np_type.name:
            made[name] = rng.standard_normal(shape).astype(np_type)
            what = "standard normal"
        elif np_type == np.bool_:
            made[name] = rng.integers(0, 2, shape).astype(np.bool_)
            what = "False or True"
        else:
            high, why = ranges.get(name, (DEFAULT_INT_HIGH, ""))
            high = min(high, int(np.iinfo(np_type).max) + 1)
            made[name] = rng.integers(0, high, shape).astype(np_type)
            what = f"integers in [0, {high})" + (
                f", the rows of {why}" if why else " (indexes no table: a mask or flag)")
        if drawn is not None:
            drawn.append(f"{name}: {np_type.name} {size}, {what}")
    return made
