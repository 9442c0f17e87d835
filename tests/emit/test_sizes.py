"""Self-contained signatures: a size a body reads is computed in the body from its own
activations, so a layer takes activations and weights only (issue 32)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
import torch

import onnx_modular as om
from onnx_modular.check.inspect import input_kinds
from onnx_modular.emit.outline import outline
from onnx_modular.emit.sizes import derive, is_size, transpose_through_reshapes

from .graphs import FLOAT, call, fx, model, run, weight


def _dynamic(name: str, shape: list[object], dtype: ir.DataType = ir.DataType.FLOAT
             ) -> ir.Value:
    dims = [ir.SymbolicDim(d) if isinstance(d, str) else d for d in shape]
    return ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(dims))


def _sized_blocks() -> tuple[ir.Model, dict]:
    """``y = reshape(x @ w_i, [batch, 2, 2])`` twice, the batch size computed once at the
    root (``Squeeze(Shape(x)[0:1])``, as torch.export's ``sym_size``) and read by both."""
    x = _dynamic("x", ["b", 4])
    shape = ir.node("Shape", [x], attributes={"start": 0, "end": 1}, name="n_shape")
    shape.outputs[0].name, shape.outputs[0].type = "sym", ir.TensorType(ir.DataType.INT64)
    shape.outputs[0].shape = ir.Shape([1])
    nodes: list[ir.Node] = [shape]
    target = ir.Value(name="two_two", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([2]),
                      const_value=ir.tensor(np.array([2, 2], dtype=np.int64), name="two_two"))
    size = fx("Concat", [shape.outputs[0], target], "size", (3,), axis=0)
    size.outputs[0].type = ir.TensorType(ir.DataType.INT64)  # (fx's type object is shared)
    nodes.append(size)
    last, weights, chains = x, [], {"size": ()}
    for i in range(2):
        w = weight(f"layers.{i}.w", seed=i)
        mm = fx("MatMul", [last, w], f"mm{i}", None)
        mm.outputs[0].shape = ir.Shape([ir.SymbolicDim("b"), 4])
        re = fx("Reshape", [mm.outputs[0], size.outputs[0]], f"re{i}", None)
        re.outputs[0].shape = ir.Shape([ir.SymbolicDim("b"), 2, 2])
        flat = fx("Reshape", [re.outputs[0], _minus_one(f"flat{i}")], f"fl{i}", None)
        flat.outputs[0].shape = ir.Shape([ir.SymbolicDim("b"), 4])
        nodes += [mm, re, flat]
        weights.append(w)
        chains.update({f"mm{i}": (call(f"layers.{i}"),), f"re{i}": (call(f"layers.{i}"),),
                       f"fl{i}": (call(f"layers.{i}"),)})
        last = flat.outputs[0]
    weights += [target] + [n.inputs[1] for n in nodes if n.name.startswith("n_fl")]
    return model([x], [last], nodes, weights), chains


def _minus_one(name: str) -> ir.Value:
    return ir.Value(name=name, type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([2]),
                    const_value=ir.tensor(np.array([-1, 4], dtype=np.int64), name=name))


def test_a_size_read_by_calls_is_computed_in_their_body() -> None:
    m, chains = _sized_blocks()
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    (want,) = run(m, x=x)
    outline(m, chains, own_sizes=True)
    (block,) = m.functions.values()  # both calls, one function
    calls = [n for n in m.graph if n.op_identifier() in m.functions]
    assert len(calls) == 2 and all("size" not in [v.name for v in c.inputs] for c in calls)
    assert len(block.inputs) == 3  # the activation, its weight, the flattening constant
    assert any(n.op_type == "Shape" and n.inputs[0] is block.inputs[0] for n in block)
    for rows in (3, 7):  # another batch than the one seen: the body's own shape
        x = np.random.default_rng(rows).standard_normal((rows, 4)).astype(np.float32)
        (got,) = run(m, x=x)
        assert got.shape == (rows, 4)
    np.testing.assert_array_equal(run(m, x=np.ones((3, 4), np.float32))[0].shape, (3, 4))
    assert want.shape == (3, 4)


def test_without_it_the_size_is_an_input() -> None:
    m, chains = _sized_blocks()
    outline(m, chains)
    calls = [n for n in m.graph if n.op_identifier() in m.functions]
    assert all("size" in [v.name for v in c.inputs] for c in calls)


def test_a_size_from_anything_but_shapes_stays_an_input() -> None:
    """A size read from data (an index tensor's values) cannot be recomputed from shapes."""
    data = _dynamic("ids", ["b"], ir.DataType.INT64)
    node = ir.node("ReduceMax", [data], attributes={"keepdims": 1}, name="n_max")
    node.outputs[0].type = ir.TensorType(ir.DataType.INT64)
    node.outputs[0].shape = ir.Shape([1])
    assert is_size(node.outputs[0])
    activation = _dynamic("h", ["b", 4])
    assert derive(node.outputs[0], [(activation, activation)], "s") is None


def test_a_dimension_no_activation_has_stays_an_input() -> None:
    x = _dynamic("x", ["b", 4])
    shape = ir.node("Shape", [x], name="n_shape")
    shape.outputs[0].type = ir.TensorType(ir.DataType.INT64)
    shape.outputs[0].shape = ir.Shape([2])
    other = _dynamic("h", ["s", 4])
    assert derive(shape.outputs[0], [(other, other)], "s") is None
    same = _dynamic("h2", [4, "b"])
    nodes = derive(shape.outputs[0], [(same, same)], "s")
    assert nodes is not None and nodes[-1].outputs[0].name == "s"
    assert FLOAT  # the graphs helper module is the one the other emit tests use


@pytest.mark.slow
@pytest.mark.parametrize("name, layer, inputs", [("gpt2", "GPT2Block", 14),
                                                ("llama", "LlamaDecoderLayer", 13)])
def test_decoder_layers_take_activations_and_weights_only(name: str, layer: str, inputs: int
                                                          ) -> None:
    """Dynamic batch and sequence: the layer's inputs are its activations and its weights
    (no size, none unused), one function for every layer, and the model runs at sizes
    other than the example's as torch does."""
    from tests import models

    model, args = getattr(models, name)(2)
    batch, seq = torch.export.Dim("batch", min=1, max=32), torch.export.Dim("seq", min=2, max=32)
    result = om.export(model, args, dynamic_shapes=({0: batch, 1: seq},))
    kinds = input_kinds(result.model_proto)
    (found,) = [f for f in result.functions if f.name.startswith(layer)]
    assert len(found.calls) == 2 and len(kinds[found.name]) == inputs
    for function, kind in kinds.items():
        assert "size" not in kind and "unused" not in kind, (function, kind)
    _no_size_from_an_input(result.model)
    import onnxruntime as ort
    session = ort.InferenceSession(result.model_proto.SerializeToString())
    for shape in [(3, 5), (1, 9)]:
        ids = torch.randint(0, 99, shape)
        want = model(ids)
        want = (want[0] if isinstance(want, tuple) else want).detach().numpy()
        (got, *_) = session.run(None, {session.get_inputs()[0].name: ids.numpy()})
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)


