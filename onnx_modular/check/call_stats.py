"""Error statistics per module call, rolled up in execution order, and where error grows.

``torch.onnx.verification`` reports, per value, the max abs and rel error, a histogram and
the dtypes; a user with 32 decoder layers wants the same per module call, in the order the
calls ran, and one sentence saying where the error starts and how it grows: "model.h.17
(GPT2Block 18 of 32) first exceeds tolerance; model.h.18 ... model.h.31 grow from 3e-4 to
2e-1". The localization fills :class:`CallError` for every module call it pairs with torch;
:func:`find_stack` picks the repeated blocks the sentence is about. A ``CallError`` is the
error a call *receives and passes on*; :class:`OwnError` is the error it *adds*: the call
run alone on torch's inputs of it (:mod:`~onnx_modular.check.own`), which names the layer a
quantization or an fp16 conversion hurts where the propagated error grows everywhere after.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from onnx_modular.check.calls import CallRecord
from onnx_modular.check.numerics import abs_errors, json_float
from onnx_modular.check.report import fmt_err

#: Upper edges of the absolute-error histogram's buckets (decades); the last is open.
HIST_EDGES: tuple[float, ...] = (1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)
HIST_LABELS: tuple[str, ...] = ("<1e-8", "<1e-7", "<1e-6", "<1e-5", "<1e-4", "<1e-3",
                                "<1e-2", "<1e-1", "<1", ">=1")


def abs_error_histogram(actual: np.ndarray, expected: np.ndarray) -> list[int]:
    """Counts of ``|actual - expected|`` per decade (a NaN or inf the other side does not
    match counts as >= 1; a matched one as 0)."""
    a = np.asarray(actual)
    e = np.asarray(expected)
    if a.shape != e.shape or a.size == 0:
        return [0] * (len(HIST_EDGES) + 1)
    same_float = a.dtype == e.dtype and a.dtype in (np.float32, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(a - e) if same_float else None
    if err is None or not np.isfinite(err).all():  # the check's rules: NaN only matches NaN
        err = abs_errors(a, e)
    err = err.ravel()
    bins = np.searchsorted(np.asarray(HIST_EDGES, dtype=err.dtype), err, side="right")
    return np.bincount(bins, minlength=len(HIST_EDGES) + 1).tolist()


@dataclasses.dataclass
class CallError(CallRecord):
    """One module call's outputs against torch's: every compared output rolled into one."""

    order: int  # the call's index in torch's execution order
    depth: int
    parent: int | None  # ``order`` of the enclosing call
    max_abs: float
    max_rel: float
    mismatched: int
    size: int  # elements compared
    dtypes: str  # "float32" or "float32 -> float16" (torch -> ONNX) when they differ
    histogram: list[int]
    ok: bool
    inherited: bool | None = None  # diverging only: an input diverged already

    def to_dict(self) -> dict[str, Any]:
        return {"order": self.order, "call_id": self.call_id, "module_path": self.module_path,
                "module_type": self.module_type, "depth": self.depth, "ok": self.ok,
                "max_abs_err": json_float(self.max_abs), "max_rel_err": json_float(self.max_rel),
                "mismatched": self.mismatched, "size": self.size, "dtypes": self.dtypes,
                "abs_err_hist": self.histogram, "inherited": self.inherited}


@dataclasses.dataclass
class OwnError(CallRecord):
    """One module call run alone on torch's inputs of it, against torch's outputs of it.

    ``compared`` False: it could not be run (``note`` says why) and its numbers are NaN.
    ``propagated``: the call's max abs error inside the full model, where the localization
    paired it (:class:`CallError`), to read beside its own.
    """

    order: int  # the call's index in torch's execution order
    depth: int
    max_abs: float
    max_rel: float
    mismatched: int
    size: int
    dtypes: str
    histogram: list[int]
    ok: bool
    compared: bool = True
    note: str = ""  # why it was not run, or how an input was fed when not plainly
    propagated: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"order": self.order, "call_id": self.call_id, "module_path": self.module_path,
                "module_type": self.module_type, "depth": self.depth,
                "compared": self.compared, "ok": self.ok if self.compared else None,
                "max_abs_err": json_float(self.max_abs), "max_rel_err": json_float(self.max_rel),
                "mismatched": self.mismatched, "size": self.size, "dtypes": self.dtypes,
                "abs_err_hist": self.histogram, "note": self.note,
                "propagated_max_abs_err": None if self.propagated is None
                else json_float(self.propagated)}


@dataclasses.dataclass
class OwnErrors:
    """Every module call's own error in torch's execution order, and ``first``: the call
    id of the first whose own error leaves tolerance, in the order calls finish (so the
    innermost: a layer before the block holding it); ``note`` says why ``calls`` is empty."""

    calls: list[OwnError]
    first: str | None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"first_mismatch": self.first, "note": self.note,
                "calls_compared": sum(c.compared for c in self.calls),
                "calls": [c.to_dict() for c in self.calls]}


@dataclasses.dataclass
class Stack:
    """Repeated calls of one class under one parent (decoder layers, DiT blocks), in order,
    and what their errors say."""

    module_type: str
    parent: str  # the parent's call id ("" for the root)
    calls: list[CallError]
    first_bad: int | None  # index into ``calls``
    summary: str
    jump: int | None = None  # none fails: where the error leaps 10x over those before

    def to_dict(self) -> dict[str, Any]:
        return {"module_type": self.module_type, "parent": self.parent,
                "calls": [c.call_id for c in self.calls],
                "first_exceeding": (self.calls[self.first_bad].call_id
                                    if self.first_bad is not None else None),
                "first_jump": self.calls[self.jump].call_id if self.jump is not None else None,
                "summary": self.summary}


def _short(type_name: str) -> str:
    return type_name.rsplit(".", 1)[-1]


def find_stack(errors: list[CallError], focus: str | None = None) -> Stack | None:
    """The repeated blocks to summarize: the largest group (at least 2) of calls of one
    class under one parent among those holding the first mismatch ``focus`` or an ancestor
    of it (the decoder layers around a diverging attention), else among those with a
    diverging call; groups of 3 or more (layers, not a pair of projections) first."""
    by_order = {e.order: e for e in errors}
    groups: dict[tuple[int | None, str], list[CallError]] = {}
    for e in errors:
        groups.setdefault((e.parent, e.module_type), []).append(e)
    candidates = [g for g in groups.values() if len(g) >= 2]
    if not candidates:
        return None

    def holds_focus(group: list[CallError]) -> bool:
        return focus is not None and any(
            focus == c.call_id or focus.startswith(c.call_id + ".") for c in group)

    best = max(candidates, key=lambda g: (holds_focus(g), len(g) >= 3,
                                          any(not c.ok for c in g), len(g), -g[0].depth))
    best.sort(key=lambda c: c.order)
    parent = by_order.get(best[0].parent) if best[0].parent is not None else None
    first_bad = next((i for i, c in enumerate(best) if not c.ok), None)
    jump = _jump(best) if first_bad is None else None
    return Stack(best[0].module_type, parent.call_id if parent else "", best, first_bad,
                 _summary(best, first_bad, jump), jump)


def _jump(calls: list[CallError]) -> int | None:
    """Where the error first leaps (10x and more over every call before), within tolerance:
    an error too small to fail at the block's output still shows where it arises."""
    best, best_ratio = None, 10.0
    worst = calls[0].max_abs
    for i, c in enumerate(calls[1:], 1):
        ratio = c.max_abs / max(worst, 1e-12)
        if ratio >= best_ratio and best is None:
            best, best_ratio = i, ratio
        worst = max(worst, c.max_abs)
    return best


