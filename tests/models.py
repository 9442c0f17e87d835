"""The one registry of test models: every architecture the tests and ``scripts/zoo.py`` build.

``ARCHITECTURES`` maps a name to an :class:`Architecture`: calling it with no argument gives
``(model, args)``; transformers entries take ``layers=`` (and ``full_output=True`` for the
model's whole output instead of its last hidden state). ``names(*tags)`` selects entries by
tag. Transformers models are built from small configs with random weights (seeded): nothing is
downloaded. Below the registry: hand-written corner-case modules several test files share, and
``hierarchical(...)``, a hand-built hierarchical ONNX twin of ``Net`` with the call-node
metadata CONTRACTS.md specifies (it stands in for the exporter in validate/compare tests).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import onnx_modular as om

Builder = Callable[..., tuple[nn.Module, tuple]]


def seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def token_ids(vocab: int = 99, batch: int = 2, seq: int = 8) -> tuple[torch.Tensor]:
    return (torch.randint(0, vocab, (batch, seq), generator=seeded(0)),)


def pixels(batch: int = 2, size: int = 32) -> tuple[torch.Tensor]:
    return (torch.randn(batch, 3, size, size, generator=seeded(0)),)


def x8(batch: int = 2) -> tuple[torch.Tensor]:
    return (torch.randn(batch, 8, generator=seeded(1)),)


# ---- wrappers: tensors in, tensors (or a dict of them) out -------------------------------------

class HF(nn.Module):
    """A transformers model called with one tensor keyword (``key``) and ``call_kwargs``.

    Returns the last hidden state, or with ``full_output`` the whole output (a dict).
    """

    def __init__(self, model: nn.Module, key: str = "input_ids", *, full_output: bool = False,
                 **call_kwargs: object) -> None:
        super().__init__()
        self.model, self.key, self.full_output = model, key, full_output
        self.call_kwargs = call_kwargs

    def forward(self, x: torch.Tensor) -> Any:
        out = self.model(**{self.key: x}, **self.call_kwargs, return_dict=True)
        return out if self.full_output else out[0]


class LastHidden(HF):
    """Token ids in (the exported input is named ``input_ids``), last hidden state out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model, "input_ids", use_cache=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids)


def _transformers(config: str, model: str, cfg: dict[str, object], *, key: str = "input_ids",
                  args: tuple | None = None, full_output: bool = False,
                  model_kwargs: dict[str, object] | None = None,
                  call_kwargs: dict[str, object] | None = None) -> tuple[nn.Module, tuple]:
    """``transformers.<model>(transformers.<config>(**cfg))`` in eval mode, weights seeded."""
    import transformers

    torch.manual_seed(0)
    config_obj = getattr(transformers, config)(attn_implementation="eager", **cfg)
    module = getattr(transformers, model)(config_obj, **(model_kwargs or {})).eval()
    wrapped = HF(module, key, full_output=full_output, **(call_kwargs or {}))
    return wrapped.eval(), args if args is not None else token_ids()


NO_CACHE = {"use_cache": False}


# ---- transformers architectures ----------------------------------------------------------------

def gpt2(layers: int = 2) -> tuple[nn.Module, tuple]:
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=layers, n_embd=32, n_head=4, vocab_size=99, n_positions=64,
                     use_cache=False, attn_implementation="eager")
    return LastHidden(GPT2Model(cfg).eval()).eval(), token_ids()


def bert(layers: int = 2) -> tuple[nn.Module, tuple]:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(num_hidden_layers=layers, hidden_size=32, num_attention_heads=4,
                     intermediate_size=64, vocab_size=99, max_position_embeddings=64,
                     attn_implementation="eager")
    return LastHidden(BertModel(cfg, add_pooling_layer=False).eval()).eval(), token_ids()


def _decoder(name: str, config: str, model: str, **extra: object) -> Builder:
    """Llama-like decoders: one config layout, last hidden state of token ids."""

    def build(layers: int = 2) -> tuple[nn.Module, tuple]:
        import transformers

        torch.manual_seed(0)
        cfg = getattr(transformers, config)(
            num_hidden_layers=layers, hidden_size=32, num_attention_heads=4,
            intermediate_size=64, vocab_size=99, max_position_embeddings=64,
            attn_implementation="eager", **extra)
        return LastHidden(getattr(transformers, model)(cfg).eval()).eval(), token_ids()

    build.__name__ = build.__qualname__ = name
    return build