def _no_size_from_an_input(model: ir.Model) -> None:
    """No Range, Reshape, Expand or ConstantOfShape of a body takes its size from a
    function input other than through a Shape of it."""
    sized = {"Range": [0, 1, 2], "Reshape": [1], "Expand": [1], "ConstantOfShape": [0]}
    for function in model.functions.values():
        inputs = set(function.inputs)
        for node in function:
            for k in sized.get(node.op_type, []):
                todo, seen = [node.inputs[k]], set()
                while todo:
                    value = todo.pop()
                    if value is None or value in seen:
                        continue
                    seen.add(value)
                    assert value not in inputs, (function.name, node.name)
                    producer = value.producer()
                    if producer is not None and producer.op_type != "Shape":
                        todo.extend(producer.inputs)


def test_one_dimension_slices_assembled_together_become_one_slice() -> None:
    from onnx_modular.emit.sizes import merge_shape_slices

    x = _dynamic("x", ["b", "s", 4])
    first = ir.node("Shape", [x], attributes={"start": 0, "end": 1})
    second = ir.node("Shape", [x], attributes={"start": 1, "end": 2})
    const = ir.node("Constant", [], attributes={
        "value": ir.tensor(np.array([2, 2], dtype=np.int64))})
    nodes = [first, second, const]
    concats = []
    for i in range(2):  # two reshapes assemble the same leading dims
        concat = ir.node("Concat", [first.outputs[0], second.outputs[0], const.outputs[0]],
                         attributes={"axis": 0}, name=f"c{i}")
        reshape = ir.node("Reshape", [x, concat.outputs[0]], name=f"r{i}")
        nodes += [concat, reshape]
        concats.append(reshape.outputs[0])
    for i, v in enumerate([first, second, const]):
        v.outputs[0].name = f"v{i}"
    for i, node in enumerate(nodes[3:]):
        node.outputs[0].name = f"n{i}"
    graph = ir.Graph([x], concats, nodes=nodes, opset_imports={"": 18}, name="g")
    assert merge_shape_slices(graph) == 2
    shapes = [n for n in graph if n.op_type == "Shape"]
    assert len(shapes) == 1 and shapes[0].attributes.get_int("end") == 2
    assert all(len(n.inputs) == 2 for n in graph if n.op_type == "Concat")
    m = ir.Model(graph, ir_version=10)
    feeds = np.ones((3, 5, 4), np.float32)
    assert [o.shape for o in run(m, x=feeds)] == [(3, 5, 2, 2)] * 2


