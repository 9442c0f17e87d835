"""Drop-in fidelity of om.export: models torch.onnx exports export here too (non-persistent
``nn.Buffer`` read by identical blocks, ``torch.cond`` inside a submodule), identical blocks
share one function even where weight-derived values are small or a call's input is a
constant in only one call, and no function is named like an ONNX operator."""

from __future__ import annotations

import collections

import models
import onnx
import onnx.inliner
import pytest
import torch
from models import CondNet, Rotaries
from torch import nn

import onnx_modular as om
from onnx_modular.emit import outline
from onnx_modular.emit.functions import operator_names

pytestmark = pytest.mark.slow  # whole models: the full suite, not the inner loop

# ---- models torch.onnx exports ---------------------------------------------------------------


def _exports_validates_flattens(model: nn.Module, args: tuple) -> onnx.ModelProto:
    """Hierarchical and flat exports both match torch in ONNX Runtime; the onnx inliner
    accepts the hierarchical one."""
    proto = om.export(model, args).model_proto
    onnx.checker.check_model(proto, full_check=True)
    assert om.validate(model, args, proto, providers="cpu").ok
    flat = om.export(model, args, functions="none").model_proto
    assert not flat.functions
    assert om.validate(model, args, flat, providers="cpu").ok
    onnx.checker.check_model(onnx.inliner.inline_local_functions(proto), full_check=True)
    return proto


def _functions_of(proto: onnx.ModelProto, class_name: str) -> list[str]:
    return [f.name for f in proto.functions if f.doc_string.rsplit(".", 1)[-1] == class_name]


def test_non_persistent_nn_buffer_read_by_identical_blocks() -> None:
    torch.manual_seed(0)
    proto = _exports_validates_flattens(Rotaries().eval(), models.x8())
    assert _functions_of(proto, "Rotary") == ["Rotary"]


@pytest.mark.parametrize("name, layer", [("gptj", "GPTJBlock"), ("swin", "SwinStage")])
def test_transformers_with_non_persistent_nn_buffers(name: str, layer: str) -> None:
    model, args = models.ARCHITECTURES[name](layers=2)
    proto = _exports_validates_flattens(model, args)
    assert _functions_of(proto, layer)


@pytest.mark.parametrize("positive", [True, False])
def test_cond_inside_a_submodule(positive: bool, ort_outputs, assert_close) -> None:
    torch.manual_seed(0)
    model = CondNet().eval()
    x = torch.randn(2, 8).abs() * (1 if positive else -1)
    proto = _exports_validates_flattens(model, (x,))
    assert _functions_of(proto, "CondBlock") == ["CondBlock"]  # branches keyed by value
    assert_close(ort_outputs(proto, (x,))[0], model(x), 1e-5)


def test_an_invalid_model_of_our_making_is_not_blamed_on_the_inputs(monkeypatch) -> None:
    """Outlining that forgets what If branches read gives an invalid model from valid
    inputs: the error says it is ours, not "do the example inputs fit the model?"."""
    monkeypatch.setattr(outline, "_nested", lambda nodes: (set(), {}))
    torch.manual_seed(0)
    with pytest.raises(om.OnnxModularError) as raised:
        om.export(CondNet().eval(), models.x8())
    assert "onnx_modular defect" in str(raised.value)
    assert "example inputs" not in str(raised.value)


# ---- identical blocks share one function ----------------------------------------------------


