"""Numerics of every check: dtype names, tolerances by dtype, the diff, and the output check.

``validate`` (ONNX Runtime against torch), ``compare`` (model a against model b),
``compare-io`` (a model against saved outputs), the localization (module outputs against
torch's) and extraction judge values the same way, here: one conversion to numpy for
comparison, one diff (:func:`diff`, whose rules the README's "How outputs are compared"
states), one per-output check.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import onnx

from onnx_modular.leaves.errors import fail

#: (rtol, atol) by element type name (:func:`dtype_name`'s spelling), used unless the caller
#: gives its own. Floats are judged ``|actual - expected| <= atol + rtol * |expected|``; the
#: tolerances are a few units in the last place of each format, so that kernels summing in
#: another order pass and a wrong op does not. Complex values are judged part by part with
#: their component's tolerances. Every other type (integers, bool) compares exactly.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-3),
    "bfloat16": (1.6e-2, 1e-2),
    "float8_e4m3fn": (1.25e-1, 1.6e-2),
    "float8_e4m3fnuz": (1.25e-1, 1.6e-2),
    "float8_e5m2": (2.5e-1, 1.6e-2),
    "float8_e5m2fnuz": (2.5e-1, 1.6e-2),
    "complex128": (1e-7, 1e-7),
    "complex64": (1e-4, 1e-4),
}
#: A floating type missing from the table (a float8 variant numpy spells otherwise).
OTHER_FLOAT_TOLERANCES = (2.5e-1, 1.6e-2)


# ---- dtype names -----------------------------------------------------------------------------

def is_float(dtype_name: str) -> bool:
    """Judged within tolerances (floats and complex); everything else compares exactly."""
    return dtype_name in DEFAULT_TOLERANCES or dtype_name.startswith(("float", "complex"))


def dtype_name(value: Any) -> str:
    """``float32``, ``bfloat16``, ``bool``...: one spelling for torch tensors and numpy
    arrays (ml_dtypes included), so the two sides of a check name their dtypes alike."""
    if hasattr(value, "detach"):  # a torch tensor; numpy users need no torch
        return str(value.dtype).removeprefix("torch.")
    array = np.asarray(value)
    return "bool" if array.dtype == np.bool_ else str(array.dtype)


def onnx_elem_name(elem_type: int) -> str:
    """An ONNX element type in :func:`dtype_name`'s spelling."""
    try:
        np_type = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    except Exception:  # a type numpy cannot hold: its ONNX name
        return onnx.TensorProto.DataType.Name(elem_type).lower()
    return "bool" if np_type == np.bool_ else str(np.dtype(np_type))


def check_tolerances(rtol: Any, atol: Any) -> None:
    """User tolerances are None or finite numbers >= 0.

    A NaN tolerance makes every ``err > limit`` false, so any output would pass; a negative
    or infinite one is a typo that turns the check into "always fails" or "always passes".
    """
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating,
                                                             np.integer)):
            raise fail(f"{name} must be a number, got {type(value).__name__} {value!r:.40}")
        if not math.isfinite(value) or value < 0:
            raise fail(f"{name} must be a finite number >= 0, got {value}")


#: Float types a model may compute in below its outputs' precision (a float32 mean of fp16
#: activations): such an output is judged with their tolerances. Float8 is left out: its
#: tolerances would hide real errors of a float32 output.
LOW_PRECISION = ("bfloat16", "float16")


def computes_in(weights: Iterable[Any]) -> str | None:
    """``float16`` or ``bfloat16`` where most of a torch model's floating parameters (by
    elements) are of that type: a half-precision model, whose float32 outputs are only as
    exact as its activations. Decided from torch, never from the file: a file that rounds
    through fp16 by mistake must not loosen its own check."""
    counts: dict[str, int] = {}
    for tensor in weights:
        name = dtype_name(tensor)
        if is_float(name):
            counts[name] = counts.get(name, 0) + int(tensor.numel())
    low = {name: counts.get(name, 0) for name in LOW_PRECISION}
    if 2 * sum(low.values()) <= sum(counts.values()):
        return None
    return max(low, key=lambda name: low[name])


def tolerances_for(dtype_name: str, rtol: float | None, atol: float | None) -> tuple[float, float]:
    """User values apply to floating outputs; integers and bool are always exact."""
    if not is_float(dtype_name):
        return 0.0, 0.0
    d_rtol, d_atol = DEFAULT_TOLERANCES.get(dtype_name, OTHER_FLOAT_TOLERANCES)
    return (d_rtol if rtol is None else rtol), (d_atol if atol is None else atol)


def to_numpy(value: Any) -> np.ndarray:
    """A tensor or array as numpy for comparison (bfloat16 widened to float32).

    Feeds keep their dtype (:func:`onnx_modular.leaves.runtime.to_feed`); a value to compare only
    needs numbers numpy can subtract.
    """
    if hasattr(value, "detach"):  # a torch tensor
        import torch

        t = value.detach().cpu()
        if t.dtype == torch.bfloat16:
            return t.float().numpy()
        return t.resolve_conj().resolve_neg().numpy()
    return np.asarray(value)


