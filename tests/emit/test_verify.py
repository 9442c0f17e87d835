"""emit/verify: strict type and shape inference before writing; a failure is one line that
names the module call and FX node it happened in."""

from __future__ import annotations

import onnx_ir as ir
import pytest

from onnx_modular.diagnostics import OnnxModularError
from onnx_modular.emit.verify import verify
from onnx_modular.leaves.metadata import META_CALL, META_PATH, META_TYPE, STACK_TRACE

from .graphs import OPSET, fx, model, value, weight

TRACE = ('File "/usr/lib/python3/site-packages/torch/nn/modules/module.py", line 1, in x\n'
         'File "/home/me/model.py", line 42, in forward')


def _int_ids_into_a_linear(outlined: bool) -> ir.Model:
    """int64 ids multiplied by a float weight: exports, but no runtime takes it."""
    ids, w = value("ids", (2, 4), ir.DataType.INT64), weight("layers.0.weight")
    if not outlined:
        mm = fx("MatMul", [ids, w], "mm")
        return model([ids], mm.outputs, [mm], [w])
    x, wi = value("input_0", (2, 4), ir.DataType.INT64), value("weight", (4, 4))
    mm = fx("MatMul", [x, wi], "mm")
    mm.metadata_props[STACK_TRACE] = TRACE
    body = ir.Graph([x, wi], mm.outputs, nodes=[mm], opset_imports={"": OPSET}, name="Block")
    function = ir.Function("pkg", "Block", graph=body, attributes=[])
    call = ir.node("Block", [ids, w], domain="pkg", name="layers.0",
                   metadata_props={META_PATH: "layers.0", META_CALL: "layers.0",
                                   META_TYPE: "pkg.Block"})
    call.outputs[0].name = "y"
    return model([ids], call.outputs, [call], [w], functions=[function],
                 opsets={"": OPSET, "pkg": 1})


def test_a_valid_model_passes_and_keeps_its_weights() -> None:
    x, w = value("x"), weight("w")
    mm = fx("MatMul", [x, w], "mm")
    m = model([x], mm.outputs, [mm], [w])
    verify(m)
    assert [v.name for v in m.graph.inputs] == ["x"]
    assert list(m.graph.initializers) == ["w"] and m.graph.initializers["w"].const_value


def test_weights_come_back_after_a_failure() -> None:
    m = _int_ids_into_a_linear(outlined=False)
    with pytest.raises(OnnxModularError):
        verify(m)
    assert [v.name for v in m.graph.inputs] == ["ids"]
    assert list(m.graph.initializers) == ["layers.0.weight"]


def test_a_type_error_in_a_function_names_the_module_and_fx_node() -> None:
    with pytest.raises(OnnxModularError) as caught:
        verify(_int_ids_into_a_linear(outlined=True))
    error = caught.value
    text = str(error)
    assert text.startswith("error: OM0202 translation: ") and "\n" not in text
    assert "in module 'layers.0', node 'mm'" in text
    assert "do the example inputs fit the model?" in text  # the flat model fails too
    location = error.diagnostic.location
    assert (location.module_path, location.fx_node) == ("layers.0", "mm")
    assert (location.source_file, location.source_line) == ("/home/me/model.py", 42)


def test_a_type_error_in_the_main_graph_is_one_line_too() -> None:
    with pytest.raises(OnnxModularError, match=r"^error: OM0202 .*the exported model is invalid"):
        verify(_int_ids_into_a_linear(outlined=False))


def _squeeze_of_size_16(axes_in_function: bool) -> ir.Model:
    """``Neg(Squeeze(x, axes=[1]))`` of a ``[2, 16, 4]`` x: invalid ONNX. The axes are an
    initializer of the main graph, or a constant in the body of ``inner``'s function."""
    import numpy as np

    x = value("x", (2, 16, 4))
    axes = ir.Value(name="axes", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([1]),
                    const_value=ir.tensor(np.array([1], dtype=np.int64), name="axes"))
    if not axes_in_function:
        sq = fx("Squeeze", [x, axes], "squeeze", (2, 16, 4))
        return model([x], sq.outputs, [sq], [axes])
    xi = value("input_0", (2, 16, 4))
    constant = ir.node("Constant", [], attributes={"value": axes.const_value})
    sq = fx("Squeeze", [xi, constant.outputs[0]], "squeeze", (2, 16, 4))
    neg = fx("Neg", sq.outputs, "neg", (2, 16, 4))
    body = ir.Graph([xi], neg.outputs, nodes=[constant, sq, neg], opset_imports={"": OPSET},
                    name="Inner")
    function = ir.Function("pkg", "Inner", graph=body, attributes=[])
    node = ir.node("Inner", [x], domain="pkg", name="inner",
                   metadata_props={META_PATH: "inner", META_CALL: "inner",
                                   META_TYPE: "pkg.Inner"})
    node.outputs[0].name = "y"
    return model([x], node.outputs, [node], functions=[function],
                 opsets={"": OPSET, "pkg": 1})


def test_an_invalid_node_reading_a_small_initializer_is_found() -> None:
    """Initializers used to be bare inputs to inference, their values unknown: a Squeeze of
    a size-16 dimension with its axes in an initializer passed, and ORT refused the file."""
    m = _squeeze_of_size_16(axes_in_function=False)
    with pytest.raises(OnnxModularError, match="node 'squeeze': .*Dimension of input 1 must "
                       "be 1 instead of 16"):
        verify(m)
    assert list(m.graph.initializers) == ["axes"] and [v.name for v in m.graph.inputs] == ["x"]


def test_the_first_failure_is_named_not_what_followed_from_it() -> None:
    """Inference reports the Squeeze, then the Neg reading its untyped output: the error
    gives the Squeeze's reason, not 'Input 0 expected to have type but instead is null'."""
    with pytest.raises(OnnxModularError) as caught:
        verify(_squeeze_of_size_16(axes_in_function=True))
    text = str(caught.value)
    assert "in module 'inner', node 'squeeze': [ShapeInferenceError] Dimension of input 1 " \
        "must be 1 instead of 16" in text and "null" not in text


def test_initializers_keep_their_order_small_and_large() -> None:
    big, small = weight("big", (64, 64)), weight("small", (2, 2), seed=1)
    late = weight("late", (64, 64), seed=2)
    x = value("x", (2, 64))
    mm = fx("MatMul", [x, big], "mm", (2, 64))
    mm2 = fx("MatMul", [mm.outputs[0], late], "mm2", (2, 64))
    add = fx("Add", [small, small], "add", (2, 2))
    m = model([x], [mm2.outputs[0], add.outputs[0]], [mm, mm2, add], [big, small, late])
    verify(m)
    assert list(m.graph.initializers) == ["big", "small", "late"]
    assert all(v.const_value is not None for v in m.graph.initializers.values())
