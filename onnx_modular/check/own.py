"""Each module call's own error against torch: the ONNX call run on torch's inputs of it.

The judge compares every call's outputs inside the full model, after all the drift before
it (:class:`~onnx_modular.check.call_stats.CallError`, ``inherited``). A quantized or fp16
file drifts everywhere after its first lossy layer, so that table says where the error
*starts*, not which layers *add* it. Here every module call of the ONNX model runs alone,
fed the tensors torch passed that call (the recorder keeps them), and its outputs are
compared with torch's outputs of it: the error the call itself adds
(:class:`~onnx_modular.check.call_stats.OwnError`). The ONNX side is
:mod:`~onnx_modular.check.module_diff`'s: the model inlined with its labels and cut into
calls (``labelled_calls``: a quantizer's unlabelled nodes join the call they serve), one
session holding a copy of each call (``run_fed``).

Pairing, as the judge pairs: an ONNX call with the torch call of its call id
(:func:`~onnx_modular.check.judge.resolve`); each ONNX input with an unused torch input of
its shape and dtype (any float for a float: an fp16 call takes torch's fp32 values cast),
the one closest to ONNX's own value where several fit; with one of the same element count
where only a reshape parts them (the input read only through Reshape-like ops, or made by
one); where torch passed none (a mask or a shape ONNX computes outside the call) ONNX's own
value is fed and the row says so. Each ONNX output pairs with the closest torch output of
its shape. A call is judged at the precision it computes in: an fp16 output against torch's
fp32 within fp16's tolerances (unless ``rtol``/``atol`` are given).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import onnx_ir as ir
import torch

from onnx_modular.check.call_stats import HIST_EDGES, OwnError, OwnErrors, abs_error_histogram
from onnx_modular.check.judge import closest, dtype_pairs, resolve
from onnx_modular.check.module_diff import (
    Fed,
    LabelledCall,
    labelled_calls,
    run_exposing,
    run_fed,
)
from onnx_modular.check.numerics import (
    DEFAULT_TOLERANCES,
    Diff,
    check_value,
    dtype_name,
    is_float,
    onnx_elem_name,
    to_numpy,
)
from onnx_modular.check.options import Tolerances
from onnx_modular.check.probe import OnnxCall
from onnx_modular.check.recorder import TorchCall
from onnx_modular.check.runners import ValidationRun
from onnx_modular.leaves import runtime
from onnx_modular.leaves._compat import tensor_version
from onnx_modular.leaves.metadata import CallInfo

__all__ = ["own_errors"]

#: Ops that move no element: a value read only through them is its reshaped self.
_RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})


@dataclasses.dataclass
class _Feeding:
    """How one call is fed: an array per ONNX input (None: it cannot be), notes on inputs
    fed other than plainly, ONNX values the pairing still needs, and why it cannot be."""

    arrays: list[np.ndarray] | None
    notes: list[str]
    wanted: set[str]
    reason: str = ""


def own_errors(run: ValidationRun, torch_calls: list[TorchCall], *,
               onnx_values: dict[str, np.ndarray] | None = None,
               propagated: dict[str, float] | None = None) -> OwnErrors:
    """Every module call of ``run.loaded`` that torch made too, run on torch's inputs of
    it, on ``run.provider``, judged by ``run.tolerances``.

    ``onnx_values``: ONNX's values by the labelled model's names where known already (a
    flat model's probe keeps its names); others the pairing needs come from one run of the
    model on the run's feeds. ``propagated``: each call id's max abs error in the full model.
    """
    loaded, feeds, provider = run.loaded, run.inputs.feeds, run.provider
    if not torch_calls:
        return OwnErrors([], None, "the torch model has no submodule calls")
    labelled = labelled_calls(loaded)
    if labelled is None:
        return OwnErrors([], None, "the ONNX model carries no module labels")
    calls = sorted(labelled.calls.values(), key=lambda c: (c.end, -c.depth))
    records = [OnnxCall(CallInfo(c.call_id, c.call_id.split("@", 1)[0], c.module_type), [])
               for c in calls]
    pairs = sorted(((calls[k], j) for k, j in resolve(records, torch_calls).items()),
                   key=lambda p: p[1])
    if not pairs:
        return OwnErrors([], None, "no module call of the ONNX model is a call torch made")
    known = dict(onnx_values or {})
    wanted = {n for call, j in pairs for n in _feeding(call, torch_calls[j], known).wanted}
    if wanted:  # one run of the model for the ONNX values the pairing needs
        known.update(run_exposing(labelled, wanted, feeds, provider))
    rows: dict[int, OwnError] = {}
    fed: list[Fed] = []
    notes: dict[str, list[str]] = {}
    for call, j in pairs:
        feeding = _feeding(call, torch_calls[j], known)
        notes[call.call_id] = feeding.notes
        if feeding.arrays is None:
            rows[j] = _not_run(torch_calls[j], j, feeding.reason)
        else:
            fed.append((call.call_id, call, feeding.arrays))
    results, refused = run_fed(labelled, fed, provider)
    for call, j in pairs:
        if j in rows:
            continue
        tcall = torch_calls[j]
        if call.call_id in refused:
            rows[j] = _not_run(tcall, j, "ONNX Runtime refused it on torch's inputs: "
                               + refused[call.call_id])
            continue
        row = _judged(tcall, j, results[call.call_id], _precision(call), run.tolerances)
        row.note = "; ".join([*notes[call.call_id], *([row.note] if row.note else [])])
        rows[j] = row
    for row in rows.values():
        row.propagated = (propagated or {}).get(row.call_id)
    ordered = [rows[j] for j in sorted(rows)]
    first = next((rows[j].call_id for j in _finishing_order(torch_calls)
                  if j in rows and rows[j].compared and not rows[j].ok), None)
    return OwnErrors(ordered, first)


def _feeding(call: LabelledCall, tcall: TorchCall, known: dict[str, np.ndarray]) -> _Feeding:
    """Each ONNX input of ``call`` paired with a torch input of ``tcall`` (see the module's
    docstring); ``wanted`` names the ONNX values it needs and ``known`` lacks."""
    intact = [(i, t) for i, (t, v) in enumerate(zip(tcall.inputs, tcall.input_versions,
                                                     strict=True)) if tensor_version(t) == v]
    used: set[int] = set()
    arrays: list[np.ndarray] = []
    notes: list[str] = []
    wanted: set[str] = set()
    for value in call.inputs:
        own = known.get(value.name)
        shape = own.shape if own is not None else _static_shape(value)
        dtype = dtype_name(own) if own is not None else (
            onnx_elem_name(int(value.dtype)) if value.dtype is not None else None)
        fits = [(i, t) for i, t in intact if i not in used and _same_kind(dtype_name(t), dtype)]
        if shape is None:
            wanted.add(value.name)
            arrays.append(np.empty(0))
            continue
        same = [(i, t) for i, t in fits if tuple(t.shape) == shape]
        if len(same) > 1:
            if own is None:
                wanted.add(value.name)
            else:
                found = closest(own, [t for _, t in same], None, None)
                same = [p for p in same if found is not None and p[1] is found[1]] or same
        if same:
            i, t = same[0]
            used.add(i)
            arrays.append(runtime.to_feed(t))
            continue
        size = math.prod(shape)
        reshaped = [(i, t) for i, t in fits if t.numel() == size] if _only_reshaped(value) \
            else []
        if reshaped:
            i, t = reshaped[0]
            used.add(i)
            arrays.append(runtime.to_feed(t).reshape(shape))
            notes.append(f"torch input {i} reshaped to {list(shape)}")
            continue
        if own is None:
            wanted.add(value.name)
            arrays.append(np.empty(0))
            continue
        arrays.append(own)
        notes.append(f"'{value.name}' {dtype}{list(shape)}: ONNX's value (torch passed "
                     "no such tensor)")
    if wanted:
        missing = ", ".join(sorted(wanted))
        return _Feeding(None, notes, wanted, f"no value for input(s) {missing}")
    return _Feeding(arrays, notes, wanted)


def _static_shape(value: ir.Value) -> tuple[int, ...] | None:
    shape = value.shape
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return tuple(int(d) for d in shape)


def _same_kind(torch_dtype: str, onnx_dtype: str | None) -> bool:
    """A torch value can feed an ONNX input: the same dtype, or floats both (cast)."""
    if onnx_dtype is None or torch_dtype == onnx_dtype:
        return True
    return is_float(torch_dtype) and is_float(onnx_dtype) and not onnx_dtype.startswith(
        "complex") and not torch_dtype.startswith("complex")


def _only_reshaped(value: ir.Value) -> bool:
    """Its elements reach the call in torch's order whatever its shape: made by a
    Reshape-like op outside the call, or read only through them inside it."""
    producer = value.producer()
    if producer is not None and producer.op_type in _RESHAPES and \
            producer.domain in ("", "ai.onnx"):
        return True
    uses = list(value.uses())
    return bool(uses) and all(u.node.op_type in _RESHAPES and u.idx == 0 for u in uses)


def _not_run(tcall: TorchCall, order: int, why: str) -> OwnError:
    return OwnError(tcall.call, order, tcall.depth, math.nan, math.nan, 0, 0, "",
                    [0] * (len(HIST_EDGES) + 1), True, compared=False, note=why)


def _precision(call: LabelledCall) -> str | None:
    """The loosest float type the call computes in (float16 inside an fp16 model's root
    call, whose outputs are cast back to float32)."""
    names = {onnx_elem_name(int(v.dtype)) for n in call.nodes for v in n.outputs
             if v.dtype is not None}
    floats = [n for n in names if n in DEFAULT_TOLERANCES]
    return max(floats, key=lambda n: DEFAULT_TOLERANCES[n], default=None)


def _judged(tcall: TorchCall, order: int, actual: list[np.ndarray], precision: str | None,
            tolerances: Tolerances) -> OwnError:
    """The call's outputs on torch's inputs against torch's outputs of it."""
    rtol, atol = tolerances.rtol, tolerances.atol
    expected = tcall.intact_outputs()
    compared: list[tuple[np.ndarray, torch.Tensor, Diff]] = []
    if len(actual) == len(expected) and all(
            value.shape == tuple(t.shape) for value, t in zip(actual, expected, strict=True)):
        pairs = list(zip(actual, expected, strict=True))  # the call's outputs, in order
    else:  # each ONNX output with the closest torch output of its shape, one to one
        pairs, left = [], list(expected)
        for value in actual:
            found = closest(value, left, rtol, atol)
            if found is not None:
                pairs.append((value, found[1]))
                left = [t for t in left if t is not found[1]]
    for value, tensor in pairs:
        compared.append((value, tensor, _diff(value, tensor, precision, rtol, atol)))
    if not compared:
        return _not_run(tcall, order, "no output of the ONNX call has the shape of a torch "
                        "output of it")
    histogram = [0] * (len(HIST_EDGES) + 1)
    for a, e, _ in compared:
        counts = abs_error_histogram(a, to_numpy(e))
        histogram = [x + y for x, y in zip(histogram, counts, strict=True)]
    diffs = [d for _, _, d in compared]
    return OwnError(tcall.call, order, tcall.depth, max(d.max_abs for d in diffs),
                    max(d.max_rel for d in diffs), sum(d.mismatched for d in diffs),
                    sum(int(a.size) for a, _, _ in compared),
                    dtype_pairs([(a, e) for a, e, _ in compared]), histogram,
                    all(d.ok for d in diffs),
                    note=next((d.note for d in diffs if d.note), ""))


def _diff(actual: np.ndarray, expected: torch.Tensor, precision: str | None,
          rtol: float | None, atol: float | None) -> Diff:
    """Within the tolerances of the loosest float of the value's, torch's and the call's
    (the precision the call computes in: fp16's for an fp16 call), unless the user set
    them."""
    theirs = dtype_name(expected)
    known = [DEFAULT_TOLERANCES[d] for d in (dtype_name(actual), precision)
             if d in DEFAULT_TOLERANCES]
    loose = max(known, default=None)
    if loose is not None and is_float(theirs) and loose > DEFAULT_TOLERANCES.get(theirs, loose):
        rtol = loose[0] if rtol is None else rtol
        atol = loose[1] if atol is None else atol
    return check_value(actual, expected, rtol, atol, same_dtype=False).diff


def _finishing_order(calls: list[TorchCall]) -> list[int]:
    """Torch's calls in the order they returned (a call after everything it called)."""
    order: list[int] = []
    open_calls: list[int] = []
    for i, call in enumerate(calls):
        while open_calls and open_calls[-1] != call.parent:
            order.append(open_calls.pop())
        open_calls.append(i)
    order.extend(reversed(open_calls))
    return order