llama = _decoder("llama", "LlamaConfig", "LlamaModel", num_key_value_heads=2, use_cache=False)
qwen2 = _decoder("qwen2", "Qwen2Config", "Qwen2Model", num_key_value_heads=2, use_cache=False)
mistral = _decoder("mistral", "MistralConfig", "MistralModel", num_key_value_heads=2)
phi3 = _decoder("phi3", "Phi3Config", "Phi3Model", num_key_value_heads=2, pad_token_id=0)
gemma = _decoder("gemma", "GemmaConfig", "GemmaModel", num_key_value_heads=2, head_dim=8)
roberta = _decoder("roberta", "RobertaConfig", "RobertaModel")


def distilbert(layers: int = 2) -> tuple[nn.Module, tuple]:
    from transformers import DistilBertConfig, DistilBertModel

    torch.manual_seed(0)
    cfg = DistilBertConfig(n_layers=layers, dim=32, n_heads=4, hidden_dim=64, vocab_size=99,
                           max_position_embeddings=64, attn_implementation="eager")
    return LastHidden(DistilBertModel(cfg).eval()).eval(), token_ids()


def opt(layers: int = 2, full_output: bool = False) -> tuple[nn.Module, tuple]:
    return _transformers("OPTConfig", "OPTModel", dict(
        num_hidden_layers=layers, hidden_size=32, ffn_dim=64, num_attention_heads=4,
        vocab_size=99, max_position_embeddings=64, word_embed_proj_dim=32, use_cache=False),
        full_output=full_output, call_kwargs=NO_CACHE)


def gpt_neox(layers: int = 2, full_output: bool = False) -> tuple[nn.Module, tuple]:
    return _transformers("GPTNeoXConfig", "GPTNeoXModel", dict(
        num_hidden_layers=layers, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        vocab_size=99, max_position_embeddings=64, use_cache=False),
        full_output=full_output, call_kwargs=NO_CACHE)


def falcon(layers: int = 2, full_output: bool = False) -> tuple[nn.Module, tuple]:
    return _transformers("FalconConfig", "FalconModel", dict(
        num_hidden_layers=layers, hidden_size=32, num_attention_heads=4, vocab_size=99,
        use_cache=False, new_decoder_architecture=False, multi_query=True, alibi=False),
        full_output=full_output, call_kwargs=NO_CACHE)


def bloom(layers: int = 2, full_output: bool = False) -> tuple[nn.Module, tuple]:
    return _transformers("BloomConfig", "BloomModel", dict(
        n_layer=layers, hidden_size=32, n_head=4, vocab_size=99),
        full_output=full_output, call_kwargs=NO_CACHE)


def mamba(layers: int = 2, full_output: bool = False) -> tuple[nn.Module, tuple]:
    return _transformers("MambaConfig", "MambaModel", dict(
        num_hidden_layers=layers, hidden_size=32, state_size=4, vocab_size=99),
        full_output=full_output, call_kwargs=NO_CACHE)


def mixtral(layers: int = 2, full_output: bool = False) -> tuple[nn.Module, tuple]:
    """Experts as ``batched_mm``: the default ``grouped_mm`` has no ONNX translation."""
    return _transformers("MixtralConfig", "MixtralModel", dict(
        num_hidden_layers=layers, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=99, num_local_experts=4, num_experts_per_tok=2,
        max_position_embeddings=64, use_cache=False, experts_implementation="batched_mm"),
        full_output=full_output, call_kwargs=NO_CACHE)


def t5_encoder(layers: int = 2, full_output: bool = False) -> tuple[nn.Module, tuple]:
    return _transformers("T5Config", "T5EncoderModel", dict(
        num_layers=layers, d_model=32, d_kv=8, num_heads=4, d_ff=64, vocab_size=99),
        full_output=full_output)


