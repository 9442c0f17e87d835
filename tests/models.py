"""Models the tests share: hand-written corner cases and tiny transformers architectures.

Transformers models are built from small configs with random weights: nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class LastHidden(nn.Module):
    """Wraps a transformers model so export sees tensors in and one tensor out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False, return_dict=True)[0]


def _ids(vocab: int = 99, batch: int = 2, seq: int = 8) -> tuple[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, vocab, (batch, seq), generator=g),)


def gpt2(layers: int = 2) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=layers, n_embd=32, n_head=4, vocab_size=99, n_positions=64,
                     use_cache=False, attn_implementation="eager")
    return LastHidden(GPT2Model(cfg).eval()).eval(), _ids()


def bert(layers: int = 2) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(num_hidden_layers=layers, hidden_size=32, num_attention_heads=4,
                     intermediate_size=64, vocab_size=99, max_position_embeddings=64,
                     attn_implementation="eager")
    return LastHidden(BertModel(cfg, add_pooling_layer=False).eval()).eval(), _ids()


def llama(layers: int = 2) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    cfg = LlamaConfig(num_hidden_layers=layers, hidden_size=32, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, vocab_size=99,
                      max_position_embeddings=64, use_cache=False, attn_implementation="eager")
    return LastHidden(LlamaModel(cfg).eval()).eval(), _ids()


def qwen2(layers: int = 2) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import Qwen2Config, Qwen2Model

    torch.manual_seed(0)
    cfg = Qwen2Config(num_hidden_layers=layers, hidden_size=32, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, vocab_size=99,
                      max_position_embeddings=64, use_cache=False, attn_implementation="eager")
    return LastHidden(Qwen2Model(cfg).eval()).eval(), _ids()


TRANSFORMERS: dict[str, Callable[..., tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {
    "gpt2": gpt2, "bert": bert, "llama": llama, "qwen2": qwen2,
}


# ---- hand-written corner cases ---------------------------------------------------------------

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


def x8(batch: int = 2) -> tuple[torch.Tensor]:
    return (torch.randn(batch, 8, generator=torch.Generator().manual_seed(1)),)
