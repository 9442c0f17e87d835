"""Run the whole pipeline over many architectures built from tiny configs (nothing downloaded).

For each: modularize (exact outputs?), export hierarchically (functions, layer calls), and
validate against ONNX Runtime. Prints one row per model; failures are reported, not raised.
Usage: python scripts/zoo.py [--only NAME ...]
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from models import LastHidden

import onnx_modular as om

warnings.filterwarnings("ignore")


def _decoder(config_cls: str, model_cls: str, **extra):
    def build(layers: int = 3):
        import transformers

        torch.manual_seed(0)
        cfg = getattr(transformers, config_cls)(
            num_hidden_layers=layers, hidden_size=32, num_attention_heads=4,
            intermediate_size=64, vocab_size=99, max_position_embeddings=64,
            attn_implementation="eager", **extra)
        model = getattr(transformers, model_cls)(cfg).eval()
        ids = torch.randint(0, 99, (2, 8), generator=torch.Generator().manual_seed(0))
        return LastHidden(model).eval(), (ids,)
    return build


def _vit(layers: int = 3):
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    cfg = ViTConfig(num_hidden_layers=layers, hidden_size=32, num_attention_heads=4,
                    intermediate_size=64, image_size=32, patch_size=8,
                    attn_implementation="eager")

    class Pixels(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = ViTModel(cfg, add_pooling_layer=False).eval()

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return self.model(pixel_values=pixel_values).last_hidden_state

    return Pixels().eval(), (torch.randn(2, 3, 32, 32),)


ZOO = {
    "gpt2": lambda n=3: __import__("models").gpt2(n),
    "bert": lambda n=3: __import__("models").bert(n),
    "llama": lambda n=3: __import__("models").llama(n),
    "qwen2": lambda n=3: __import__("models").qwen2(n),
    "mistral": _decoder("MistralConfig", "MistralModel", num_key_value_heads=2),
    "phi3": _decoder("Phi3Config", "Phi3Model", num_key_value_heads=2, pad_token_id=0),
    "gemma": _decoder("GemmaConfig", "GemmaModel", num_key_value_heads=2, head_dim=8),
    "roberta": _decoder("RobertaConfig", "RobertaModel"),
    "distilbert": lambda n=3: _distilbert(n),
    "vit": _vit,
}


def _distilbert(layers: int):
    from transformers import DistilBertConfig, DistilBertModel

    torch.manual_seed(0)
    cfg = DistilBertConfig(n_layers=layers, dim=32, n_heads=4, hidden_dim=64, vocab_size=99,
                           max_position_embeddings=64, attn_implementation="eager")
    ids = torch.randint(0, 99, (2, 8), generator=torch.Generator().manual_seed(0))
    return LastHidden(DistilBertModel(cfg).eval()).eval(), (ids,)


def run(name: str) -> str:
    model, args = ZOO[name]()
    start = time.perf_counter()
    ep = torch.export.export(model, args)
    gm = om.modularize(ep)
    exact = all(torch.equal(a, b) for a, b in zip(
        torch.utils._pytree.tree_leaves(gm(*args)),
        torch.utils._pytree.tree_leaves(ep.module()(*args))))
    calls = collections.Counter(sub.module_type.rsplit(".", 1)[-1]
                                for _, sub in om.passes.modularize.iter_module_calls(gm))
    result = om.export(model, args)
    proto = result.model_proto
    names = {f.name for f in proto.functions}
    sites = collections.Counter(n.op_type for f in [proto.graph, *proto.functions]
                                for n in f.node if n.op_type in names)
    layers = [k for k in sites if k.endswith(("Layer", "Block"))]
    layer = max(layers, key=lambda k: len(k)) if layers else "-"
    rep = om.validate(model, args, proto)
    return (f"{name:<11} modularize {'exact' if exact else 'DIFFERS'}, {sum(calls.values())} "
            f"calls | {len(names)} functions, layer function {layer} x{sites.get(layer, 0)} | "
            f"validate {'ok' if rep.ok else 'MISMATCH ' + str(rep.first_mismatch)} | "
            f"{time.perf_counter() - start:.1f}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="+", default=list(ZOO))
    opts = parser.parse_args()
    for name in opts.only:
        try:
            print(run(name), flush=True)
        except Exception as e:
            print(f"{name:<11} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:150]}")
            traceback.print_exc(limit=3, file=sys.stderr)


if __name__ == "__main__":
    main()
