"""Protobuf wire-level patches, against onnx's own parser."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_modular.check import wire
from onnx_modular.leaves._io import encode_varint


def _model(with_sparse: bool = False) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    b = numpy_helper.from_array(np.array([1.5, -2.0, 3.0], np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"], name="mm"),
             helper.make_node("Add", ["xw", "b"], ["y"], name="add")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], [w, b],
        value_info=[helper.make_tensor_value_info("xw", TensorProto.FLOAT, [1, 3])])
    if with_sparse:
        values = numpy_helper.from_array(np.array([7.0], np.float32), "s")
        indices = numpy_helper.from_array(np.array([1], np.int64), "s_idx")
        graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [3]))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                              producer_name="test", doc_string="doc")
    helper.set_model_props(model, {"k": "v"})
    return model


def test_initializer_patch_parses_as_a_model_holding_only_the_initializers() -> None:
    model = _model(with_sparse=True)
    patch = onnx.ModelProto.FromString(wire.initializer_patch(model.SerializeToString()))
    assert list(patch.graph.initializer) == list(model.graph.initializer)
    assert list(patch.graph.sparse_initializer) == list(model.graph.sparse_initializer)
    assert not patch.graph.node and not patch.graph.input and not patch.opset_import


def test_light_model_plus_the_patch_is_the_original() -> None:
    model = _model()
    light = wire.without_initializers(model)
    assert all(not i.raw_data and not i.float_data for i in light.graph.initializer)
    assert [(i.name, i.data_type, list(i.dims)) for i in light.graph.initializer] == [
        ("w", TensorProto.FLOAT, [2, 3]), ("b", TensorProto.FLOAT, [3])]
    # concatenated messages merge: repeated fields append, so the shells come first
    joined = onnx.ModelProto.FromString(light.SerializeToString()
                                        + wire.initializer_patch(model.SerializeToString()))
    assert [i.name for i in joined.graph.initializer] == ["w", "b", "w", "b"]
    data = {i.name: numpy_helper.to_array(i) for i in joined.graph.initializer[2:]}
    np.testing.assert_array_equal(data["w"], numpy_helper.to_array(model.graph.initializer[0]))


def test_without_initializers_keeps_everything_but_the_weights() -> None:
    model = _model()
    light = wire.without_initializers(model)
    for field in ("ir_version", "producer_name", "doc_string", "model_version", "domain"):
        assert getattr(light, field) == getattr(model, field)
    assert list(light.opset_import) == list(model.opset_import)
    assert list(light.metadata_props) == list(model.metadata_props)
    for field in ("node", "input", "output", "value_info"):
        assert list(getattr(light.graph, field)) == list(getattr(model.graph, field))
    assert light.graph.name == "g"
    assert model.graph.initializer[0].raw_data  # the original is untouched


def test_outputs_patch_appends_graph_outputs() -> None:
    model = _model()
    patch = wire.outputs_patch(["xw", "x"])
    joined = onnx.ModelProto.FromString(model.SerializeToString() + patch)
    assert [o.name for o in joined.graph.output] == ["y", "xw", "x"]
    assert [n.name for n in joined.graph.node] == ["mm", "add"]
    assert onnx.ModelProto.FromString(wire.outputs_patch([])) == onnx.ModelProto()


def test_a_model_without_a_graph_gives_an_empty_graph_patch() -> None:
    patch = wire.initializer_patch(onnx.ModelProto(ir_version=9).SerializeToString())
    assert onnx.ModelProto.FromString(patch) == onnx.ModelProto(graph=onnx.GraphProto())


def test_fields_walks_every_wire_type() -> None:
    # ModelProto: ir_version (varint, field 1), a fixed64 (field 20) and a fixed32 (21),
    # which onnx leaves unknown, and producer_name (length-delimited, field 2)
    buf = (b"\x08\x09" + encode_varint(20 << 3 | 1) + b"\x00" * 8
           + encode_varint(21 << 3 | 5) + b"\x00" * 4 + b"\x12\x02ab")
    fields = list(wire._fields(buf, 0, len(buf)))
    assert [(number, end) for number, _, _, end in fields] == [(1, 2), (20, 12), (21, 18),
                                                               (2, 22)]
    assert onnx.ModelProto.FromString(buf).producer_name == "ab"  # onnx reads it alike
    with pytest.raises(ValueError, match="wire type 3"):
        list(wire._fields(b"\x0b", 0, 1))


def test_varint_reads_multi_byte_values() -> None:
    assert wire._varint(bytes([0xAC, 0x02]), 0) == (300, 2)
    assert wire._varint(bytes([0x05, 0x01]), 1) == (1, 2)
