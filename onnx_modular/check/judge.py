"""The judge of localization: which module call is the first whose ONNX outputs leave torch's.

ONNX calls (:mod:`~onnx_modular.check.probe`) resolve to torch calls
(:mod:`~onnx_modular.check.recorder`); their outputs pair by shape and dtype, and where
several have the same shape the closest one counts, so a reordering never reads as a
mismatch. The first mismatch is the diverging call whose earliest diverging value comes
first in the inlined graph; on a tie the deeper call wins.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np
import torch

from onnx_modular.check.call_stats import (
    HIST_EDGES,
    CallError,
    OwnErrors,
    Stack,
    abs_error_histogram,
    find_stack,
)
from onnx_modular.check.calls import CallRecord
from onnx_modular.check.numerics import Diff, check_value, dtype_name, json_float, to_numpy
from onnx_modular.check.probe import OnnxCall, Probe
from onnx_modular.check.recorder import TorchCall

__all__ = ["Evidence", "Localization", "ModuleDivergence", "closest", "dtype_pairs", "judge",
           "resolve"]

_CALL_SUFFIX = re.compile(r"@(\d+)$")


def _components(path: str) -> list[str]:
    return [p for p in _CALL_SUFFIX.sub("", path).split(".") if p]


def _suffix_score(a: str, b: str) -> int:
    score = 0
    for x, y in zip(reversed(_components(a)), reversed(_components(b)), strict=False):
        if x != y:
            break
        score += 1
    return score


class _CallTree:
    """Torch's calls as a tree (each call's parent), with each call's descendants in
    execution order, computed once per root asked about."""

    def __init__(self, torch_calls: list[TorchCall]) -> None:
        self.children: dict[int | None, list[int]] = {}
        for i, c in enumerate(torch_calls):
            self.children.setdefault(c.parent, []).append(i)
        self._below: dict[int | None, list[int]] = {}
        self._inside: dict[int | None, set[int]] = {}

    def descendants(self, root: int | None) -> list[int]:
        if root not in self._below:
            out, todo = [], list(reversed(self.children.get(root, [])))
            while todo:  # pre-order, without recursion (a module tree may be deep)
                i = todo.pop()
                out.append(i)
                todo += reversed(self.children.get(i, []))
            self._below[root] = out
        return self._below[root]

    def is_descendant(self, i: int, root: int | None) -> bool:
        if root not in self._inside:
            self._inside[root] = set(self.descendants(root))
        return i in self._inside[root]


def _closest_call(call: OnnxCall, candidates: list[int], torch_calls: list[TorchCall],
                  used: set[int]) -> int | None:
    """The unused torch call among ``candidates`` of the call's class whose path shares the
    longest tail with the call's (the first on a tie)."""
    best, best_score = None, 0
    for j in candidates:
        if j in used:
            continue
        t = torch_calls[j]
        if call.module_type and t.module_type != call.module_type:
            continue
        score = _suffix_score(call.call_id, t.call_id)
        if score > best_score:
            best, best_score = j, score
    return best


def resolve(onnx_calls: list[OnnxCall], torch_calls: list[TorchCall]) -> dict[int, int]:
    """ONNX call index -> torch call index.

    Calls of the main graph name their call exactly. A call inlined from a shared function
    body carries the metadata of the call the body was made from (``h.0.attn`` inside the
    body that ``h.1`` also calls); it resolves to the descendant of its parent's torch call
    with the same class whose path shares the longest tail with it.
    """
    by_id = {c.call_id: i for i, c in enumerate(torch_calls)}
    tree = _CallTree(torch_calls)
    mapping: dict[int, int] = {}
    used: set[int] = set()
    for k, call in enumerate(onnx_calls):
        if "#" in call.call_id:  # a piece of a split call: its outputs are intermediates
            continue
        parent = mapping.get(call.parent) if call.parent is not None else None
        if call.parent is not None and parent is None:
            continue  # the parent could not be placed, so neither can this call
        exact = by_id.get(call.call_id)
        if exact is not None and (call.exact or parent is None
                                  or tree.is_descendant(exact, parent)):
            if exact not in used:
                mapping[k] = exact
                used.add(exact)
            continue
        if call.exact:
            continue
        best = _closest_call(call, tree.descendants(parent), torch_calls, used)
        if best is not None:
            mapping[k] = best
            used.add(best)
    return mapping


