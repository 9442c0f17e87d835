"""``om.validate`` binds keyword inputs as torch.export flattened them for the ONNX model:
in the order of the call (a program's: of the call it was captured with), not of
``forward``'s signature."""

from __future__ import annotations

import models
import pytest
import torch
from torch import nn

import onnx_modular as om

pytestmark = pytest.mark.slow  # whole models: the full suite, not the inner loop


class PairMask(nn.Module):
    """A tensor pair and an int64 mask as keywords, after the positional input."""

    def forward(self, x: torch.Tensor, pair: tuple[torch.Tensor, torch.Tensor] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        a, b = pair
        return (x * 2 + a - b * 3) * mask.to(x.dtype)


class Gpt2Step(nn.Module):
    """One decoding step of GPT-2 on a KV cache passed as per-layer keys and values."""

    def __init__(self) -> None:
        super().__init__()
        self.model = models.gpt2()[0].model

    def forward(self, input_ids: torch.Tensor, keys: tuple[torch.Tensor, ...] = (),
                values: tuple[torch.Tensor, ...] = (),
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        from transformers import DynamicCache

        cache = DynamicCache()
        for i, (k, v) in enumerate(zip(keys, values, strict=True)):
            cache.update(k, v, i)
        return self.model(input_ids=input_ids, past_key_values=cache,
                          attention_mask=attention_mask, use_cache=True).last_hidden_state


def _pair_mask(order: list[str]) -> tuple[nn.Module, dict]:
    g = models.seeded(2)
    given = {"x": torch.randn(3, 4, generator=g),
             "pair": (torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)),
             "mask": torch.randint(0, 2, (3, 4), generator=g)}
    return PairMask(), {k: given[k] for k in order}


def _gpt2_step(order: list[str]) -> tuple[nn.Module, dict]:
    g = models.seeded(3)
    given = {"input_ids": torch.randint(0, 99, (2, 1), generator=g),
             "keys": tuple(torch.randn(2, 4, 5, 8, generator=g) for _ in range(2)),
             "values": tuple(torch.randn(2, 4, 5, 8, generator=g) for _ in range(2)),
             "attention_mask": torch.ones(2, 6, dtype=torch.int64)}
    return Gpt2Step().eval(), {k: given[k] for k in order}


CASES = {
    # dtypes differ where the signature's order would bind: an int64 input fed a float
    "pair_mask": (_pair_mask, ["x", "mask", "pair"]),
    "gpt2_mask_first": (_gpt2_step, ["input_ids", "attention_mask", "values", "keys"]),
    # dtypes and shapes agree: the signature's order would swap keys and values silently
    "gpt2_values_first": (_gpt2_step, ["input_ids", "values", "keys", "attention_mask"]),
    "pair_mask_signature_order": (_pair_mask, ["x", "pair", "mask"]),
}


@pytest.mark.parametrize("case", CASES)
def test_keywords_bind_in_the_order_of_the_call(case: str) -> None:
    build, order = CASES[case]
    model, kwargs = build(order)
    result = om.export(model, (), kwargs=kwargs)
    report = om.validate(model, (), result, kwargs=kwargs, providers="cpu")
    assert report.ok, report


@pytest.mark.parametrize("case", ["pair_mask", "gpt2_values_first"])
def test_a_program_binds_in_the_order_it_was_captured_with(case: str) -> None:
    """Keywords given in another order than the program's capture follow the capture's,
    as SplitRunner orders them."""
    build, order = CASES[case]
    model, kwargs = build(order)
    program = torch.export.export(model, (), kwargs=kwargs)
    result = om.export(program)
    shuffled = dict(reversed(list(kwargs.items())))
    assert list(shuffled) != list(kwargs)
    report = om.validate(program, (), result, kwargs=shuffled, providers="cpu")
    assert report.ok, report