def deberta_v2(layers: int = 2, full_output: bool = False) -> tuple[nn.Module, tuple]:
    """Relative attention: every layer reads the shared relative position embeddings."""
    return _transformers("DebertaV2Config", "DebertaV2Model", dict(
        num_hidden_layers=layers, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        vocab_size=99, max_position_embeddings=64, relative_attention=True, position_buckets=16,
        pos_att_type=["p2c", "c2p"]), full_output=full_output)


def _vision(config: str, model: str, layers: int, full_output: bool) -> tuple[nn.Module, tuple]:
    """A tiny vision transformer (32x32 images, patches of 8) called with pixel_values."""
    return _transformers(config, model, dict(
        num_hidden_layers=layers, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        image_size=32, patch_size=8), key="pixel_values", args=pixels(),
        full_output=full_output)


def vit(layers: int = 2, full_output: bool = False) -> tuple[nn.Module, tuple]:
    return _vision("ViTConfig", "ViTModel", layers, full_output)


def clip_vision(layers: int = 2, full_output: bool = False) -> tuple[nn.Module, tuple]:
    return _vision("CLIPVisionConfig", "CLIPVisionModel", layers, full_output)


def whisper_encoder(layers: int = 2, full_output: bool = False) -> tuple[nn.Module, tuple]:
    from transformers import WhisperConfig, WhisperModel

    torch.manual_seed(0)
    cfg = WhisperConfig(encoder_layers=layers, decoder_layers=1, d_model=32,
                        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                        decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=32,
                        vocab_size=99, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                        decoder_start_token_id=1, attn_implementation="eager")
    encoder = WhisperModel(cfg).get_encoder().eval()
    features = (torch.randn(1, 16, 64, generator=seeded(0)),)
    return HF(encoder, "input_features", full_output=full_output).eval(), features


def gptj(layers: int = 2, full_output: bool = False) -> tuple[nn.Module, tuple]:
    """Rotary tables as a non-persistent ``nn.Buffer`` in every attention."""
    return _transformers("GPTJConfig", "GPTJModel", dict(
        n_layer=layers, n_embd=32, n_head=4, rotary_dim=4, vocab_size=99, n_positions=64,
        bos_token_id=0, eos_token_id=0, use_cache=False),
        full_output=full_output, call_kwargs=NO_CACHE)


def swin(layers: int = 2, full_output: bool = False) -> tuple[nn.Module, tuple]:
    """Windowed attention; each block reads its own non-persistent relative position index
    (an ``nn.Buffer``). ``layers``: blocks per stage (two stages)."""
    return _transformers("SwinConfig", "SwinModel", dict(
        image_size=32, patch_size=4, embed_dim=16, depths=[layers, layers], num_heads=[2, 2],
        window_size=4), key="pixel_values", args=pixels(), full_output=full_output)


def mamba2(layers: int = 2, full_output: bool = False) -> tuple[nn.Module, tuple]:
    """Each mixer computes ``-exp(A_log)``: small per-layer values derived from weights."""
    return _transformers("Mamba2Config", "Mamba2Model", dict(
        num_hidden_layers=layers, hidden_size=32, state_size=8, num_heads=8, head_dim=8,
        n_groups=1, expand=2, vocab_size=99, chunk_size=8),
        full_output=full_output, call_kwargs=NO_CACHE)


def falcon_h1(layers: int = 2, full_output: bool = False) -> tuple[nn.Module, tuple]:
    """Attention and a Mamba2 mixer side by side in every layer."""
    return _transformers("FalconH1Config", "FalconH1Model", dict(
        num_hidden_layers=layers, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, vocab_size=99, mamba_d_ssm=32, mamba_n_heads=4,
        mamba_d_head=8, mamba_d_state=8, mamba_n_groups=1, mamba_chunk_size=8,
        max_position_embeddings=64, use_cache=False),
        full_output=full_output, call_kwargs=NO_CACHE)


def zamba2(layers: int = 4, full_output: bool = False) -> tuple[nn.Module, tuple]:
    """Mamba layers with one hybrid (shared transformer block) layer third; at least 3."""
    kinds = ["mamba"] * layers
    kinds[2] = "hybrid"
    return _transformers("Zamba2Config", "Zamba2Model", dict(
        num_hidden_layers=layers, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=4, attention_head_dim=8, vocab_size=99, mamba_d_state=8,
        mamba_headdim=8, n_mamba_heads=8, mamba_ngroups=1, chunk_size=8, num_mem_blocks=1,
        layers_block_type=kinds, max_position_embeddings=64, use_cache=False,
        use_mem_rope=False), full_output=full_output, call_kwargs=NO_CACHE)


