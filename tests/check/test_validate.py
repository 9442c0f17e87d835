"""validate(): torch eager vs ONNX Runtime, per-dtype tolerances, reports, localization."""

from __future__ import annotations

import json

import models
import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

import onnx_modular as om
from onnx_modular.check import numerics
from onnx_modular.check.probe import build_probe
from onnx_modular.leaves import runtime as _ort

HAS_CUDA = "CUDAExecutionProvider" in _ort.available_providers()
NO_CUDA = "needs onnxruntime-gpu with the CUDAExecutionProvider and a CUDA GPU"


class Layer(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.fc(x))


class Stack(nn.Module):
    """Three residual layers, a head and two outputs in a dict (pytree flattening)."""

    def __init__(self, d: int = 8, n: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer(d) for _ in range(n))
        self.head = nn.Linear(d, 4)

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> dict:
        for layer in self.layers:
            x = layer(x)
        if scale is not None:
            x = x * scale
        logits = self.head(x)
        return {"logits": logits, "best": logits.argmax(-1)}


def _export(model: nn.Module, args: tuple, **kw: object) -> onnx.ModelProto:
    return torch.onnx.export(model, args, dynamo=True, verbose=False, **kw).model_proto


def _copy(proto: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    return out


def _scale_initializer(proto: onnx.ModelProto, name: str, factor: float) -> onnx.ModelProto:
    proto = _copy(proto)
    for init in proto.graph.initializer:
        if init.name == name:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * factor, name))
            return proto
    raise AssertionError(f"no initializer {name}")


@pytest.fixture(scope="module")
def stack() -> tuple[nn.Module, tuple, onnx.ModelProto]:
    torch.manual_seed(0)
    model = Stack().eval()
    args = (torch.randn(2, 8),)
    return model, args, _export(model, args)


@pytest.fixture(scope="module")
def gpt2() -> tuple[nn.Module, tuple, onnx.ModelProto]:
    model, args = models.gpt2(3)
    return model, args, _export(model, args)


# ---- models that validate ------------------------------------------------------------------

@pytest.mark.slow
def test_flat_model_validates(stack, tmp_path):
    model, args, proto = stack
    rep = om.validate(model, args, proto)
    assert rep.ok and rep.first_mismatch is None and rep.localization is None
    assert rep.providers == [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider")
                             if p in _ort.available_providers()]
    cpu = rep.results[-1]
    assert [o.name for o in cpu.outputs] == [o.name for o in proto.graph.output]
    assert [o.dtype for o in cpu.outputs] == ["float32", "int64"]
    assert cpu.outputs[1].rtol == 0 and cpu.outputs[1].atol == 0  # integers are exact
    assert cpu.outputs[0].diff.max_abs < 1e-5 and cpu.session_s > 0 and cpu.run_s > 0
    # JSON-able, markdown, terminal rendering, atomic save by suffix
    data = json.loads(json.dumps(rep.to_dict()))
    assert data["ok"] is True and data["first_mismatch"] is None
    assert data["providers"]["CPUExecutionProvider"]["outputs"][0]["max_abs_err"] < 1e-5
    assert "OK" in str(rep) and "CPU" in str(rep)
    rep.save(tmp_path / "r.json")
    rep.save(tmp_path / "r.md")
    assert json.loads((tmp_path / "r.json").read_text())["ok"] is True
    assert "| EP | output |" in (tmp_path / "r.md").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.md"]
    with pytest.raises(om.OnnxModularError, match=r"use a \.json"):
        rep.save(tmp_path / "r.txt")


@pytest.mark.slow
def test_path_export_result_and_kwargs(tmp_path):
    torch.manual_seed(1)
    model = Stack().eval()
    args, kwargs = (torch.randn(2, 8),), {"scale": torch.full((8,), 0.5)}
    prog = torch.onnx.export(model, args, kwargs=kwargs, dynamo=True, verbose=False)
    prog.save(tmp_path / "m.onnx")
    for target in (prog, tmp_path / "m.onnx", str(tmp_path / "m.onnx")):
        rep = om.validate(model, args, target, kwargs=kwargs, providers="cpu")
        assert rep.ok, rep.summary()
    other = {"scale": torch.full((8,), -2.0)}  # kwargs are inputs: bound by name, not baked
    assert om.validate(model, args, prog, kwargs=other, providers=["cpu"]).ok


