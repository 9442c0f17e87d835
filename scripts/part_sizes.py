"""Node and function counts of region/stage models and the single-file split, beside the
hierarchical export of the same model: parts should be as small as exports.

    python scripts/part_sizes.py
"""

from __future__ import annotations

import torch
from torch import nn

import onnx_modular as om


class Encoder(nn.Module):
    """Four standard transformer encoder layers (MultiheadAttention, eval-mode Dropout)."""

    def __init__(self, layers: int = 4, dim: int = 32) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, 4, 64, batch_first=True) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def gpt2() -> tuple[nn.Module, tuple[torch.Tensor]]:
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    config = GPT2Config(n_layer=4, n_embd=32, n_head=4, vocab_size=99, n_positions=64,
                        use_cache=False, attn_implementation="eager")

    class LastHidden(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = GPT2Model(config).eval()

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=ids, return_dict=True)[0]

    return LastHidden().eval(), (torch.randint(0, 99, (2, 8)),)


def sizes(model: object) -> tuple[int, int, int]:
    """(main-graph nodes, functions, nodes in function bodies) of an onnx_ir model."""
    functions = list(model.functions.values())  # type: ignore[attr-defined]
    return (len(list(model.graph)), len(functions),  # type: ignore[attr-defined]
            sum(len(list(f)) for f in functions))


def report(title: str, model: nn.Module, args: tuple, parts: object) -> None:
    export = om.export(model, args)
    main, fns, body = sizes(export.model)
    print(f"\n{title}: om.export {main} main nodes, {fns} functions, {body} body nodes")
    total_main = total_body = total_fns = 0
    for graph in parts.region_graphs():  # type: ignore[attr-defined]
        m, f, b = sizes(graph.model)
        total_main, total_fns, total_body = total_main + m, total_fns + f, total_body + b
        print(f"  {graph.name:16s} {m:5d} main nodes {f:3d} functions {b:5d} body nodes")
    print(f"  all parts        {total_main:5d} main nodes {total_fns:3d} functions "
          f"{total_body:5d} body nodes")
    single = parts.single_model()  # type: ignore[attr-defined]
    m, f, b = sizes(single)
    print(f"  save_single      {m:5d} main nodes {f:3d} functions {b:5d} body nodes "
          f"(region functions included)")


def main() -> None:
    torch.manual_seed(0)
    encoder, x = Encoder().eval(), (torch.randn(2, 8, 32),)
    report("TransformerEncoder x4, stages at layers.2",
           encoder, x, om.split_stages(encoder, x, split_points={"layers.2": "beginning"}))
    report("TransformerEncoder x4, deny aten.gelu / aten.relu", encoder, x,
           om.split(encoder, x, support={"deny": ["aten.relu"]}))
    model, ids = gpt2()
    report("GPT-2 x4, deny aten.tanh", model, ids,
           om.split(model, ids, support={"deny": ["aten.tanh"]}))
    report("GPT-2 x4, stages at h.2", model, ids,
           om.split_stages(model, ids, split_points={"model.h.2": "beginning"}))


if __name__ == "__main__":
    main()