class LogScale(nn.Module):
    """``x * exp(log_scale)``: a weight-only computation of ``n`` elements."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.log_scale = nn.Parameter(torch.randn(n))
        self.fc = nn.Linear(n, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * torch.exp(self.log_scale)


class LogScales(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(LogScale(n) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


@pytest.mark.parametrize("n", [1, 8, 16, 17, 32])
def test_small_weight_derived_values_enter_as_inputs(n: int, ort_outputs, assert_close) -> None:
    torch.manual_seed(0)
    model, args = LogScales(n).eval(), (torch.randn(2, n),)
    proto = om.export(model, args).model_proto
    assert _functions_of(proto, "LogScale") == ["LogScale"]
    body = next(f for f in proto.functions if f.name == "LogScale")
    assert not [n for n in body.node if n.op_type == "Constant"]  # exp(log_scale) is an input
    assert_close(ort_outputs(proto, args)[0], model(*args), 1e-5)


class Decoder(nn.Module):
    """DETR's decoder: the first layer reads a zero target plus learned queries (a
    constant), the next ones the previous layer's output."""

    def __init__(self) -> None:
        super().__init__()
        self.queries = nn.Parameter(torch.randn(5, 8))
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.LayerNorm(8))
                                    for _ in range(3))
        self.cross = nn.Linear(8, 8)

    def forward(self, memory: torch.Tensor) -> torch.Tensor:
        x = torch.zeros_like(self.queries)
        for layer in self.layers:
            x = layer(x + self.queries) + self.cross(memory)
        return x


def test_a_constant_input_of_one_call_is_not_folded_into_its_body(ort_outputs,
                                                                   assert_close) -> None:
    torch.manual_seed(0)
    model, args = Decoder().eval(), (torch.randn(5, 8),)
    proto = om.export(model, args).model_proto
    assert _functions_of(proto, "Sequential") == ["Sequential"]
    calls = collections.Counter(n.op_type for n in proto.graph.node)
    assert calls["Sequential"] == 3
    assert_close(ort_outputs(proto, args)[0], model(*args), 1e-5)
    flat = om.export(model, args, functions="none").model_proto
    assert_close(ort_outputs(flat, args)[0], model(*args), 1e-5)


@pytest.mark.parametrize("name, layers, classes", [
    ("mamba2", 3, ["Mamba2Block", "Mamba2Mixer"]),
    ("falcon_h1", 3, ["FalconH1DecoderLayer", "FalconH1Mixer"]),
    ("zamba2", 4, ["Zamba2MambaMixer"]),
    ("gemma3", 6, ["Gemma3DecoderLayer", "Gemma3RMSNorm"]),
    ("detr", 3, ["DetrDecoderLayer"]),
])
def test_trained_layers_share_one_function(name: str, layers: int, classes: list[str],
                                          ort_outputs, assert_close) -> None:
    model, args = models.ARCHITECTURES[name](layers=layers)
    models.trained(model)
    result = om.export(model, args)
    proto = result.model_proto
    for cls in classes:
        assert _functions_of(proto, cls) == [cls], cls
    assert_close(ort_outputs(proto, args)[0], model(*args), 1e-4)
    if name == "zamba2":  # the hybrid layer adds the shared block's output: a real difference
        hybrid = [f for f in result.functions if f.name == "Zamba2MambaDecoderLayer_1"]
        assert hybrid and "extra Add" in hybrid[0].differs_from
        assert hybrid[0].calls == ("model.layers.2.mamba_decoder",)


# ---- names engines confuse -------------------------------------------------------------------


def _named(name: str, body: type[nn.Module]) -> type[nn.Module]:
    return type(name, (body,), {"__module__": __name__})


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x)) * 0.5


OPERATOR_NAMED = ["Softmax", "Identity", "Attention", "LayerNormalization", "Gelu"]


class OperatorNamed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.parts = nn.ModuleList(_named(n, _Scaled)() for n in OPERATOR_NAMED)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for part in self.parts:
            x = part(x)
        return x


def test_no_function_is_named_like_an_operator(ort_outputs, assert_close) -> None:
    assert {"Softmax", "Attention", "Gelu"} <= operator_names()  # default and com.microsoft
    torch.manual_seed(0)
    model, args = OperatorNamed().eval(), models.x8()
    proto = om.export(model, args, dedupe=False).model_proto
    names = {f.name for f in proto.functions}
    assert not names & operator_names()
    assert {f"{n}_module" for n in OPERATOR_NAMED} <= names
    assert all(n.op_type in names for n in proto.graph.node if n.domain != "")
    assert_close(ort_outputs(proto, args)[0], model(*args), 1e-5)
    again = om.export(model, args, dedupe=False).model_proto
    assert again.SerializeToString() == proto.SerializeToString()  # deterministic names