def test_a_slice_read_elsewhere_is_left_alone() -> None:
    from onnx_modular.emit.sizes import merge_shape_slices

    x = _dynamic("x", ["b", "s"])
    first = ir.node("Shape", [x], attributes={"start": 0, "end": 1})
    second = ir.node("Shape", [x], attributes={"start": 1, "end": 2})
    concat = ir.node("Concat", [first.outputs[0], second.outputs[0]], attributes={"axis": 0})
    other = ir.node("Identity", [first.outputs[0]])
    graph = ir.Graph([x], [concat.outputs[0], other.outputs[0]],
                     nodes=[first, second, concat, other], opset_imports={"": 18})
    assert merge_shape_slices(graph) == 0


def test_unknown_dimensions_match_nothing() -> None:
    """Two dimensions nobody named are not the same size (both read 'None' as text)."""
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT),
                 shape=ir.Shape([ir.SymbolicDim(None), 4]))
    y = ir.Value(name="y", type=ir.TensorType(ir.DataType.FLOAT),
                 shape=ir.Shape([ir.SymbolicDim(None), 4]))
    shape = ir.node("Shape", [y], attributes={"start": 0, "end": 1})
    shape.outputs[0].type = ir.TensorType(ir.DataType.INT64)
    shape.outputs[0].shape = ir.Shape([1])
    assert derive(shape.outputs[0], [(x, x)], "s") is None


def _heads_reshape(source_dims: list[object], *, start: int = 0, end: int = 2,
                   allowzero: int = 1, tail: tuple[int, ...] = (-1, 2)) -> tuple[ir.Graph, ir.Node]:
    """``Reshape(Relu(x), Concat(Shape(a, start, end), tail))``, x: [b, s, 4] -- the split
    into heads of an attention whose sizes its body computes from its own input ``a``."""
    x, a = _dynamic("x", ["b", "s", 4]), _dynamic("a", source_dims)
    relu = ir.node("Relu", [x], name="relu")
    relu.outputs[0].name, relu.outputs[0].type = "h", FLOAT
    relu.outputs[0].shape = ir.Shape([ir.SymbolicDim("b"), ir.SymbolicDim("s"), 4])
    shape = ir.node("Shape", [a], attributes={"start": start, "end": end}, name="shape")
    rest = ir.node("Constant", [], attributes={
        "value": ir.tensor(np.array(tail, dtype=np.int64))}, name="rest")
    concat = ir.node("Concat", [shape.outputs[0], rest.outputs[0]], attributes={"axis": 0},
                     name="concat")
    reshape = ir.node("Reshape", [relu.outputs[0], concat.outputs[0]],
                      attributes={"allowzero": allowzero}, name="reshape")
    for node in (shape, rest, concat, reshape):
        node.outputs[0].name = f"{node.name}_out"
    graph = ir.Graph([x, a], [reshape.outputs[0]], nodes=[relu, shape, rest, concat, reshape],
                     opset_imports={"": 18}, name="g")
    return graph, reshape