@dataclasses.dataclass
class ModuleDivergence(CallRecord):
    """A module call whose ONNX outputs leave torch's, and by how much."""

    depth: int
    output: str  # the ONNX value name of the worst output
    max_abs: float
    max_rel: float
    mismatched: int
    position: int = 0
    inherited: bool = False  # an input of the call diverged already

    def to_dict(self) -> dict[str, Any]:
        return {"module_path": self.module_path, "call_id": self.call_id,
                "module_type": self.module_type, "depth": self.depth, "output": self.output,
                "inherited": self.inherited,
                "max_abs_err": json_float(self.max_abs),
                "max_rel_err": json_float(self.max_rel), "mismatched": self.mismatched}


@dataclasses.dataclass(eq=False)
class Evidence:
    """What the judging saw, kept (not copied) for extraction and the viewer overlay:
    the probe, every value it exposed, torch's calls and which ONNX call is which."""

    probe: Probe
    values: dict[str, np.ndarray]
    torch_calls: list[TorchCall]
    mapping: dict[int, int]  # ONNX call index -> torch call index
    rtol: float | None
    atol: float | None

    def onnx_call_of(self, torch_index: int) -> int | None:
        """The ONNX call paired with torch call ``torch_index``, if any."""
        for k, j in self.mapping.items():
            if j == torch_index:
                return k
        return None


@dataclasses.dataclass
class Localization:
    """Every diverging module call in execution order, and the first (deepest) one.

    ``errors`` holds every paired call's error in execution order (diverging or not), so
    a report can show where the error starts growing; ``own`` each call's own error, run
    alone on torch's inputs of it (:mod:`~onnx_modular.check.own`; None: not measured).
    ``evidence``: the values judged, kept by the session that localized (never by a
    report); ``node_data``: their Model Explorer overlay, kept as data where they are not.
    """

    kind: str
    calls_checked: int
    divergences: list[ModuleDivergence]
    first: ModuleDivergence | None
    note: str = ""
    errors: list[CallError] = dataclasses.field(default_factory=list)
    evidence: Evidence | None = dataclasses.field(default=None, repr=False, compare=False)
    own: OwnErrors | None = None
    node_data: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False,
                                                  compare=False)

    def stack(self) -> Stack | None:
        """The repeated blocks whose errors tell where the error starts to grow."""
        return find_stack(self.errors, self.first.call_id if self.first else None)

    def to_dict(self) -> dict[str, Any]:
        stack = self.stack()
        return {"kind": self.kind, "calls_checked": self.calls_checked,
                "first_mismatch": self.first.module_path if self.first else None,
                "divergences": [d.to_dict() for d in self.divergences], "note": self.note,
                "abs_err_hist_edges": list(HIST_EDGES),
                "calls": [e.to_dict() for e in self.errors],
                "stack": stack.to_dict() if stack is not None else None,
                "own": self.own.to_dict() if self.own is not None else None}


def closest(actual: np.ndarray, candidates: list[torch.Tensor], rtol: float | None,
            atol: float | None) -> tuple[Diff, torch.Tensor] | None:
    """The diff to the nearest same-shape torch tensor, and that tensor; None when none
    has the shape (how an ONNX value finds the torch value it stands for)."""
    best: tuple[Diff, torch.Tensor] | None = None
    for t in candidates:
        if tuple(t.shape) != actual.shape:
            continue
        d = check_value(actual, t, rtol, atol, same_dtype=False).diff
        if best is None or (d.ok, -d.max_abs) > (best[0].ok, -best[0].max_abs):
            best = d, t
    return best


def _inputs_diverge(call: OnnxCall, tcall: TorchCall, values: dict[str, np.ndarray],
                    rtol: float | None, atol: float | None) -> bool:
    """Whether a torch input of the call has no agreeing ONNX input (so it was fed wrong).

    ONNX inputs also hold weights and constants; a torch input pairs with the closest
    ONNX input of its shape, and inputs the probe cannot see are not held against it.
    """
    arrays = [values[n] for n in call.inputs if n in values]
    for t in tcall.intact_inputs():
        best: Diff | None = None
        for actual in arrays:
            found = closest(actual, [t], rtol, atol)
            d = found[0] if found is not None else None
            if d is not None and (best is None or (d.ok, -d.max_abs) > (best.ok, -best.max_abs)):
                best = d
        if best is not None and not best.ok:
            return True
    return False


