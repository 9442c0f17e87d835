"""check/numerics: the one diff every check judges values by, tolerances per dtype, and the
per-value check."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch

from onnx_modular.check.numerics import (
    DEFAULT_TOLERANCES,
    OTHER_FLOAT_TOLERANCES,
    abs_errors,
    check_tolerances,
    check_value,
    computes_in,
    diff,
    dtype_name,
    integer_errors,
    is_float,
    json_float,
    onnx_elem_name,
    to_numpy,
    tolerances_for,
)
from onnx_modular.diagnostics import OnnxModularError

NAN, INF = math.nan, math.inf


def _f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_within_tolerance_passes_and_reports_the_errors() -> None:
    d = diff(_f32(1.0, 2.0005), _f32(1.0, 2.0), rtol=1e-3, atol=0.0)
    assert d.ok and d.mismatched == 0
    assert d.max_abs == pytest.approx(5e-4, rel=1e-3)
    assert d.max_rel == pytest.approx(2.5e-4, rel=1e-3)


def test_the_limit_is_atol_plus_rtol_times_expected() -> None:
    expected = _f32(100.0, 0.0)
    assert diff(_f32(100.5, 0.1), expected, rtol=1e-2, atol=0.1).ok  # 0.5 <= 0.1 + 1
    d = diff(_f32(100.5, 0.2), expected, rtol=1e-2, atol=0.1)
    assert not d.ok and d.mismatched == 1


@pytest.mark.parametrize(("actual", "expected", "ok"), [
    ((NAN, 1.0), (NAN, 1.0), True),
    ((1.0, 1.0), (NAN, 1.0), False),
    ((NAN, 1.0), (1.0, 1.0), False),
    ((INF, -INF), (INF, -INF), True),
    ((INF, 1.0), (-INF, 1.0), False),
    ((1e30, 1.0), (INF, 1.0), False),
])
def test_nan_matches_only_nan_and_inf_only_the_same_inf(
        actual: tuple[float, ...], expected: tuple[float, ...], ok: bool) -> None:
    for dtype in (np.float32, np.float64):
        d = diff(np.array(actual, dtype), np.array(expected, dtype), rtol=1.0, atol=1.0)
        assert d.ok is ok, (actual, expected, dtype)
        if not ok:
            assert d.max_abs == INF and d.note


def test_the_note_says_which_nan_or_inf_failed() -> None:
    d = diff(_f32(1.0, NAN), _f32(NAN, 2.0), rtol=0.0, atol=0.0)
    assert d.note == ("1 expected NaN not matched; 1 NaN/inf where a finite value is "
                      "expected")


def test_integers_compare_exactly_beyond_float64_precision() -> None:
    big = np.array([2**60], dtype=np.int64)
    d = diff(big + 1, big, rtol=1.0, atol=1.0)  # through float64 they would be equal
    assert not d.ok and d.max_abs == 1.0
    assert diff(big, big.copy(), 0.0, 0.0).ok
    huge = np.array([2**64 - 1], dtype=np.uint64)
    assert integer_errors(huge, np.array([-1], dtype=np.int64))[0] == float(2**64)
    assert integer_errors(np.array([True]), np.array([False]))[0] == 1.0


def test_complex_values_compare_part_by_part() -> None:
    expected = np.array([1 + 1j], np.complex64)
    assert diff(np.array([1 + 1.00001j], np.complex64), expected, 1e-4, 1e-4).ok
    d = diff(np.array([1.0], np.float32), expected, 1e-4, 1e-4)
    assert not d.ok and "the expected values are complex, the others real" in d.note


def test_shapes_must_match_and_empty_arrays_pass() -> None:
    d = diff(np.zeros((2, 3)), np.zeros((3, 2)), 1.0, 1.0)
    assert not d.ok and d.note == "shape [2, 3] != expected [3, 2]" and d.mismatched == 6
    assert diff(np.zeros((0, 3)), np.zeros((0, 3)), 0.0, 0.0).ok


def test_values_that_are_no_numbers_fail() -> None:
    d = diff(np.array(["a"]), np.array(["a"]), 0.0, 0.0)
    assert not d.ok and "cannot be compared as numbers" in d.note


def test_abs_errors_follow_the_same_rules() -> None:
    errors = abs_errors(_f32(NAN, INF, 1.0, NAN), _f32(NAN, INF, 3.0, 0.0))
    np.testing.assert_array_equal(errors, [0.0, 0.0, 2.0, INF])


def test_tolerances_by_dtype() -> None:
    assert tolerances_for("float16", None, None) == DEFAULT_TOLERANCES["float16"]
    assert tolerances_for("float32", 0.5, None) == (0.5, DEFAULT_TOLERANCES["float32"][1])
    assert tolerances_for("int64", 0.5, 0.5) == (0.0, 0.0)  # integers are always exact
    assert tolerances_for("bool", None, None) == (0.0, 0.0)
    assert tolerances_for("float8_e8m0fnu", None, None) == OTHER_FLOAT_TOLERANCES
    assert is_float("complex64") and is_float("bfloat16") and not is_float("int8")


def test_a_model_computes_in_half_precision_where_most_of_its_weights_are() -> None:
    half, table = torch.zeros(64, 64, dtype=torch.float16), torch.zeros(8, dtype=torch.float16)
    norm, big = torch.zeros(64), torch.zeros(64, 64)
    assert computes_in([half, norm]) == "float16"  # a .half() model keeping fp32 norms
    assert computes_in([big, table]) is None  # one fp16 table in a float32 model
    assert computes_in([half.bfloat16(), norm]) == "bfloat16"
    assert computes_in([torch.zeros(3, dtype=torch.int64)]) is None
    assert computes_in([]) is None


def test_a_float32_output_of_a_float16_model_is_judged_at_float16_tolerances() -> None:
    """A float32 mean of fp16 activations (2.9e-4 off) failed at float32's 1e-4."""
    expected = torch.tensor([0.5, -0.25])
    actual = np.array([0.5003, -0.25], np.float32)
    assert not check_value(actual, expected, None, None).ok
    judged = check_value(actual, expected, None, None, computed_in="float16")
    assert judged.ok and (judged.rtol, judged.atol) == DEFAULT_TOLERANCES["float16"]
    assert not check_value(actual + 0.01, expected, None, None, computed_in="float16").ok
    assert not check_value(actual, expected, 1e-5, 1e-5, computed_in="float16").ok  # user's
    ints = check_value(np.array([3]), torch.tensor([3]), None, None, computed_in="float16")
    assert (ints.rtol, ints.atol) == (0.0, 0.0)