def test_a_reshape_to_its_own_leading_dimensions_copies_them() -> None:
    """Sizes read from another activation with the same symbolic dimensions become 0s
    (copy the input's dimension): a constant shape ONNX Runtime infers after inlining,
    without the Shape and Concat; the same numbers at other sizes."""
    from onnx_modular.emit.sizes import copy_own_dims

    graph, reshape = _heads_reshape(["b", "s", 4])
    assert copy_own_dims(graph) == 1
    assert ir.convenience.get_const_tensor(reshape.inputs[1]).numpy().tolist() == [0, 0, 2, 2]
    assert reshape.attributes.get_int("allowzero") == 0
    assert sorted(n.op_type for n in graph) == ["Constant", "Relu", "Reshape"]
    for b, s in [(3, 5), (1, 1), (0, 2)]:
        x = np.random.default_rng(0).standard_normal((b, s, 4)).astype(np.float32)
        (got,) = run(ir.Model(graph, ir_version=10), x=x, a=np.zeros((b, s, 4), np.float32))
        np.testing.assert_array_equal(got, np.maximum(x, 0).reshape(b, s, 2, 2))


@pytest.mark.parametrize("source, kwargs", [
    (["b", "t", 4], {}),                      # another sequence length: not x's dimension
    (["s", "b", 4], {}),                      # x's dimensions, at other positions
    (["b", "s", 4], {"start": 1, "end": 3}),  # s, 4 at positions 0 and 1
    (["b", "s", 4], {"tail": (0, 2)}),        # a literal 0 under allowzero=1: an empty axis
    ([None, "s", 4], {}),                     # an unknown dimension equals nothing
], ids=["other-size", "other-position", "shifted", "literal-zero", "unknown"])
def test_a_reshape_whose_sizes_are_not_its_own_is_left_alone(source: list[object],
                                                             kwargs: dict) -> None:
    from onnx_modular.emit.sizes import copy_own_dims

    graph, reshape = _heads_reshape(source, **kwargs)
    before = [n.op_type for n in graph]
    assert copy_own_dims(graph) == 0
    assert [n.op_type for n in graph] == before and reshape.inputs[1].name == "concat_out"


