"""Run the whole pipeline over the test model registry (tests/models.py; nothing downloaded).

For each: modularize (exact outputs?), export hierarchically (functions, layer calls), and
validate against ONNX Runtime. Prints one row per model; failures are reported, not raised.
Transformers models are built with 3 layers.
Usage: python scripts/zoo.py [--only NAME ...] [--tag TAG ...]
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

import models

import onnx_modular as om
from onnx_modular.passes.modularize import iter_module_calls

warnings.filterwarnings("ignore")


def build(name: str) -> tuple[torch.nn.Module, tuple]:
    arch = models.ARCHITECTURES[name]
    return arch(layers=3) if "transformers" in arch.tags else arch()


def run(name: str) -> str:
    model, args = build(name)
    start = time.perf_counter()
    ep = torch.export.export(model, args)
    gm = om.modularize(ep)
    exact = all(torch.equal(a, b) for a, b in zip(
        torch.utils._pytree.tree_leaves(gm(*args)),
        torch.utils._pytree.tree_leaves(ep.module()(*args))))
    calls = collections.Counter(sub.module_type.rsplit(".", 1)[-1]
                                for _, sub in iter_module_calls(gm))
    result = om.export(model, args)
    proto = result.model_proto
    names = {f.name for f in proto.functions}
    sites = collections.Counter(n.op_type for f in [proto.graph, *proto.functions]
                                for n in f.node if n.op_type in names)
    layer = models.ARCHITECTURES[name].layer or "-"
    rep = om.validate(model, args, proto)
    return (f"{name:<16} modularize {'exact' if exact else 'DIFFERS'}, {sum(calls.values())} "
            f"calls | {len(names)} functions, layer function {layer} x{sites.get(layer, 0)} | "
            f"validate {'ok' if rep.ok else 'MISMATCH ' + str(rep.first_mismatch)} | "
            f"{time.perf_counter() - start:.1f}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="+", choices=list(models.ARCHITECTURES), default=None)
    parser.add_argument("--tag", nargs="+", default=[],
                        help="only architectures with every one of these tags")
    opts = parser.parse_args()
    for name in [n for n in models.names(*opts.tag) if opts.only is None or n in opts.only]:
        try:
            print(run(name), flush=True)
        except Exception as e:
            print(f"{name:<16} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:150]}")
            traceback.print_exc(limit=3, file=sys.stderr)


if __name__ == "__main__":
    main()
