"""Verdicts: NaN and inf, integers, complex, inputs changed in place, random integer inputs.

Every check of the package (validate, compare, compare-io, localization, extraction) judges
values with ``numerics.diff``; these tests hold that one rule to the README's "How outputs are
compared", on every dtype a model outputs, and then the checks that use it end to end.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import onnx
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import onnx_modular as om
from onnx_modular.check import numerics

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")

NAN, INF = float("nan"), float("inf")
FLOATS = [torch.float32, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64]


def _verdict(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    return numerics.check_value(actual, expected, None, None).ok


# ---- the rule, dtype by dtype -----------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(("expected", "actual", "ok"), [
    ([1.0, NAN], [1.0, NAN], True),     # NaN at the same position
    ([1.0, NAN], [1.0, 0.0], False),    # a NaN reference matched by a finite value
    ([1.0, NAN], [NAN, 1.0], False),    # NaN at another position
    ([1.0, 2.0], [1.0, NAN], False),    # NaN where a number is expected
    ([-INF, 2.0], [-INF, 2.0], True),   # the same inf
    ([-INF, 2.0], [0.0, 2.0], False),   # masked logits: -inf against 0
    ([-INF, 2.0], [INF, 2.0], False),   # the other inf
    ([INF, 2.0], [NAN, 2.0], False),
    ([1.0, 2.0], [1.0, INF], False),    # inf where a number is expected
    ([1.0, 2.0], [1.0, 2.0], True),
])
def test_nan_and_inf_on_every_float_dtype(dtype, expected, actual, ok):
    e, a = torch.tensor(expected, dtype=dtype), torch.tensor(actual, dtype=dtype)
    assert _verdict(a, e) is ok
    assert _verdict(a.numpy() if dtype != torch.bfloat16 else a, e) is ok  # ORT's side: numpy
    d = numerics.check_value(a, e, None, None).diff
    if not ok:
        wrong = sum(not (x == y or (math.isnan(x) and math.isnan(y)))
                    for x, y in zip(actual, expected, strict=True))
        assert d.mismatched == wrong and d.max_abs == INF and d.note


@pytest.mark.parametrize("dtype", INTS)
def test_integers_compare_exactly(dtype):
    big = 2**60 if dtype == torch.int64 else 2**30
    e = torch.tensor([big, -big, 7], dtype=dtype)
    assert _verdict(e.clone(), e)
    off = e.clone()
    off[0] += 1  # through float64, 2**60 + 1 == 2**60: the old check said 0 error
    d = numerics.check_value(off, e, None, None).diff
    assert not d.ok and d.max_abs == 1.0 and d.mismatched == 1
    # the largest differences do not overflow
    lo = torch.tensor([torch.iinfo(dtype).min], dtype=dtype)
    hi = torch.tensor([torch.iinfo(dtype).max], dtype=dtype)
    assert numerics.check_value(hi, lo, None, None).diff.max_abs == float(2 ** (
        torch.iinfo(dtype).bits) - 1)
    # user tolerances never loosen integers
    assert not numerics.check_value(off, e, 1.0, 10.0).ok


def test_bool_and_mixed_integer_types():
    e = torch.tensor([True, False, True])
    assert _verdict(e.clone(), e)
    assert not _verdict(torch.tensor([True, True, True]), e)
    assert not numerics.diff(np.array([2**64 - 1], np.uint64), np.array([-1], np.int64), 0, 0).ok
    assert numerics.diff(np.array([5], np.uint64), np.array([5], np.int64), 0, 0).ok
    assert numerics.diff(np.array([3], np.uint8), np.array([3], np.int64), 0, 0).ok


def test_complex_is_judged_part_by_part():
    real = np.array([1.0, 2.0], np.float32)
    assert not numerics.diff(real, real + 5j, 1e-4, 1e-4).ok
    assert "complex" in numerics.diff(real, real + 5j, 1e-4, 1e-4).note
    assert numerics.diff(real + 0j, real + 0j, 1e-4, 1e-4).ok
    assert not numerics.diff(real + 1j, real + 0j, 1e-4, 1e-4).ok
    assert not numerics.diff(np.array(["a"]), np.array(["a"]), 0, 0).ok


def test_tolerances_are_explicit_per_dtype():
    for name in ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"):
        assert name in numerics.DEFAULT_TOLERANCES
    for name in ("int8", "int32", "int64", "uint8", "bool"):
        assert numerics.tolerances_for(name, 1.0, 1.0) == (0.0, 0.0)


# ---- property: the rule against a slow, exact reference -------------------------------------

def _reference_ok(a: np.ndarray, e: np.ndarray, rtol: float, atol: float) -> bool:
    """Element by element, in exact arithmetic (Fraction), the README's rules."""
    for x, y in zip(a.ravel().tolist(), e.ravel().tolist(), strict=True):
        if isinstance(x, int) and isinstance(y, int):
            if x != y:
                return False
            continue
        x, y = float(x), float(y)
        if math.isnan(y) or math.isnan(x):
            if not (math.isnan(x) and math.isnan(y)):
                return False
        elif math.isinf(y) or math.isinf(x):
            if x != y:
                return False
        elif abs(Fraction(x) - Fraction(y)) > Fraction(atol) + Fraction(rtol) * abs(Fraction(y)):
            return False
    return True


