"""check/inputs: which tensor feeds which ONNX input (declared_inputs, bind_inputs, feeds,
leaves), and inputs made up when none are given (random_inputs, index_ranges)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch
from onnx import TensorProto, helper

from onnx_modular.check.inputs import (
    DEFAULT_DIM,
    bind_inputs,
    declared_inputs,
    feeds,
    index_ranges,
    input_signature,
    leaves,
    random_inputs,
)
from onnx_modular.diagnostics import OnnxModularError


def _proto(*inputs: onnx.ValueInfoProto, initializer: str | None = None) -> onnx.ModelProto:
    """A model declaring ``inputs`` (and returning the first as is)."""
    inits = [helper.make_tensor(initializer, TensorProto.FLOAT, [1], [1.0])] \
        if initializer else []
    listed = list(inputs) + ([helper.make_tensor_value_info(initializer, TensorProto.FLOAT,
                                                            [1])] if initializer else [])
    node = helper.make_node("Identity", [inputs[0].name], ["out"])
    graph = helper.make_graph([node], "g", listed, [helper.make_tensor_value_info(
        "out", inputs[0].type.tensor_type.elem_type, None)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


X = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
IDS = helper.make_tensor_value_info("ids", TensorProto.INT64, [2, "seq"])


def test_initializers_listed_as_inputs_are_not_declared_inputs() -> None:
    proto = _proto(X, IDS, initializer="w")
    assert [i.name for i in declared_inputs(proto)] == ["x", "ids"]
    assert input_signature(proto) == [("float32", 2), ("int64", 2)]


def test_bind_by_name_when_every_name_matches_else_by_position() -> None:
    proto = _proto(X, IDS)
    x, ids = torch.randn(5, 3), torch.zeros(2, 7, dtype=torch.int64)
    by_name = bind_inputs(proto, [("ids", ids), ("x", x)])
    assert list(by_name) == ["x", "ids"] and by_name["x"].shape == (5, 3)
    by_position = bind_inputs(proto, [("a", x), ("b", ids)])
    assert by_position["ids"].dtype == np.int64


@pytest.mark.parametrize(("given", "message"), [
    ([("x", torch.randn(5, 3))], r"the ONNX model takes 2 input\(s\) \(x, ids\) but 1 tensor\(s\)"),
    ([("x", torch.randn(5, 3).double()), ("ids", torch.zeros(2, 7, dtype=torch.int64))],
     r"input #0 'x': the ONNX model expects float32, got a float64 tensor"),
    ([("x", torch.randn(5)), ("ids", torch.zeros(2, 7, dtype=torch.int64))],
     r"input #0 'x': the ONNX model expects rank 2, got a tensor of shape \[5\] \(rank 1\)"),
    ([("x", torch.randn(5, 3)), ("ids", torch.zeros(3, 7, dtype=torch.int64))],
     r"input #1 'ids': the ONNX model expects dimension 0 to be 2, got shape \[3, 7\]"),
], ids=["count", "dtype", "rank", "size"])
def test_a_mismatch_is_one_line(given: list, message: str) -> None:
    with pytest.raises(OnnxModularError, match=r"^error: OM0501 bad-input: " + message):
        bind_inputs(_proto(X, IDS), given)


class _Keywords(torch.nn.Module):
    def forward(self, x: torch.Tensor, pair: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor | None = None) -> torch.Tensor:
        return x


def test_leaves_name_single_tensors_by_parameter() -> None:
    x, a, b, m = (torch.zeros(1) for _ in range(4))
    found = leaves(_Keywords(), (x, (a, b)), {"mask": m})
    assert [name for name, _ in found] == ["x", None, None, "mask"]
    assert [t for _, t in found] == [x, a, b, m]


def test_feeds_by_position_by_name_and_by_keyword() -> None:
    proto = _proto(X, IDS)
    x, ids = np.ones((5, 3), np.float32), np.zeros((2, 7), np.int64)
    assert list(feeds(proto, [x, ids])) == ["x", "ids"]
    assert feeds(proto, {"ids": ids, "x": x})["ids"] is not None
    mixed = feeds(proto, [x], kwargs={"ids": torch.from_numpy(ids)})
    assert mixed["ids"].dtype == np.int64 and mixed["x"].shape == (5, 3)


def test_feeds_that_do_not_fit_are_refused() -> None:
    proto = _proto(X, IDS)
    with pytest.raises(OnnxModularError, match=r"inputs lack ids \(the models take x, ids\)"):
        feeds(proto, {"x": np.ones((5, 3), np.float32)})
    with pytest.raises(OnnxModularError, match=r"take 2 input\(s\) \(x, ids\) but 1 were"):
        feeds(proto, [np.ones((5, 3), np.float32)])


def test_random_inputs_fit_the_declared_types_and_shapes() -> None:
    flag = helper.make_tensor_value_info("flag", TensorProto.BOOL, [])
    drawn: list[str] = []
    made = random_inputs(_proto(X, IDS, flag), drawn=drawn)
    assert made["x"].shape == (DEFAULT_DIM, 3) and made["x"].dtype == np.float32
    assert made["ids"].shape == (2, DEFAULT_DIM) and set(np.unique(made["ids"])) <= {0, 1}
    assert made["flag"].shape == () and made["flag"].dtype == np.bool_
    assert drawn[1] == "ids: int64 2x4, integers in [0, 2) (indexes no table: a mask or flag)"
    again = random_inputs(_proto(X, IDS, flag))
    np.testing.assert_array_equal(made["x"], again["x"])  # seeded


def test_symbols_take_the_default_size_and_expressions_are_evaluated() -> None:
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["s0", "s0 + 1", "2*s0"])
    made = random_inputs(_proto(a))
    assert made["a"].shape == (DEFAULT_DIM, DEFAULT_DIM + 1, 2 * DEFAULT_DIM)


def test_a_dynamic_size_takes_the_other_model_s_static_one() -> None:
    static = helper.make_tensor_value_info("x", TensorProto.FLOAT, [7, 3])
    made = random_inputs(_proto(X), other=_proto(static))
    assert made["x"].shape == (7, 3)


def test_a_size_that_evaluates_too_large_is_refused() -> None:
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["s0*s0*s0*s0*s0*s0*s0*s0*s0*s0"
                                                               "*s0*s0*s0*s0*s0*s0*s0*s0*s0*s0"
                                                               "*s0*s0*s0*s0*s0"])
    with pytest.raises(OnnxModularError, match=r"input 'a' dimension 0 has the symbolic size"):
        random_inputs(_proto(a))


def test_token_ids_are_drawn_over_the_rows_of_their_table() -> None:
    ids = ir.Value(name="ids", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([2, 5]))
    small = ir.Value(name="wte", type=ir.TensorType(ir.DataType.FLOAT),
                     shape=ir.Shape([50, 8]))
    large = ir.Value(name="big", type=ir.TensorType(ir.DataType.FLOAT),
                     shape=ir.Shape([90, 8]))
    cast = ir.node("Cast", [ids], attributes={"to": ir.DataType.INT32})
    gathers = [ir.node("Gather", [small, cast.outputs[0]]), ir.node("Gather", [large, ids])]
    # a table of dynamic size bounds nothing
    mask = ir.Value(name="mask", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape(["n"]))
    use_mask = ir.node("Gather", [mask, mask])
    graph = ir.Graph([ids, mask], [*(g.outputs[0] for g in gathers), *use_mask.outputs],
                     nodes=[cast, *gathers, use_mask], initializers=[small, large],
                     opset_imports={"": 18})
    ranges = index_ranges(ir.Model(graph, ir_version=10))
    assert ranges == {"ids": (50, "wte")}  # the smaller table bounds it
    proto = _proto(helper.make_tensor_value_info("ids", TensorProto.INT64, [4000]))
    made = random_inputs(proto, ranges=ranges)
    assert made["ids"].min() >= 0 and made["ids"].max() == 49