def json_float(x: float) -> float | str:
    """JSON has no inf or NaN: those become their names."""
    return x if math.isfinite(x) else str(x)


# ---- the diff --------------------------------------------------------------------------------

@dataclasses.dataclass
class Diff:
    """How far ``actual`` is from ``expected``; ``ok`` by :func:`diff`'s rules; ``note`` says
    why values failed where the numbers alone do not (NaN, inf, complex, shape)."""

    max_abs: float
    max_rel: float
    ok: bool
    mismatched: int = 0
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"max_abs_err": json_float(self.max_abs), "max_rel_err": json_float(self.max_rel),
                "ok": self.ok, "mismatched": self.mismatched, "note": self.note}


def diff(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> Diff:
    """Max abs and rel error (rel over ``max(|expected|, atol)``), and pass/fail.

    The rules (the README's "How outputs are compared"): a NaN in ``expected`` is matched
    only by a NaN, an inf only by the same inf, and a NaN or inf in ``actual`` fails where
    ``expected`` is finite; two integer (or bool) arrays are compared exactly as integers,
    never through float64 (which rounds int64 beyond 2**53); complex values part by part.
    """
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape:
        return Diff(math.inf, math.inf, False, int(expected.size),
                    f"shape {list(actual.shape)} != expected {list(expected.shape)}")
    if actual.size == 0:
        return Diff(0.0, 0.0, True)
    if actual.ndim == 0:  # a scalar (a loss): numpy's arithmetic on 0-d gives no arrays back
        actual, expected = actual.reshape(1), expected.reshape(1)
    unreadable = next((x.dtype for x in (expected, actual) if not _numeric(x.dtype)), None)
    if unreadable is not None:
        return Diff(math.inf, math.inf, False, int(expected.size),
                    f"values of dtype {unreadable} cannot be compared as numbers")
    if np.iscomplexobj(actual) or np.iscomplexobj(expected):
        return _diff_complex(actual, expected, rtol, atol)
    if _exact(actual.dtype) and _exact(expected.dtype):
        err = integer_errors(actual, expected)
        bad = err != 0
        note = ""
    else:
        fast = _diff_finite(actual, expected, rtol, atol)
        if fast is not None:
            return fast
        err, bad, note = _float_errors(actual, expected, rtol, atol)
    return _summarize(err, bad, expected, atol, note)


def abs_errors(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """``|actual - expected|`` per element by :func:`diff`'s rules, as float64: 0 where a
    NaN or inf is matched, inf where one is not, integers exact; for histograms."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if np.iscomplexobj(actual) or np.iscomplexobj(expected):
        return np.maximum(abs_errors(np.real(actual), np.real(expected)),
                          abs_errors(np.imag(actual), np.imag(expected)))
    if _exact(actual.dtype) and _exact(expected.dtype):
        return integer_errors(actual, expected)
    return _float_errors(actual, expected, 0.0, 0.0)[0]


def _numeric(dtype: np.dtype) -> bool:
    """Numbers numpy can subtract: bool, integers, floats (ml_dtypes' too), complex."""
    if dtype.kind in "biufc":
        return True
    try:  # bfloat16 and float8 from ml_dtypes are kind "V" but convert to float64
        np.zeros(1, dtype).astype(np.float64)
    except (TypeError, ValueError):
        return False
    return dtype.fields is None and dtype.kind == "V"


def _exact(dtype: np.dtype) -> bool:
    return dtype.kind in "biu"


def integer_errors(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """``|actual - expected|`` of two integer (or bool) arrays, computed without rounding
    and as float64 (a difference of 1 at 2**60 is 1.0, not 0.0)."""
    a = actual.astype(np.uint8) if actual.dtype == np.bool_ else actual
    e = expected.astype(np.uint8) if expected.dtype == np.bool_ else expected
    if a.dtype.kind == "u" and e.dtype.kind == "u":
        wide = np.uint64
    elif max(a.dtype.itemsize if a.dtype.kind == "u" else 0,
             e.dtype.itemsize if e.dtype.kind == "u" else 0) < 8:
        wide = np.int64  # every value of both fits int64
    else:  # uint64 against a signed type: Python integers, exact at any size
        return np.abs(a.astype(object) - e.astype(object)).astype(np.float64)
    a, e = a.astype(wide), e.astype(wide)
    hi, lo = np.maximum(a, e), np.minimum(a, e)
    # hi - lo is in [0, 2**64): exact in uint64 arithmetic, whatever the signs
    return (hi.astype(np.uint64) - lo.astype(np.uint64)).astype(np.float64)


def _float_errors(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float
                  ) -> tuple[np.ndarray, np.ndarray, str]:
    """Errors in float64 with the NaN/inf rules: (abs errors, which fail, why those fail)."""
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    a_nan, e_nan = np.isnan(a), np.isnan(e)
    a_inf, e_inf = np.isinf(a), np.isinf(e)
    same = (a_nan & e_nan) | (a_inf & (a == e))
    wrong = ~same & (a_nan | e_nan | a_inf | e_inf)  # a NaN or an inf not matched
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(a - e)
        err = np.where(same, 0.0, np.where(wrong, np.inf, err))
        bad = wrong | (err > atol + rtol * np.abs(e))
    note = ""
    if wrong.any():
        parts = [f"{n} {what}" for n, what in (
            (int(np.count_nonzero(e_nan & ~a_nan)), "expected NaN not matched"),
            (int(np.count_nonzero(e_inf & ~same)), "expected inf not matched"),
            (int(np.count_nonzero(~e_nan & ~e_inf & (a_nan | a_inf))),
             "NaN/inf where a finite value is expected")) if n]
        note = "; ".join(parts)
    return err, bad, note


def _summarize(err: np.ndarray, bad: np.ndarray, expected: np.ndarray, atol: float,
               note: str) -> Diff:
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        scale = np.abs(expected.astype(np.float64)) if not np.iscomplexobj(expected) \
            else np.abs(expected).astype(np.float64)
        rel = err / np.maximum(np.nan_to_num(scale, nan=0.0, posinf=np.inf),
                               max(atol, 1.0 if _exact(expected.dtype) else
                                   np.finfo(np.float64).tiny))
    rel = np.where(err == 0, 0.0, np.nan_to_num(rel, nan=np.inf, posinf=np.inf))
    mismatched = int(np.count_nonzero(bad))
    return Diff(float(err.max()), float(rel.max()), mismatched == 0, mismatched, note)


def _diff_complex(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> Diff:
    """Complex values part by part: a real array is one whose imaginary part is 0, so a
    complex reference is never matched by its real part alone."""
    errs, bads, notes = [], [], []
    for part in (np.real, np.imag):
        a, e = np.asarray(part(actual)), np.asarray(part(expected))
        if _exact(a.dtype) and _exact(e.dtype):
            err = integer_errors(a, e)
            bad, note = err != 0, ""
        else:
            err, bad, note = _float_errors(a, e, rtol, atol)
        errs.append(err)
        bads.append(bad)
        notes.append(note)
    if np.iscomplexobj(actual) != np.iscomplexobj(expected) and bads[1].any():
        side = "expected" if np.iscomplexobj(expected) else "actual"
        notes.insert(0, f"the {side} values are complex, the others real")
    return _summarize(np.maximum(*errs), bads[0] | bads[1], expected, atol,
                      "; ".join(n for n in notes if n))


def _diff_finite(actual: np.ndarray, expected: np.ndarray, rtol: float,
                 atol: float) -> Diff | None:
    """The common case in the arrays' own float type; None when NaN or inf is involved."""
    if actual.dtype != expected.dtype or actual.dtype not in (np.float32, np.float64):
        return None
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(actual - expected)
        max_abs = float(err.max())
        if not math.isfinite(max_abs):
            return None
        scale = np.abs(expected)
        limit = scale * rtol
        limit += atol
        mismatched = int(np.count_nonzero(err > limit))
        np.maximum(scale, max(atol, np.finfo(actual.dtype).tiny), out=scale)
        max_rel = float((err / scale).max())
    return Diff(max_abs, max_rel, mismatched == 0, mismatched)


# ---- the per-output check --------------------------------------------------------------------

@dataclasses.dataclass
class ValueCheck:
    """One value against its reference: the reference's dtype, the tolerances used, the diff."""

    dtype: str
    rtol: float
    atol: float
    diff: Diff

    @property
    def ok(self) -> bool:
        return self.diff.ok


def check_value(actual: Any, expected: Any, rtol: float | None, atol: float | None, *,
                reference: str = "", same_dtype: bool = True,
                computed_in: str | None = None) -> ValueCheck:
    """``actual`` against ``expected`` (tensors or arrays) within the tolerances of
    ``expected``'s dtype (``rtol``/``atol`` override them for floats).

    With ``same_dtype``, values that are close but of another dtype fail, with a note
    naming both (``reference`` labels the expected side, e.g. "torch "): an output that
    changed dtype is a wrong export even when its numbers agree. Localization compares
    intermediate values, where only the numbers count, without it. ``computed_in``: a
    less precise float type the model computes in (:func:`computes_in`); a float output is
    judged at least at its tolerances.
    """
    dtype = dtype_name(expected)
    r, a = tolerances_for(dtype, rtol, atol)
    if computed_in is not None and is_float(dtype):
        low_r, low_a = tolerances_for(computed_in, rtol, atol)
        r, a = max(r, low_r), max(a, low_a)
    d = diff(to_numpy(actual), to_numpy(expected), r, a)
    got = dtype_name(actual)
    if same_dtype and got != dtype and d.ok:
        d = dataclasses.replace(d, ok=False, note=f"dtype {got} != {reference}{dtype}")
    return ValueCheck(dtype, r, a, d)
