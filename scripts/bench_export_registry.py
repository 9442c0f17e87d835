"""Export time over the architecture registry: ``om.export`` vs ``torch.onnx.export(dynamo=
True, optimize=True)``, side by side per model (interleaved, best of --repeat), and the median.

Small configs (the registry's, a few layers) are what users try first and what most
unseen-model checks run; there fixed costs weigh most. Target (issue 32): median <= 0.5x.
Usage: python scripts/bench_export_registry.py [--layers 4] [--repeat 2] [--only gpt2 bert]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnx_modular as om
from onnx_modular.lower.translate import quiet_torch_onnx
from tests import models


def _seconds(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _ours(model: torch.nn.Module, inputs: tuple) -> Callable[[], object]:
    return lambda: om.export(model, inputs)


def _flat(model: torch.nn.Module, inputs: tuple) -> Callable[[], object]:
    def run() -> object:
        with quiet_torch_onnx(), torch.no_grad():
            return torch.onnx.export(model, inputs, dynamo=True, optimize=True)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--only", nargs="+", help="registry names (default: transformers)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    names = args.only or models.names("transformers")
    print(f"{'model':>16} {'ours s':>7} {'flat s':>7} {'ratio':>6}")
    ratios = []
    for name in names:
        model, inputs = models.ARCHITECTURES[name](layers=args.layers)
        try:
            _flat(model, inputs)()  # warm-up: first-call imports and caches, both sides
            _ours(model, inputs)()
        except Exception as e:  # a model neither exporter takes says so and is skipped
            print(f"{name:>16} skipped: {type(e).__name__}: {str(e).splitlines()[0][:60]}")
            continue
        ours, flat = [], []
        for _ in range(args.repeat):
            flat.append(_seconds(_flat(model, inputs)))
            ours.append(_seconds(_ours(model, inputs)))
        ratio = min(ours) / min(flat)
        ratios.append(ratio)
        print(f"{name:>16} {min(ours):>7.2f} {min(flat):>7.2f} {ratio:>5.2f}x", flush=True)
    print(f"median over {len(ratios)} models: {statistics.median(ratios):.2f}x "
          "(target <= 0.5x)")


if __name__ == "__main__":
    main()