def test_an_expand_to_its_own_dimensions_keeps_them() -> None:
    """Llama's repeat_kv: ``Expand(k[b, 2, 1, s, 8], Concat(b, [2, 2], s, [8]))`` with ``b``
    and ``s`` read off another activation -> ``Expand(k, [1, 2, 2, 1, 8])``: broadcasting
    against 1 keeps the dimension (0 too); a size at another axis is left alone."""
    from onnx_modular.emit.sizes import copy_own_dims

    def graph_for(source: list[object]) -> tuple[ir.Graph, ir.Node]:
        k, a = _dynamic("k", ["b", 2, 1, "s", 8]), _dynamic("a", source)
        first = ir.node("Shape", [a], attributes={"start": 0, "end": 1}, name="first")
        second = ir.node("Shape", [a], attributes={"start": 1, "end": 2}, name="second")
        mid = ir.node("Constant", [], attributes={
            "value": ir.tensor(np.array([2, 2], dtype=np.int64))}, name="mid")
        last = ir.node("Constant", [], attributes={
            "value": ir.tensor(np.array([8], dtype=np.int64))}, name="last")
        concat = ir.node("Concat", [first.outputs[0], mid.outputs[0], second.outputs[0],
                                    last.outputs[0]], attributes={"axis": 0}, name="concat")
        expand = ir.node("Expand", [k, concat.outputs[0]], name="expand")
        nodes = [first, second, mid, last, concat, expand]
        for node in nodes:
            node.outputs[0].name = f"{node.name}_out"
        return ir.Graph([k, a], [expand.outputs[0]], nodes=nodes, opset_imports={"": 18}), expand

    graph, expand = graph_for(["b", "s", 32])
    assert copy_own_dims(graph) == 1
    assert ir.convenience.get_const_tensor(expand.inputs[1]).numpy().tolist() == [1, 2, 2, 1, 8]
    assert sorted(n.op_type for n in graph) == ["Constant", "Expand"]
    for b, s in [(3, 5), (0, 4), (2, 0)]:
        k = np.random.default_rng(1).standard_normal((b, 2, 1, s, 8)).astype(np.float32)
        (got,) = run(ir.Model(graph, ir_version=10), k=k, a=np.zeros((b, s, 32), np.float32))
        np.testing.assert_array_equal(got, np.broadcast_to(k, (b, 2, 2, s, 8)))
    graph, _ = graph_for(["s", "b", 32])  # b and s swapped: not k's dimensions there
    assert copy_own_dims(graph) == 0


@pytest.mark.parametrize("dims, target, expected", [
    (["b", 17, 32], [-1, 17, 4, 8], [0, 17, 4, 8]),   # ViT's heads: the -1 is the batch
    (["b", 17, 32], [-1, 4, 8], None),                # the -1 is b * 17: no copy says it
    (["b", "s", 32], [-1, 4, 8], None),               # two symbolic sizes in one -1
    (["b", 17, 32], [17, -1, 32], None),              # the batch at another position
    ([2, 17, 32], [-1, 17, 4, 8], None),              # static: inference reads the -1
], ids=["batch", "merged", "two-symbols", "moved", "static"])
def test_a_minus_one_standing_for_the_inputs_own_dimension_becomes_a_copy(
        dims: list[object], target: list[int], expected: list[int] | None) -> None:
    from onnx_modular.emit.sizes import copy_own_dims

    x = _dynamic("x", dims)
    relu = ir.node("Relu", [x], name="relu")
    relu.outputs[0].name, relu.outputs[0].type = "h", FLOAT
    relu.outputs[0].shape = x.shape
    shape = ir.node("Constant", [], attributes={
        "value": ir.tensor(np.array(target, dtype=np.int64))}, name="shape")
    shape.outputs[0].name = "shape_out"
    reshape = ir.node("Reshape", [relu.outputs[0], shape.outputs[0]], name="reshape")
    reshape.outputs[0].name = "y"
    graph = ir.Graph([x], [reshape.outputs[0]], nodes=[relu, shape, reshape],
                     opset_imports={"": 18})
    assert copy_own_dims(graph) == (expected is not None)
    got = ir.convenience.get_const_tensor(reshape.inputs[1]).numpy().tolist()
    assert got == (expected or target)
    if expected is not None:
        for batch in (3, 0):
            feed = np.random.default_rng(2).standard_normal([batch, 17, 32]).astype(np.float32)
            (out,) = run(ir.Model(graph, ir_version=10), x=feed)
            np.testing.assert_array_equal(out, np.maximum(feed, 0).reshape(batch, 17, 4, 8))


def _function_outputs_that_are_sizes(model: ir.Model) -> list[tuple[str, str]]:
    found = []
    for function in model.functions.values():
        for out in function.outputs:
            if is_size(out):
                found.append((function.name, str(out.name)))
    return found


