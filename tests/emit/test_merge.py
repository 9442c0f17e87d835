"""emit/merge: functions of one class whose bodies came out equal become one, to a
fixpoint (merge_equal_functions), names dense again and the outline report kept true."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from onnx_modular.emit.merge import merge_equal_functions
from onnx_modular.emit.outline import outline

from .graphs import calling, function, model, run, two_blocks, value

X = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)


def test_equal_bodies_of_one_class_merge_and_calls_follow() -> None:
    first, second = function("Block", ["Relu"]), function("Block_1", ["Relu"])
    m = calling([first, second])
    assert merge_equal_functions(m) == 1
    assert [f.name for f in m.functions.values()] == ["Block"]
    assert [n.op_type for n in m.graph] == ["Block", "Block"]
    np.testing.assert_array_equal(run(m, x=X)[0], np.maximum(X, 0))


def test_the_count_is_of_functions_merged_away() -> None:
    m = calling([function(f"Block{suffix}", ["Relu"]) for suffix in ("", "_1", "_2")])
    assert merge_equal_functions(m) == 2
    assert merge_equal_functions(m) == 0  # nothing left to merge


def test_bodies_differing_only_in_shapes_merge_and_lose_their_types() -> None:
    first = function("Block", ["Relu"], shape=(2, 4))
    second = function("Block_1", ["Relu"], shape=(3, 4))
    x = value("x")
    a = ir.node("Block", [x], domain="pkg")
    m = model([x], a.outputs, [a], functions=[first, second], opsets={"": 18, "pkg": 1})
    assert merge_equal_functions(m) == 1
    (kept,) = m.functions.values()
    assert kept.inputs[0].shape is None and kept.inputs[0].type is None


def test_functions_of_different_classes_never_merge() -> None:
    m = calling([function("Block", ["Relu"]), function("Mlp", ["Relu"], doc="pkg.Mlp")])
    assert merge_equal_functions(m) == 0
    assert len(m.functions) == 2


def test_different_bodies_stay_apart_and_names_stay_dense() -> None:
    functions = [function("Block", ["Relu"]), function("Block_1", ["Neg"]),
                 function("Block_2", ["Neg"])]
    m = calling(functions)
    assert merge_equal_functions(m) == 1
    assert [f.name for f in m.functions.values()] == ["Block", "Block_1"]
    assert [n.op_type for n in m.graph] == ["Block", "Block_1", "Block_1"]
    np.testing.assert_array_equal(run(m, x=X)[0], np.maximum(X, 0))  # Relu, Neg, Neg


def test_merging_updates_the_outline_report() -> None:
    m, chains = two_blocks(second_shape=(4, 4))
    report = outline(m, chains, dedupe=False)
    assert report.function_of_call == {"layers.0": "Block", "layers.1": "Block_1"}
    assert merge_equal_functions(m, report) == 1
    assert report.function_of_call == {"layers.0": "Block", "layers.1": "Block"}
    assert report.functions == 1


def test_merged_parents_merge_in_turn() -> None:
    """Children merging makes their callers' bodies equal: the fixpoint merges those too."""
    act, act_1 = function("Act", ["Relu"], doc="pkg.Act"), function("Act_1", ["Relu"],
                                                                    doc="pkg.Act")
    parents = []
    for name, child in (("Block", act), ("Block_1", act_1)):
        x = value("x")
        node = ir.node(child.name, [x], domain="pkg")
        graph = ir.Graph([x], node.outputs, nodes=[node], opset_imports={"": 18, "pkg": 1},
                         name=name)
        parent = ir.Function("pkg", name, graph=graph, attributes=[])
        parent.doc_string = "pkg.Block"
        parents.append(parent)
    m = calling(parents)
    for f in (act, act_1):
        m.functions[f.identifier()] = f
    assert merge_equal_functions(m) == 2
    assert sorted(f.name for f in m.functions.values()) == ["Act", "Block"]


