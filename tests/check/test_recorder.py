"""The torch call recorder on small hand-built modules."""

from __future__ import annotations

import torch

from onnx_modular.check.recorder import record_calls
from onnx_modular.leaves.metadata import CallInfo


class Inner(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


class Outer(torch.nn.Module):
    """``inner`` is called twice; ``last`` changes its own output in place afterwards."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()
        self.last = Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(self.inner(x))
        z = self.last(y)
        z.mul_(2)
        return z


def test_calls_are_recorded_in_order_with_ids_parents_and_outputs() -> None:
    model = Outer()
    x = torch.zeros(2)
    out, calls = record_calls(model, lambda: model(x))
    assert [c.call for c in calls] == [
        CallInfo("inner", "inner", f"{__name__}.Inner"),
        CallInfo("inner@1", "inner", f"{__name__}.Inner"),
        CallInfo("last", "last", f"{__name__}.Inner")]
    assert [c.call_id for c in calls] == ["inner", "inner@1", "last"]
    assert all(c.depth == 0 and c.parent is None for c in calls)
    assert torch.equal(calls[1].outputs[0], torch.full((2,), 2.0))
    assert torch.equal(calls[1].intact_inputs()[0], torch.ones(2))
    assert torch.equal(out, torch.full((2,), 6.0))


def test_an_output_changed_in_place_later_is_not_compared() -> None:
    model = Outer()
    _, calls = record_calls(model, lambda: model(torch.zeros(2)))
    assert calls[2].intact_outputs() == []  # z.mul_(2) after ``last`` returned it
    assert len(calls[0].intact_outputs()) == 1


def test_nested_calls_name_their_parent_and_the_hooks_go_away() -> None:
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.ReLU()), torch.nn.Identity())
    _, calls = record_calls(model, lambda: model(torch.ones(1)))
    assert [(c.call_id, c.depth, c.parent) for c in calls] == [
        ("0", 0, None), ("0.0", 1, 0), ("1", 0, None)]
    assert calls[1].module_type == "torch.nn.modules.activation.ReLU"
    assert not model[0][0]._forward_hooks and not model[0][0]._forward_pre_hooks