class _Autoencoder(torch.nn.Module):
    """diffusers' AutoencoderKL, tiny: a GroupNorm's decomposition is the first to read the
    height and width, so torch.export files those sizes under that call (reading them off
    another activation), and the mid-block Attention's reshapes read the same ones."""

    def __init__(self) -> None:
        super().__init__()
        from diffusers import AutoencoderKL

        self.vae = AutoencoderKL(
            in_channels=3, out_channels=3, block_out_channels=(8, 16), latent_channels=4,
            down_block_types=("DownEncoderBlock2D",) * 2, norm_num_groups=4,
            up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.vae(x, sample_posterior=False, return_dict=False)[0]


@pytest.mark.slow
def test_a_size_a_call_computes_for_a_later_call_is_computed_by_each_not_returned() -> None:
    """Dynamic batch, height and width: no function returns a size, none takes one, and
    the file computes what torch does at other sizes."""
    torch.manual_seed(0)
    model, x = _Autoencoder().eval(), torch.randn(2, 3, 16, 16)
    dim = torch.export.Dim
    shapes = ({0: dim("batch", max=16), 2: 8 * dim("h", max=8), 3: 8 * dim("w", max=8)},)
    result = om.export(model, (x,), dynamic_shapes=shapes)
    assert _function_outputs_that_are_sizes(result.model) == []
    for function, kind in input_kinds(result.model_proto).items():
        assert "size" not in kind and "unused" not in kind, (function, kind)
    _no_size_from_an_input(result.model)
    for shape in [(2, 3, 16, 16), (1, 3, 24, 8)]:
        y = torch.randn(*shape)
        (got,) = run(result.model, x=y.numpy())
        with torch.no_grad():
            np.testing.assert_allclose(got, model(y).numpy(), rtol=1e-4, atol=1e-5)


def test_an_input_no_body_reads_any_more_leaves_every_signature() -> None:
    """A size passed down two levels, which the innermost body then takes from its own
    activation (a Reshape to its own leading dimensions): gone from both signatures."""
    from onnx_modular.emit.sizes import drop_unused_inputs

    x = _dynamic("x", ["b", 4])
    inner_x, inner_size = ir.Value(name="ix", shape=x.shape, type=x.type), \
        ir.Value(name="isize", shape=ir.Shape([1]), type=ir.TensorType(ir.DataType.INT64))
    relu = ir.node("Relu", [inner_x])
    inner = ir.Function("test", "Inner", graph=ir.Graph(
        [inner_x, inner_size], [relu.outputs[0]], nodes=[relu],
        opset_imports={"": 18}), attributes=[])
    outer_x, outer_size = ir.Value(name="ox", shape=x.shape, type=x.type), \
        ir.Value(name="osize", shape=ir.Shape([1]), type=ir.TensorType(ir.DataType.INT64))
    call_inner = ir.node("Inner", [outer_x, outer_size], domain="test")
    outer = ir.Function("test", "Outer", graph=ir.Graph(
        [outer_x, outer_size], [call_inner.outputs[0]], nodes=[call_inner],
        opset_imports={"": 18, "test": 1}), attributes=[])
    shape = ir.node("Shape", [x], attributes={"start": 0, "end": 1})
    call_outer = ir.node("Outer", [x, shape.outputs[0]], domain="test")
    graph = ir.Graph([x], [call_outer.outputs[0]], nodes=[shape, call_outer],
                     opset_imports={"": 18, "test": 1})
    m = ir.Model(graph, ir_version=10, functions=[inner, outer])
    assert drop_unused_inputs(m) == 2
    assert [len(f.inputs) for f in m.functions.values()] == [1, 1]
    assert len(call_outer.inputs) == 1 and len(call_inner.inputs) == 1
    (got,) = run(m, x=np.array([[-1.0, 2, -3, 4]], dtype=np.float32))
    np.testing.assert_array_equal(got, [[0, 2, 0, 4]])


def _unflattened_widths() -> ir.Graph:
    """``x [b, s, 8]`` flattened to 2-D, three products of widths 8, 4 and 16, each
    unflattened to ``[b, s, width]`` with a shape computed from ``x`` (GPT-2's ``Conv1D``)."""
    x = _dynamic("x", ["b", "s", 8])
    nodes: list[ir.Node] = []

    def const(name: str, array: np.ndarray) -> ir.Value:
        node = ir.node("Constant", [], attributes={"value": ir.tensor(array, name=name)},
                       name=name)
        node.outputs[0].name = name
        nodes.append(node)
        return node.outputs[0]

    flat = ir.node("Reshape", [x, const("rows", np.array([-1, 8], np.int64))], name="flat")
    shape = ir.node("Shape", [x], attributes={"start": 0, "end": 2}, name="lead")
    shape.outputs[0].name, shape.outputs[0].shape = "lead", ir.Shape([2])
    nodes += [flat, shape]
    outputs = []
    for width in (8, 4, 16):
        w = const(f"w{width}", np.random.default_rng(width).standard_normal(
            (8, width)).astype(np.float32))
        mm = ir.node("MatMul", [flat.outputs[0], w], name=f"mm{width}")
        target = ir.node("Concat", [shape.outputs[0], const(f"c{width}", np.array(
            [width], np.int64))], attributes={"axis": 0}, name=f"target{width}")
        out = ir.node("Reshape", [mm.outputs[0], target.outputs[0]],
                      attributes={"allowzero": 1}, name=f"unflat{width}")
        out.outputs[0].name = f"y{width}"
        nodes += [mm, target, out]
        outputs.append(out.outputs[0])
    return ir.Graph([x], outputs, nodes=nodes, opset_imports={"": 18}, name="g")


def test_unflattened_widths_share_one_shape_where_the_sizes_are_never_empty() -> None:
    """Shapes differing only in their last width become one ``[b, s, -1]`` where the
    program's ranges keep b and s at 1 or more: one Concat for three; the same numbers."""
    from onnx_modular.emit.sizes import share_unflatten_shapes

    graph = _unflattened_widths()
    assert share_unflatten_shapes(graph, frozenset({"b", "s"})) == 3
    assert [n.op_type for n in graph].count("Concat") == 1
    reshapes = [n for n in graph if n.op_type == "Reshape" and n.name.startswith("unflat")]
    assert len({n.inputs[1] for n in reshapes}) == 1
    for b, s in [(3, 5), (1, 1), (2, 7)]:
        x = np.random.default_rng(b).standard_normal((b, s, 8)).astype(np.float32)
        got = run(ir.Model(graph, ir_version=10), x=x)
        for width, y in zip((8, 4, 16), got, strict=True):
            w = np.random.default_rng(width).standard_normal((8, width)).astype(np.float32)
            np.testing.assert_allclose(y, (x.reshape(-1, 8) @ w).reshape(b, s, width),
                                       rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("nonzero", [frozenset({"s"}), frozenset()], ids=["b-may-be-0", "none"])
def test_a_size_that_may_be_empty_keeps_its_shapes(nonzero: frozenset[str]) -> None:
    """A -1 beside an empty size is ambiguous (ONNX Runtime refuses it): where the ranges
    allow b = 0 every shape stays as written, and an empty batch still runs."""
    from onnx_modular.emit.sizes import share_unflatten_shapes

    graph = _unflattened_widths()
    before = [(n.op_type, tuple(v.name for v in n.inputs)) for n in graph]
    assert share_unflatten_shapes(graph, nonzero) == 0
    assert [(n.op_type, tuple(v.name for v in n.inputs)) for n in graph] == before
    got = run(ir.Model(graph, ir_version=10), x=np.zeros((0, 3, 8), np.float32))
    assert [y.shape for y in got] == [(0, 3, 8), (0, 3, 4), (0, 3, 16)]


def _key_transposed(swap: bool) -> tuple[ir.Model, ir.Graph]:
    """torchlib's key transpose of a ``[b, 4, s, 8]`` tensor: ``Reshape(k, [-1, s, 8])``,
    ``Transpose([0, 2, 1])``, ``Reshape`` to ``[b, 4, 8, s]`` (or, ``swap=False``, to
    ``[b, 4, s, 8]``: not a transpose of the last two axes), shapes sliced from Shape(k)."""
    k = _dynamic("k", ["b", 4, "s", 8])

    def const(name: str, values: list[int]) -> ir.Node:
        node = ir.node("Constant", [], attributes={"value": ir.tensor(np.array(values,
                                                                               np.int64))})
        node.outputs[0].name = name
        return node

    shape = ir.node("Shape", [k])
    consts = [const(n, v) for n, v in [("m1", [-1]), ("m2", [-2]), ("big", [2 ** 62]),
                                      ("small", [-(2 ** 62)])]]
    m1, m2, big, small = (c.outputs[0] for c in consts)
    last = ir.node("Slice", [shape.outputs[0], m1, big])
    second = ir.node("Slice", [shape.outputs[0], m2, m1])
    lead = ir.node("Slice", [shape.outputs[0], small, m2])
    squeezed = ir.node("Concat", [m1, second.outputs[0], last.outputs[0]],
                       attributes={"axis": 0})
    inner = ir.node("Reshape", [k, squeezed.outputs[0]])
    transpose = ir.node("Transpose", [inner.outputs[0]], attributes={"perm": [0, 2, 1]})
    ends = [last, second] if swap else [second, last]
    target = ir.node("Concat", [lead.outputs[0], *(e.outputs[0] for e in ends)],
                     attributes={"axis": 0})
    outer = ir.node("Reshape", [transpose.outputs[0], target.outputs[0]])
    outer.outputs[0].name = "y"
    nodes = [shape, *consts, last, second, lead, squeezed, inner, transpose, target, outer]
    m = model([k], outer.outputs, nodes)
    return m, m.graph


def test_torchlibs_key_transpose_becomes_one_transpose() -> None:
    """At every size, an empty sequence too (which the -1 could not reshape)."""
    m, graph = _key_transposed(swap=True)
    assert transpose_through_reshapes(graph) == 1
    assert [n.op_type for n in graph] == ["Transpose"]
    assert graph.outputs[0].name == "y"
    for shape in [(2, 4, 3, 8), (1, 4, 1, 8), (3, 4, 0, 8)]:
        k = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        (got,) = run(m, k=k)
        np.testing.assert_array_equal(got, k.transpose(0, 1, 3, 2))
    _, graph = _key_transposed(swap=False)
    assert transpose_through_reshapes(graph) == 0
    assert [n.op_type for n in graph].count("Reshape") == 2


class _ScaledBySeq(torch.nn.Module):
    """A float from the sequence length: ``1 / x.shape[1]`` in the body, or ``n`` passed."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, n: int | None = None) -> torch.Tensor:
        return self.fc(x) * (1.0 / (x.shape[1] if n is None else n))


class _TwoScaled(torch.nn.Module):
    def __init__(self, passed: bool) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_ScaledBySeq() for _ in range(2))
        self.passed = passed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, x.shape[1]) if self.passed else layer(x)
        return x


@pytest.mark.parametrize("passed", [False, True])
def test_a_float_computed_from_a_size_is_computed_in_the_body(passed: bool) -> None:
    """torch.export computes ``1.0 / seq`` once at the root: the float was an input of each
    layer (``input_kinds``: activation, weight, weight, size)."""
    torch.manual_seed(0)
    model, x = _TwoScaled(passed).eval(), torch.randn(2, 5, 8)
    seq = torch.export.Dim("seq", min=2, max=64)
    result = om.export(model, (x,), functions=[_ScaledBySeq], dynamic_shapes=({1: seq},))
    assert input_kinds(result.model_proto) == {"_ScaledBySeq": ["activation", "weight",
                                                                "weight"]}
    assert [n.op_type for n in result.model.graph] == ["_ScaledBySeq"] * 2
    for sample in (x, torch.randn(2, 9, 8)):
        (got,) = run(result.model, x=sample.numpy())
        with torch.no_grad():
            np.testing.assert_allclose(got, model(sample).numpy(), rtol=1e-5, atol=1e-6)

