"""OutputCheck and ProviderResult: what validate and compare-io measured, as data."""

from __future__ import annotations

import json
import math

import numpy as np

from onnx_modular.check.numerics import Diff, check_value
from onnx_modular.check.outcome import OutputCheck, ProviderResult


def _check(name: str, ok: bool, max_abs: float = 0.0) -> OutputCheck:
    return OutputCheck("float32", 1e-4, 1e-5, Diff(max_abs, max_abs, ok, 0 if ok else 1),
                       name, [2, 3])


def test_of_names_and_shapes_a_value_check() -> None:
    check = check_value(np.ones(3, np.float32), np.ones(3, np.float32), None, None)
    out = OutputCheck.of("y", [3], check)
    assert (out.name, out.shape, out.dtype, out.rtol, out.atol) == ("y", [3], "float32",
                                                                      check.rtol, check.atol)
    assert out.diff is check.diff and out.ok


def test_an_output_check_to_dict_is_flat_and_json_safe() -> None:
    out = OutputCheck("float32", 1e-4, 1e-5, Diff(math.inf, math.nan, False, 2, "NaN"), "y",
                      [2])
    d = out.to_dict()
    assert d == {"name": "y", "shape": [2], "dtype": "float32", "rtol": 1e-4, "atol": 1e-5,
                 "max_abs_err": "inf", "max_rel_err": "nan", "ok": False, "mismatched": 2,
                 "note": "NaN"}
    json.dumps(d, allow_nan=False)


def test_a_provider_is_ok_only_when_every_output_is() -> None:
    good = ProviderResult("CPUExecutionProvider", [_check("a", True), _check("b", True)],
                          0.5, 0.01)
    bad = ProviderResult("CPUExecutionProvider", [_check("a", True), _check("b", False, 1.0)],
                         0.5, 0.01)
    assert good.ok and not bad.ok
    assert ProviderResult("CPUExecutionProvider", [], 0.0, 0.0).ok  # nothing to fail


def test_a_provider_result_to_dict_lists_its_outputs_in_order() -> None:
    result = ProviderResult("CUDAExecutionProvider", [_check("a", True), _check("b", False)],
                            1.5, 0.25)
    d = result.to_dict()
    assert (d["provider"], d["ok"], d["session_s"], d["run_s"]) == ("CUDAExecutionProvider",
                                                                    False, 1.5, 0.25)
    assert [o["name"] for o in d["outputs"]] == ["a", "b"]
    assert [o["ok"] for o in d["outputs"]] == [True, False]
