"""Batching rewrites on hand-built part models: the plan, the rewrite run in ORT, the undo."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

from onnx_modular.parts.batching import BatchPlan, batched_parts, plan_batching, plan_scalars

F, I64 = ir.DataType.FLOAT, ir.DataType.INT64


@dataclasses.dataclass
class Part:
    name: str
    model: ir.Model


def v(name: str, shape: list, dtype: ir.DataType = F) -> ir.Value:
    return ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(shape))


def _out(node: ir.Node, name: str, shape: list, dtype: ir.DataType = F) -> ir.Value:
    out = node.outputs[0]
    out.name, out.type, out.shape = name, ir.TensorType(dtype), ir.Shape(shape)
    return out


def _model(inputs, outputs, nodes) -> ir.Model:
    return ir.Model(ir.Graph(inputs, outputs, nodes=nodes, opset_imports={"": 18}),
                    ir_version=10)


def _split(size_via_gather: bool = False):
    """``y = relu(x) * batch + table`` cut after the relu: part ``a`` passes ``h`` (batched),
    ``bs`` (the batch size, 0-d) and ``table`` (a constant ``[4]``) to part ``b``."""
    def first(x):
        relu = ir.node("Relu", [x])
        h = _out(relu, "h", ["B", 4])
        if size_via_gather:
            shape = ir.node("Shape", [x])
            _out(shape, "shp", [2], I64)
            zero = ir.node("Constant", [], attributes={"value": ir.tensor(np.array(0))})
            _out(zero, "zero", [], I64).const_value = ir.tensor(np.array(0))  # as folded
            size = ir.node("Gather", [shape.outputs[0], zero.outputs[0]], attributes={"axis": 0})
            sized = [shape, zero, size]
        else:
            shape = ir.node("Shape", [x], attributes={"start": 0, "end": 1})
            _out(shape, "shp", [1], I64)
            size = ir.node("Squeeze", [shape.outputs[0]])
            sized = [shape, size]
        bs = _out(size, "bs", [], I64)
        const = ir.node("Constant", [], attributes={
            "value": ir.tensor(np.arange(4, dtype=np.float32))})
        table = _out(const, "table", [4])
        return [relu, *sized, const], h, bs, table

    def second(h, bs, table):
        cast = ir.node("Cast", [bs], attributes={"to": F})
        _out(cast, "bsf", [])
        mul = ir.node("Mul", [h, cast.outputs[0]])
        _out(mul, "hb", ["B", 4])
        add = ir.node("Add", [mul.outputs[0], table])
        return [cast, mul, add], _out(add, "y", ["B", 4])

    x = v("x", ["B", 4])
    nodes_a, h, bs, table = first(x)
    nodes_b, y = second(h, bs, table)
    whole = _model([x], [y], [*nodes_a, *nodes_b])
    xa = v("x", ["B", 4])
    na, ha, bsa, ta = first(xa)
    part_a = Part("a", _model([xa], [ha, bsa, ta], na))
    hb, bsb, tb = v("h", ["B", 4]), v("bs", [], I64), v("table", [4])
    nb, yb = second(hb, bsb, tb)
    part_b = Part("b", _model([hb, bsb, tb], [yb], nb))
    return whole, [part_a, part_b]


def _run_chain(parts: list[Part], x: np.ndarray) -> np.ndarray:
    env = {"x": x}
    for part in parts:
        proto = ir.serde.serialize_model(part.model)
        session = ort.InferenceSession(proto.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        feeds = {i.name: env[i.name] for i in session.get_inputs()}
        env.update(zip(names, session.run(None, feeds), strict=True))
    return env["y"]


def _interface(part: Part) -> tuple[list, list]:
    g = part.model.graph
    return [(i.name, list(i.shape)) for i in g.inputs], [(o.name, list(o.shape))
                                                         for o in g.outputs]


@pytest.mark.parametrize("via_gather", [False, True])
def test_the_batch_size_is_recomputed_and_a_shared_table_passed_in_rows(via_gather) -> None:
    whole, parts = _split(via_gather)
    plan = plan_batching(whole.graph, parts)
    assert plan.symbol == "B" and plan.reason == ""
    assert plan.batch_sizes == {"bs"} and plan.shared == {"table"} and not plan.scalars


def test_the_rewritten_parts_compute_the_same_and_are_restored_after() -> None:
    whole, parts = _split()
    plan = plan_batching(whole.graph, parts)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    expected = _run_chain(parts, x)
    before = [_interface(p) for p in parts]
    with batched_parts(parts, plan):
        a_out = [o.name for o in parts[0].model.graph.outputs]
        b_in = _interface(parts[1])[0]
        assert a_out == ["h", "table__om_rows"]  # the batch size is no longer passed
        assert b_in == [("h", [ir.SymbolicDim("B"), 4]),
                        ("table__om_rows", [ir.SymbolicDim("B"), 4])]

        np.testing.assert_array_equal(_run_chain(parts, x), expected)
    assert [_interface(p) for p in parts] == before
    np.testing.assert_array_equal(_run_chain(parts, x), expected)
    assert not [o.name for p in parts for n in p.model.graph for o in n.outputs
                if "__om_" in (o.name or "")]


def test_scalars_cross_a_cut_as_one_element_and_come_back() -> None:
    whole, parts = _split()
    plan = plan_scalars(whole.graph, parts)
    assert plan.scalars == {"bs"} and plan.symbol is None
    x = np.ones((2, 4), np.float32)
    expected = _run_chain(parts, x)
    with batched_parts(parts, plan):
        outs = {o.name: list(o.shape) for o in parts[0].model.graph.outputs}
        assert outs["bs__om_1"] == [1]
        assert [i.name for i in parts[1].model.graph.inputs] == ["h", "bs__om_1", "table"]
        np.testing.assert_array_equal(_run_chain(parts, x), expected)
    assert [o.name for o in parts[0].model.graph.outputs] == ["h", "bs", "table"]


def test_an_empty_plan_changes_nothing() -> None:
    _, parts = _split()
    graph = parts[0].model.graph
    nodes, outputs = list(graph), list(graph.outputs)
    with batched_parts(parts, BatchPlan("B")):
        assert list(graph) == nodes and list(graph.outputs) == outputs


def _reason(whole: ir.Model, parts: list[Part]) -> str:
    plan = plan_batching(whole.graph, parts)
    assert plan.symbol is None
    return plan.reason


def test_no_dynamic_first_dimension_cannot_batch() -> None:
    x = v("x", [2, 4])
    relu = ir.node("Relu", [x])
    whole = _model([x], [_out(relu, "y", [2, 4])], [relu])
    assert "no dynamic first dimension" in _reason(whole, [])
    assert "no dynamic first dimension" in _reason(_model([], [], []), [])


def test_an_output_without_the_batch_dimension_cannot_batch() -> None:
    whole, parts = _split()
    whole.graph.outputs[0].shape = ir.Shape([4, "B"])
    assert _reason(whole, parts) == ("the model's 'y' has shape [4, 'B'], without the batch "
                                     "dimension 'B' first")


def test_a_request_dependent_tensor_without_the_batch_dimension_cannot_batch() -> None:
    whole, parts = _split()
    parts[0].model.graph.outputs[0].shape = ir.Shape([4, "B"])  # h reads x
    assert _reason(whole, parts) == ("'h' of part 'a' has shape [4, 'B'], without the batch "
                                     "dimension 'B' first, and depends on the request")


def test_a_part_passing_a_rewritten_value_on_unchanged_cannot_batch() -> None:
    whole, parts = _split()
    graph = parts[1].model.graph
    graph.outputs.append(graph.inputs[2])  # table straight through
    assert _reason(whole, parts) == "part 'b' passes 'table' on unchanged"


def test_a_part_without_a_batched_input_cannot_batch() -> None:
    whole, parts = _split()
    parts[1].model.graph.inputs.pop(0)  # b reads bs and table only
    assert _reason(whole, parts) == ("part 'b' reads no tensor with the batch dimension to "
                                     "take the batch size from")


def test_a_part_passing_only_the_batch_size_cannot_batch() -> None:
    whole, parts = _split()
    outputs = parts[0].model.graph.outputs
    del outputs[2], outputs[0]  # a passes bs alone
    assert _reason(whole, parts) == "part 'a' only passes the batch size on"


def test_a_whole_shape_is_not_the_batch_size() -> None:
    whole, parts = _split()
    shape = next(n for n in whole.graph if n.op_type == "Shape")
    del shape.attributes["end"]  # Shape(x): every dimension, not the first
    assert _reason(whole, parts) == ("'bs' of part 'a' has shape [], without the batch "
                                     "dimension 'B' first, and depends on the request")