# ---- functions parametrized by attributes ---------------------------------------------------


class Bounded(nn.Module):
    """A scale and clamp bounds as plain Python floats: Constants in the body."""

    def __init__(self, scale: float, low: float, high: float) -> None:
        super().__init__()
        self.scale, self.low, self.high = scale, low, high

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.scale).clamp(self.low, self.high)


class Layer(nn.Module):
    """A layer whose hyperparameters vary with its depth, as in a model's per-layer config."""

    def __init__(self, alpha: float, eps: float, scale: float) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.CELU(alpha)
        self.norm = nn.LayerNorm(8, eps=eps)
        self.bound = Bounded(scale, -scale, 2 * scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bound(self.norm(self.act(self.fc(x))))


class Hyper(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer(alpha, eps, scale) for alpha, eps, scale in
                                    [(1.0, 1e-5, 0.5), (2.0, 1e-3, 1.5), (0.5, 1e-5, 3.0)])
        self.acts = nn.ModuleList([nn.LeakyReLU(0.1), nn.LeakyReLU(0.3), nn.ELU(0.5),
                                   nn.Hardtanh(-2.0, 2.0), nn.Hardtanh(-1.0, 3.0)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        for act in self.acts:
            x = act(x)
        return x


def _attributes(function: onnx.FunctionProto) -> list[str]:
    return [*function.attribute, *(a.name for a in function.attribute_proto)]


def test_bodies_differing_in_scalars_share_one_function_with_attributes(
        ort_outputs, assert_close, tmp_path) -> None:
    torch.manual_seed(0)
    model, args = Hyper().eval(), (torch.randn(2, 8) * 3,)
    proto = om.export(model, args).model_proto
    onnx.checker.check_model(proto, full_check=True)
    functions = {f.name: f for f in proto.functions}
    for cls in ["Layer", "CELU", "LayerNorm", "Bounded", "LeakyReLU", "Hardtanh"]:
        assert _functions_of(proto, cls) == [cls], cls
    assert _attributes(functions["CELU"]) == ["alpha"]
    assert _attributes(functions["LayerNorm"]) == ["epsilon"]
    assert len(_attributes(functions["Bounded"])) == 3  # scale, low, high
    # the layer passes its own attributes on to its children
    refs = {a.ref_attr_name for n in functions["Layer"].node for a in n.attribute}
    assert {"alpha", "epsilon"} <= refs
    alphas = [next(a.f for a in n.attribute if a.name == "alpha")
              for n in proto.graph.node if n.op_type == "Layer"]
    assert alphas == [1.0, 2.0, 0.5]
    expected = model(*args)
    assert_close(ort_outputs(proto, args)[0], expected, 1e-5)
    inlined = onnx.inliner.inline_local_functions(proto)
    onnx.checker.check_model(inlined, full_check=True)
    assert_close(ort_outputs(inlined, args)[0], expected, 1e-5)
    # invariant 2: inlined, the same ops as the flat model, same numbers bit for bit
    flat = om.export(model, args, functions="none").model_proto
    ops = collections.Counter(n.op_type for n in inlined.graph.node if n.op_type != "Constant")
    assert ops == collections.Counter(n.op_type for n in flat.graph.node)
    assert (ort_outputs(proto, args)[0] == ort_outputs(flat, args)[0]).all()
    with om.Validation(model, args, proto, providers="cpu", localize=True) as validation:
        report = validation.run()
        assert report.ok
        # a parametrized call cut out alone takes its own values (layers.2: alpha 0.5, not
        # the default 1.0), its children's references included
        for call in ("layers.2", "layers.1.act", "acts.4"):
            extraction = validation.extract(tmp_path / call, call=call)
            assert extraction.alone.ok, call
            module = onnx.load(tmp_path / call / "module.onnx")
            assert not [a for n in module.graph.node for a in n.attribute if a.ref_attr_name]
    # invariant 6: byte-identical
    om.export(model, args).save(tmp_path / "a.onnx")
    om.export(model, args).save(tmp_path / "b.onnx")
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
