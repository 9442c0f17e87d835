"""lower/translate: the one FX -> ONNX translation (every node names its FX node), opset
checks, one-line failures, stable stack traces."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from models import TwoLinear
from torch import nn

from onnx_modular.diagnostics import OnnxModularError
from onnx_modular.leaves.metadata import STACK_TRACE, fx_name
from onnx_modular.lower.capture import capture
from onnx_modular.lower.translate import (
    MIN_HIERARCHICAL_OPSET,
    MIN_OPSET,
    Translation,
    check_opset,
    inline_translator_functions,
    stable_stack_traces,
    translate,
)


@torch.library.custom_op("om_tests::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@mystery.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class Mysterious(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mystery(self.fc(x))


@pytest.fixture(scope="module")
def model() -> TwoLinear:
    torch.manual_seed(0)
    return TwoLinear().eval()


@pytest.fixture(scope="module")
def translation(model: TwoLinear) -> Translation:
    return translate(capture(model, (torch.randn(3, 4),)))


def test_the_translation_computes_what_the_module_does(model: TwoLinear,
                                                       translation: Translation) -> None:
    x = torch.randn(3, 4)
    proto = ir.serde.serialize_model(translation.model)
    session = ort.InferenceSession(proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    (actual,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    np.testing.assert_allclose(actual, model(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_every_node_names_an_fx_node_of_the_decomposed_program(
        translation: Translation) -> None:
    fx_nodes = {n.name for n in translation.program.graph.nodes}
    named = [fx_name(node) for node in translation.model.graph]
    assert named and None not in named
    assert set(named) <= fx_nodes


@pytest.mark.slow
def test_an_untranslatable_op_is_one_line_naming_its_node() -> None:
    program = capture(Mysterious(), (torch.randn(2, 4),))
    with pytest.raises(OnnxModularError) as caught:
        translate(program)
    text = str(caught.value)
    assert "OM0202" in text and "\n" not in text
    assert "torch.onnx could not translate the program: node 'mystery'" in text
    assert caught.value.diagnostic.location.fx_node == "mystery"


@pytest.mark.parametrize("opset", [None, MIN_HIERARCHICAL_OPSET,
                                   onnx.defs.onnx_opset_version()])
def test_supported_opsets_pass(opset: int | None) -> None:
    check_opset(opset, flat=False)


def test_below_18_only_a_flat_model_goes() -> None:
    check_opset(MIN_HIERARCHICAL_OPSET - 1, flat=True)
    with pytest.raises(OnnxModularError, match=r"OM0104 .*opset 17 is below 18.*"
                                               r"functions='none'"):
        check_opset(MIN_HIERARCHICAL_OPSET - 1, flat=False)
    with pytest.raises(OnnxModularError, match=r"use opset >= 18$") as caught:
        check_opset(17, flat=False, what="a split")
    assert "functions='none'" not in str(caught.value)


@pytest.mark.parametrize("opset", [MIN_OPSET - 1, onnx.defs.onnx_opset_version() + 1, True,
                                   "18", 18.0])
def test_an_opset_onnx_cannot_emit_is_refused(opset: object) -> None:
    with pytest.raises(OnnxModularError, match=r"OM0202 .*is not an ONNX opset this onnx "
                                               r"can emit"):
        check_opset(opset, flat=True)  # type: ignore[arg-type]


def test_generated_file_numbers_are_dropped_from_stack_traces() -> None:
    x = ir.Value(name="x")
    node = ir.node("Relu", [x], metadata_props={
        STACK_TRACE: 'File "<eval_with_key>.17", line 5, in forward\n'
                     'File "/src/model.py", line 3, in forward'})
    graph = ir.Graph([x], node.outputs, nodes=[node], opset_imports={"": 18})
    stable_stack_traces(ir.Model(graph, ir_version=10))
    assert node.metadata_props[STACK_TRACE] == (
        'File "<eval_with_key>", line 5, in forward\nFile "/src/model.py", line 3, in forward')


def test_functions_the_translator_made_are_inlined_with_their_calls_labels() -> None:
    """torchlib under onnxscript < 0.7 emits helper functions (``aten_split``): their nodes
    are inlined, each copy naming the FX node of its call, so the module hierarchy alone
    decides the functions (before this, Outline refused the model: OM0002)."""
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2, 4]))
    inner_in = ir.Value(name="a", type=ir.TensorType(ir.DataType.FLOAT))
    relu = ir.node("Relu", [inner_in])
    helper = ir.Function("pkg.torch.onnx", "aten_helper", attributes=[], graph=ir.Graph(
        [inner_in], relu.outputs, nodes=[relu], opset_imports={"": 18}, name="aten_helper"))
    label = "%relu_1 : [num_users=1] = call_function[target=torch.ops.aten.relu.default]"
    call = ir.node("aten_helper", [x], domain="pkg.torch.onnx",
                   metadata_props={"pkg.torch.onnx.fx_node": label})
    call.outputs[0].name = "relu_1"
    model = ir.Model(ir.Graph([x], call.outputs, nodes=[call], name="main",
                              opset_imports={"": 18, "pkg.torch.onnx": 1}),
                     ir_version=10, functions=[helper])
    inline_translator_functions(model)
    assert not model.functions
    (node,) = list(model.graph)
    assert node.op_type == "Relu" and fx_name(node) == "relu_1"


class _Registers(nn.Module):
    """Dinov2 with registers (tiny): torch.export's program guards the height and width to
    the example's (``x.size()[2] // 8 == 4``) without a constraint error, and its graph
    holds only for those sizes."""

    def __init__(self) -> None:
        super().__init__()
        import transformers

        config = transformers.Dinov2WithRegistersConfig(
            num_hidden_layers=1, hidden_size=32, num_attention_heads=4, intermediate_size=64,
            image_size=32, patch_size=8, num_register_tokens=4)
        self.model = transformers.Dinov2WithRegistersModel(config).eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=x).last_hidden_state


@pytest.mark.slow
def test_a_dimension_a_guard_fixes_is_static_in_the_file_and_warned_about() -> None:
    """Marked dynamic, fixed by the program: the file declares the size, so ONNX Runtime
    refuses another one (it computed other numbers than torch before: |diff| 0.48)."""
    import onnx_modular as om

    torch.manual_seed(0)
    model, x = _Registers().eval(), torch.randn(2, 3, 32, 40)
    dim = torch.export.Dim
    shapes = ({0: dim("batch", max=16), 2: 8 * dim("h", min=2, max=8),
               3: 8 * dim("w", min=2, max=8)},)
    result = om.export(model, (x,), dynamic_shapes=shapes)
    (given,) = result.model.graph.inputs
    assert list(given.shape)[1:] == [3, 32, 40] and not isinstance(given.shape[0], int)
    warned = [d.message for d in result.diagnostics if "marked dynamic" in d.message]
    assert len(warned) == 2 and "axis 2" in warned[0] and "size 32" in warned[0]
    session = ort.InferenceSession(result.model_proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    y = torch.randn(3, 3, 32, 40)  # the batch stays dynamic
    with torch.no_grad():
        np.testing.assert_allclose(session.run(None, {"x": y.numpy()})[0], model(y).numpy(),
                                   rtol=1e-4, atol=1e-5)
    with pytest.raises(Exception, match="invalid dimensions"):
        session.run(None, {"x": torch.randn(1, 3, 40, 32).numpy()})


@pytest.mark.slow
def test_under_the_hook_a_dimension_a_guard_fixes_is_static_too() -> None:
    """torch.onnx's own translation keeps the dimensions symbolic (``8*s39``), their range
    one value: the file the hook leaves declares the sizes."""
    import onnx_modular as om

    torch.manual_seed(0)
    model, x = _Registers().eval(), torch.randn(2, 3, 32, 40)
    dim = torch.export.Dim
    shapes = ({0: dim("batch", max=16), 2: 8 * dim("h", min=2, max=8),
               3: 8 * dim("w", min=2, max=8)},)
    with om.hook():
        program = torch.onnx.export(model, (x,), dynamic_shapes=shapes, dynamo=True)
    (given,) = program.model.graph.inputs
    assert list(given.shape)[1:] == [3, 32, 40] and not isinstance(given.shape[0], int)
    session = ort.InferenceSession(program.model_proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="invalid dimensions"):
        session.run(None, {"x": torch.randn(1, 3, 40, 32).numpy()})


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [False, True])
def test_t5_with_torchs_attention_exports_with_gradients_on(dynamic: bool) -> None:
    """transformers' default attention (SDPA) in T5, exported outside ``torch.no_grad()``:
    torch's decomposition with autograd on gave its output other strides than the capture,
    and the ``reshape`` after it a ``view`` no tensor could take (OM0202, as torch.onnx
    fails); captured and translated without autograd it exports and matches torch."""
    import models

    import onnx_modular as om

    model, args = models.t5_encoder(layers=1)
    model.model.config._attn_implementation = "sdpa"
    assert torch.is_grad_enabled()
    shapes = ({0: torch.export.Dim("batch", max=8), 1: torch.export.Dim("seq", min=2,
                                                                         max=16)},)
    result = om.export(model, args, dynamic_shapes=shapes if dynamic else None)
    assert torch.is_grad_enabled()  # the caller's mode is given back
    other = (torch.randint(0, 99, (3, 5)),) if dynamic else args
    assert om.validate(model, other, result.model_proto, providers="cpu").ok
    if not dynamic:  # a program the user captured with gradients on translates too
        given = om.export(torch.export.export(model, args), args)
        assert om.validate(model, args, given.model_proto, providers="cpu").ok
