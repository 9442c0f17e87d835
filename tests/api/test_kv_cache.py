"""A decoder exported with its KV cache, every size dynamic: one function for its layers.

Issue 32 measured Olive's dynamo export of a KV-cache GPT-2 splitting layer 0 off; through
``om.export`` the cache enters every layer the same way, so the layers share one function
whose inputs are activations and weights only, and the file computes what torch does.
"""

from __future__ import annotations

import collections

import pytest
import torch

import onnx_modular as om
from onnx_modular.check.inspect import input_kinds

pytestmark = pytest.mark.slow  # a whole transformers model

LAYERS, HEADS, EMBED = 3, 4, 64


class WithCache(torch.nn.Module):
    """GPT-2 fed its past keys and values as tensors, returning logits and the new cache."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        self.config = GPT2Config(n_layer=LAYERS, n_embd=EMBED, n_head=HEADS, vocab_size=99,
                                 n_positions=64, use_cache=True)
        self.model = GPT2LMHeadModel(self.config).eval()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from transformers.cache_utils import DynamicCache

        cache = DynamicCache(config=self.config)
        for layer in range(LAYERS):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         past_key_values=cache, use_cache=True)
        present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
        return (out.logits, *present)


def test_a_kv_cache_decoder_has_one_layer_function_under_dynamic_shapes() -> None:
    batch, seq, past_len = 2, 4, 5
    ids = torch.randint(0, 99, (batch, seq), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(batch, seq + past_len, dtype=torch.long)
    past = [torch.randn(batch, HEADS, past_len, EMBED // HEADS) for _ in range(2 * LAYERS)]
    model, auto = WithCache().eval(), torch.export.Dim.AUTO
    shapes = ({0: auto, 1: auto}, {0: auto, 1: auto}, ({0: auto, 2: auto},) * (2 * LAYERS))
    result = om.export(model, (ids, mask, *past), dynamic_shapes=shapes)
    layer = [f for f in result.functions if f.name.startswith("GPT2Block")]
    assert [f.name for f in layer] == ["GPT2Block"] and len(layer[0].calls) == LAYERS
    kinds = collections.Counter(input_kinds(result.model_proto)["GPT2Block"])
    assert kinds == {"activation": 4, "weight": 12}  # hidden, mask, past key, past value
    report = om.validate(model, (ids, mask, *past), result, providers="cpu")
    assert report.ok, report.to_dict()
