"""Extraction on models the other tests do not use (acceptance checks).

A transformers decoder (GPT-NeoX), a vision CNN (transformers' ResNet) and a diffusion
transformer (diffusers' SD3 MMDiT), tiny configs, weights perturbed as trained (fresh
models have all-zero biases and all-one norms, which export as one shared constant).
An error planted in one call's weights, exported hierarchical and flat: the first mismatch
extracted alone reproduces the error with the same order of magnitude, and a healthy
block of the same class, fed diverging inputs in the full model, matches on torch's.
"""

from __future__ import annotations

import models
import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

import onnx_modular as om
from onnx_modular.check.compare_io import compare_io

pytestmark = pytest.mark.slow  # whole models: the full suite, not the inner loop


def _as_trained(model: nn.Module) -> nn.Module:
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    return model


def _neox() -> tuple[nn.Module, tuple]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPTNeoXConfig(
        num_hidden_layers=4, hidden_size=32, num_attention_heads=4, intermediate_size=64,
        vocab_size=99, max_position_embeddings=64, use_cache=False,
        attn_implementation="eager")
    ids = torch.randint(0, 99, (2, 8), generator=torch.Generator().manual_seed(0))
    return models.LastHidden(transformers.GPTNeoXModel(cfg).eval()).eval(), (ids,)


def _resnet() -> tuple[nn.Module, tuple]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16, 16],
                                    depths=[1, 2, 2], layer_type="basic")
    inner = transformers.ResNetModel(cfg).eval()

    class ResNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.resnet = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.resnet(x, return_dict=False)[1]

    return ResNet().eval(), (torch.randn(2, 3, 32, 32),)


def _sd3() -> tuple[nn.Module, tuple]:
    pytest.importorskip("diffusers")
    torch.manual_seed(0)
    return models.sd3(layers=4)


# model, the weight to plant in, the call that diverges first, a healthy later block
CASES = {
    "gpt-neox": (_neox, "model.layers.2.attention.query_key_value.bias",
                 "model.layers.2.attention.query_key_value", "model.layers.3"),
    "resnet": (_resnet, "resnet.encoder.stages.1.layers.1.layer.0.convolution.weight",
               "resnet.encoder.stages.1.layers.1.layer.0.convolution",
               "resnet.encoder.stages.2.layers.1"),
    "sd3-mmdit": (_sd3, "transformer.transformer_blocks.2.attn.to_v.bias",
                  "transformer.transformer_blocks.2.attn.to_v",
                  "transformer.transformer_blocks.3"),
}


@pytest.mark.parametrize("functions", ["all", "none"])
@pytest.mark.parametrize("name", list(CASES))
def test_planted_error_reproduces_alone_and_healthy_block_matches(name, functions, tmp_path):
    make, weight, first, healthy = CASES[name]
    model, args = make()
    _as_trained(model)
    proto = om.export(model, args, functions=functions).model_proto
    init = next(i for i in proto.graph.initializer if i.name == weight)
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5 + 0.1, weight))

    with om.Validation(model, args, proto, providers="cpu") as validation:
        rep = validation.run()
        assert not rep.ok and rep.first_mismatch == first
        bad = validation.extract(tmp_path / "bad")
        ok = validation.extract(tmp_path / "ok", call=healthy)
    alone = compare_io(tmp_path / "bad" / "module.onnx", tmp_path / "bad" / "inputs.npz",
                       tmp_path / "bad" / "expected.npz", providers="cpu")
    assert not alone.ok
    in_model = bad.in_model.max_abs
    assert in_model / 10 <= alone.max_abs <= in_model * 10

    assert not next(e for e in rep.localization.errors if e.call_id == healthy).ok
    assert all(p.source.startswith("torch input") for p in ok.inputs), ok.inputs
    assert compare_io(tmp_path / "ok" / "module.onnx", tmp_path / "ok" / "inputs.npz",
                      tmp_path / "ok" / "expected.npz", providers="cpu").ok
    module = onnx.load(tmp_path / "ok" / "module.onnx")
    onnx.checker.check_model(module, full_check=True)
    with np.load(tmp_path / "ok" / "expected.npz") as expected:
        assert set(expected.files) <= {o.name for o in module.graph.output}