@pytest.mark.slow
def test_transformers_gpt2_validates(gpt2):
    model, args, proto = gpt2
    rep = om.validate(model, args, proto, providers="cpu", localize=True)
    assert rep.ok, rep.summary()
    assert rep.localization is not None and rep.localization.kind == "flat"
    assert rep.localization.calls_checked > 20 and rep.localization.divergences == []


@pytest.mark.slow
def test_exported_program_as_model(stack):
    model, args, proto = stack
    ep = torch.export.export(model, args)
    assert om.validate(ep, args, proto, providers="cpu").ok
    bad = _scale_initializer(proto, "layers.2.fc.weight", 1.5)
    rep = om.validate(ep, args, bad, providers="cpu")
    assert not rep.ok and rep.first_mismatch == "layers.2.fc"


# ---- planted errors: localization ---------------------------------------------------------

@pytest.mark.slow
def test_planted_weight_error_flat(stack):
    model, args, proto = stack
    rep = om.validate(model, args, _scale_initializer(proto, "layers.1.fc.weight", 1.5))
    assert not rep.ok
    assert rep.first_mismatch == "layers.1.fc"
    paths = [d.module_path for d in rep.localization.divergences]
    assert "layers.0" not in paths and "layers.0.fc" not in paths
    assert paths.index("layers.1.fc") < paths.index("layers.1") < paths.index("layers.2")
    first = rep.localization.divergences[0]
    assert first.max_abs > 1e-3 and first.mismatched > 0
    inherited = {d.module_path: d.inherited for d in rep.localization.divergences}
    assert inherited["layers.1.fc"] is False and inherited["layers.1"] is False
    assert inherited["layers.2"] is True and inherited["head"] is True  # fed a wrong value
    data = json.loads(json.dumps(rep.to_dict()))
    assert data["first_mismatch"] == "layers.1.fc"
    assert data["localization"]["divergences"][0]["module_path"] == "layers.1.fc"
    assert "layers.1.fc" in rep.to_markdown() and "MISMATCH" in str(rep)


@pytest.mark.slow
def test_planted_op_error_flat(stack):
    model, args, proto = stack
    bad = _copy(proto)
    adds = [n for n in bad.graph.node if n.op_type == "Add"
            and "layers.1" in {p.key: p.value for p in n.metadata_props}.get(
                "pkg.torch.onnx.name_scopes", "")]
    assert adds, "the residual Add of layers.1"
    adds[-1].op_type = "Sub"
    rep = om.validate(model, args, bad, providers="cpu")
    assert not rep.ok and rep.first_mismatch == "layers.1"


@pytest.mark.slow
def test_planted_error_gpt2(gpt2):
    model, args, proto = gpt2
    bad = _scale_initializer(proto, "model.h.1.mlp.c_fc.weight", 1.1)
    rep = om.validate(model, args, bad, providers="cpu")
    assert not rep.ok
    assert rep.first_mismatch == "model.h.1.mlp.c_fc"
    assert all(not d.module_path.startswith("model.h.0")
               for d in rep.localization.divergences)


def test_no_localization_without_metadata(stack):
    model, args, proto = stack
    bad = _scale_initializer(proto, "layers.1.fc.weight", 1.5)
    for node in bad.graph.node:
        del node.metadata_props[:]
    rep = om.validate(model, args, bad, providers="cpu")
    assert not rep.ok and rep.first_mismatch is None
    assert rep.localization.kind == "none" and "metadata" in rep.localization.note


# ---- hierarchical models (call nodes with onnx_modular metadata) ---------------------------

