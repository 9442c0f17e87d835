"""How ONNX Runtime optimizes and loads the hierarchical file against torch.onnx's flat one.

ONNX Runtime inlines every local function at load and then optimizes; what it can fuse and
how long it takes to load say whether a hierarchical file costs anything at run time. For
the architectures given, at static and dynamic (batch, sequence) shapes, prints the node
count after ORT's extended offline optimization (hierarchical, flat, and the operators
that differ) and the session creation time ratio (median of --runs).
Targets (issue 32): equal nodes at static shapes, at most 2 shape nodes more per layer call
under dynamic shapes; session creation <= 1.2x on the 24-layer GPT-2.
``--layer-only`` exports with ``functions=[<the layer class>]`` (one nesting level).
``--models`` takes any name of the test architecture registry that has a layer class
(``tests/models.py``: bloom, deberta_v2, t5_encoder, ...), or ``gpt2-medium``: the real
24-layer GPT-2's dimensions (1024 wide, 16 heads, its vocabulary; random weights, nothing
downloaded, about 6 GB of memory), where ORT's fixed cost per function call weighs against
real weights; ``--attention sdpa`` runs transformers' default attention instead of the eager
one the tests build.
Usage: python scripts/bench_ort_parity.py [--models gpt2 llama] [--layers 4] [--runs 7]
       python scripts/bench_ort_parity.py --models gpt2 --layers 24 --static-only
       python scripts/bench_ort_parity.py --layer-only [--attention sdpa]
       python scripts/bench_ort_parity.py --models gpt2-medium --static-only --layer-only
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
import warnings
from pathlib import Path

import onnxruntime as ort
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnx_modular as om
from onnx_modular.lower.translate import quiet_torch_onnx
from tests import models
from tests.ort_offline import optimized_ops


def _session_seconds(path: Path, runs: int) -> float:
    times = []
    for _ in range(runs):
        options = ort.SessionOptions()
        options.log_severity_level = 4
        start = time.perf_counter()
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _dynamic_shapes(inputs: tuple[torch.Tensor, ...]) -> tuple[dict, ...]:
    """Batch and sequence dynamic for token ids; batch only for pixels."""
    batch = torch.export.Dim("batch", min=1, max=32)
    if inputs[0].dtype.is_floating_point:
        return ({0: batch},)
    return ({0: batch, 1: torch.export.Dim("seq", min=2, max=32)},)


#: GPT-2 medium's dimensions: the 24-layer GPT-2 as released.
GPT2_MEDIUM = {"n_layer": 24, "n_embd": 1024, "n_head": 16, "vocab_size": 50257,
               "n_positions": 1024}


def _gpt2_medium() -> tuple[torch.nn.Module, tuple]:
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    config = GPT2Config(**GPT2_MEDIUM, use_cache=False, attn_implementation="eager")
    return models.LastHidden(GPT2Model(config).eval()).eval(), models.token_ids()


def _build(name: str, layers: int, attention: str) -> tuple[torch.nn.Module, tuple]:
    """A registry architecture, its attention switched to ``attention`` on every config."""
    if name == "gpt2-medium":
        model, inputs = _gpt2_medium()
    else:
        model, inputs = models.ARCHITECTURES[name](layers=layers)
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            config._attn_implementation = attention
    return model, inputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2", "llama", "bert", "vit"])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--static-only", action="store_true")
    parser.add_argument("--layer-only", action="store_true",
                        help="functions=[the layer class] instead of every module")
    parser.add_argument("--attention", choices=["eager", "sdpa"], default="eager")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    print(f"{'model':>6} {'shapes':>7} {'hier':>5} {'flat':>5} {'per layer':>9} "
          f"{'session':>8}  operators that differ (hierarchical - flat)")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            for dynamic in ([False] if args.static_only else [False, True]):
                model, inputs = _build(name, args.layers, args.attention)
                shapes = _dynamic_shapes(inputs) if dynamic else None
                hier = Path(tmp, f"{name}_{dynamic}_hier.onnx")
                flat = Path(tmp, f"{name}_{dynamic}_flat.onnx")
                layer = models.ARCHITECTURES[name.split("-")[0]].layer
                count = GPT2_MEDIUM["n_layer"] if name == "gpt2-medium" else args.layers
                functions = [layer] if args.layer_only and layer else "all"
                om.export(model, inputs, dynamic_shapes=shapes, functions=functions).save(hier)
                with quiet_torch_onnx(), torch.no_grad():
                    torch.onnx.export(model, inputs, dynamic_shapes=shapes,
                                      dynamo=True).save(str(flat))
                a, b = optimized_ops(hier), optimized_ops(flat)
                differ = {k: a[k] - b[k] for k in sorted(set(a) | set(b)) if a[k] != b[k]}
                ratio = _session_seconds(hier, args.runs) / _session_seconds(flat, args.runs)
                extra = (sum(a.values()) - sum(b.values())) / count
                print(f"{name:>6} {'dynamic' if dynamic else 'static':>7} {sum(a.values()):>5} "
                      f"{sum(b.values()):>5} {extra:>+9.1f} {ratio:>7.2f}x  {differ}")


if __name__ == "__main__":
    main()
