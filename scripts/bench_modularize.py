"""Modularize vs torch.export.unflatten on the same program, side by side in one run.

Prints, for 12/48/96 identical layers: nodes, both times, the ratio, and time per node, both
as the user sees it and with CPython's cyclic GC off. Both generate the Python code of every
module as they build (Modularize did it lazily, on first call, until torch.compile needed it
ready): modularize pauses the GC while it builds,
and the collection that follows can be a full one over the whole heap (torch and the model
included), a cost that steps with the heap, not with the graph.
Targets: ratio <= 0.5x; time per node flat (within 20%) from 1k to 10k nodes.
Usage: python scripts/bench_modularize.py [--layers 12 48 96] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import time

import torch
import torch.fx
from torch import nn

from onnx_modular import modularize


class Gated(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(self.norm(x))
        a, b = h.chunk(2, dim=-1)
        return x + self.down(torch.cat([a * torch.sigmoid(b), a - b], dim=-1) * 0.5)


class Layer(nn.Module):
    """About 100 FX nodes: 12 layers ~ 1k nodes, 96 layers ~ 10k nodes."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.parts = nn.ModuleList([Gated(dim) for _ in range(6)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for part in self.parts:
            x = part(x)
        return x


class Net(nn.Module):
    def __init__(self, layers: int, dim: int = 16) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Layer(dim) for _ in range(layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def best_of(fn, repeat: int, gc_off: bool = False) -> float:
    """Best wall time; each run starts from a collected heap, its result freed untimed."""
    times = []
    for _ in range(repeat):
        gc.collect()
        if gc_off:
            gc.disable()
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
        gc.enable()
        del result
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, nargs="+", default=[12, 48, 96])
    parser.add_argument("--repeat", type=int, default=5)
    opts = parser.parse_args()
    x = torch.randn(2, 16)
    rows = []
    print(f"{'layers':>6} {'nodes':>6} {'modularize s':>13} "
          f"{'unflatten s':>12} {'ratio':>6} {'us/node':>8} {'gc off':>7}")
    for n in opts.layers:
        ep = torch.export.export(Net(n).eval(), (x,))
        nodes = len(ep.graph.nodes)
        ours = best_of(lambda ep=ep: modularize(ep), opts.repeat)
        theirs = best_of(lambda ep=ep: torch.export.unflatten(ep), opts.repeat)
        quiet = best_of(lambda ep=ep: modularize(ep), opts.repeat, gc_off=True)
        gm, ref = modularize(ep), ep.module()
        assert torch.equal(gm(x), ref(x))
        per_node = ours / nodes * 1e6
        quiet_per_node = quiet / nodes * 1e6
        rows.append((n, nodes, ours, theirs, per_node, quiet_per_node))
        print(f"{n:>6} {nodes:>6} {ours:>13.3f} {theirs:>12.3f} "
              f"{ours / theirs:>6.2f} {per_node:>8.1f} {quiet_per_node:>7.1f}")
    if len(rows) > 1:
        sizes = sorted(r[1] for r in rows)
        for label, column in (("", 4), (" (cyclic GC off)", 5)):
            spread = max(r[column] for r in rows) / min(r[column] for r in rows)
            print(f"time per node{label}, max/min over {sizes[0]}..{sizes[-1]} nodes: "
                  f"{spread:.2f}x")


if __name__ == "__main__":
    main()
