"""``--dynamic INPUT:AXIS=NAME[,AXIS=NAME]``: dynamic dimensions for ``export`` on the
command line, as ``dynamic_shapes`` with named axes (``{0: "batch", 1: "seq"}``) is in the API.

``INPUT`` is a parameter name of the model's ``forward`` or the position of a positional
input (``0``); each axis is ``Dim.DYNAMIC``, named on the file's axes as ``om.export`` names
string dimensions. The specs are checked against the inputs before the export starts.
"""

from __future__ import annotations

import argparse
import inspect
import re
from collections.abc import Sequence
from typing import Any

import torch

from onnx_modular.leaves.errors import fail, rules

_AXIS = re.compile(r"^\s*(-?\d+)\s*=\s*([A-Za-z_][A-Za-z0-9_]*)\s*$")


def add_dynamic(parser: argparse.ArgumentParser) -> None:
    """``--dynamic``, repeatable; read with :func:`dynamic_shapes`."""
    parser.add_argument("--dynamic", action="append", metavar="INPUT:AXIS=NAME[,AXIS=NAME]",
                        help="dynamic axes of one input, named in the file, e.g. "
                        "input_ids:0=batch,1=seq (repeat per input)")


def dynamic_shapes(specs: Sequence[str] | None, model: Any, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """``dynamic_shapes`` for ``om.export`` from the ``--dynamic`` specs: a dict over every
    input by its parameter name, ``None`` where an input has no dynamic axis."""
    if not specs:
        return None
    if isinstance(model, torch.export.ExportedProgram):
        raise fail("--dynamic applies to a model, not an ExportedProgram: its shapes were "
                   "fixed when it was exported (export it with dynamic_shapes=)",
                   rules.BAD_INPUT)
    names = _parameter_names(model, len(args))
    inputs = {**dict(zip(names, args)), **kwargs}
    shapes: dict[str, Any] = {name: None for name in inputs}
    for spec in specs:
        name, axes = _parsed(spec, names, inputs)
        tensor = inputs[name]
        if not isinstance(tensor, torch.Tensor):
            raise fail(f"--dynamic {spec}: input '{name}' is a {type(tensor).__name__}, not a "
                       "tensor; --dynamic names axes of tensor inputs", rules.BAD_INPUT)
        if shapes[name] is not None:
            raise fail(f"--dynamic {spec}: input '{name}' is given twice", rules.BAD_INPUT)
        shapes[name] = {}
        for a, dim in axes:
            axis = _axis(a, tensor, spec, name)
            if axis in shapes[name]:
                raise fail(f"--dynamic {spec}: axis {a} of '{name}' is named twice",
                           rules.BAD_INPUT)
            shapes[name][axis] = dim
    _refuse_var_keywords(shapes, model, names)
    return shapes


def _refuse_var_keywords(shapes: dict[str, Any], model: Any, positional: list[str]) -> None:
    """Inputs ``forward`` collects in ``**kwargs``: torch.export fails inside on dynamic
    shapes for such a call (``Must provide a tree_name``), whatever the spec says of them."""
    parameters = _parameters(model)
    named = {p.name for p in parameters if p.kind != p.VAR_KEYWORD}
    collected = [k for k in shapes if k not in named and k not in positional]
    if collected and any(p.kind == p.VAR_KEYWORD for p in parameters):
        raise fail(f"--dynamic: forward collects {', '.join(collected)} in **kwargs, and "
                   "torch.export takes no dynamic shapes for such a call; name them as "
                   "parameters of forward, or export without --dynamic", rules.BAD_INPUT)


def _parameters(model: Any) -> list[inspect.Parameter]:
    """The parameters of the model's ``forward`` (none where Python cannot tell)."""
    forward = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        return list(inspect.signature(forward).parameters.values())
    except (TypeError, ValueError):
        return []


def _parameter_names(model: Any, count: int) -> list[str]:
    """The names of the first ``count`` positional parameters of ``forward``."""
    positional = [p.name for p in _parameters(model)
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < count:
        raise fail(f"--dynamic names inputs by forward's parameters, and it has "
                   f"{len(positional)} positional one(s) for {count} positional input(s)",
                   rules.BAD_INPUT)
    return positional[:count]


def _parsed(spec: str, names: list[str], inputs: dict[str, Any]
            ) -> tuple[str, list[tuple[int, str]]]:
    """``INPUT:AXIS=NAME,...`` -> (the input's parameter name, [(axis, name)])."""
    head, colon, tail = spec.partition(":")
    head = head.strip()
    if not colon or not head or not tail.strip():
        raise fail(f"--dynamic {spec!r}: expected INPUT:AXIS=NAME[,AXIS=NAME], e.g. "
                   "input_ids:0=batch,1=seq", rules.BAD_INPUT)
    name = names[int(head)] if head.isdigit() and int(head) < len(names) else head
    if name not in inputs:
        raise fail(f"--dynamic {spec}: the model takes no input '{head}' (its inputs: "
                   f"{', '.join(inputs) or 'none'}, or their positions)", rules.BAD_INPUT)
    axes = []
    for part in tail.split(","):
        match = _AXIS.match(part)
        if match is None:
            raise fail(f"--dynamic {spec}: {part.strip()!r} is not AXIS=NAME (e.g. 0=batch)",
                       rules.BAD_INPUT)
        axes.append((int(match.group(1)), match.group(2)))
    return name, axes


def _axis(axis: int, tensor: torch.Tensor, spec: str, name: str) -> int:
    """``axis`` of ``tensor``, negative from the end; out of range is an error."""
    if not -tensor.dim() <= axis < tensor.dim():
        raise fail(f"--dynamic {spec}: input '{name}' has {tensor.dim()} axes "
                   f"(shape {list(tensor.shape)}); there is no axis {axis}", rules.BAD_INPUT)
    return axis % tensor.dim()