@pytest.mark.parametrize(("plant", "expected"), [
    ({}, None),
    ({"weight_scale": {1: 1.5}}, "layers.1.fc"),  # resolved through the shared body
    ({"layer_ops": {1: "Sub"}}, "layers.1"),       # a copied body only layers.1 calls
    ({"lin_scale": {2: 1.3}}, "layers.2.fc"),      # a nested copied body
])
def test_hierarchical_localization(plant, expected):
    model, args = models.net()
    proto = models.hierarchical(model, **plant)
    rep = om.validate(model, args, proto, providers="cpu", localize=True)
    assert rep.ok == (expected is None)
    assert rep.first_mismatch == expected
    assert rep.localization.kind == "hierarchical"
    assert rep.localization.calls_checked == 6  # every Layer and every nested Lin call


def test_probe_names_survive_inlining():
    model, _ = models.net()
    probe = build_probe(models.hierarchical(model))
    assert [c.call_id for c in probe.calls] == [
        "layers.0", "layers.0.fc", "layers.1", "layers.0.fc", "layers.2", "layers.0.fc"]
    assert [c.exact for c in probe.calls] == [True, False] * 3
    assert probe.calls[1].parent == 0 and probe.calls[3].parent == 2
    inlined = onnx.load_from_string(probe.model_bytes)
    # bodies that call functions are expanded; leaf calls (Lin) stay calls for ORT to expand
    assert {f.name for f in inlined.functions} == {"Lin"}
    assert not any(n.op_type == "Layer" for n in inlined.graph.node)
    # the weights come back as fields cut from the original bytes, once each
    assert sorted(i.name for i in inlined.graph.initializer) == [
        f"layers.{i}.fc.weight" for i in range(3)]
    assert all(i.raw_data or i.float_data for i in inlined.graph.initializer)
    outputs = {o.name for o in inlined.graph.output}
    for call in probe.calls:
        assert call.outputs and set(call.outputs) <= outputs
    # the nested calls' outputs are distinct values, one per call instance
    assert len({c.outputs[0] for c in probe.calls}) == 6


# ---- hierarchical exports from om.export ---------------------------------------------------

@pytest.fixture(scope="module")
def gpt2_hier() -> tuple[nn.Module, tuple, onnx.ModelProto]:
    model, args = models.gpt2(3)
    return model, args, om.export(model, args).model_proto


@pytest.mark.slow
def test_hierarchical_export_validates(gpt2_hier):
    model, args, proto = gpt2_hier
    assert proto.functions
    rep = om.validate(model, args, proto, providers="cpu", localize=True)
    assert rep.ok, rep.summary()
    loc = rep.localization
    assert loc.kind == "hierarchical" and loc.divergences == []
    # every module call instance, nested ones in shared bodies included, was paired
    assert loc.calls_checked >= 1 + 2 + 3 * 9


@pytest.mark.slow
def test_hierarchical_planted_weight(gpt2_hier):
    model, args, proto = gpt2_hier
    bad = _scale_initializer(proto, "model.h.1.mlp.c_fc.weight", 1.1)
    rep = om.validate(model, args, bad, providers="cpu")
    assert not rep.ok and rep.first_mismatch == "model.h.1.mlp.c_fc"
    assert all(not d.module_path.startswith("model.h.0") for d in rep.localization.divergences)


@pytest.mark.slow
def test_hierarchical_planted_in_function_body(gpt2_hier):
    """An error inside the body of the Conv1D that only model.h.2's c_fc call uses."""
    model, args, proto = gpt2_hier
    bad = _copy(proto)
    model_fn = models.isolate_call(bad, "model")
    block = models.isolate_call(bad, "model.h.2", model_fn)
    mlp = models.isolate_call(bad, "model.h.0.mlp", block)  # shared body: h.0's metadata
    conv = models.isolate_call(bad, "model.h.0.mlp.c_fc", mlp)
    gemm = next(n for n in conv.node if n.op_type == "Gemm")
    gemm.attribute.append(onnx.helper.make_attribute("alpha", 1.05))
    rep = om.validate(model, args, bad, providers="cpu")
    assert not rep.ok and rep.first_mismatch == "model.h.2.mlp.c_fc"
    # a residual Add turned Sub in the block body that only model.h.1 calls
    bad = _copy(proto)
    block = models.isolate_call(bad, "model.h.1", models.isolate_call(bad, "model"))
    [n for n in block.node if n.op_type == "Add"][-1].op_type = "Sub"
    rep = om.validate(model, args, bad, providers="cpu")
    assert not rep.ok and rep.first_mismatch == "model.h.1"


