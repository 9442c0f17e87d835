"""``om.outline`` of a flat GPT-2 vs the ``torch.onnx.export(dynamo=True)`` that wrote it.

Outlining reads labels and moves nodes: it should cost a fraction of the export it follows.
For a GPT-2 small-width config at 12, 24 and 48 layers, prints the export time, the outline
time of its file (and of that file after ``quantize_dynamic``), their ratio, and the
functions the outline found. Target: outline <= 0.25x the export at 48 layers.
Usage: python scripts/bench_outline.py [--layers 12 24 48]
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnx_modular as om
from onnx_modular.lower.translate import quiet_torch_onnx
from tests.models import gpt2


def _timed(run: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = run(*args)
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[12, 24, 48])
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from onnxruntime.quantization import QuantType, quantize_dynamic

    print(f"{'layers':>6} {'export s':>9} {'outline s':>10} {'ratio':>6} "
          f"{'int8 outline s':>15} {'ratio':>6}  functions (blocks)")
    with tempfile.TemporaryDirectory() as tmp:
        for layers in args.layers:
            model, inputs = gpt2(layers)
            flat, int8 = Path(tmp, f"flat{layers}.onnx"), Path(tmp, f"int8_{layers}.onnx")
            with quiet_torch_onnx(), torch.no_grad():
                t_export, program = _timed(functools.partial(torch.onnx.export, dynamo=True),
                                           model, inputs)
            program.save(str(flat))
            quantize_dynamic(str(flat), str(int8), weight_type=QuantType.QInt8)
            t_outline, result = _timed(om.outline, flat)
            t_int8, _ = _timed(om.outline, int8)
            blocks = sum(1 for f in result.functions if f.module_type.endswith("GPT2Block"))
            print(f"{layers:>6} {t_export:>9.2f} {t_outline:>10.2f} "
                  f"{t_outline / t_export:>5.2f}x {t_int8:>15.2f} {t_int8 / t_export:>5.2f}x  "
                  f"{len(result.functions)} ({blocks})")


if __name__ == "__main__":
    main()
