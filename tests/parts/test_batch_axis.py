"""The batch-axis analysis on small exported models: what mixes rows along the batch, what
it cannot follow, and what it proves (each checked against ONNX Runtime: the rows of a
stacked run equal each row run alone where it proves the batch, and differ where it finds
mixing)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from torch import nn

import onnx_modular as om
from onnx_modular.parts.batch_axis import analyze

pytestmark = pytest.mark.slow  # each case exports a model


class Fn(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


def translation(model: nn.Module, x: torch.Tensor) -> ir.Model:
    batch = torch.export.Dim("batch", max=64)
    program = torch.export.export(model.eval(), (x,), dynamic_shapes=({0: batch},),
                                  strict=False)
    return om.split_stages(program, num_stages=1).onnx_model


def rows_alone_equal_stacked(model: ir.Model, x: np.ndarray) -> bool:
    proto = ir.serde.serialize_model(model).SerializeToString()
    session = ort.InferenceSession(proto, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    (stacked,) = session.run(None, {name: x})
    alone = np.concatenate([session.run(None, {name: x[i:i + 1]})[0] for i in range(len(x))])
    return stacked.shape == alone.shape and np.allclose(stacked, alone, atol=1e-5)


W = torch.randn(6, 6, generator=torch.Generator().manual_seed(0))
CASES = {  # name: (function of x [batch, 6], the first mixing op, "proven", or None)
    "mean over the batch": (lambda x: x - x.mean(0), "ReduceMean"),
    "x @ x.T": (lambda x: x @ x.T, "MatMul"),
    "cumsum over the batch": (lambda x: x.cumsum(0), "CumSum"),
    "topk over the batch": (lambda x: x.topk(1, dim=0).values + x, "TopK"),
    "softmax over the batch": (lambda x: x.softmax(0), "Softmax"),
    "flip of the batch": (lambda x: x.flip(0), None),
    "batch size as a value": (lambda x: x * x.shape[0], "Mul"),
    "expanded to [batch, batch]": (lambda x: x[:, :1].expand(x.shape[0], x.shape[0]), None),
    "rows along the last axis": (lambda x: torch.relu(x @ W).softmax(-1) * 2, "proven"),
    # filed as "cannot follow" once, which batch_dim= then trusted: wrong served answers
    "clamped to the batch size": (lambda x: torch.clamp(x @ W, max=x.shape[0]), "mixing"),
    "sort of the batch": (lambda x: x.sort(0).values, "mixing"),
    "roll of the batch": (lambda x: x.roll(1, 0), "mixing"),
    "mask shaped by the batch": (lambda x: torch.ones(x.shape[0], x.shape[0]).tril() @ x,
                                 "mixing"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_mixing_is_found_and_proof_holds_in_ort(case) -> None:
    fn, expected = CASES[case]
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    model = translation(Fn(fn), x)
    graph = model.graph
    analysis = analyze(graph, graph.inputs[0].shape[0].value)
    if expected == "proven":
        assert analysis.proven, analysis.summary()
    elif expected == "mixing":
        assert analysis.mixing, analysis.summary()
    elif expected is not None:
        assert analysis.mixing and analysis.mixing[0].op == expected, analysis.summary()
    else:
        assert not analysis.proven
    assert not analysis.proven or rows_alone_equal_stacked(model, x.numpy())
    if analysis.mixing:
        assert not rows_alone_equal_stacked(model, x.numpy())


def test_the_sequence_first_encoder_attends_across_its_first_axis() -> None:
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0)  # batch_first=False
    model = translation(layer, torch.randn(5, 3, 16))
    analysis = analyze(model.graph, model.graph.inputs[0].shape[0].value)
    first = analysis.mixing[0]
    assert first.op == "MatMul" and "'self_attn' (MultiheadAttention)" in first.module
    assert not rows_alone_equal_stacked(model, np.random.default_rng(0).standard_normal(
        (5, 3, 16)).astype(np.float32))


def test_a_flatten_that_is_undone_keeps_the_batch() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x.flatten(0, 1) * 2).unflatten(0, (-1, 3)).transpose(1, 2).relu()

    x = torch.randn(4, 3, 6)
    model = translation(Fn(fn), x)
    analysis = analyze(model.graph, model.graph.inputs[0].shape[0].value)
    assert analysis.proven, analysis.summary()
    assert rows_alone_equal_stacked(model, x.numpy())


@pytest.mark.parametrize("op", ["Slice", "TopK"])
def test_sizes_read_from_the_batch_are_not_a_proof(op: str) -> None:
    """``Slice(x, 0, Shape(x)[0], axis=1)`` and ``TopK(x, k=Shape(x)[0], axis=1)`` keep the
    batch at axis 0 but make each row as wide as the batch is long: stacked, a request's
    rows come back (4, 4) where alone they are (1, 1)."""
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT),
                 shape=ir.Shape([ir.SymbolicDim("b"), 8]))
    size = ir.node("Shape", [x], attributes={"start": 0, "end": 1})
    size.outputs[0].name = "size"

    def const(name: str, value: int) -> ir.Value:
        return ir.Value(name=name, type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([1]),
                        const_value=ir.tensor(np.array([value], dtype=np.int64)))

    zero, one = const("zero", 0), const("one", 1)
    if op == "Slice":
        node = ir.node("Slice", [x, zero, size.outputs[0], one])
    else:
        node = ir.node("TopK", [x, size.outputs[0]], attributes={"axis": 1}, num_outputs=2)
    node.outputs[0].name = "y"
    graph = ir.Graph([x], [node.outputs[0]], nodes=[size, node], initializers=[zero, one],
                     opset_imports={"": 18})
    analysis = analyze(graph, "b")
    assert analysis.mixing and op in analysis.summary()
    assert not rows_alone_equal_stacked(ir.Model(graph, ir_version=10),
                                        np.arange(32, dtype=np.float32).reshape(4, 8))