def dtype_pairs(pairs: list[tuple[np.ndarray, torch.Tensor]]) -> str:
    """The dtypes compared, torch's first ("float32 -> float16" where ONNX's differs)."""
    names = []
    for actual, expected in pairs:
        want, got = dtype_name(expected), dtype_name(actual)
        name = want if want == got else f"{want} -> {got}"
        if name not in names:
            names.append(name)
    return ", ".join(names)


def _paired_outputs(call: OnnxCall, tcall: TorchCall, values: dict[str, np.ndarray],
                    rtol: float | None, atol: float | None
                    ) -> list[tuple[str, np.ndarray, torch.Tensor, Diff]]:
    """Each ONNX output of the call with the closest intact torch output of its shape."""
    outputs = tcall.intact_outputs()
    pairs = []
    for name in call.outputs:
        actual = values.get(name)
        found = closest(actual, outputs, rtol, atol) if actual is not None else None
        if found is not None:
            pairs.append((name, actual, found[1], found[0]))
    return pairs


def _judge_call(evidence: Evidence, k: int, j: int
                ) -> tuple[CallError | None, ModuleDivergence | None]:
    """The error of ONNX call ``k`` paired with torch call ``j`` (None: nothing of it could
    be compared), and its divergence when an output leaves torch's."""
    probe, values = evidence.probe, evidence.values
    call, tcall = probe.calls[k], evidence.torch_calls[j]
    rtol, atol = evidence.rtol, evidence.atol
    pairs = _paired_outputs(call, tcall, values, rtol, atol)
    if not pairs:
        return None, None
    bad = [(probe.position.get(name, 0), name, d) for name, _, _, d in pairs if not d.ok]
    divergence, inherited = None, None
    if bad:
        position, name, _ = min(bad, key=lambda b: b[0])
        inherited = _inputs_diverge(call, tcall, values, rtol, atol)
        divergence = ModuleDivergence(
            tcall.call, tcall.depth, name, max(d.max_abs for _, _, d in bad),
            max(d.max_rel for _, _, d in bad), sum(d.mismatched for _, _, d in bad),
            position, inherited)
    histogram = [0] * (len(HIST_EDGES) + 1)
    for _, actual, expected, _ in pairs:
        counts = abs_error_histogram(actual, to_numpy(expected))
        histogram = [a + b for a, b in zip(histogram, counts, strict=True)]
    diffs = [d for _, _, _, d in pairs]
    error = CallError(
        tcall.call, j, tcall.depth, tcall.parent, max(d.max_abs for d in diffs),
        max(d.max_rel for d in diffs), sum(d.mismatched for d in diffs),
        sum(int(a.size) for _, a, _, _ in pairs), dtype_pairs([(a, e) for _, a, e, _ in pairs]),
        histogram, not bad, inherited)
    return error, divergence


def judge(
    probe: Probe,
    onnx_values: dict[str, np.ndarray],
    torch_calls: list[TorchCall],
    rtol: float | None,
    atol: float | None,
) -> Localization:
    """Compare every paired call's outputs (and, for diverging calls, inputs).

    A call whose outputs diverge while its inputs agree with torch is where the error
    arises; ``first`` is the earliest such call (the deepest on a tie), or the earliest
    diverging call when every one of them was fed diverging inputs. Every compared call's
    error goes to ``errors``, in torch's execution order.
    """
    mapping = resolve(probe.calls, torch_calls)
    evidence = Evidence(probe, onnx_values, torch_calls, mapping, rtol, atol)
    divergences: list[ModuleDivergence] = []
    errors: list[CallError] = []
    for k, j in mapping.items():
        error, divergence = _judge_call(evidence, k, j)
        if error is not None:
            errors.append(error)
        if divergence is not None:
            divergences.append(divergence)
    divergences.sort(key=lambda d: (d.position, -d.depth))
    errors.sort(key=lambda e: e.order)
    origins = [d for d in divergences if not d.inherited]
    first = origins[0] if origins else (divergences[0] if divergences else None)
    note = "" if errors else "no module call of the ONNX model could be paired with torch"
    return Localization(probe.kind, len(errors), divergences, first, note, errors, evidence)