SPECIALS = st.sampled_from([NAN, INF, -INF, 0.0, -0.0, 1.0, 1e30, -1e-30, 3.4e38])
FLOAT_DTYPES = st.sampled_from([np.float16, np.float32, np.float64])


@st.composite
def float_pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    dtype = draw(FLOAT_DTYPES)
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=2, max_side=5))
    elements = st.one_of(SPECIALS, st.floats(width=np.finfo(dtype).bits, allow_nan=True))
    e = draw(hnp.arrays(dtype, shape, elements=elements))
    # the actual side: often the reference nudged, or with a special swapped in
    a = e.copy()
    for i in draw(st.lists(st.integers(0, e.size - 1), max_size=3)):
        a.flat[i] = draw(st.one_of(SPECIALS, st.floats(width=np.finfo(dtype).bits)))
    return a, e


@pytest.mark.slow
@settings(max_examples=300, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(float_pairs(), st.sampled_from([(0.0, 0.0), (1e-4, 1e-4), (1e-2, 1e-3), (0.5, 1.0)]))
def test_float_rule_matches_exact_reference(pair, tol):
    a, e = pair
    rtol, atol = tol
    d = numerics.diff(a, e, rtol, atol)
    assert d.ok is _reference_ok(a, e, rtol, atol)
    assert d.ok is (d.mismatched == 0)
    if not d.ok:
        assert d.max_abs > 0


INT_DTYPES = st.sampled_from([np.int8, np.int32, np.int64, np.uint8, np.uint64, np.bool_])


@st.composite
def int_pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    da, de = draw(INT_DTYPES), draw(INT_DTYPES)
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=1, max_side=6))
    e = draw(hnp.arrays(de, shape))
    a = e.astype(da, casting="unsafe") if draw(st.booleans()) else draw(hnp.arrays(da, shape))
    return a, e


@pytest.mark.slow
@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(int_pairs())
def test_integer_rule_is_exact(pair):
    a, e = pair
    d = numerics.diff(a, e, 0.0, 0.0)
    exact = [int(x) for x in a.tolist()], [int(y) for y in e.tolist()]
    assert d.ok is (exact[0] == exact[1])
    worst = max(abs(x - y) for x, y in zip(*exact, strict=True))
    assert d.max_abs == float(worst)


# ---- the checks that use the rule, end to end -------------------------------------------------

