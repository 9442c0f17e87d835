"""Corner cases of cutting a model into parts: a translated constant read by a region
earlier than the one it was made in, and a model with no operator at all."""

from __future__ import annotations

from collections.abc import Callable

import models
import pytest
import torch
from torch import nn

import onnx_modular as om


class TwoClamps(nn.Module):
    """Both clamps use the same bounds: the translation makes each constant once."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.clamp(0.0, 1.0) + y.clamp(0.0, 1.0)


class ScaleTwice(nn.Module):
    """One scalar for two multiplications; the first one's stage needs the second's."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a = x * 0.5
        b = (y + 1.0) * 0.5
        return a + b


class LayerAndScale(nn.Module):
    """A submodule (its own function) and a scale made for the later stage first."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        first = torch.relu(x * 3.0)
        return self.fc(y * 3.0) + first


def _args() -> tuple[torch.Tensor, torch.Tensor]:
    g = models.seeded(5)
    return torch.randn(4, generator=g), torch.randn(4, generator=g)


# model, {FX node name: stage id} (others: 1): the node making the constant goes last
CASES: dict[str, tuple[Callable[[], nn.Module], dict[str, int]]] = {
    "two_clamps": (TwoClamps, {"clamp": 1, "clamp_1": 0}),
    "scale_twice": (ScaleTwice, {"mul": 1, "add": 0, "mul_1": 0, "add_1": 1}),
    "layer_and_scale": (LayerAndScale, {"mul": 1, "mul_1": 0, "linear": 0}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_constant_read_by_an_earlier_region_is_copied_into_it(case: str, tmp_path,
                                                               assert_close) -> None:
    build, stage_of = CASES[case]
    model, args = build().eval(), _args()
    result = om.split_by(model, lambda n: stage_of.get(n.name, 1), args=args)
    assert len(result.stages) >= 2
    result.save(tmp_path / "parts")
    assert_close(om.SplitRunner(tmp_path / "parts")(*args), model(*args), 1e-6)


class Identity(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Swap(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return y, x


class OnlyMarker(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        om.pipe_split()
        return x


NO_OPERATOR = {
    "identity": (Identity, 1),
    "swap": (Swap, 2),
    "only_marker": (OnlyMarker, 1),
}

ENTRIES = {
    "split_stages": lambda m, a: om.split_stages(m, a),
    "split_stages_points": lambda m, a: om.split_stages(m, a, {"": "end"}),
    "split_stages_balanced": lambda m, a: om.split_stages(m, a, num_stages=2),
    "split_by": lambda m, a: om.split_by(m, lambda n: 0, args=a),
    "split": lambda m, a: om.split(m, a, support=["aten.add"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("name", NO_OPERATOR)
def test_a_model_without_operators_is_refused_up_front(name: str, entry: str) -> None:
    """One line, the same as om.split's, before any translation."""
    if (name, entry) == ("only_marker", "split"):
        pytest.skip("om.split does not take pipe_split markers")
    build, n_inputs = NO_OPERATOR[name]
    args = _args()[:n_inputs]
    with pytest.raises(om.OnnxModularError,
                       match=r"^error: OM0002 .*at least one operator \(nothing to split\)$"):
        ENTRIES[entry](build(), args)
