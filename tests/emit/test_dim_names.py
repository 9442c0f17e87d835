"""emit/dim_names: the file's dynamic dimensions carry the user's Dim names, as torch.onnx
writes them, in the main graph and in every function body; sizes stay the same."""

from __future__ import annotations

import re

import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from models import gpt2
from torch.export import Dim

import onnx_modular as om
from onnx_modular.emit.dim_names import name_dims


def _dim_params(model: onnx.ModelProto) -> set[str]:
    values = [*model.graph.input, *model.graph.output, *model.graph.value_info]
    for function in model.functions:
        values += function.value_info
    return {d.dim_param for v in values for d in v.type.tensor_type.shape.dim if d.dim_param}


@pytest.mark.slow
def test_the_file_names_dynamic_dimensions_after_the_users_dims_in_every_body(
        tmp_path, assert_close) -> None:
    model, (ids,) = gpt2()
    shapes = ({0: Dim("batch", min=1, max=16), 1: Dim("seq", min=2, max=32)},)
    result = om.export(model, (ids,), dynamic_shapes=shapes)
    path = tmp_path / "model.onnx"
    result.save(path)
    saved = onnx.load(str(path))
    assert [d.dim_param for d in saved.graph.input[0].type.tensor_type.shape.dim] == \
        ["batch", "seq"]
    params = _dim_params(saved)
    assert saved.functions and {"batch", "seq"} <= params
    # no torch symbol is left, in expressions neither ("seq*batch")
    assert not [p for p in params if re.search(r"(?<!\w)s\d+(?!\w)", p)], params
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    other = torch.randint(0, 99, (3, 5))
    with torch.no_grad():
        expected = model(other)
    assert_close(session.run(None, {session.get_inputs()[0].name: other.numpy()})[0],
                 expected.numpy() if isinstance(expected, torch.Tensor) else expected[0])


def test_a_symbol_is_renamed_whole_never_inside_a_longer_one() -> None:
    x = ir.Value(name="x", shape=ir.Shape([ir.SymbolicDim("s1"), ir.SymbolicDim("s11"), 4]))
    y = ir.Value(name="y", shape=ir.Shape([ir.SymbolicDim("s1 + s11"),
                                           ir.SymbolicDim("2*s1"), ir.SymbolicDim("s7")]))
    node = ir.node("Identity", [x], outputs=[y])
    model = ir.Model(ir.Graph([x], [y], nodes=[node], opset_imports={"": 20}), ir_version=10)
    assert name_dims(model, {"s1": "batch", "s11": "past"}) == 2
    assert [d.value if isinstance(d, ir.SymbolicDim) else d for d in x.shape] == \
        ["batch", "past", 4]
    assert [d.value for d in y.shape] == ["batch + past", "2*batch", "s7"]
    assert name_dims(model, {}) == 0
