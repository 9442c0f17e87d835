"""Benchmark: ``validate --extract`` vs plain ``validate`` on a 24-layer model with an error.

GPT-2 (transformers, small config, 24 layers) with an error planted in layer 17's MLP,
saved as hierarchical (om.export), flat (om.export functions="none") and flat torch.onnx
files. Side by side in one run, each the best of ``--repeat`` interleaved runs after a
warm-up: what ``python -m onnx_modular validate`` does (validate a file; the mismatch makes
it localize) and ``validate --extract DIR`` (the same, then writing module.onnx,
inputs.npz, expected.npz, README.md and running the module alone once); and the extraction
alone, from one report. The model load and Python start-up the command line adds to both
are left out.

    python scripts/bench_extract.py [--layers 24] [--dim 32] [--seq 16] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import onnx
import torch
from onnx import numpy_helper

import onnx_modular as om

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_validate import gpt2, paired_times, size_options

warnings.filterwarnings("ignore")


def _planted(proto: onnx.ModelProto, name: str) -> onnx.ModelProto:
    init = next(i for i in proto.graph.initializer if i.name == name)
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, name))
    return proto


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size_options(parser)
    opts = parser.parse_args()
    layer = min(17, opts.layers - 1)
    weight = f"model.h.{layer}.mlp.c_fc.weight"
    model, args = gpt2(opts.layers, opts.dim, opts.seq)
    exports = [
        ("hierarchical (om.export)", lambda: om.export(model, args).model_proto),
        ("flat (om.export none)", lambda: om.export(model, args, functions="none").model_proto),
        ("flat (torch.onnx)", lambda: torch.onnx.export(model, args, dynamo=True,
                                                        verbose=False).model_proto),
    ]
    rows = []
    counter = iter(range(10**6))  # a fresh directory per extraction
    with tempfile.TemporaryDirectory() as tmp:
        for kind, make in exports:
            path = Path(tmp) / f"{len(rows)}.onnx"
            onnx.save(_planted(make(), weight), path)

            def plain(p: Path = path) -> Any:
                return om.validate(model, args, p, providers="cpu")

            def extracting(p: Path = path) -> Any:
                with om.Validation(model, args, p, providers="cpu") as validation:
                    validation.run()
                    return validation.extract(Path(tmp) / f"x{next(counter)}")

            x = extracting()
            plain_s, extract_s, _, _ = paired_times(plain, extracting, opts.repeat)
            alone = []
            with om.Validation(model, args, path, providers="cpu") as validation:
                validation.run()
                for _ in range(opts.repeat):
                    start = time.perf_counter()
                    validation.extract(Path(tmp) / f"x{next(counter)}")
                    alone.append(time.perf_counter() - start)
            rows.append((kind, x.call_id, x.reproduces, plain_s, extract_s, min(alone)))

    print(f"\nvalidate vs validate --extract, GPT-2 {opts.layers} layers, dim {opts.dim}, "
          f"seq {opts.seq}, error planted in {weight}, CPU EP, best of {opts.repeat}, "
          f"interleaved (torch {torch.__version__}, {os.cpu_count()} cores)")
    head = (f"{'ONNX':<26} {'extracted':<20} {'repro':>5} {'validate s':>10} "
            f"{'--extract s':>11} {'ratio':>6} {'extract alone s':>15}")
    print(head)
    print("-" * len(head))
    for kind, call, repro, plain_s, extract_s, alone_s in rows:
        print(f"{kind:<26} {call:<20} {'yes' if repro else 'NO':>5} {plain_s:>10.3f} "
              f"{extract_s:>11.3f} {extract_s / plain_s:>5.2f}x {alone_s:>15.3f}")


if __name__ == "__main__":
    main()
