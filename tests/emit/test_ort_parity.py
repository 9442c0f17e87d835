"""ONNX Runtime optimizes the hierarchical file as it does torch.onnx's flat one.

ORT inlines every local function at load, then optimizes; a module boundary must cost no
fusion. At static shapes the optimized graphs hold the same operators, node for node
(``scripts/bench_ort_parity.py`` measures dynamic shapes and session creation too).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
import torch

import onnx_modular as om
from onnx_modular.lower.translate import quiet_torch_onnx
from tests import models

pytestmark = pytest.mark.slow


def _optimized_ops(path: Path) -> collections.Counter[str]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(path.with_suffix(".opt.onnx"))
    options.log_severity_level = 3
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(path.with_suffix(".opt.onnx")))
    assert not optimized.functions  # ORT inlined every call
    return collections.Counter(n.op_type for n in optimized.graph.node)


@pytest.mark.parametrize("build", [models.gpt2, models.bert, models.llama],
                         ids=["gpt2", "bert", "llama"])
def test_ort_optimizes_the_hierarchical_file_to_the_flat_files_graph(
        build: Callable[[int], tuple[torch.nn.Module, tuple]], tmp_path: Path) -> None:
    model, inputs = build(2)
    hierarchical, flat = tmp_path / "hier.onnx", tmp_path / "flat.onnx"
    om.export(model, inputs).save(hierarchical)
    assert onnx.load(str(hierarchical), load_external_data=False).functions
    with quiet_torch_onnx(), torch.no_grad():
        torch.onnx.export(model, inputs, dynamo=True).save(str(flat))
    # GPT-2: its attention ends in a view and c_proj starts with one; ORT fuses the pair only
    # with allowzero=0 (emit/optimize.plain_reshapes), one Reshape per layer before
    assert _optimized_ops(hierarchical) == _optimized_ops(flat)