def gemma3(layers: int = 2, full_output: bool = False) -> tuple[nn.Module, tuple]:
    """RMSNorm computes ``1 + weight``; q/k norms of 8 elements, the others of 32."""
    return _transformers("Gemma3TextConfig", "Gemma3TextModel", dict(
        num_hidden_layers=layers, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, vocab_size=99, max_position_embeddings=64,
        sliding_window=4, use_cache=False), full_output=full_output, call_kwargs=NO_CACHE)


def detr(layers: int = 2, full_output: bool = False) -> tuple[nn.Module, tuple]:
    """A ResNet backbone (no timm, nothing downloaded); the first decoder layer reads a zero
    target plus the query embeddings, a constant. ``layers``: decoder layers."""
    import transformers

    torch.manual_seed(0)
    backbone = transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                         out_features=["stage2"])
    cfg = transformers.DetrConfig(
        use_timm_backbone=False, use_pretrained_backbone=False, backbone_config=backbone,
        d_model=32, encoder_layers=2, decoder_layers=layers, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=5,
        attn_implementation="eager")
    model = transformers.DetrModel(cfg).eval()
    return HF(model, "pixel_values", full_output=full_output).eval(), pixels()


def trained(model: nn.Module, scale: float = 0.05, seed: int = 1) -> nn.Module:
    """``model`` with seeded noise added to every parameter: layers built from one config
    start with equal weights, trained ones do not (what folding per-layer values shows)."""
    generator = seeded(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(scale * torch.randn(parameter.shape, generator=generator,
                                               dtype=parameter.dtype))
    return model


# ---- hand-written corner cases -------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.fc(self.norm(x)))


class Stack(nn.Module):
    """``n`` identical residual blocks."""

    def __init__(self, n: int = 3, dim: int = 8) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(dim) for _ in range(n)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class SharedTwice(nn.Module):
    """One module instance called twice, with a functional op between the calls."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared(torch.sigmoid(self.shared(x)))


class TwoOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.fc(x)
        return y.relu(), y.sum(-1)


class MultiOut(nn.Module):
    """A submodule with two outputs, a kwarg, a buffer and a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.two = TwoOut()
        self.register_buffer("scale", torch.full((8,), 0.5))
        self.empty = nn.Identity()

    def forward(self, x: torch.Tensor, *, bias: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a, b = self.two(self.empty(x))
        return a * self.scale + bias, b + 2.0, torch.tensor([1.0, 2.0])


class Containers(nn.Module):
    """Nested Sequential, ModuleDict and ModuleList."""

    def __init__(self) -> None:
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.ReLU(), nn.Linear(8, 8)))
        self.heads = nn.ModuleDict({"a": nn.Linear(8, 4), "b": nn.Linear(8, 4)})
        self.extra = nn.ModuleList([nn.Tanh(), nn.Sigmoid()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.seq(x)
        h = self.extra[1](self.extra[0](h))
        return torch.cat([self.heads["a"](h), self.heads["b"](h)], dim=-1)


class ConvBN(nn.Module):
    """BatchNorm in training mode mutates its running statistics in place."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(torch.relu(self.bn(self.conv(x)))).flatten(1)


class ConvNet(nn.Module):
    """Conv/BN/GELU residual blocks and a dict output (softmax probabilities, features)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.GELU())
            for _ in range(3))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.stem(x)
        for block in self.blocks:
            x = x + block(x)
        feat = self.pool(x).flatten(1)
        return {"probs": self.head(feat).softmax(-1), "feat": feat}


def convnet() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return ConvNet().eval(), (torch.randn(2, 3, 16, 16, generator=seeded(0)),)