def _model(nodes: list, inputs: list, outputs: list, inits: list | None = None
           ) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits or [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _io(name: str, elem: int, shape: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


class Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


class Masked(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.masked_fill(x < 0, float("-inf"))


class AddBig(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 2**60


class Doubles(nn.Module):
    """Changes its input in place before using it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mul_(2) + 1


def test_validate_nan_reference_is_not_matched_by_a_number():
    x = torch.tensor([[-1.0, 2.0, -3.0, 4.0]])
    f = _io("x", TensorProto.FLOAT, [1, 4])
    y = _io("y", TensorProto.FLOAT, [1, 4])
    log_abs = _model([helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Log", ["a"], ["y"])],
                     [f], [y])
    rep = om.validate(Log(), (x,), log_abs, providers="cpu")
    assert not rep.ok
    assert "NaN" in rep.results[0].outputs[0].diff.note
    log = _model([helper.make_node("Log", ["x"], ["y"])], [f], [y])
    assert om.validate(Log(), (x,), log, providers="cpu").ok


def test_validate_masked_inf_is_not_matched_by_zero():
    x = torch.tensor([[-1.0, 2.0, -3.0, 4.0]])
    relu = _model([helper.make_node("Relu", ["x"], ["y"])], [_io("x", TensorProto.FLOAT, [1, 4])],
                  [_io("y", TensorProto.FLOAT, [1, 4])])
    assert not om.validate(Masked(), (x,), relu, providers="cpu").ok


def test_validate_and_compare_int64_beyond_float64():
    x = torch.tensor([[1, 2, 3]], dtype=torch.int64)

    def adds(k: int) -> onnx.ModelProto:
        return _model([helper.make_node("Add", ["x", "k"], ["y"])],
                      [_io("x", TensorProto.INT64, [1, 3])], [_io("y", TensorProto.INT64, [1, 3])],
                      [numpy_helper.from_array(np.array(k, np.int64), "k")])

    assert om.validate(AddBig(), (x,), adds(2**60), providers="cpu").ok
    assert not om.validate(AddBig(), (x,), adds(2**60 + 1), providers="cpu").ok
    rep = om.compare(adds(2**60), adds(2**60 + 1))
    assert not rep.equivalent and rep.outputs[0].diff.max_abs == 1.0


def test_validate_feeds_ort_the_inputs_torch_was_given():
    x = torch.tensor([[1.0, 2.0, 3.0]])
    kept = x.clone()
    io = [_io("x", TensorProto.FLOAT, [1, 3])], [_io("y", TensorProto.FLOAT, [1, 3])]
    two, one = (numpy_helper.from_array(np.array(v, np.float32), n)
                for v, n in ((2.0, "two"), (1.0, "one")))
    right = _model([helper.make_node("Mul", ["x", "two"], ["m"]),
                    helper.make_node("Add", ["m", "one"], ["y"])], *io, [two, one])
    wrong = _model([helper.make_node("Add", ["x", "one"], ["y"])], *io, [one])
    assert om.validate(Doubles(), (x,), right, providers="cpu", localize=True).ok
    assert not om.validate(Doubles(), (x,), wrong, providers="cpu").ok
    assert torch.equal(x, kept)  # the caller's tensor is left as it was given


def test_compare_draws_token_ids_over_the_embedding():
    vocab, dim = 50, 4
    table = np.random.default_rng(0).standard_normal((vocab, dim)).astype(np.float32)
    other = table.copy()
    other[2:] += 1.0  # the two models agree on ids 0 and 1 only

    def embeds(weights: np.ndarray) -> onnx.ModelProto:
        return _model([helper.make_node("Gather", ["emb", "ids"], ["y"])],
                      [_io("ids", TensorProto.INT64, [2, 8])],
                      [_io("y", TensorProto.FLOAT, [2, 8, dim])],
                      [numpy_helper.from_array(weights, "emb")])

    rep = om.compare(embeds(table), embeds(other))
    assert not rep.equivalent
    assert any("[0, 50)" in line and "emb" in line for line in rep.inputs_drawn)
    assert "Random inputs" in rep.to_markdown()
    assert om.compare(embeds(table), embeds(table)).equivalent


def test_compare_io_complex_expected_is_a_mismatch(tmp_path):
    model = _model([helper.make_node("Identity", ["x"], ["y"])],
                   [_io("x", TensorProto.FLOAT, [3])], [_io("y", TensorProto.FLOAT, [3])])
    x = np.array([1.0, 2.0, 3.0], np.float32)
    rep = om.compare_io(model.SerializeToString(), {"x": x}, {"y": x + 5j}, providers="cpu")
    assert not rep.ok
    assert om.compare_io(model.SerializeToString(), {"x": x}, {"y": x}, providers="cpu").ok


def test_compare_reads_external_constants_beside_the_model(tmp_path, monkeypatch):
    """A small weight saved as external data enters the topology hash by value: it is read
    from the model's folder, not from a file of the same name in the current directory."""
    def saved(folder, value: float) -> str:
        folder.mkdir()
        model = _model([helper.make_node("Add", ["x", "k"], ["y"])],
                       [_io("x", TensorProto.FLOAT, [4])], [_io("y", TensorProto.FLOAT, [4])],
                       [numpy_helper.from_array(np.full(4, value, np.float32), "k")])
        onnx.save_model(model, str(folder / "m.onnx"), save_as_external_data=True,
                        location="m.data", size_threshold=0)
        return str(folder / "m.onnx")

    a, b = saved(tmp_path / "a", 1.0), saved(tmp_path / "b", 1.0)
    decoy = saved(tmp_path / "cwd", 7.0)  # the current directory holds another m.data
    monkeypatch.chdir(tmp_path / "cwd")
    rep = om.compare(a, b)
    assert rep.equivalent and rep.same_structure
    assert om.compare(a, decoy).a.topology == rep.a.topology
    assert not om.compare(a, decoy).same_structure