def _summary(calls: list[CallError], first_bad: int | None, jump: int | None) -> str:
    n, kind = len(calls), _short(calls[0].module_type)
    if first_bad is None and jump is None:
        worst = max(c.max_abs for c in calls)
        return f"all {n} {kind} calls stay within tolerance (max abs err <= {fmt_err(worst)})"
    at = first_bad if first_bad is not None else jump
    assert at is not None
    bad = calls[at]
    if first_bad is not None:
        text = (f"{bad.call_id} ({kind} {at + 1} of {n}) first exceeds tolerance "
                f"(max abs err {fmt_err(bad.max_abs)})")
        if at:
            before = max(c.max_abs for c in calls[:at])
            them = "the one before stays" if at == 1 else f"the {at} before stay"
            text += f"; {them} within it (<= {fmt_err(before)})"
    else:
        before = max(c.max_abs for c in calls[:at])
        text = (f"all {n} {kind} calls stay within tolerance, but the error leaps at "
                f"{bad.call_id} ({kind} {at + 1} of {n}) from <= {fmt_err(before)} to "
                f"{fmt_err(bad.max_abs)}")
    rest = calls[at + 1:]
    if rest:
        span = (rest[0].call_id if len(rest) == 1
                else f"{rest[0].call_id} ... {rest[-1].call_id}")
        start, end = rest[0].max_abs, rest[-1].max_abs
        if len(rest) == 1:
            text += f"; {span} is at {fmt_err(start)}"
        elif end > 2 * start:
            text += f"; {span} grow from {fmt_err(start)} to {fmt_err(end)}"
        elif start > 2 * end:
            text += f"; {span} fall from {fmt_err(start)} to {fmt_err(end)}"
        else:
            text += f"; {span} stay near {fmt_err(max(start, end))}"
        still_ok = sum(c.ok for c in rest)
        if still_ok and first_bad is not None:
            text += f" ({still_ok} of them within tolerance)"
    return text