def _scale_model(values: list[float], *, in_branch: bool) -> ir.Model:
    """Two functions of one class, ``y = x * c``, c differing: a ``Constant(value_float=)``
    in the body, or a scale inside an ``If`` branch."""
    import onnx
    from onnx import helper as h

    def body(name: str, v: float) -> onnx.FunctionProto:
        if not in_branch:
            nodes = [h.make_node("Constant", [], ["c"], value_float=v),
                     h.make_node("Mul", ["x", "c"], ["y"])]
        else:
            out = h.make_tensor_value_info("t", onnx.TensorProto.FLOAT, None)
            branch = h.make_graph(
                [h.make_node("Constant", [], ["k"],
                             value=h.make_tensor("k", onnx.TensorProto.FLOAT, [], [v])),
                 h.make_node("Mul", ["x", "k"], ["t"])], "then", [], [out])
            other = h.make_graph([h.make_node("Identity", ["x"], ["t"])], "else", [], [out])
            nodes = [h.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                     h.make_node("Constant", [], ["zero"], value_float=0.0),
                     h.make_node("Greater", ["s", "zero"], ["p"]),
                     h.make_node("If", ["p"], ["y"], then_branch=branch, else_branch=other)]
        return h.make_function("pkg", name, ["x"], ["y"], nodes,
                               opset_imports=[h.make_opsetid("", 18)], doc_string="Scale")

    names = [f"F{i}" for i in range(len(values))]
    graph = h.make_graph([h.make_node(n, ["x"], [f"y{i}"], domain="pkg")
                          for i, n in enumerate(names)], "g",
                         [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                         [h.make_tensor_value_info(f"y{i}", onnx.TensorProto.FLOAT, [2])
                          for i in range(len(values))])
    proto = h.make_model(graph, functions=[body(n, v) for n, v in zip(names, values)],
                         opset_imports=[h.make_opsetid("", 18), h.make_opsetid("pkg", 1)])
    return ir.serde.deserialize_model(proto)


def _outputs(m: ir.Model) -> list[np.ndarray]:
    import onnxruntime

    session = onnxruntime.InferenceSession(ir.serde.serialize_model(m).SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    return session.run(None, {"x": np.ones(2, np.float32)})


@pytest.mark.parametrize("in_branch", [False, True])
def test_scalars_merging_cannot_make_per_call_are_compared_by_value(in_branch: bool) -> None:
    """Merging bodies that differ in float scalars gives each call its value only for the
    body's own ``Constant(value=)`` and attributes: a ``value_float`` Constant, or a scale
    inside an If branch (a ``torch.cond`` of two instances), keyed by kind only, made every
    call compute the first instance's value (2.0 where torch gave 3.0)."""
    m = _scale_model([2.0, 3.0], in_branch=in_branch)
    expected = _outputs(m)
    assert merge_equal_functions(m) == 0
    assert len(m.functions) == 2
    got = _outputs(m)
    assert [float(g[0]) for g in got] == [float(e[0]) for e in expected] == [2.0, 3.0]


@pytest.mark.parametrize("in_branch", [False, True])
def test_equal_scalars_in_those_places_still_merge(in_branch: bool) -> None:
    m = _scale_model([2.0, 2.0], in_branch=in_branch)
    assert merge_equal_functions(m) == 1
    assert [float(g[0]) for g in _outputs(m)] == [2.0, 2.0]


def _gated(name: str, shared: bool, second_op: str = "Sigmoid") -> ir.Function:
    """``a * second_op(b)`` of class pkg.Block; ``shared``: one input read as ``a`` and
    ``b`` (the body outlined for a call ``block(h, h)``)."""
    a = value("a")
    b = a if shared else value("b")
    gate = ir.node(second_op, [b])
    mul = ir.node("Mul", [a, gate.outputs[0]])
    graph = ir.Graph([a] if shared else [a, b], mul.outputs, nodes=[gate, mul],
                     opset_imports={"": 18}, name=name)
    f = ir.Function("pkg", name, graph=graph, attributes=[])
    f.doc_string = "pkg.Block"
    return f


def _two_calls(full: ir.Function, small: ir.Function) -> ir.Model:
    """``full(x, y)`` then ``small(h)`` on its result."""
    x, y = value("x"), value("y")
    first = ir.node(full.name, [x, y], domain="pkg", name="call_0")
    second = ir.node(small.name, [first.outputs[0]], domain="pkg", name="call_1")
    out = second.outputs[0]
    out.name, out.type, out.shape = "out", ir.TensorType(ir.DataType.FLOAT), ir.Shape((2, 4))
    return model([x, y], [out], [first, second], functions=[full, small],
                 opsets={"": 18, "pkg": 1})


def test_a_call_passing_one_tensor_twice_shares_its_class_function() -> None:
    """``layer(h, h)`` read one value where its siblings read two: its body had one input
    less and was a function of its own (differs_from said only '5 inputs (vs 6)')."""
    x, y = (np.random.default_rng(i).standard_normal((2, 4)).astype(np.float32)
            for i in (1, 2))
    m = _two_calls(_gated("Block", shared=False), _gated("Block_1", shared=True))
    assert merge_equal_functions(m) == 1
    assert [f.name for f in m.functions.values()] == ["Block"]
    second = list(m.graph)[1]
    assert second.op_type == "Block" and second.inputs[0] is second.inputs[1]
    h = x / (1 + np.exp(-y))
    np.testing.assert_allclose(run(m, x=x, y=y)[0], h / (1 + np.exp(-h)), rtol=1e-6)


def test_a_body_that_is_not_the_fuller_one_with_two_inputs_shared_stays_apart() -> None:
    m = _two_calls(_gated("Block", shared=False),
                   _gated("Block_1", shared=True, second_op="Tanh"))
    assert merge_equal_functions(m) == 0
    assert len(m.functions) == 2


def _attention_like(name: str, inputs: int) -> ir.Function:
    """``q * Sigmoid(k) + Tanh(v)`` of class pkg.Attn, its three operands read from
    ``inputs`` distinct inputs (1: a call ``attn(x, x, x)``; 2: ``attn(x, y, y)``)."""
    q = value("q")
    k = q if inputs == 1 else value("k")
    v = k if inputs < 3 else value("v")
    gate, squash = ir.node("Sigmoid", [k]), ir.node("Tanh", [v])
    mul = ir.node("Mul", [q, gate.outputs[0]])
    add = ir.node("Add", [mul.outputs[0], squash.outputs[0]])
    graph = ir.Graph(list(dict.fromkeys([q, k, v])), add.outputs,
                     nodes=[gate, squash, mul, add], opset_imports={"": 18}, name=name)
    f = ir.Function("pkg", name, graph=graph, attributes=[])
    f.doc_string = "pkg.Attn"
    return f


@pytest.mark.parametrize("inputs", [1, 2])
def test_a_call_passing_one_tensor_three_times_shares_its_class_function(inputs: int) -> None:
    """``attn(h, h, h)`` read one value where its siblings read three (found by a tester:
    the merge took one shared input only)."""
    x, y, z = (np.random.default_rng(i).standard_normal((2, 4)).astype(np.float32)
               for i in (1, 2, 3))
    full, small = _attention_like("Attn", 3), _attention_like("Attn_1", inputs)
    a, b, c = value("x"), value("y"), value("z")
    first = ir.node("Attn", [a, b, c], domain="pkg", name="call_0")
    h = first.outputs[0]
    second = ir.node("Attn_1", [h] if inputs == 1 else [h, a], domain="pkg", name="call_1")
    out = second.outputs[0]
    out.name, out.type, out.shape = "out", ir.TensorType(ir.DataType.FLOAT), ir.Shape((2, 4))
    m = model([a, b, c], [out], [first, second], functions=[full, small],
              opsets={"": 18, "pkg": 1})
    assert merge_equal_functions(m) == 1
    assert [f.name for f in m.functions.values()] == ["Attn"]
    call = list(m.graph)[1]
    assert call.op_type == "Attn" and len(call.inputs) == 3

    def attn(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        return q / (1 + np.exp(-k)) + np.tanh(v)

    first_out = attn(x, y, z)
    expected = attn(first_out, first_out, first_out) if inputs == 1 \
        else attn(first_out, x, x)
    np.testing.assert_allclose(run(m, x=x, y=y, z=z)[0], expected, rtol=1e-6)


def _summing(name: str, inputs: int, last: str) -> ir.Function:
    """``last(x0 + x1 + ... )`` of class pkg.Sum over ``inputs`` inputs of one shape."""
    xs = [value(f"x{i}") for i in range(inputs)]
    nodes, total = [], xs[0]
    for x in xs[1:]:
        nodes.append(ir.node("Add", [total, x]))
        total = nodes[-1].outputs[0]
    nodes.append(ir.node(last, [total]))
    graph = ir.Graph(xs, nodes[-1].outputs, nodes=nodes, opset_imports={"": 18}, name=name)
    f = ir.Function("pkg", name, graph=graph, attributes=[])
    f.doc_string = "pkg.Sum"
    return f


def test_many_inputs_of_one_shape_are_no_search() -> None:
    """Which of 40 inputs of one shape a 37-input body could share is a choice among
    millions: the candidates the signatures offer are tried a bounded number of times
    (a full search hung an export of GPT-J for minutes)."""
    full, small = _summing("Sum", 40, "Relu"), _summing("Sum_1", 37, "Sigmoid")
    xs = [value(f"in{i}") for i in range(40)]
    first = ir.node("Sum", xs, domain="pkg", name="call_0")
    second = ir.node("Sum_1", [first.outputs[0], *xs[1:37]], domain="pkg", name="call_1")
    out = second.outputs[0]
    out.name, out.type, out.shape = "out", ir.TensorType(ir.DataType.FLOAT), ir.Shape((2, 4))
    m = model(xs, [out], [first, second], functions=[full, small], opsets={"": 18, "pkg": 1})
    assert merge_equal_functions(m) == 0
    assert len(m.functions) == 2
