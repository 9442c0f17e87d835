"""What a check is asked, built once and frozen; what a run skipped comes back, never written
into the options."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from onnx_modular.check.options import CheckOptions, ProviderPlan, Tolerances
from onnx_modular.check.outcome import ProviderResult
from onnx_modular.check.runners import Inputs, Outputs
from onnx_modular.check.validate import check_providers
from onnx_modular.diagnostics import OnnxModularError
from onnx_modular.leaves import runtime
from onnx_modular.leaves.errors import fail

CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"


def test_tolerances_are_checked_once_and_frozen() -> None:
    assert Tolerances.checked(None, None) == Tolerances()
    assert Tolerances.checked(1e-3, 0) == Tolerances(1e-3, 0)
    for bad in (math.nan, -1.0, math.inf):
        with pytest.raises(OnnxModularError, match="rtol must be a finite number"):
            Tolerances.checked(bad, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Tolerances().rtol = 1.0  # type: ignore[misc]


def test_a_provider_plan_says_whether_the_user_chose() -> None:
    default = ProviderPlan.resolve(None)
    assert default.defaulted and CPU in default.providers
    assert set(default.unavailable) == set(runtime.DEFAULT_PROVIDERS) - set(default.providers)
    chosen = ProviderPlan.resolve("cpu")
    assert chosen == ProviderPlan((CPU,), False, chosen.unavailable)
    assert not chosen.defaulted and not chosen.unavailable
    with pytest.raises(TypeError):
        default.unavailable["x"] = "y"  # type: ignore[index]
    with pytest.raises(OnnxModularError, match="'no_such_ep' is not available"):
        ProviderPlan.resolve("no_such_ep")


def test_check_options_are_one_frozen_record() -> None:
    options = CheckOptions.of(providers="cpu", rtol=0.1, localize=True)
    assert options.tolerances == Tolerances(0.1, None) and options.plan.providers == (CPU,)
    assert options.always_localize and not CheckOptions.of().always_localize
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.localize = False  # type: ignore[misc]
    with pytest.raises(OnnxModularError, match="atol must be"):  # tolerances first
        CheckOptions.of(providers="no_such_ep", atol=-1)


class _Runner:
    name = CPU
    session_s = 0.0

    def __enter__(self) -> _Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def run(self, inputs: Inputs) -> Outputs:
        return Outputs([np.ones(2, np.float32)], 0.0)


def _open(provider: str) -> _Runner:
    if provider == CUDA:
        raise runtime.ProviderUnavailableError(fail("no GPU here").diagnostic)
    return _Runner()


def test_what_was_skipped_is_returned_and_the_options_stay() -> None:
    expected = [torch.ones(2)]
    defaulted = CheckOptions(Tolerances(), ProviderPlan((CUDA, CPU), True,
                                                        {"OtherExecutionProvider": "absent"}))
    before = dataclasses.replace(defaulted)
    results, skipped = check_providers(_open, ["y"], Inputs(), expected, defaulted)
    assert [r.provider for r in results] == [CPU] and all(isinstance(r, ProviderResult)
                                                          for r in results)
    assert results[0].ok
    assert skipped == {"OtherExecutionProvider": "absent", CUDA: skipped[CUDA]}
    assert "no GPU here" in skipped[CUDA]
    assert defaulted == before and dict(defaulted.plan.unavailable) == {
        "OtherExecutionProvider": "absent"}
    asked = CheckOptions(Tolerances(), ProviderPlan((CUDA, CPU), False))
    with pytest.raises(runtime.ProviderUnavailableError):  # asked for: an error, not a skip
        check_providers(_open, ["y"], Inputs(), expected, asked)


def test_the_tolerances_given_are_the_ones_judged() -> None:
    expected = [torch.full((2,), 1.01)]
    loose = CheckOptions(Tolerances(0.1, 0.1), ProviderPlan((CPU,), False))
    strict = dataclasses.replace(loose, tolerances=Tolerances(0, 0))
    assert check_providers(_open, ["y"], Inputs(), expected, loose)[0][0].ok
    assert not check_providers(_open, ["y"], Inputs(), expected, strict)[0][0].ok