class Marked(nn.Module):
    """Three stages by ``om.pipe_split()`` (two markers in a row make no empty stage); an
    unused submodule for the never-runs error."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.a, self.b, self.c = (nn.Linear(dim, dim) for _ in range(3))
        self.unused = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        om.pipe_split()
        x = torch.relu(self.b(x))
        om.pipe_split()
        om.pipe_split()
        return self.c(x) + x


DIM = 8


class Lin(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(DIM, DIM) / DIM**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = Lin()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.fc(x))


class Net(nn.Module):
    """Three ``Layer`` calls of one ``Lin`` each: the model ``hierarchical()`` mirrors."""

    def __init__(self, n: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def net() -> tuple[Net, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Net().eval(), (torch.randn(2, DIM),)


class InPlace(nn.Module):
    """The parent changes a submodule's output in place after the call returned: torch's
    record of ``inner``'s output is gone."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.after = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)
        y.mul_(3.0)
        return self.after(y)


class Rotary(nn.Module):
    """Reads a non-persistent buffer created as ``nn.Buffer`` (GPT-J's rotary table)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Buffer(torch.linspace(0.0, 1.0, 8), persistent=False)
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.table.cos()


class Rotaries(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Rotary() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class CondBlock(nn.Module):
    """``torch.cond`` inside a submodule: If branches that read the block's values."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return torch.cond(y.sum() > 0, lambda t: t.relu() * 2.0, lambda t: t.tanh() - 1.0,
                          (y,))


class CondNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(CondBlock() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def _hand(cls: Callable[[], nn.Module], args: Callable[[], tuple]) -> Builder:
    def build() -> tuple[nn.Module, tuple]:
        torch.manual_seed(0)
        return cls().eval(), args()

    build.__name__ = build.__qualname__ = getattr(cls, "__name__", "build")
    return build


# ---- the registry ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Architecture:
    """``build(**size)`` -> ``(model, args)``; the entry itself is callable the same way."""

    build: Builder
    tags: frozenset[str]
    layer: str | None = None  # the repeated block's class: one function, one call per layer

    def __call__(self, **kwargs: Any) -> tuple[nn.Module, tuple]:
        return self.build(**kwargs)


def _arch(build: Builder, tags: str, layer: str | None = None) -> Architecture:
    return Architecture(build, frozenset(tags.split()), layer)


# Tags: "transformers" (takes layers= and full_output=) or "hand"; what the model is (decoder,
# encoder, vision, audio, moe, ssm); "core": the four architectures most tests run on.
# Not here: MultiOut (needs a keyword input) and Marked (om.export cannot translate its
# pipe_split markers; it is for split_stages only).
ARCHITECTURES: dict[str, Architecture] = {
    "gpt2": _arch(gpt2, "transformers decoder core", "GPT2Block"),
    "bert": _arch(bert, "transformers encoder core", "BertLayer"),
    "llama": _arch(llama, "transformers decoder core", "LlamaDecoderLayer"),
    "qwen2": _arch(qwen2, "transformers decoder core", "Qwen2DecoderLayer"),
    "mistral": _arch(mistral, "transformers decoder", "MistralDecoderLayer"),
    "phi3": _arch(phi3, "transformers decoder", "Phi3DecoderLayer"),
    "gemma": _arch(gemma, "transformers decoder", "GemmaDecoderLayer"),
    "opt": _arch(opt, "transformers decoder", "OPTDecoderLayer"),
    "gpt_neox": _arch(gpt_neox, "transformers decoder", "GPTNeoXLayer"),
    "falcon": _arch(falcon, "transformers decoder", "FalconDecoderLayer"),
    "bloom": _arch(bloom, "transformers decoder", "BloomBlock"),
    "mixtral": _arch(mixtral, "transformers decoder moe", "MixtralDecoderLayer"),
    "mamba": _arch(mamba, "transformers decoder ssm", "MambaBlock"),
    "roberta": _arch(roberta, "transformers encoder", "RobertaLayer"),
    "distilbert": _arch(distilbert, "transformers encoder", "TransformerBlock"),
    "t5_encoder": _arch(t5_encoder, "transformers encoder", "T5Block"),
    "deberta_v2": _arch(deberta_v2, "transformers encoder", "DebertaV2Layer"),
    "vit": _arch(vit, "transformers encoder vision", "ViTLayer"),
    "clip_vision": _arch(clip_vision, "transformers encoder vision", "CLIPEncoderLayer"),
    "whisper_encoder": _arch(whisper_encoder, "transformers encoder audio",
                             "WhisperEncoderLayer"),
    "gptj": _arch(gptj, "transformers decoder", "GPTJBlock"),
    "swin": _arch(swin, "transformers encoder vision"),
    "mamba2": _arch(mamba2, "transformers decoder ssm", "Mamba2Block"),
    "falcon_h1": _arch(falcon_h1, "transformers decoder ssm", "FalconH1DecoderLayer"),
    "zamba2": _arch(zamba2, "transformers decoder ssm"),
    "gemma3": _arch(gemma3, "transformers decoder", "Gemma3DecoderLayer"),
    "detr": _arch(detr, "transformers vision", "DetrDecoderLayer"),
    "convnet": _arch(convnet, "hand vision"),
    "stack": _arch(_hand(Stack, x8), "hand", "Block"),
    "shared_twice": _arch(_hand(SharedTwice, x8), "hand"),
    "containers": _arch(_hand(Containers, x8), "hand"),
    "conv_bn": _arch(_hand(ConvBN, lambda: (torch.randn(2, 3, 6, 6, generator=seeded(0)),)),
                     "hand vision"),
    "net": _arch(net, "hand", "Layer"),
    "rotaries": _arch(_hand(Rotaries, x8), "hand", "Rotary"),
    "cond": _arch(_hand(CondNet, x8), "hand", "CondBlock"),
}


def names(*tags: str) -> list[str]:
    """Registry names carrying every one of ``tags``, in registry order."""
    return [name for name, arch in ARCHITECTURES.items() if arch.tags.issuperset(tags)]


# ---- a hand-built hierarchical ONNX twin of Net ------------------------------------------------
# A ``Net`` of three ``Layer`` calls that share one ``Layer`` function, whose body calls a shared
# ``Lin`` function. The nested call node inside the shared body carries the metadata of the call
# the body was made from (``layers.0.fc``), as a deduplicated body must.

DOMAIN = "hand_hier"


def _type(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _meta(node: onnx.NodeProto, path: str, cls: type, fx_outputs: list[str]) -> None:
    for key, value in (("onnx_modular.module_path", path), ("onnx_modular.call_id", path),
                       ("onnx_modular.module_type", _type(cls)),
                       ("onnx_modular.fx_outputs", json.dumps(fx_outputs))):
        node.metadata_props.add(key=key, value=value)


def _lin_function(name: str = "Lin", scale: float | None = None) -> onnx.FunctionProto:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["matmul"])]
    if scale is not None:  # a planted error: the body scales its result
        nodes.append(helper.make_node("Constant", [], ["s"],
                                      value=numpy_helper.from_array(np.float32(scale), "s")))
        nodes[0].output[0] = "mm"
        nodes.append(helper.make_node("Mul", ["mm", "s"], ["matmul"]))
    return helper.make_function(DOMAIN, name, ["x", "w"], ["matmul"], nodes,
                                [helper.make_opsetid("", 18)])


def _layer_function(name: str = "Layer", lin: str = "Lin",
                    residual: str = "Add") -> onnx.FunctionProto:
    call = helper.make_node(lin, ["x", "w"], ["matmul"], domain=DOMAIN)
    _meta(call, "layers.0.fc", Lin, ["matmul"])
    nodes = [call, helper.make_node("Relu", ["matmul"], ["relu"]),
             helper.make_node(residual, ["x", "relu"], ["add"])]
    return helper.make_function(DOMAIN, name, ["x", "w"], ["add"], nodes,
                                [helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])


