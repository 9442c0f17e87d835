"""Benchmark: validate with per-module localization vs plain validate, 24-layer models.

Side by side in one run, on the bundled TinyGPT (24 decoder blocks) and GPT-2 (24 layers,
small config): plain ``validate(localize=False)`` and ``validate(localize=True)`` (the
worst case: localization runs although every output matches), each the best of
``--repeat`` interleaved runs after a warm-up. Target: localization <= 2x plain. The hierarchical
export is measured too when ``onnx_modular.export`` is available.

    python scripts/bench_validate.py [--layers 24] [--dim 32] [--seq 16] [--repeat 5]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

import onnx_modular as om

warnings.filterwarnings("ignore")


def paired_times(plain: Callable[[], Any], localized: Callable[[], Any],
                 repeat: int) -> tuple[float, float, Any, Any]:
    """Best-of-``repeat`` seconds for each, runs interleaved so that load on the machine
    hits both alike; one warm-up each first (torch and ORT first-call costs)."""
    a, b = plain(), localized()
    ta, tb = [], []
    for _ in range(repeat):
        for fn, times in ((plain, ta), (localized, tb)):
            # the previous run's garbage is collected outside the timing, as timeit does
            # (a full collection of this heap, transformers and torch in it, takes ~300 ms)
            gc.collect()
            start = time.perf_counter()
            result = fn()
            times.append(time.perf_counter() - start)
            if fn is plain:
                a = result
            else:
                b = result
    return min(ta), min(tb), a, b


def _models(layers: int, dim: int, seq: int) -> list[tuple[str, torch.nn.Module, tuple]]:
    from onnx_modular.examples import TinyGPT

    torch.manual_seed(0)
    ids = torch.randint(0, 128, (2, seq), generator=torch.Generator().manual_seed(0))
    out = [("TinyGPT", TinyGPT(dim=dim, layers=layers, context=max(64, seq)).eval(), (ids,))]
    with contextlib.suppress(ImportError):  # transformers is a test dependency
        out.append(("GPT-2", *gpt2(layers, dim, seq)))
    return out


def gpt2(layers: int, dim: int, seq: int) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """GPT-2 (transformers, small config) returning its last hidden state; batch 2."""
    from transformers import GPT2Config, GPT2Model

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from models import LastHidden

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=layers, n_embd=dim, n_head=4, vocab_size=128,
                     n_positions=max(64, seq), use_cache=False, attn_implementation="eager")
    ids = torch.randint(0, 128, (2, seq), generator=torch.Generator().manual_seed(0))
    return LastHidden(GPT2Model(cfg).eval()).eval(), (ids,)


def size_options(parser: argparse.ArgumentParser) -> None:
    """The model-size and repetition flags bench_validate and bench_extract share."""
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dim", type=int, default=32, help="hidden size")
    parser.add_argument("--seq", type=int, default=16, help="sequence length (batch 2)")


def _exports(model: torch.nn.Module, args: tuple) -> list[tuple[str, Any]]:
    flat = torch.onnx.export(model, args, dynamo=True, verbose=False).model_proto
    out = [("flat (torch.onnx)", flat)]
    export = getattr(om, "export", None)
    if export is not None:
        try:
            out.append(("hierarchical (om.export)", export(model, args).model_proto))
        except Exception as exc:  # report and go on: the benchmark is about validate
            print(f"  om.export failed: {type(exc).__name__}: {exc}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size_options(parser)
    opts = parser.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    rows = []
    for name, model, args in _models(opts.layers, opts.dim, opts.seq):
        for kind, proto in _exports(model, args):
            plain_s, loc_s, plain, loc = paired_times(
                lambda m=model, a=args, p=proto: om.validate(m, a, p, providers="cpu",
                                                             localize=False),
                lambda m=model, a=args, p=proto: om.validate(m, a, p, providers="cpu",
                                                             localize=True),
                opts.repeat)
            assert plain.ok and loc.ok, loc.summary()
            rows.append((name, kind, len(proto.graph.node) + sum(len(f.node)
                                                                for f in proto.functions),
                         loc.localization.calls_checked, plain_s, loc_s))

    print(f"\nvalidate, {opts.layers} layers, dim {opts.dim}, seq {opts.seq}, CPU EP, "
          f"best of {opts.repeat}, interleaved (torch {torch.__version__}, {os.cpu_count()} cores)")
    head = f"{'model':<8} {'ONNX':<26} {'nodes':>6} {'calls':>6} {'plain s':>8} " \
           f"{'localized s':>11} {'ratio':>6}"
    print(head)
    print("-" * len(head))
    for name, kind, nodes, calls, plain_s, loc_s in rows:
        print(f"{name:<8} {kind:<26} {nodes:>6} {calls:>6} {plain_s:>8.3f} {loc_s:>11.3f} "
              f"{loc_s / plain_s:>5.2f}x")
    worst = max(r[5] / r[4] for r in rows)
    print(f"\nworst ratio {worst:.2f}x (target <= 2x): {'met' if worst <= 2 else 'MISSED'}")


if __name__ == "__main__":
    main()