@pytest.mark.slow
def test_first_mismatch_is_judged_on_the_same_inputs():
    """Llama's MLP: down_proj(act(gate(x)) * up(x)). A Mul turned Add inside the MLP body
    makes down_proj's output diverge first (it is the MLP's output too), but down_proj is
    fed a wrong input; the MLP call is where torch and ONNX part on the same inputs."""
    model, args = models.llama(2)
    bad = om.export(model, args).model_proto
    fn = None
    for call_id in ("model", "model.layers.1", "model.layers.0.mlp"):
        fn = models.isolate_call(bad, call_id, fn)
    next(n for n in fn.node if n.op_type == "Mul").op_type = "Add"
    rep = om.validate(model, args, bad, providers="cpu")
    assert not rep.ok and rep.first_mismatch == "model.layers.1.mlp"
    inherited = {d.module_path: d.inherited for d in rep.localization.divergences}
    assert inherited["model.layers.1.mlp.down_proj"] is True
    assert inherited["model.layers.1.mlp"] is False


# ---- inputs, files, providers: clear one-line errors -----------------------------------------

def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_input_mismatches(stack):
    model, args, proto = stack
    with pytest.raises(om.OnnxModularError) as e:
        om.validate(model, (args[0], args[0]), proto)
    assert "takes 1 input(s)" in _one_line(e)
    with pytest.raises(om.OnnxModularError) as e:
        om.validate(model, (args[0].double(),), proto)
    assert "expects float32, got a float64" in _one_line(e)
    with pytest.raises(om.OnnxModularError) as e:
        om.validate(model, (args[0][None],), proto)
    assert "expects rank 2" in _one_line(e)
    with pytest.raises(om.OnnxModularError) as e:
        om.validate(model, (torch.randn(3, 8),), proto)
    assert "dimension 0 to be 2" in _one_line(e)


def test_unreadable_models(stack, tmp_path):
    model, args, _ = stack
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07this is not a protobuf" * 8)
    with pytest.raises(om.OnnxModularError) as e:
        om.validate(model, args, corrupt)
    assert "corrupt.onnx" in _one_line(e)
    with pytest.raises(om.OnnxModularError, match="no such file"):
        om.validate(model, args, tmp_path / "missing.onnx")
    with pytest.raises(om.OnnxModularError, match="must be a path"):
        om.validate(model, args, 42)


def test_providers_and_reports(stack, tmp_path):
    model, args, proto = stack
    assert _ort.resolve_providers("cpu") == ["CPUExecutionProvider"]
    assert _ort.resolve_providers(["CPU", "CPUExecutionProvider"]) == ["CPUExecutionProvider"]
    if not HAS_CUDA:
        with pytest.raises(om.OnnxModularError, match="onnxruntime-gpu"):
            om.validate(model, args, proto, providers="cuda")
    with pytest.raises(om.OnnxModularError, match="not available"):
        om.validate(model, args, proto, providers="nosuch")
    from io import StringIO

    from rich.console import Console

    out = StringIO()
    console = Console(file=out, width=120)
    rep = om.validate(model, args, proto, providers="cpu")
    assert rep.ok
    console.print(rep)
    rep.save(tmp_path / "ok.json")
    bad = _scale_initializer(proto, "layers.1.fc.weight", 1.5)
    rep = om.validate(model, args, bad, providers="cpu")
    assert not rep.ok and rep.first_mismatch == "layers.1.fc"
    console.print(rep)
    assert "layers.1.fc" in out.getvalue() and "MISMATCH" in out.getvalue()
    with pytest.raises(om.OnnxModularError, match="no such file"):
        om.validate(model, args, tmp_path / "nope.onnx")
    assert json.loads((tmp_path / "ok.json").read_text())["ok"] is True


