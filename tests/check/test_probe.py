"""The probe: a model's module calls found and their outputs exposed, on hand-built graphs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from onnx_modular.check.probe import build_probe
from onnx_modular.leaves.metadata import (
    CLASS_HIERARCHY,
    META_CALL,
    META_PATH,
    META_TYPE,
    NAME_SCOPES,
)

OPSET = [helper.make_opsetid("", 18), helper.make_opsetid("local", 1)]


def _meta(node: onnx.NodeProto, **props: str) -> onnx.NodeProto:
    for key, value in props.items():
        node.metadata_props.add(key=key, value=value)
    return node


def _call(function: str, inputs: list[str], outputs: list[str], call_id: str,
          module_type: str) -> onnx.NodeProto:
    node = helper.make_node(function, inputs, outputs, domain="local", name=call_id)
    return _meta(node, **{META_CALL: call_id, META_PATH: call_id, META_TYPE: module_type})


def _io(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])


def hierarchical() -> onnx.ModelProto:
    """``blk`` (a Block) calls ``blk.act`` (an Act: Relu) and negates; ``head`` is an Act."""
    act = helper.make_function("local", "Act", ["x"], ["y"],
                               [helper.make_node("Relu", ["x"], ["y"])], OPSET)
    block = helper.make_function("local", "Block", ["x"], ["y"], [
        _call("Act", ["x"], ["h"], "blk.act", "m.Act"),
        helper.make_node("Neg", ["h"], ["y"])], OPSET)
    graph = helper.make_graph([_call("Block", ["x"], ["b"], "blk", "m.Block"),
                               _call("Act", ["b"], ["y"], "head", "m.Act")],
                              "main", [_io("x")], [_io("y")])
    return helper.make_model(graph, opset_imports=OPSET, functions=[act, block])


def _scoped(op: str, inputs: list[str], outputs: list[str], scopes: list[str],
            classes: list[str]) -> onnx.NodeProto:
    node = helper.make_node(op, inputs, outputs)
    return _meta(node, **{NAME_SCOPES: repr(scopes), CLASS_HIERARCHY: repr(classes)})


def flat() -> onnx.ModelProto:
    """torch.onnx's flat form of the same model: module chains in ``name_scopes``."""
    nodes = [_scoped("Relu", ["x"], ["h"], ["", "blk", "blk.act", "relu"],
                     ["M", "Block", "Act", "aten.relu"]),
             _scoped("Neg", ["h"], ["b"], ["", "blk", "neg"], ["M", "Block", "aten.neg"]),
             _scoped("Relu", ["b"], ["y"], ["", "head", "relu"], ["M", "Act", "aten.relu"])]
    graph = helper.make_graph(nodes, "main", [_io("x")], [_io("y")])
    return helper.make_model(graph, opset_imports=OPSET[:1])


def _run(probe_bytes: bytes, x: np.ndarray) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(probe_bytes, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, {"x": x}), strict=True))


def test_hierarchical_calls_are_found_nested_and_exposed() -> None:
    probe = build_probe(hierarchical())
    assert probe.kind == "hierarchical" and probe.inlined
    calls = {c.call_id: c for c in probe.calls}
    assert set(calls) == {"blk", "blk.act", "head"}
    assert calls["blk"].module_type == "m.Block" and calls["blk"].parent is None
    assert probe.calls[calls["blk.act"].parent].call_id == "blk"
    assert calls["blk"].function == ("local", "Block", "")
    x = np.array([-1.0, 2.0], dtype=np.float32)
    values = _run(probe.model_bytes, x)
    assert np.array_equal(values[calls["blk.act"].outputs[0]], [0.0, 2.0])
    assert np.array_equal(values[calls["blk"].outputs[0]], [-0.0, -2.0])
    assert np.array_equal(values[calls["head"].outputs[0]], [0.0, 0.0])


def test_flat_calls_come_from_name_scopes() -> None:
    probe = build_probe(flat())
    assert probe.kind == "flat" and not probe.inlined
    calls = {c.call_id: c for c in probe.calls}
    assert set(calls) == {"blk", "blk.act", "head"}
    assert calls["blk"].module_type == "Block" and calls["blk"].nodes == [0, 1]
    assert calls["blk"].outputs == ["b"] and calls["blk.act"].outputs == ["h"]
    values = _run(probe.model_bytes, np.array([-1.0, 2.0], dtype=np.float32))
    assert {"h", "b", "y"} <= set(values)


def test_a_model_without_module_metadata_has_nothing_to_probe() -> None:
    model = flat()
    for node in model.graph.node:
        del node.metadata_props[:]
    assert build_probe(model).kind == "none"


def test_flat_metadata_labelling_two_calls_is_refused_with_a_reason() -> None:
    """A call id whose nodes are parted by another call's labels two calls."""
    nodes = [_meta(helper.make_node("Relu", ["x"], ["a"]), **{META_CALL: "layer"}),
             _meta(helper.make_node("Neg", ["a"], ["b"]), **{META_CALL: "other"}),
             _meta(helper.make_node("Relu", ["b"], ["y"]), **{META_CALL: "layer"})]
    graph = helper.make_graph(nodes, "main", [_io("x")], [_io("y")])
    probe = build_probe(helper.make_model(graph, opset_imports=OPSET[:1]))
    assert probe.kind == "none" and "'layer' labels more than one" in probe.note