def hierarchical(model: Net, *, layer_ops: dict[int, str] | None = None,
                 weight_scale: dict[int, float] | None = None,
                 lin_scale: dict[int, float] | None = None) -> onnx.ModelProto:
    """The ONNX twin of ``model``; the keyword arguments plant errors in one call each.

    ``layer_ops``: layer index -> residual op (``"Sub"``) in a copy of the Layer body that
    only that call uses. ``weight_scale``: layer index -> factor on that layer's weight
    initializer. ``lin_scale``: layer index -> factor applied inside a copy of the Lin body
    that only that layer's (copied) Layer body calls.
    """
    layer_ops, weight_scale, lin_scale = layer_ops or {}, weight_scale or {}, lin_scale or {}
    functions = {"Lin": _lin_function(), "Layer": _layer_function()}
    nodes, inits = [], []
    previous = "x"
    for i, layer in enumerate(model.layers):
        w = layer.fc.weight.detach().numpy() * weight_scale.get(i, 1.0)
        inits.append(numpy_helper.from_array(w.astype(np.float32), f"layers.{i}.fc.weight"))
        op = "Layer"
        if i in layer_ops or i in lin_scale:
            op, lin = f"Layer_{i}", "Lin"
            if i in lin_scale:
                lin = f"Lin_{i}"
                functions[lin] = _lin_function(lin, lin_scale[i])
            functions[op] = _layer_function(op, lin, layer_ops.get(i, "Add"))
        out = "output" if i == len(model.layers) - 1 else f"add_{i}"
        call = helper.make_node(op, [previous, f"layers.{i}.fc.weight"], [out], domain=DOMAIN,
                                name=f"layers.{i}")
        _meta(call, f"layers.{i}", Layer, [out])
        nodes.append(call)
        previous = out
    graph = helper.make_graph(
        nodes, "Net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, DIM])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [2, DIM])], inits)
    proto = helper.make_model(
        graph, functions=list(functions.values()),
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    proto.ir_version = 10
    onnx.checker.check_model(proto, full_check=True)
    return proto


def isolate_call(proto: onnx.ModelProto, call_id: str,
                 within: onnx.FunctionProto | None = None) -> onnx.FunctionProto:
    """Give the call node ``call_id`` (in the main graph or in ``within``) a private copy of
    its function, so that a change planted in the copy affects that one call only.

    Inside a function body call ids are relative to its module (``c_fc`` for
    ``model.h.0.mlp.c_fc``): a nested call matches by the tail of ``call_id``."""
    nodes = within.node if within is not None else proto.graph.node
    for node in nodes:
        meta = {p.key: p.value for p in node.metadata_props}
        own = meta.get("onnx_modular.call_id")
        if own is None or not (own == call_id or (
                within is not None and call_id.endswith("." + own))):
            continue
        original = next(f for f in proto.functions
                        if f.name == node.op_type and f.domain == node.domain)
        copy = proto.functions.add()
        copy.CopyFrom(original)
        copy.name = f"{original.name}_planted_{len(proto.functions)}"
        node.op_type = copy.name
        return copy
    raise AssertionError(f"no call node {call_id}")


class Tied(nn.Module):
    """Embedding and output head share one weight, as language models tie them."""

    def __init__(self, vocab: int = 16, dim: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.body = Stack(2, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(ids)))


def used_weight_bytes(program: torch.export.ExportedProgram) -> int:
    """Parameters, buffers and constants the program reads (LLama keeps an unused buffer)."""
    used = {n.name for n in program.graph.nodes if n.op == "placeholder" and n.users}
    total = 0
    for spec in program.graph_signature.input_specs:
        if spec.target is None or spec.arg.name not in used:
            continue
        t = program.state_dict.get(spec.target, program.constants.get(spec.target))
        if isinstance(t, torch.Tensor):
            total += t.numel() * t.element_size()
    return total


def sd3(layers: int = 3) -> tuple[nn.Module, tuple]:
    """A tiny Stable Diffusion 3 MMDiT (diffusers)."""
    from diffusers import SD3Transformer2DModel

    inner = SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=layers, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=16,
        pooled_projection_dim=16, out_channels=4, pos_embed_max_size=16).eval()

    class SD3(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.transformer = inner

        def forward(self, hidden, enc, pooled, t):  # type: ignore[no-untyped-def]
            return self.transformer(hidden_states=hidden, encoder_hidden_states=enc,
                                    pooled_projections=pooled, timestep=t,
                                    return_dict=False)[0]

    return SD3().eval(), (torch.randn(1, 4, 8, 8), torch.randn(1, 4, 16),
                          torch.randn(1, 16), torch.tensor([3.0]))


class TwoLinear(nn.Module):
    """Two Linear layers around a ReLU: the smallest model with two module calls."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))