def test_tolerances_by_dtype():
    assert numerics.tolerances_for("float32", None, None) == (1e-4, 1e-4)
    assert numerics.tolerances_for("float16", None, None) == (1e-2, 1e-3)
    assert numerics.tolerances_for("bfloat16", None, None) == (1.6e-2, 1e-2)
    assert numerics.tolerances_for("int64", 1.0, 1.0) == (0.0, 0.0)
    assert numerics.tolerances_for("bool", None, None) == (0.0, 0.0)
    assert numerics.tolerances_for("float32", 1e-2, None) == (1e-2, 1e-4)
    d = numerics.diff(np.array([1.0, np.nan]), np.array([1.0 + 1e-5, np.nan]), 1e-4, 1e-4)
    assert d.ok and d.max_abs == pytest.approx(1e-5)
    assert not numerics.diff(np.array([1, 2]), np.array([1, 3]), 0, 0).ok
    assert not numerics.diff(np.zeros(3), np.zeros(4), 1, 1).ok


@pytest.mark.slow
def test_float16_model_and_user_tolerance():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4)).half().eval()
    args = (torch.randn(2, 16, dtype=torch.float16),)
    proto = _export(model, args)
    rep = om.validate(model, args, proto, providers="cpu")
    assert rep.ok, rep.summary()
    assert rep.results[0].outputs[0].dtype == "float16"
    assert rep.results[0].outputs[0].rtol == 1e-2
    strict = om.validate(model, args, proto, providers="cpu", rtol=0.0, atol=0.0)
    assert strict.results[0].outputs[0].atol == 0.0


@pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA)
def test_cuda_provider(gpt2):
    model, args, proto = gpt2
    rep = om.validate(model, args, proto, providers="cuda,cpu")
    assert rep.providers == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert rep.ok, rep.summary()
    bad = _scale_initializer(proto, "model.h.1.mlp.c_fc.weight", 1.1)
    rep = om.validate(model, args, bad, providers="cuda")
    assert rep.localization_provider == "CUDAExecutionProvider"
    assert rep.first_mismatch == "model.h.1.mlp.c_fc"


@pytest.mark.slow
def test_values_changed_in_place_are_not_compared():
    torch.manual_seed(0)
    model, args = models.InPlace().eval(), (torch.randn(2, 4),)
    proto = _export(model, args)
    rep = om.validate(model, args, proto, providers="cpu", localize=True)
    assert rep.ok and rep.localization.divergences == []
    assert rep.localization.calls_checked == 1  # "after"; "inner"'s output changed later


def test_localization_of_a_model_with_external_data(tmp_path):
    """Loading reads the data files in, which clears the references in the proto: the probe
    (built from the file's own bytes) must still be told where the data lies."""
    model, args = models.net()
    proto = models.hierarchical(model, weight_scale={1: 1.5})
    onnx.save_model(proto, tmp_path / "m.onnx", save_as_external_data=True,
                    location="m.data", size_threshold=0)
    rep = om.validate(model, args, tmp_path / "m.onnx", providers="cpu")
    assert not rep.ok and rep.first_mismatch == "layers.1.fc"


@pytest.mark.parametrize("broken", [False, True])
def test_localization_asked_up_front_matches_one_asked_later(stack, broken: bool) -> None:
    """localize=True builds the probe on a thread beside the plain check (unfused for a
    passing model, fused anew for a failing one); the verdict is the one asked later."""
    model, args, proto = stack
    if broken:
        proto = _scale_initializer(proto, "layers.2.fc.weight", 1.5)
    early = om.validate(model, args, proto, providers="cpu", localize=True)
    with om.Validation(model, args, proto, providers="cpu", localize=False) as session:
        late = session.run()
        assert late.localization is None
        late = session.localize()
    assert early.ok == late.ok == (not broken)
    assert early.localization == late.localization
    assert early.localization.calls_checked > 0
    assert early.first_mismatch == ("layers.2.fc" if broken else None)


