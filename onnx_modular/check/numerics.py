"""Numerics of every check: dtype names, tolerances by dtype, the diff, and the output check.

``validate`` (ONNX Runtime against torch), ``compare`` (model a against model b) and the
localization (module outputs against torch's) judge values the same way, here: one
conversion to numpy for comparison, one diff, one per-output check.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import onnx

from onnx_modular.errors import fail

#: (rtol, atol) by ONNX element type name; integers and bool compare exactly.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-3),
    "bfloat16": (1.6e-2, 1e-2),
}


# ---- dtype names -----------------------------------------------------------------------------

def is_float(dtype_name: str) -> bool:
    return dtype_name in DEFAULT_TOLERANCES or dtype_name.startswith("float8")


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


def tolerances_for(dtype_name: str, rtol: float | None, atol: float | None) -> tuple[float, float]:
    """User values apply to floating outputs; integers and bool are always exact."""
    if not is_float(dtype_name):
        return 0.0, 0.0
    d_rtol, d_atol = DEFAULT_TOLERANCES.get(dtype_name, (1.6e-2, 1e-2))
    return (d_rtol if rtol is None else rtol), (d_atol if atol is None else atol)


def to_numpy(value: Any) -> np.ndarray:
    """A tensor or array as numpy for comparison (bfloat16 widened to float32).

    Feeds keep their dtype (:func:`onnx_modular.runtime.to_feed`); a value to compare only
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
    """How far ``actual`` is from ``expected``; ``ok`` is an allclose with NaN == NaN."""

    max_abs: float
    max_rel: float
    ok: bool
    mismatched: int = 0
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"max_abs_err": json_float(self.max_abs), "max_rel_err": json_float(self.max_rel),
                "ok": self.ok, "mismatched": self.mismatched, "note": self.note}


def diff(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> Diff:
    """Max abs and rel error (rel over ``max(|expected|, atol)``), and pass/fail."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape:
        return Diff(math.inf, math.inf, False, int(expected.size),
                    f"shape {list(actual.shape)} != expected {list(expected.shape)}")
    if actual.size == 0:
        return Diff(0.0, 0.0, True)
    fast = _diff_finite(actual, expected, rtol, atol)
    if fast is not None:
        return fast
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    both_nan = np.isnan(a) & np.isnan(e)
    same_inf = np.isinf(a) & np.isinf(e) & (np.sign(a) == np.sign(e))
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(a - e)
        err = np.where(both_nan | same_inf, 0.0, err)
        err = np.where(np.isnan(err), np.inf, err)
        bad = err > atol + rtol * np.abs(e)
        rel = err / np.maximum(np.abs(e), max(atol, np.finfo(np.float64).tiny))
    mismatched = int(np.count_nonzero(bad))
    return Diff(float(err.max()), float(np.nan_to_num(rel, nan=np.inf).max()),
                mismatched == 0, mismatched)


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
                reference: str = "", same_dtype: bool = True) -> ValueCheck:
    """``actual`` against ``expected`` (tensors or arrays) within the tolerances of
    ``expected``'s dtype (``rtol``/``atol`` override them for floats).

    With ``same_dtype``, values that are close but of another dtype fail, with a note
    naming both (``reference`` labels the expected side, e.g. "torch "): an output that
    changed dtype is a wrong export even when its numbers agree. Localization compares
    intermediate values, where only the numbers count, without it.
    """
    dtype = dtype_name(expected)
    r, a = tolerances_for(dtype, rtol, atol)
    d = diff(to_numpy(actual), to_numpy(expected), r, a)
    got = dtype_name(actual)
    if same_dtype and got != dtype and d.ok:
        d = dataclasses.replace(d, ok=False, note=f"dtype {got} != {reference}{dtype}")
    return ValueCheck(dtype, r, a, d)
