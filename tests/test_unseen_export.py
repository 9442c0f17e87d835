"""Models and inputs the other tests do not use: more architectures, and what broke on them.

Transformers models come from tiny configs with random weights (nothing is downloaded).
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from torch import nn

import onnx_modular as om
from onnx_modular.emit.canonical import graph_key
from onnx_modular.passes.modularize import iter_module_calls


class Wrap(nn.Module):
    """Tensor in, last hidden state out."""

    def __init__(self, model: nn.Module, key: str, **extra: object) -> None:
        super().__init__()
        self.model, self.key, self.extra = model, key, extra

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(**{self.key: x}, **self.extra, return_dict=True)[0]


def _ids() -> tuple[torch.Tensor]:
    return (torch.randint(0, 99, (2, 8), generator=torch.Generator().manual_seed(0)),)


def _build(config: str, model: str, key: str = "input_ids", args: tuple | None = None,
           extra: dict | None = None, **cfg: object) -> tuple[nn.Module, tuple]:
    import transformers

    torch.manual_seed(0)
    config_obj = getattr(transformers, config)(attn_implementation="eager", **cfg)
    module = getattr(transformers, model)(config_obj).eval()
    return Wrap(module, key, **(extra or {})).eval(), args or _ids()


def _whisper_encoder() -> tuple[nn.Module, tuple]:
    from transformers import WhisperConfig, WhisperModel

    torch.manual_seed(0)
    cfg = WhisperConfig(encoder_layers=2, decoder_layers=1, d_model=32, encoder_attention_heads=4,
                        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                        num_mel_bins=16, max_source_positions=32, vocab_size=99, pad_token_id=0,
                        bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
                        attn_implementation="eager")
    encoder = WhisperModel(cfg).get_encoder().eval()
    return Wrap(encoder, "input_features").eval(), (torch.randn(1, 16, 64),)


NO_CACHE = {"use_cache": False}
ARCHITECTURES = {  # name -> (builder, layer class that must be one function called per layer)
    "opt": (lambda: _build("OPTConfig", "OPTModel", extra=NO_CACHE, num_hidden_layers=2,
                           hidden_size=32, num_attention_heads=4, ffn_dim=64, vocab_size=99,
                           max_position_embeddings=64, word_embed_proj_dim=32),
            "OPTDecoderLayer"),
    "gpt_neox": (lambda: _build("GPTNeoXConfig", "GPTNeoXModel", extra=NO_CACHE,
                                num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                intermediate_size=64, vocab_size=99,
                                max_position_embeddings=64), "GPTNeoXLayer"),
    "falcon": (lambda: _build("FalconConfig", "FalconModel", extra=NO_CACHE,
                              num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                              vocab_size=99), "FalconDecoderLayer"),
    "bloom": (lambda: _build("BloomConfig", "BloomModel", extra=NO_CACHE, n_layer=2,
                             hidden_size=32, n_head=4, vocab_size=99), "BloomBlock"),
    "t5_encoder": (lambda: _build("T5Config", "T5EncoderModel", num_layers=2, d_model=32,
                                  d_kv=8, num_heads=4, d_ff=64, vocab_size=99), "T5Block"),
    "deberta_v2": (lambda: _build("DebertaV2Config", "DebertaV2Model", num_hidden_layers=2,
                                  hidden_size=32, num_attention_heads=4, intermediate_size=64,
                                  vocab_size=99, max_position_embeddings=64), "DebertaV2Layer"),
    "clip_vision": (lambda: _build("CLIPVisionConfig", "CLIPVisionModel", key="pixel_values",
                                   args=(torch.randn(2, 3, 32, 32),), num_hidden_layers=2,
                                   hidden_size=32, num_attention_heads=4, intermediate_size=64,
                                   image_size=32, patch_size=8), "CLIPEncoderLayer"),
    "whisper_encoder": (_whisper_encoder, "WhisperEncoderLayer"),
    # Mamba's two blocks used to become two functions each (MambaBlock, MambaBlock_1...):
    # a shared constant shifted the node numbering of the structural key.
    "mamba": (lambda: _build("MambaConfig", "MambaModel", extra=NO_CACHE, num_hidden_layers=2,
                             hidden_size=32, state_size=4, vocab_size=99), "MambaBlock"),
}


def _ort(proto: onnx.ModelProto, args: tuple) -> list[np.ndarray]:
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)})


def _sites(proto: onnx.ModelProto) -> collections.Counter[str]:
    names = {f.name for f in proto.functions}
    return collections.Counter(n.op_type for g in [proto.graph, *proto.functions]
                               for n in g.node if n.op_type in names)


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_unseen_architecture(name: str) -> None:
    build, layer = ARCHITECTURES[name]
    model, args = build()
    ep = torch.export.export(model, args)
    gm = om.modularize(ep)
    assert torch.equal(gm(*args), ep.module()(*args))
    assert all(sub.module_path and sub.module_type for _, sub in iter_module_calls(gm))

    proto = om.export(model, args).model_proto
    onnx.checker.check_model(proto, full_check=True)
    with torch.no_grad():
        expected = model(*args).numpy()
    np.testing.assert_allclose(_ort(proto, args)[0], expected, atol=1e-4, rtol=1e-4)
    layers = {f.name: f for f in proto.functions if f.doc_string.endswith("." + layer)}
    assert list(layers) == [layer], f"one function for {layer}, got {list(layers)}"
    assert _sites(proto)[layer] == 2  # one call per layer


@pytest.mark.parametrize("name", ["opt"])
def test_unseen_flat_equals_hierarchical_and_bytes_are_stable(name: str) -> None:
    model, args = ARCHITECTURES[name][0]()
    first = om.export(model, args).model_proto
    flat = om.export(model, args, functions="none").model_proto
    assert not flat.functions
    np.testing.assert_allclose(_ort(first, args)[0], _ort(flat, args)[0], atol=1e-6)
    assert om.export(model, args).model_proto.SerializeToString() == first.SerializeToString()
    # through the hook too: unchanged torch.onnx.export calls give the same bytes each time
    with om.hook():
        hooked = [torch.onnx.export(model, args, dynamo=True).model_proto.SerializeToString()
                  for _ in range(2)]
    assert hooked[0] == hooked[1]


def test_key_ignores_where_a_constant_sits() -> None:
    """torch.onnx shares one Constant between calls; the first call keeps the original, at a
    different place than the copies the others get. The bodies are still interchangeable."""
    def body(constant_first: bool) -> ir.Graph:
        x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
        const = ir.node("Constant", [], attributes={"value": ir.tensor(np.array([2.0], "f"))})
        relu = ir.node("Relu", [x])
        mul = ir.node("Mul", [relu.outputs[0], x])
        add = ir.node("Add", [mul.outputs[0], const.outputs[0]])
        order = [const, relu, mul, add] if constant_first else [relu, mul, const, add]
        return ir.Graph([x], add.outputs, nodes=order, opset_imports={"": 18})

    assert graph_key(body(True)) == graph_key(body(False))


class _Inner(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.om_unseen.mystery(x) + 1


class _Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * 3


def test_untranslatable_op_error_names_op_node_and_module() -> None:
    lib = torch.library.Library("om_unseen", "FRAGMENT")
    lib.define("mystery(Tensor x) -> Tensor")
    lib.impl("mystery", lambda x: x * 2, "CompositeExplicitAutograd")
    lib.impl("mystery", lambda x: torch.empty_like(x), "Meta")
    with pytest.raises(om.OnnxModularError) as info:
        om.export(_Outer(), (torch.randn(3),))
    message = str(info.value)
    assert "\n" not in message and "Refer to the full stack trace" not in message
    assert "om_unseen.mystery" in message and "node 'mystery'" in message
    assert "module 'inner'" in message and "test_unseen_export.py" in message


def test_unreachable_opset_is_a_clear_error_not_an_invalid_model() -> None:
    model, args = nn.Sequential(nn.Linear(4, 4), nn.GELU()), (torch.randn(2, 4),)
    with pytest.raises(om.OnnxModularError, match="OM0202.*opset 99") as info:
        om.export(model, args, opset=99)
    assert "\n" not in str(info.value)


def test_functions_of_a_wrong_type_is_a_clear_error() -> None:
    with pytest.raises(om.OnnxModularError, match="OM0104.*functions= takes.*got 42"):
        om.export(nn.Linear(4, 4), (torch.randn(2, 4),), functions=42)


class _Branches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda x: self.a(x), lambda x: self.b(x).relu(), (x,))


def test_torch_cond_exports_and_bytes_are_stable() -> None:
    """Branch code is generated (``<eval_with_key>.N``, N counting up in the process): the
    source locations must not carry N, or a second export differs."""
    model, args = _Branches().eval(), (torch.randn(2, 4),)
    ep = torch.export.export(model, args)
    assert torch.equal(om.modularize(ep)(*args), ep.module()(*args))
    first = om.export(model, args).model_proto
    onnx.checker.check_model(first, full_check=True)
    np.testing.assert_allclose(_ort(first, args)[0], model(*args).detach().numpy(), atol=1e-5)
    assert om.export(model, args).model_proto.SerializeToString() == first.SerializeToString()