@pytest.mark.slow
@pytest.mark.parametrize("broken", [False, True])
def test_a_large_model_is_checked_without_prepacked_weights(tmp_path, monkeypatch, prepacked,
                                                            broken: bool) -> None:
    """Above LARGE_MODEL_BYTES (lowered here) neither session prepacks: ORT maps the
    external weights instead of copying them. The verdict and the culprit are the same."""
    from onnx_modular.leaves import runtime

    model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(4)])
    args = (torch.randn(3, 5, 64),)
    result = om.export(model.eval(), args)
    result.save(tmp_path / "m.onnx", external_data_threshold=0)
    if broken:
        with torch.no_grad():
            model[2][0].weight.mul_(1.5)
    monkeypatch.setattr(runtime, "LARGE_MODEL_BYTES", 0)
    lean = om.validate(model, args, tmp_path / "m.onnx", providers="cpu", localize=True)
    # the plain session, the probe's, and the own errors' (each call on torch's inputs)
    lean_sessions = len(prepacked)
    assert lean_sessions >= 3 and not any(prepacked)
    monkeypatch.setattr(runtime, "LARGE_MODEL_BYTES", 2**62)
    default = om.validate(model, args, tmp_path / "m.onnx", providers="cpu", localize=True)
    assert len(prepacked) > lean_sessions + 1 and all(prepacked[lean_sessions:])
    assert lean.ok == default.ok == (not broken)
    assert lean.first_mismatch == default.first_mismatch == ("2.0" if broken else None)


class ScalarLoss(nn.Module):
    """0-d outputs, as diffusers' VQModel's loss: a float mean, an int count, a bool flag."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.fc(x)
        return y.pow(2).mean(), (y > 0).sum(), (y > 0).any(), (y * 0).sum() / 0.0


@pytest.mark.slow
@pytest.mark.parametrize("localize", [False, True])
def test_scalar_outputs_validate_with_the_right_verdict(localize: bool) -> None:
    """A 0-d float output raised 'return arrays must be of ArrayType' in the diff; it must
    pass when ORT matches torch (the NaN scalar matching NaN) and fail when it does not."""
    torch.manual_seed(0)
    model, args = ScalarLoss().eval(), (torch.randn(3, 4),)
    proto = _export(model, args)
    rep = om.validate(model, args, proto, providers="cpu", localize=localize)
    assert rep.ok, rep.summary()
    with torch.no_grad():
        model.fc.bias += 0.5  # torch now differs from the exported model
    rep = om.validate(model, args, proto, providers="cpu", localize=localize)
    assert not rep.ok
    failed = [c for c in rep.results[0].outputs if not c.ok]
    assert failed and failed[0].diff.max_abs > 1e-3, rep.summary()


class RunningMean(nn.Module):
    """Updates a buffer in place on every call, as a running statistic or a counter does."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(4))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.mean.mul_(0.5).add_(x.mean(0))
        self.steps = self.steps + 1  # reassigned, where `mean` is updated in place
        return x + self.mean


