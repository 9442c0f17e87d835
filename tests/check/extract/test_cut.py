"""The call as a standalone model: a flat call's nodes renamed relative to the module (its
weights, constants copied in, other inputs ``input_<k>``), a hierarchical call's function
body; the model checks and runs alone, and gives what the nodes gave in the model."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_modular.check.extract.cut import cut, standalone_model, weight
from onnx_modular.leaves.errors import OnnxModularError

W = np.arange(9, dtype=np.float32).reshape(3, 3) / 10
X = np.ones((2, 3), np.float32)
TCALL = SimpleNamespace(call_id="layer", module_type="Linear")


def flat() -> onnx.ModelProto:
    """``x -> layer (MatMul by its weight, Add a constant) -> Relu``."""
    nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(
                 np.full(3, 0.5, np.float32))),
             helper.make_node("MatMul", ["x", "layer.weight"], ["layer/mm"]),
             helper.make_node("Add", ["layer/mm", "c"], ["layer/out"]),
             helper.make_node("Relu", ["layer/out"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(W, "layer.weight")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_a_flat_call_is_its_nodes_named_relative_to_the_module() -> None:
    proto = flat()
    call = SimpleNamespace(call_id="layer", module_path="layer", function=None, nodes=[1, 2],
                           arguments=["x", "layer.weight", "c"], results=["layer/out"])
    built, kind = cut(proto, proto.graph, call, "layer")
    assert kind == "flat"
    assert built.weights == [("weight", "layer.weight")]
    assert built.inputs == [("input_0", "x")] and built.outputs == [("output_0", "layer/out")]
    assert [n.output[0] for n in built.constants] == ["c"]
    weights = [weight(proto.graph.initializer[0], "weight", None)]
    model = standalone_model(proto, built, weights, {"input_0": X},
                             {"output_0": X @ W + 0.5}, TCALL, "m.onnx")
    (out,) = run(model, {"input_0": X})
    np.testing.assert_allclose(out, X @ W + 0.5, rtol=1e-6)
    assert {p.key: p.value for p in model.metadata_props}["onnx_modular.extracted_call"] == \
        "layer"


def test_a_hierarchical_call_is_its_functions_body() -> None:
    body = helper.make_function("pkg", "Block", ["inp", "w"], ["out"],
                                [helper.make_node("MatMul", ["inp", "w"], ["out"])],
                                [helper.make_opsetid("", 18)])
    graph = helper.make_graph(
        [helper.make_node("Block", ["x", "W"], ["y"], domain="pkg")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(W, "W")])
    proto = helper.make_model(graph, functions=[body], opset_imports=[
        helper.make_opsetid("", 18), helper.make_opsetid("pkg", 1)])
    call = SimpleNamespace(call_id="block", module_path="block", function=("pkg", "Block", ""),
                           nodes=[], arguments=["x", "W"], results=["y"])
    built, kind = cut(proto, proto.graph, call, "block")
    assert kind == "hierarchical"
    assert (built.weights, built.inputs, built.outputs) == (
        [("w", "W")], [("inp", "x")], [("out", "y")])
    model = standalone_model(proto, built, [weight(proto.graph.initializer[0], "w", None)],
                             {"inp": X}, {"out": X @ W}, TCALL, "m.onnx")
    np.testing.assert_allclose(run(model, {"inp": X})[0], X @ W, rtol=1e-6)


def test_a_call_with_neither_body_nor_nodes_and_outside_weights_are_one_line(tmp_path
                                                                            ) -> None:
    proto = flat()
    call = SimpleNamespace(call_id="c", module_path="c", function=None, nodes=[],
                           arguments=[], results=[])
    with pytest.raises(OnnxModularError, match="module call 'torch.c' cannot be cut out"):
        cut(proto, proto.graph, call, "torch.c")
    init = numpy_helper.from_array(W, "layer.weight")
    init.data_location = TensorProto.EXTERNAL
    init.ClearField("raw_data")
    init.external_data.add(key="location", value="w.bin")
    with pytest.raises(OnnxModularError, match="external data and the model was given "
                       "without a path"):
        weight(init, "weight", None)
    with pytest.raises(OnnxModularError, match="cannot read the external data"):
        weight(init, "weight", tmp_path)
    (tmp_path / "w.bin").write_bytes(W.tobytes())
    loaded = weight(init, "weight", tmp_path)
    assert loaded.name == "weight" and loaded.data_location == TensorProto.DEFAULT
    np.testing.assert_array_equal(numpy_helper.to_array(loaded), W)
