"""Figures for splits that mean what the user said: GPT-2, Llama, ViT and DiT (small configs,
random weights, nothing downloaded).

- ``deny=["onnx::Softmax"]``: regions, and whether any accelerator model holds a Softmax
  (main graph, every function body, subgraphs), chained result vs torch;
- ``num_stages=2..4``: weight bytes per stage, max/min, chained result vs torch;
- the Triton repository of a 4-stage Llama: its models and the ensemble's steps.

    python scripts/split_figures.py [--layers 8]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

import onnx_modular as om


class LastHidden(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x, return_dict=True)[0]


class DiTWrapper(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.model(x, timestep=t, class_labels=y, return_dict=False)[0]


def gpt2(layers: int):
    from transformers import GPT2Config, GPT2Model

    cfg = GPT2Config(n_layer=layers, n_embd=64, n_head=4, vocab_size=512, n_positions=64)
    return LastHidden(GPT2Model(cfg)), (torch.randint(0, 512, (2, 16)),)


def llama(layers: int):
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(num_hidden_layers=layers, hidden_size=64, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, vocab_size=512,
                      max_position_embeddings=64)
    return LastHidden(LlamaModel(cfg)), (torch.randint(0, 512, (2, 16)),)


def vit(layers: int):
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(num_hidden_layers=layers, hidden_size=64, num_attention_heads=4,
                    intermediate_size=128, image_size=32, patch_size=8)
    return LastHidden(ViTModel(cfg, add_pooling_layer=False)), (torch.randn(2, 3, 32, 32),)


def dit(layers: int):
    from diffusers import DiTTransformer2DModel

    model = DiTTransformer2DModel(num_attention_heads=4, attention_head_dim=16,
                                  in_channels=4, num_layers=layers, sample_size=8,
                                  patch_size=2, num_embeds_ada_norm=10)
    return DiTWrapper(model), (torch.randn(2, 4, 8, 8), torch.tensor([3, 7]),
                               torch.tensor([1, 2]))


MODELS = {"GPT-2": gpt2, "Llama": llama, "ViT": vit, "DiT": dit}


def softmax_on_acc(result) -> int:
    """Softmax nodes in accelerator models: graph, every function body, subgraphs."""
    from onnx_modular.emit.regions import op_types_in

    return sum(1 for g in result.region_graphs() if g.is_acc
               and ("", "Softmax") in op_types_in(g.model))


def max_diff(result, model, args) -> float:
    with tempfile.TemporaryDirectory() as d:
        result.save(d)
        got = om.SplitRunner(d).run(*args)
    return float(np.abs(np.asarray(got) - model(*args).detach().numpy()).max())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=8)
    opts = parser.parse_args()
    for name, build in MODELS.items():
        torch.manual_seed(0)
        model, args = build(opts.layers)
        model.eval()
        start = time.perf_counter()
        split = om.split(model, args, support=om.OperatorSupport(deny=["onnx::Softmax"]))
        kinds = [r.kind for r in split.regions]
        warned = [d.message for d in split.diagnostics if d.level == om.Level.WARNING]
        print(f"{name} x{opts.layers}: deny onnx::Softmax -> {len(kinds)} regions "
              f"({kinds.count('acc')} acc, {kinds.count('cpu')} cpu); acc models holding "
              f"Softmax: {softmax_on_acc(split)}; denied nodes: "
              f"{sum(split.plan.unsupported_ops.values())} "
              f"({', '.join(sorted(split.plan.unsupported_ops))}); max |diff| vs torch "
              f"{max_diff(split, model, args):.1e}; warnings {len(warned)}; "
              f"{time.perf_counter() - start:.1f} s")
        for k in (2, 3, 4):
            stages = om.split_stages(model, args, num_stages=k)
            plan = stages.stage_plan
            actual = [sum(w.values()) for w in stages.parameters_of().values()]
            assert actual == plan.stage_bytes
            print(f"  num_stages={k}: bytes {plan.stage_bytes} max/min "
                  f"{max(actual) / min(actual):.2f}; cut at {list(plan.split_points)}; "
                  f"max |diff| {max_diff(stages, model, args):.1e}")
        if name == "Llama":
            stages = om.split_stages(model, args, num_stages=4)
            with tempfile.TemporaryDirectory() as d:
                repo = stages.save_triton(Path(d) / "repo", name="llama", gpus=[0, 1, 2, 3])
                configs = repo.configs()
                print(f"  Triton repository: models {sorted(configs)}")
                for step in configs["llama"].ensemble_scheduling.step:
                    group = configs[step.model_name].instance_group[0]
                    print(f"    step {step.model_name}: {dict(step.input_map)} -> "
                          f"{dict(step.output_map)}; instance_group "
                          f"{group.count}x gpus {list(group.gpus)}")


if __name__ == "__main__":
    main()