class Repeats(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stat = RunningMean()

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs = []
        for _ in range(3):
            x = self.stat(x)
            outs.append(x)
        return outs


@pytest.mark.slow
def test_validating_leaves_the_models_buffers_as_they_were() -> None:
    """Each eager run updated the buffers the file holds as constants: the model changed
    under the user, and the next check (another validate, the localization's recording run)
    compared a different model, MISMATCH at ``stat``."""
    torch.manual_seed(0)
    model, args = Repeats().eval(), (torch.randn(2, 4),)
    proto = _export(model, args)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for localize in (False, True, False):
        rep = om.validate(model, args, proto, providers="cpu", localize=localize)
        assert rep.ok, rep.summary()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # a file holding other buffer values is still told apart
    model.stat.mean.fill_(1.0)
    assert not om.validate(model, args, proto, providers="cpu").ok


class _WithSize(nn.Module):
    """Returns a size beside its tensor: a dynamic export writes it as an output."""

    def __init__(self, axis: int) -> None:
        super().__init__()
        self.fc, self.axis = nn.Linear(8, 8), axis

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return self.fc(x), x.shape[self.axis]


@pytest.mark.slow
def test_a_size_the_model_returns_is_paired_with_its_output_and_checked(tmp_path):
    """The file om.export wrote had 2 outputs where torch returned 1 tensor (and an int):
    validate refused it ("they cannot be paired")."""
    torch.manual_seed(0)
    model, x = _WithSize(1).eval(), torch.randn(2, 5, 8)
    shapes = ({0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("seq", max=64)},)
    right = om.export(model, (x,), dynamic_shapes=shapes)
    assert len(right.model_proto.graph.output) == 2
    report = om.validate(model, (x,), right, providers=["cpu"])
    assert report.ok and not report.unchecked
    # a file without the size output is checked on its tensor and says what it left out
    tensor_only = right.model_proto
    tensor_only.graph.output.pop()
    report = om.validate(model, (x,), tensor_only, providers=["cpu"])
    assert report.ok and "1 number(s) the file has no output for" in report.unchecked
    assert "not compared" in report.summary() and "Not compared" in report.to_markdown()
    assert report.to_dict()["unchecked"] == report.unchecked
    other = _WithSize(0).eval()  # the batch size (2) where torch returns the sequence's (5)
    other.load_state_dict(model.state_dict())
    wrong = om.export(other, (x,), dynamic_shapes=shapes)
    assert not om.validate(model, (x,), wrong, providers=["cpu"]).ok
    with pytest.raises(om.OnnxModularError, match=r"torch returns 1 tensor\(s\) and 1 "
                       r"number\(s\) but .* has 3 output\(s\)"):
        om.validate(model, (x,), om.export(_TwoOut(), (x,)), providers=["cpu"])


class _TwoOut(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x + 1, x * 2, x - 1


class _HalfNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 32),
                                                   nn.GELU(), nn.Linear(32, 16))
                                     for _ in range(3)])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for block in self.blocks:
            x = x + block(x)
        return x.softmax(-1), x.float().mean(-1)


@pytest.mark.slow
def test_a_float32_output_of_float16_activations_is_judged_as_float16(tmp_path):
    """The float32 mean of fp16 activations was judged at float32's 1e-4 and the correct
    file reported MISMATCH (a parts directory too); a file of other weights still fails."""
    torch.manual_seed(0)
    model, x = _HalfNet().half().eval(), torch.randn(2, 5, 16).half()
    report = om.validate(model, (x,), om.export(model, (x,)), providers=["cpu"])
    assert report.ok, report
    program = torch.export.export(model, (x,), strict=False)
    om.split_stages(program, num_stages=2).save(tmp_path / "stages")
    assert om.validate(model, (x,), tmp_path / "stages", providers=["cpu"]).ok
    other = _HalfNet().half().eval()
    assert not om.validate(model, (x,), om.export(other, (x,)), providers=["cpu"]).ok


class _Rounding(nn.Module):
    """A float32 model with an fp16 table; ``round_trip``: a wrong translation that rounds
    an intermediate through float16."""

    def __init__(self, round_trip: bool) -> None:
        super().__init__()
        self.fc, self.round_trip = nn.Linear(16, 16), round_trip
        self.register_buffer("table", torch.linspace(0, 1, 4096).half())  # most elements

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc(x)) * 30
        if self.round_trip:
            h = h.half().float()
        return h + self.table[pos].float().unsqueeze(-1)


@pytest.mark.slow
def test_a_file_rounding_through_float16_is_no_excuse_in_a_float32_model():
    """The file's fp16 types (or one fp16 table) loosened every float32 output to fp16's
    tolerances: a file off by ~5e-3 relative passed (found by a tester)."""
    torch.manual_seed(0)
    model = _Rounding(False).eval()
    wrong = _Rounding(True).eval()
    wrong.load_state_dict(model.state_dict())
    args = (torch.randn(4, 16), torch.tensor([1, 3, 5, 7]))
    assert om.validate(model, args, om.export(model, args), providers=["cpu"]).ok
    assert not om.validate(model, args, om.export(wrong, args), providers=["cpu"]).ok
