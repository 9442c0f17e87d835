"""compare(): structure after inlining, numerics on the same inputs, reports and errors."""

from __future__ import annotations

import json
from io import StringIO

import models
import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from rich.console import Console

import onnx_modular as om
from onnx_modular.check.compare import topology_hash
from onnx_modular.check.inputs import random_inputs


@pytest.fixture(scope="module")
def twins() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """A hierarchical model (shared functions) and the flat torch.onnx export of the same net."""
    model, args = models.net()
    hier = models.hierarchical(model)
    flat = torch.onnx.export(model, args, dynamo=True, verbose=False).model_proto
    return hier, flat


def _console() -> tuple[Console, StringIO]:
    out = StringIO()
    return Console(file=out, width=120), out


@pytest.mark.slow
def test_hierarchical_and_flat_twin_are_equivalent(twins, tmp_path):
    hier, flat = twins
    rep = om.compare(hier, flat)
    assert rep.equivalent and rep.ok and rep.exit_code == 0
    assert rep.same_structure  # inlined, the two graphs are the same up to names
    assert rep.a.functions == 2 and rep.b.functions == 0
    assert rep.a.nodes == 3 + 3 + 1 and rep.a.inlined_nodes == rep.b.inlined_nodes == 9
    assert rep.a.op_histogram == rep.b.op_histogram == {"Add": 3, "MatMul": 3, "Relu": 3}
    assert rep.outputs[0].diff.max_abs == 0.0
    assert rep.a.session_s > 0 and rep.b.run_s > 0 and rep.a.size_bytes > 0
    data = json.loads(json.dumps(rep.to_dict()))
    assert data["equivalent"] is True and data["a"]["topology"] == data["b"]["topology"]
    assert "EQUIVALENT" in str(rep)
    rep.save(tmp_path / "c.md")
    assert "EQUIVALENT" in (tmp_path / "c.md").read_text()
    # paths work as well as ModelProtos; the report prints and saves as JSON
    onnx.save(hier, tmp_path / "h.onnx")
    console, out = _console()
    rep = om.compare(tmp_path / "h.onnx", flat)
    assert rep.equivalent and rep.exit_code == 0 and rep.a.label.endswith("h.onnx")
    console.print(rep)
    assert "EQUIVALENT" in out.getvalue()
    rep.save(tmp_path / "c.json")
    assert json.loads((tmp_path / "c.json").read_text())["equivalent"] is True


@pytest.mark.slow
def test_altered_model_differs(twins):
    hier, flat = twins
    model, _ = models.net()
    altered = models.hierarchical(model, layer_ops={1: "Sub"})
    rep = om.compare(altered, flat)
    assert not rep.equivalent and not rep.ok and rep.exit_code == 1
    assert not rep.same_structure
    assert rep.a.op_histogram["Sub"] == 1 and rep.a.op_histogram["Add"] == 2
    assert "DIFFERENT" in rep.summary()
    assert om.compare(flat, altered).exit_code == 1
    # a weight change keeps the structure but not the numbers
    scaled = models.hierarchical(model, weight_scale={2: 1.01})
    rep = om.compare(hier, scaled)
    assert rep.same_structure and not rep.equivalent


@pytest.mark.slow
def test_corrupt_and_missing_files_are_one_line_errors(twins, tmp_path):
    hier, _ = twins
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07not an onnx file" * 16)
    with pytest.raises(om.OnnxModularError) as e:
        om.compare(hier, corrupt)
    assert "corrupt.onnx" in str(e.value) and "\n" not in str(e.value)
    assert e.value.__cause__ is not None  # the cause is kept for --debug
    with pytest.raises(om.OnnxModularError) as e:
        om.compare(tmp_path / "missing.onnx", hier)
    assert "missing.onnx" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow
def test_signature_mismatch_and_given_inputs(twins):
    hier, flat = twins
    other = helper.make_model(helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.INT64, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [2, 8])]))
    rep = om.compare(hier, other)
    assert not rep.equivalent and "input signatures differ" in rep.reasons[0]
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    assert om.compare(hier, flat, [x]).equivalent
    assert om.compare(hier, flat, {"x": torch.from_numpy(x)}).equivalent
    with pytest.raises(om.OnnxModularError, match="inputs lack"):
        om.compare(hier, flat, {"y": x})
    with pytest.raises(om.OnnxModularError, match="take 1 input"):
        om.compare(hier, flat, [x, x])


