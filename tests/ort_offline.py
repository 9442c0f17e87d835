"""ONNX Runtime's offline optimization, as the ORT parity tests, the outline tool test and
``scripts/bench_ort_parity.py`` run it: one way of asking what ORT makes of a file."""

from __future__ import annotations

import collections
from pathlib import Path

import onnx
import onnxruntime as ort


def optimize_offline(src: Path, dst: Path) -> None:
    """ORT's extended-level graph optimization of ``src``, written to ``dst`` (every local
    function inlined, as ORT loads it)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(dst)
    options.log_severity_level = 3
    ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])


def optimized_model(path: Path) -> onnx.ModelProto:
    """The model ORT runs for ``path``, after its offline optimization (beside it, .opt.onnx)."""
    optimized = path.with_suffix(".opt.onnx")
    optimize_offline(path, optimized)
    return onnx.load(str(optimized))


def optimized_ops(path: Path) -> collections.Counter[str]:
    """Operator counts of :func:`optimized_model`."""
    return collections.Counter(n.op_type for n in optimized_model(path).graph.node)
