"""Why two functions of one class stayed apart: ``BasicBlock_1`` differs from ``BasicBlock``
in a downsample call and Conv strides [2, 2] (vs [1, 1]).

A backend compiles each distinct function once, so every extra function of a class should
be explained by a real difference; the reason is recorded on the function
(``onnx_modular.differs_from``) and shown by ``res.functions`` and ``inspect``.
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Iterable

import numpy as np
import onnx_ir as ir

from onnx_modular.emit.infra import EmitPass
from onnx_modular.leaves.metadata import DIFFERS_FROM

#: At most this many reasons per function: the first differences say enough.
MAX_REASONS = 4


def _label(node: ir.Node, functions: dict[ir.OperatorIdentifier, ir.Function]) -> str:
    """A call by its function (``Sequential_1 call``), anything else by its op type."""
    called = functions.get(node.op_identifier())
    return f"{called.name} call" if called is not None else node.op_type


def _is_constant(node: ir.Node) -> bool:
    return node.op_type == "Constant" and node.domain in ("", "ai.onnx")


def _plain(value: object) -> str:
    if isinstance(value, ir.TensorProtocol):
        array = value.numpy()
        return str(array.tolist()) if array.size <= 8 else f"{array.dtype}{list(array.shape)}"
    if isinstance(value, (list, tuple)):
        return str(list(value))
    return repr(value)


def _constants(function: ir.Function) -> list[tuple[str, str]]:
    """The body's constant tensors: as shown, and by value (a large one shows only its dtype
    and shape)."""
    found = []
    for node in function:
        attr = node.attributes.get("value")
        if not _is_constant(node) or attr is None or attr.is_ref():
            continue
        value = attr.value
        digest = ""
        if isinstance(value, ir.TensorProtocol):
            array = np.ascontiguousarray(value.numpy())
            digest = hashlib.blake2b(array.tobytes(), digest_size=16).hexdigest()
        found.append((_plain(value), digest))
    return sorted(found)


def _counts(labels: Iterable[str]) -> collections.Counter[str]:
    return collections.Counter(labels)


def _spell(counter: collections.Counter[str]) -> str:
    return ", ".join(f"{k}" if v == 1 else f"{k} x{v}" for k, v in sorted(counter.items()))


def differences(function: ir.Function, base: ir.Function,
                functions: dict[ir.OperatorIdentifier, ir.Function]) -> list[str]:
    """What tells ``function`` from ``base`` (same class): ops, attributes, constants, I/O."""
    reasons: list[str] = []
    if len(function.inputs) != len(base.inputs):
        reasons.append(f"{len(function.inputs)} inputs (vs {len(base.inputs)})")
    if len(function.outputs) != len(base.outputs):
        reasons.append(f"{len(function.outputs)} outputs (vs {len(base.outputs)})")
    mine = [n for n in function if not _is_constant(n)]
    theirs = [n for n in base if not _is_constant(n)]
    extra = _counts(_label(n, functions) for n in mine) - \
        _counts(_label(n, functions) for n in theirs)
    missing = _counts(_label(n, functions) for n in theirs) - \
        _counts(_label(n, functions) for n in mine)
    if extra:
        reasons.append(f"extra {_spell(extra)}")
    if missing:
        reasons.append(f"no {_spell(missing)}")
    by_type: dict[str, list[ir.Node]] = collections.defaultdict(list)
    for node in theirs:
        by_type[_label(node, functions)].append(node)
    seen: dict[str, int] = collections.Counter()
    for node in mine:
        label = _label(node, functions)
        k = seen[label]
        seen[label] += 1
        if k >= len(by_type[label]):
            continue
        other = by_type[label][k]
        for name, attr in sorted(node.attributes.items()):
            theirs_attr = other.attributes.get(name)
            if theirs_attr is None or attr.type in (ir.AttributeType.GRAPH,
                                                     ir.AttributeType.GRAPHS) \
                    or attr.is_ref() or theirs_attr.is_ref():
                continue  # a value each call gives (@epsilon) tells no body from another
            a, b = _plain(attr.value), _plain(theirs_attr.value)
            if a != b:
                text = f"{label} {name}={a} (vs {b})"
                if text not in reasons:
                    reasons.append(text)
    constants, base_constants = _constants(function), _constants(base)
    if constants != base_constants:
        new = [c for c in constants if c not in base_constants]
        shown = [text for text, _ in new if text not in {t for t, _ in base_constants}]
        if shown:
            reasons.append("constants " + ", ".join(shown[:2]))
        elif new:  # too large to show: same dtype and shape, other values
            reasons.append("other values in constant " + ", ".join(
                sorted({text for text, _ in new})[:2]))
        else:
            reasons.append("fewer constants")
    if not reasons:
        shapes = [str(v.shape) for v in function.inputs]
        base_shapes = [str(v.shape) for v in base.inputs]
        reasons.append(f"input shapes {shapes} (vs {base_shapes})" if shapes != base_shapes
                       else "how the same ops are wired")
    return reasons[:MAX_REASONS]


def annotate_differences(model: ir.Model) -> dict[str, str]:
    """Record on each extra function of a class why it is not the class's first function."""
    first: dict[tuple[str, str | None], ir.Function] = {}
    explained: dict[str, str] = {}
    for function in model.functions.values():
        key = (function.domain, function.doc_string)
        base = first.setdefault(key, function)
        if base is function:
            function.metadata_props.pop(DIFFERS_FROM, None)
            continue
        text = f"{base.name}: " + "; ".join(differences(function, base, model.functions))
        function.metadata_props[DIFFERS_FROM] = text
        explained[function.name] = text
    return explained


class ExplainDifferences(EmitPass):
    """Every extra function of a class records what tells it from the first one."""

    def run(self, model: ir.Model) -> None:
        annotate_differences(model)
