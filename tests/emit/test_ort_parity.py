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
import pytest
import torch

import onnx_modular as om
from onnx_modular.lower.translate import quiet_torch_onnx
from tests import models
from tests.ort_offline import optimized_model

pytestmark = pytest.mark.slow


def _optimized_ops(path: Path) -> collections.Counter[str]:
    optimized = optimized_model(path)
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


_SHAPE_OPS = {"Shape", "Concat", "Reshape"}
#: Add + LayerNormalization ORT fuses to SkipLayerNormalization only when it knows both
#: inputs' symbolic dims; a function's value_info does not survive ORT's inlining and a
#: Slice or Expand with a computed size (BERT's position ids and mask) loses the names.
_SKIP_FUSION = {"Add", "LayerNormalization", "SkipLayerNormalization"}


@pytest.mark.parametrize("build, functions, shape_nodes_per_layer, fusions_missed", [
    (models.llama, "all", 1, 0), (models.gpt2, "all", 6, 1), (models.bert, "all", 0, 4),
    (models.gpt2, ["GPT2Block"], 1, 1), (models.bert, ["BertLayer"], 0, 0),
    (models.vit, ["ViTLayer"], 0, 0)],
    ids=["llama", "gpt2", "bert", "gpt2-layers", "bert-layers", "vit-layers"])
def test_under_dynamic_shapes_only_the_bodies_own_sizes_remain(
        build: Callable[[int], tuple[torch.nn.Module, tuple]], functions: object,
        shape_nodes_per_layer: int, fusions_missed: int, tmp_path: Path) -> None:
    """Dynamic batch (and sequence): each body computes its sizes from its own activations
    (emit/sizes), and a Reshape to its input's own dimensions copies them (``[0, 0, 4, 8]``,
    ``[0, 17, 4, 8]`` for ViT's ``[-1, 17, 4, 8]``) and an Expand keeps them
    (``[1, 2, 2, 1, 8]``), so after ORT's optimization the two files hold the same compute
    operators, the hierarchical one a few shape nodes more per layer: Llama 1 (its
    attention's two one-dimension Shapes, one Concat fewer), GPT-2 a Shape and a Concat per
    Conv1D call (the size of its output, from a 2-D Gemm: nothing to copy), less what the
    root's own sizes save; with one function per GPT-2 layer its three Conv1D widths share
    one ``[batch, seq, -1]`` (the ranges keep both at 1 or more), so a Shape per layer
    remains. The Add + LayerNormalization pairs ORT leaves unfused in BERT
    follow from names lost in BertModel's body (a Slice and an Expand of computed sizes),
    which with ``functions=[BertLayer]`` is the main graph, where torch's value_info holds."""
    model, inputs = build(2)
    dims = {0: torch.export.Dim("batch", min=1, max=32)}
    if not inputs[0].dtype.is_floating_point:
        dims[1] = torch.export.Dim("seq", min=2, max=32)
    hierarchical, flat = tmp_path / "hier.onnx", tmp_path / "flat.onnx"
    om.export(model, inputs, dynamic_shapes=(dims,), functions=functions).save(hierarchical)
    with quiet_torch_onnx(), torch.no_grad():
        torch.onnx.export(model, inputs, dynamic_shapes=(dims,), dynamo=True).save(str(flat))
    ours, theirs = _optimized_ops(hierarchical), _optimized_ops(flat)
    differ = {op: ours[op] - theirs[op] for op in set(ours) | set(theirs) if ours[op] != theirs[op]}
    assert set(differ) <= _SHAPE_OPS | _SKIP_FUSION, differ
    assert differ.get("SkipLayerNormalization", 0) == -fusions_missed, differ
    assert sum(differ.get(op, 0) for op in _SHAPE_OPS) <= shape_nodes_per_layer * 2, differ


def _bert_sdpa(layers: int) -> tuple[torch.nn.Module, tuple]:
    """BERT with transformers' default attention (torch's scaled_dot_product_attention)."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=layers, hidden_size=32, num_attention_heads=4,
                        intermediate_size=64, vocab_size=99, max_position_embeddings=64)
    return models.LastHidden(BertModel(config, add_pooling_layer=False).eval()).eval(), \
        models.token_ids()


@pytest.mark.parametrize("functions, fusions_missed", [(["BertLayer"], 0), ("all", 4)],
                         ids=["layers", "all"])
def test_torchs_attention_keeps_every_skip_layer_norm_fusion(
        functions: object, fusions_missed: int, tmp_path: Path) -> None:
    """torchlib writes scaled_dot_product_attention's key transpose as Reshape, Transpose,
    Reshape with shapes computed from Shape(key); inside a body ORT could not name the
    result and lost every layer's SkipLayerNormalization (0 of 4). As one Transpose
    (emit/sizes.transpose_through_reshapes) the two files fuse the same, ours with fewer
    shape and data-movement nodes, and the numbers hold at other sizes. With ``'all'``
    the names BertModel's body loses cost 4, as with eager attention (above)."""
    model, inputs = _bert_sdpa(2)
    dims = ({0: torch.export.Dim("batch", min=1, max=32),
             1: torch.export.Dim("seq", min=2, max=32)},)
    hierarchical, flat = tmp_path / "hier.onnx", tmp_path / "flat.onnx"
    om.export(model, inputs, dynamic_shapes=dims, functions=functions).save(hierarchical)
    with quiet_torch_onnx(), torch.no_grad():
        torch.onnx.export(model, inputs, dynamic_shapes=dims, dynamo=True).save(str(flat))
    ours, theirs = _optimized_ops(hierarchical), _optimized_ops(flat)
    assert theirs["SkipLayerNormalization"] == 4
    differ = {op: ours[op] - theirs[op] for op in set(ours) | set(theirs) if ours[op] != theirs[op]}
    assert differ.get("SkipLayerNormalization", 0) == -fusions_missed, differ
    moved = {op: n for op, n in differ.items() if op not in _SKIP_FUSION}
    assert all(n < 0 for n in moved.values()), differ
    assert set(moved) <= _SHAPE_OPS | {"Gather", "Slice", "Transpose"}, differ
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(str(hierarchical), providers=["CPUExecutionProvider"])
    for shape in [(3, 5), (1, 2)]:
        ids = torch.randint(0, 99, shape)
        with torch.no_grad():
            want = model(ids).numpy()
        (got,) = session.run(None, {"input_ids": ids.numpy()})
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