def test_random_inputs_from_declared_types():
    graph = helper.make_graph(
        [helper.make_node("Identity", ["a"], ["y"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", "s0 + 1", 3]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", None]),
         helper.make_tensor_value_info("mask", TensorProto.BOOL, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    feeds = random_inputs(helper.make_model(graph))
    assert feeds["a"].shape == (4, 5, 3) and feeds["a"].dtype == np.float32
    assert feeds["ids"].shape == (4, 4) and feeds["ids"].dtype == np.int64
    assert set(np.unique(feeds["ids"])) <= {0, 1}
    assert feeds["mask"].dtype == np.bool_


def test_topology_hash_ignores_names(twins):
    hier, _ = twins
    renamed = onnx.ModelProto()
    renamed.CopyFrom(hier)
    for node in renamed.graph.node:
        node.name = "renamed_" + node.name
    mapping = {"add_0": "zzz", "add_1": "yyy"}
    for node in renamed.graph.node:
        node.input[:] = [mapping.get(n, n) for n in node.input]
        node.output[:] = [mapping.get(n, n) for n in node.output]
    assert topology_hash(renamed) == topology_hash(hier)


@pytest.fixture(scope="module")
def export_twins() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    model, args = models.gpt2(2)
    return (om.export(model, args).model_proto,
            om.export(model, args, functions="none").model_proto)


@pytest.mark.slow
def test_om_export_hierarchical_vs_flat(export_twins, tmp_path):
    hier, flat = export_twins
    assert hier.functions and not flat.functions
    rep = om.compare(hier, flat)
    assert rep.equivalent, rep.summary()
    assert rep.a.nodes < rep.b.nodes  # shared bodies are stored once
    onnx.save(hier, tmp_path / "h.onnx")
    onnx.save(flat, tmp_path / "f.onnx")
    assert om.compare(tmp_path / "h.onnx", tmp_path / "f.onnx").exit_code == 0
    # alter one of them: a Gemm inside the (shared) Conv1D body scales its result
    altered = onnx.ModelProto()
    altered.CopyFrom(hier)
    conv = next(f for f in altered.functions if f.name.startswith("Conv1D"))
    next(n for n in conv.node if n.op_type == "Gemm").attribute.append(
        helper.make_attribute("alpha", 1.01))
    onnx.save(altered, tmp_path / "a.onnx")
    assert om.compare(tmp_path / "a.onnx", tmp_path / "f.onnx").exit_code == 1
    (tmp_path / "c.onnx").write_bytes((tmp_path / "h.onnx").read_bytes()[:100])
    with pytest.raises(om.OnnxModularError, match="c.onnx"):
        om.compare(tmp_path / "c.onnx", tmp_path / "f.onnx")


def test_topology_hash_folds_constants_and_identities():
    def model(folded: bool) -> onnx.ModelProto:
        shape = onnx.numpy_helper.from_array(np.array([4, 2], np.int64), "shape")
        nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"])]
        inits = [shape]
        if not folded:  # the shape as a Constant node, behind an Identity
            nodes = [helper.make_node("Constant", [], ["c"], value=shape),
                     helper.make_node("Identity", ["c"], ["shape"]), *nodes]
            inits = []
        return helper.make_model(helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2])], inits))

    assert topology_hash(model(True)) == topology_hash(model(False))
    other = model(True)
    other.graph.initializer[0].CopyFrom(
        onnx.numpy_helper.from_array(np.array([8, 1], np.int64), "shape"))
    assert topology_hash(other) != topology_hash(model(True))  # small constants by value


def test_large_models_are_compared_without_prepacked_weights(twins, monkeypatch, prepacked):
    """Above LARGE_MODEL_BYTES (lowered here) sessions map weights instead of packing a
    private copy; equivalent twins stay equivalent and a 1% weight change is still seen."""
    from onnx_modular.leaves import runtime

    hier, flat = twins
    model, _ = models.net()
    monkeypatch.setattr(runtime, "LARGE_MODEL_BYTES", 0)
    assert om.compare(hier, flat).equivalent
    assert not om.compare(hier, models.hierarchical(model, weight_scale={2: 1.01})).equivalent
    assert prepacked == [False] * 4


def _difference(order: tuple[str, str], shapes: dict[str, list] | None = None
                ) -> onnx.ModelProto:
    """``y = x - w``, its two inputs declared in ``order`` (``[4, 8]`` unless ``shapes``)."""
    shapes = shapes or {}
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shapes.get(n, [4, 8]))
              for n in order]
    graph = helper.make_graph([helper.make_node("Sub", ["x", "w"], ["y"])], "sub", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_inputs_declared_in_another_order_are_fed_by_name() -> None:
    """b declares (w, x) where a declares (x, w): fed by position, x went to w and two
    models computing the same were reported different."""
    a, b = _difference(("x", "w")), _difference(("w", "x"))
    assert om.compare(a, b).to_dict()["equivalent"]
    x, w = np.ones((4, 8), np.float32), np.zeros((4, 8), np.float32)
    assert om.compare(a, b, inputs=[x, w]).to_dict()["equivalent"]
    assert om.compare(a, b, inputs={"w": w, "x": x}).to_dict()["equivalent"]
    other = _difference(("x", "w"))
    other.graph.node[0].input[:] = ["w", "x"]  # w - x: really different
    assert not om.compare(a, other, inputs=[x, w]).to_dict()["equivalent"]


def test_random_inputs_take_sizes_from_the_input_of_the_same_name() -> None:
    """a's ``x`` is ``[N, 8]``; b declares ``w`` first and ``x`` as ``[3, 8]``: N was drawn
    from b's first input (``w``, ``[4, 8]``) and b refused its ``x``."""
    a = _difference(("x", "w"), {"x": ["N", 8], "w": [1, 8]})
    b = _difference(("w", "x"), {"x": [3, 8], "w": [1, 8]})
    assert om.compare(a, b).to_dict()["equivalent"]