@pytest.mark.parametrize(("rtol", "atol"), [(NAN, None), (None, -1.0), (INF, None),
                                            ("1e-3", None), (None, True)])
def test_bad_user_tolerances_are_refused(rtol: object, atol: object) -> None:
    with pytest.raises(OnnxModularError, match=r"OM0501 .*(rtol|atol) must be a"):
        check_tolerances(rtol, atol)


def test_good_user_tolerances_pass() -> None:
    check_tolerances(None, None)
    check_tolerances(0, np.float32(1e-3))


def test_dtype_names_agree_between_torch_numpy_and_onnx() -> None:
    assert dtype_name(torch.zeros(1, dtype=torch.bfloat16)) == "bfloat16"
    assert dtype_name(np.zeros(1, dtype=ml_dtypes.bfloat16)) == "bfloat16"
    assert dtype_name(torch.zeros(1, dtype=torch.bool)) == dtype_name(np.zeros(1, bool)) \
        == onnx_elem_name(onnx.TensorProto.BOOL) == "bool"
    assert onnx_elem_name(onnx.TensorProto.FLOAT16) == "float16"


def test_to_numpy_widens_bfloat16_and_resolves_views() -> None:
    assert to_numpy(torch.ones(2, dtype=torch.bfloat16)).dtype == np.float32
    negated = torch.tensor([1.0, 2.0])._neg_view()
    np.testing.assert_array_equal(to_numpy(negated), [-1.0, -2.0])
    assert json_float(INF) == "inf" and json_float(1.5) == 1.5


def test_check_value_uses_the_reference_dtype_tolerances() -> None:
    half = torch.tensor([1.0, 2.0], dtype=torch.float16)
    check = check_value(half + 0.001, half, None, None)
    assert check.ok and (check.rtol, check.atol) == DEFAULT_TOLERANCES["float16"]
    assert check.dtype == "float16"


def test_a_changed_dtype_fails_even_when_the_numbers_agree() -> None:
    expected = torch.tensor([1.0, 2.0])
    check = check_value(expected.double(), expected, None, None, reference="torch ")
    assert not check.ok and check.diff.note == "dtype float64 != torch float32"
    assert check_value(expected.double(), expected, None, None, same_dtype=False).ok


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_a_scalar_float_compares_like_an_array(dtype: type) -> None:
    """A 0-d output (a loss): numpy gives scalars, not arrays, back from arithmetic on it;
    the diff used to raise 'return arrays must be of ArrayType'."""
    one, two = np.array(1.0, dtype), np.array(2.0, dtype)
    assert diff(one, one.copy(), 1e-4, 1e-4).ok
    wrong = diff(one, two, 1e-4, 1e-4)
    assert (wrong.ok, wrong.mismatched, wrong.max_abs, wrong.max_rel) == (False, 1, 1.0, 0.5)


@pytest.mark.parametrize(("actual", "expected", "ok"), [
    (np.array(np.nan, np.float32), np.array(np.nan, np.float32), True),
    (np.array(np.nan, np.float32), np.array(1.0, np.float32), False),
    (np.array(1.0, np.float32), np.array(np.nan, np.float32), False),
    (np.array(np.inf, np.float32), np.array(np.inf, np.float32), True),
    (np.array(7, np.int64), np.array(7, np.int64), True),
    (np.array(7, np.int64), np.array(8, np.int64), False),
    (np.array(True), np.array(True), True),
    (np.array(True), np.array(False), False),
    (np.array(1 + 2j, np.complex64), np.array(1 + 3j, np.complex64), False),
])
def test_scalars_of_every_kind_follow_the_rules(actual: np.ndarray, expected: np.ndarray,
                                                ok: bool) -> None:
    assert diff(actual, expected, 1e-4, 1e-4).ok is ok
    assert check_value(torch.from_numpy(np.asarray(actual)), expected, None, None).ok is ok
