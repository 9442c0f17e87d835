"""emit/optimize (and emit/hold): weight folding before outlining, the optimizer after,
initializer clean-up."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch

import onnx_modular as om
from onnx_modular.emit.optimize import (
    SMALL_CONSTANT,
    collapse_reshapes,
    finish_inlined,
    fold_weights,
    optimize,
    plain_reshapes,
    remove_unused_initializers,
    share_equal_constants,
)
from onnx_modular.emit.walk import all_nodes
from onnx_modular.leaves._weights import StridedTensor

from .graphs import OPSET, call, function, fx, model, run, value, weight

X = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)


def _transposed(shape: tuple[int, int]) -> ir.Model:
    """``y = x @ Transpose(w)``: the transpose of weight ``w`` folds."""
    x, w = value("x", (2, shape[1])), weight("w", shape)
    t = fx("Transpose", [w], "t", shape[::-1], perm=[1, 0])
    mm = fx("MatMul", [x, t.outputs[0]], "y", (2, shape[0]))
    return model([x], mm.outputs, [t, mm], [w])


def test_a_folded_weight_stays_an_initializer_however_small() -> None:
    m = _transposed((3, 4))
    expected = run(m, x=X)[0]
    fold_weights(m, {"w"})
    assert [n.op_type for n in m.graph] == ["MatMul"]
    assert m.graph.node(0).inputs[1].is_initializer()
    np.testing.assert_allclose(run(m, x=X)[0], expected, rtol=1e-6)


def test_a_small_folded_constant_goes_back_into_the_graph_as_a_node() -> None:
    m = _transposed((3, 4))  # 12 elements, and "w" is not named a weight
    fold_weights(m, frozenset())
    assert [n.op_type for n in m.graph] == ["Constant", "MatMul"]
    assert not m.graph.initializers


def test_a_large_folded_constant_stays_an_initializer_unless_splat() -> None:
    assert SMALL_CONSTANT < 5 * 4
    m = _transposed((5, 4))
    fold_weights(m, frozenset())
    assert [n.op_type for n in m.graph] == ["MatMul"] and len(m.graph.initializers) == 1
    splat = _transposed((5, 4))
    splat.graph.initializers["w"].const_value = ir.tensor(np.zeros((5, 4), np.float32),
                                                          name="w")
    fold_weights(splat, frozenset())
    assert [n.op_type for n in splat.graph] == ["Constant", "MatMul"]


def test_a_folded_view_is_written_in_blocks() -> None:
    m = _transposed((5, 4))
    fold_weights(m, {"w"})
    (folded,) = m.graph.initializers.values()
    tensor = folded.const_value
    assert not tensor.raw.flags.c_contiguous  # the transpose of w, a view
    assert isinstance(tensor, StridedTensor)


def test_a_value_computed_from_a_weight_is_a_weight_too() -> None:
    """``1 + weight`` (an RMSNorm's scale): small, but baked into a body it would make every
    layer a function of its own."""
    x, w = value("x"), weight("norm.weight", (4,))
    one = ir.node("Constant", [], attributes={"value": ir.tensor(np.float32(1.0))})
    scale = fx("Add", [w, one.outputs[0]], "scale", (4,))
    y = fx("Mul", [x, scale.outputs[0]], "y")
    m = model([x], y.outputs, [one, scale, y], [w])
    fold_weights(m, {"norm.weight"})
    assert [n.op_type for n in m.graph] == ["Mul"]
    assert "scale" in m.graph.initializers


def test_an_input_constant_in_only_some_calls_of_a_class_is_held() -> None:
    """``layers.0`` reads a computed constant where ``layers.1`` reads an activation: held,
    it stays a call input, so both calls keep one body."""
    def build() -> tuple[ir.Model, list[tuple]]:
        x = value("x")
        c = ir.node("Constant", [], attributes={"value": ir.tensor(np.ones((2, 4),
                                                                          np.float32))})
        start = fx("Neg", [c.outputs[0]], "start")
        a0 = fx("Add", [start.outputs[0], x], "a0")
        a1 = fx("Add", [a0.outputs[0], x], "a1")
        m = model([x], a1.outputs, [c, start, a0, a1])
        per_node = [(), (), (call("layers.0"),), (call("layers.1"),)]
        return m, per_node

    held, per_node = build()
    fold_weights(held, frozenset(), per_node)
    assert "start" in held.graph.initializers
    assert all(n.domain == "" for n in held.graph)  # no hold is left behind
    np.testing.assert_array_equal(run(held, x=X)[0], X - 1 + X)
    plain, _ = build()
    fold_weights(plain, frozenset())
    assert "start" not in plain.graph.initializers  # a Constant node, baked into layers.0


def test_collapse_reshapes_inside_function_bodies() -> None:
    def body(target: list[int]) -> ir.Model:
        f = function("F", ["Identity"], shape=(2, 4))
        graph = f.graph
        x = graph.inputs[0]
        a = ir.node("Constant", [], attributes={"value": ir.tensor(np.array([8], np.int64))})
        b = ir.node("Constant", [], attributes={"value": ir.tensor(np.array(target,
                                                                            np.int64))})
        inner = ir.node("Reshape", [x, a.outputs[0]])
        outer = ir.node("Reshape", [inner.outputs[0], b.outputs[0]])
        for node in list(graph):
            graph.remove(node, safe=False)
        graph.extend([a, b, inner, outer])
        graph.outputs[0] = outer.outputs[0]
        m = model([value("x")], [], [], functions=[f], opsets={"": OPSET, "pkg": 1})
        caller = ir.node("F", [m.graph.inputs[0]], domain="pkg")
        m.graph.append(caller)
        m.graph.outputs.append(caller.outputs[0])
        return m

    m = body([4, 2])
    assert collapse_reshapes(m) == 1
    f = next(iter(m.functions.values()))
    assert [n.op_type for n in f if n.op_type == "Reshape"] == ["Reshape"]
    np.testing.assert_array_equal(run(m, x=X)[0], X.reshape(4, 2))
    assert collapse_reshapes(body([0, 2])) == 0  # a 0 copies the intermediate shape


def test_equal_constants_of_a_body_become_one() -> None:
    """Two Reshapes to [4, 2] and one to [8]: the two equal shapes become one Constant, the
    other value, a float with the same bytes' length and a body output keep their own."""
    f = function("F", ["Identity"], shape=(2, 4))
    graph = f.graph
    x = graph.inputs[0]

    def const(array: np.ndarray) -> ir.Node:
        return ir.node("Constant", [], attributes={"value": ir.tensor(array)})

    a, b, c = (const(np.array(v, np.int64)) for v in ([4, 2], [4, 2], [8]))
    other_dtype = const(np.array([4, 2], np.int32))
    out = const(np.array([4, 2], np.int64))
    r1, r2 = ir.node("Reshape", [x, a.outputs[0]]), ir.node("Reshape", [x, b.outputs[0]])
    flat = ir.node("Reshape", [r1.outputs[0], c.outputs[0]])
    add = ir.node("Add", [r1.outputs[0], r2.outputs[0]])
    cast = ir.node("Cast", [other_dtype.outputs[0]], attributes={"to": 7})
    for node in list(graph):
        graph.remove(node, safe=False)
    graph.extend([a, b, c, other_dtype, out, r1, r2, flat, add, cast])
    graph.outputs[:] = [add.outputs[0], flat.outputs[0], cast.outputs[0], out.outputs[0]]
    m = model([value("x")], [], [], functions=[f], opsets={"": OPSET, "pkg": 1})
    caller = ir.node("F", [m.graph.inputs[0]], domain="pkg", num_outputs=4)
    m.graph.append(caller)
    m.graph.outputs.extend(caller.outputs)
    assert share_equal_constants(graph) == 1
    assert [n.op_type for n in graph].count("Constant") == 4
    assert r2.inputs[1] is a.outputs[0] and out.outputs[0] in graph.outputs
    results = run(m, x=X)
    np.testing.assert_array_equal(results[0], 2 * X.reshape(4, 2))
    np.testing.assert_array_equal(results[1], X.reshape(8))
    np.testing.assert_array_equal(results[3], [4, 2])
    assert share_equal_constants(graph) == 0


def test_string_constants_are_compared_by_their_text() -> None:
    """A string tensor's numpy bytes are pointers: equal texts are one, others stay."""
    def const(*texts: str) -> ir.Node:
        return ir.node("Constant", [], attributes={"value": ir.tensor(np.array(texts,
                                                                               dtype=object))})

    nodes = [const("ab", "cd"), const("ab", "cd"), const("ab", "ce")]
    graph = ir.Graph([], [], nodes=nodes)
    users = [ir.node("Identity", [n.outputs[0]]) for n in nodes]
    graph.extend(users)
    graph.outputs.extend(u.outputs[0] for u in users)
    assert share_equal_constants(graph) == 1
    assert [u.inputs[0].producer() for u in users] == [nodes[0], nodes[0], nodes[2]]


def test_constants_of_two_onnx_types_with_one_numpy_type_stay_apart() -> None:
    """FLOAT8E4M3FN and FLOAT8E4M3FNUZ are both 1-byte void types to numpy: the same bits
    are 1.0 in one and 0.5 in the other, and stay two Constants."""
    def const(dtype: ir.DataType) -> ir.Node:
        tensor = ir.Tensor(np.array([0x38], np.uint8).view(dtype.numpy()), dtype=dtype)
        return ir.node("Constant", [], attributes={"value": tensor})

    nodes = [const(ir.DataType.FLOAT8E4M3FN), const(ir.DataType.FLOAT8E4M3FNUZ)]
    casts = [ir.node("Cast", [n.outputs[0]], attributes={"to": 1}) for n in nodes]
    m = model([], [c.outputs[0] for c in casts], [*nodes, *casts], opsets={"": 21})
    assert share_equal_constants(m.graph) == 0
    assert [c.inputs[0].producer() for c in casts] == nodes
    assert [float(v[0]) for v in run(m)] == [1.0, 0.5]


def test_plain_reshapes_only_where_allowzero_cannot_matter() -> None:
    """allowzero=1 -> 0 (which ONNX Runtime needs to fuse contiguous Reshapes) only for a
    constant shape without 0: with a 0 entry, or a shape computed at run time, the two
    forms can differ."""
    x = value("x", (2, 4))
    nodes, outputs = [], []
    for name, target in (("plain", [4, 2]), ("zero", [0, 4]), ("computed", None)):
        if target is None:
            shape = ir.node("Shape", [x])
            nodes.append(shape)
            shape_value = shape.outputs[0]
        else:
            constant = ir.node("Constant", [], attributes={
                "value": ir.tensor(np.array(target, np.int64))})
            nodes.append(constant)
            shape_value = constant.outputs[0]
        reshape = ir.node("Reshape", [x, shape_value], attributes={"allowzero": 1},
                          name=name)
        reshape.outputs[0].name = f"y_{name}"
        nodes.append(reshape)
        outputs.append(reshape.outputs[0])
    m = model([x], outputs, nodes, [])
    assert plain_reshapes(m) == 1
    allowzero = {n.name: n.attributes["allowzero"].as_int() for n in m.graph
                 if n.op_type == "Reshape"}
    assert allowzero == {"plain": 0, "zero": 1, "computed": 1}
    zero = next(n for n in m.graph if n.name == "zero")  # [0, 4] is no shape for (2, 4)
    m.graph.outputs.remove(zero.outputs[0])
    m.graph.remove(zero, safe=True)
    np.testing.assert_array_equal(run(m, x=X)[0], X.reshape(4, 2))


def test_optimize_removes_dead_code_and_unused_weights() -> None:
    x, w, unused = value("x"), weight("w"), weight("unused", seed=3)
    ident = fx("Identity", [x], "i")
    mm = fx("MatMul", [ident.outputs[0], w], "y")
    dead = fx("Neg", [x], "dead")
    m = model([x], mm.outputs, [ident, mm, dead], [w, unused])
    expected = run(m, x=X)[0]
    optimize(m)
    assert [n.op_type for n in m.graph] == ["MatMul"]
    assert list(m.graph.initializers) == ["w"]
    np.testing.assert_allclose(run(m, x=X)[0], expected, rtol=1e-6)


def test_two_module_calls_on_one_input_stay_two_calls_and_other_nodes_are_shared() -> None:
    """The optimizer's common-subexpression step made ``a(x)`` and ``b(x)`` of one
    weightless class one call read twice: the file lost module ``b``'s call."""
    x = value("x")
    act = function("Act", ["Tanh"])
    a = ir.node("Act", [x], domain="pkg", name="a")
    b = ir.node("Act", [x], domain="pkg", name="b")
    n1, n2 = fx("Neg", [x], "n1"), fx("Neg", [x], "n2")
    add = fx("Add", [a.outputs[0], b.outputs[0]], "s")
    out = fx("Add", [add.outputs[0], n1.outputs[0]], "t")
    tail = fx("Add", [out.outputs[0], n2.outputs[0]], "y")
    m = model([x], tail.outputs, [a, b, n1, n2, add, out, tail], functions=[act],
              opsets={"": OPSET, "pkg": 1})
    expected = 2 * np.tanh(X) - 2 * X
    optimize(m)
    assert [n.name for n in m.graph if n.op_type == "Act"] == ["a", "b"]
    assert all(not n.attributes for n in m.graph if n.op_type == "Act")  # tag removed
    assert [n.op_type for n in m.graph].count("Neg") == 1  # other nodes still shared
    np.testing.assert_allclose(run(m, x=X)[0], expected, rtol=1e-6, atol=1e-6)


def test_remove_unused_initializers_keeps_graph_outputs() -> None:
    x, w, out = value("x"), weight("w"), weight("returned", seed=2)
    y = fx("MatMul", [x, w], "y")
    m = model([x], [*y.outputs, out], [y], [w, out, weight("gone", seed=4)])
    remove_unused_initializers(m.graph)
    assert sorted(m.graph.initializers) == ["returned", "w"]


def test_finish_inlined_shares_one_initializer_per_constant_value() -> None:
    x = value("x")
    nodes: list[ir.Node] = []
    current = x
    for i in range(3):
        c = ir.node("Constant", [], attributes={"value": ir.tensor(np.float32(2.0))})
        mul = fx("Mul", [current, c.outputs[0]], f"m{i}")
        nodes += [c, mul]
        current = mul.outputs[0]
    m = model([x], [current], nodes)
    finish_inlined(m)
    assert [n.op_type for n in m.graph] == ["Mul"] * 3
    assert len(m.graph.initializers) == 1
    np.testing.assert_array_equal(run(m, x=X)[0], X * 8)


def test_an_untyped_value_computed_from_a_weight_is_a_weight_too() -> None:
    """Unoptimized, torch.onnx leaves a GroupNorm's ``Unsqueeze(weight)`` untyped: small,
    folded, it must still enter the call as an input, or each call gets its own body."""
    x, w = value("x", (2, 4, 1)), weight("norm.weight", (4,))
    axes = ir.node("Constant", [], attributes={"value": ir.tensor(np.array([1], np.int64))})
    scale = fx("Unsqueeze", [w, axes.outputs[0]], "scale", None)
    scale.outputs[0].type = None
    y = fx("Mul", [x, scale.outputs[0]], "y", (2, 4, 1))
    m = model([x], y.outputs, [axes, scale, y], [w])
    fold_weights(m, {"norm.weight"})
    assert [n.op_type for n in m.graph] == ["Mul"]
    assert "scale" in m.graph.initializers


def test_an_integer_table_sliced_from_a_weight_goes_into_the_body() -> None:
    """Position ids sliced from a buffer are an index table, not a weight."""
    ids = ir.Value(name="ids", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([8]),
                   const_value=ir.tensor(np.arange(8, dtype=np.int64), name="ids"))
    start, end = (ir.node("Constant", [], attributes={"value": ir.tensor(np.array([v]))})
                  for v in (0, 4))
    sliced = fx("Slice", [ids, start.outputs[0], end.outputs[0]], "sliced", None)
    sliced.outputs[0].type = None
    x = value("x", (8, 4))
    table = fx("Gather", [x, sliced.outputs[0]], "y", (4, 4))
    m = model([x], table.outputs, [start, end, sliced, table], [ids])
    fold_weights(m, {"ids"})
    assert "sliced" not in m.graph.initializers
    assert any(n.op_type == "Constant" and n.outputs[0].name == "sliced" for n in m.graph)


def test_a_loops_zero_state_stays_an_input_of_the_first_call() -> None:
    """``h = zeros; for _ in range(3): h = step(x, h)``: folded into the first call, the
    zero state would make it a function of its own (``Step: 4 inputs (vs 3)``)."""
    from onnx_modular.emit.outline import outline
    from onnx_modular.leaves.metadata import fx_name

    from .test_hold import _loop

    m, nodes, chains = _loop()
    expected = run(m, x=X)[0]
    fold_weights(m, frozenset(), chains)
    by_fx = {fx_name(n): c for n, c in zip(nodes, chains, strict=True) if fx_name(n)}
    report = outline(m, by_fx)
    assert report.functions == 1 and report.calls == 3
    assert all(len(n.inputs) == 2 for n in m.graph)  # x and h, the zeros an initializer
    np.testing.assert_allclose(run(m, x=X)[0], expected, rtol=1e-6)


def test_a_constant_cast_like_an_activation_stays_in_the_body() -> None:
    """``CastLike(bound, y)`` reads only ``y``'s type: a clamp bound after a Linear (``y``
    computed from its weight) is no weight, or each layer's bounds would be inputs."""
    x, w = value("x"), weight("w")
    y = fx("MatMul", [x, w], "y")
    bound = ir.node("Constant", [], attributes={"value": ir.tensor(np.float32(0.5))})
    cast = fx("CastLike", [bound.outputs[0], y.outputs[0]], "bound_cast", None)
    cast.outputs[0].type = None
    out = fx("Min", [y.outputs[0], cast.outputs[0]], "out")
    m = model([x], out.outputs, [y, bound, cast, out], [w])
    fold_weights(m, {"w"})
    assert "bound_cast" not in m.graph.initializers


class _Upsampled(torch.nn.Module):
    """torchlib writes ``interpolate``'s scales as ``Constant(value_floats=[1, 1, 2, 2])``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.nn.functional.interpolate(x, scale_factor=2.0))


def test_constants_are_tensors_so_onnxslim_keeps_a_body_loadable(tmp_path) -> None:
    """onnxslim rewrote a body's ``value_floats`` as a double tensor: ORT refused the file
    (diffusers' Upsample2D in VAE and UNet files)."""
    onnxslim = pytest.importorskip("onnxslim")
    torch.manual_seed(0)
    model = torch.nn.Sequential(_Upsampled(), _Upsampled()).eval()
    x = torch.randn(1, 4, 3, 3)
    result = om.export(model, (x,), functions=[_Upsampled])
    constants = [n for n in all_nodes(result.model) if n.op_type == "Constant"]
    assert constants and all(list(n.attributes) == ["value"] for n in constants)
    result.save(tmp_path / "up.onnx")
    onnxslim.slim(str(tmp_path / "up.onnx"), str(tmp_path / "slim.onnx"))
    assert onnx.load(str(tmp_path / "slim.onnx")).functions
    session = ort.InferenceSession(str(tmp_path / "slim.onnx"),
                                   providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-5, atol=1e-5)
