"""validate / compare / the CLI on models the other tests do not use (acceptance checks).

OPT from a tiny config, a conv net with BatchNorm, a model with kwargs and dict/tuple
outputs holding integer tensors, a float16 model; errors planted in function bodies; a
flat export whose module metadata is ambiguous; CUDA requested on a CPU-only onnxruntime;
and the command line's one-line errors.
"""

from __future__ import annotations

import json

import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

import onnx_modular as om
from onnx_modular.cli import main
from onnx_modular.leaves import runtime as _ort

pytestmark = pytest.mark.slow  # whole models: the full suite, not the inner loop

HAS_CUDA = "CUDAExecutionProvider" in _ort.available_providers()


class ConvNet(nn.Module):
    """Three identical residual conv blocks (Sequential of Conv, BatchNorm, ReLU)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
            for _ in range(3))
        self.head = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x.mean((2, 3)))


class KwDict(nn.Module):
    """Keyword inputs; a dict output holding a tuple, an argmax and a count (int64)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *,
                scale: torch.Tensor) -> dict:
        h = torch.relu(self.a(x))
        if mask is not None:
            h = h * mask
        logits = self.b(h) * scale
        return {"logits": logits, "pair": (h, logits.argmax(-1)), "count": (h > 0).sum(-1)}


class HalfStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = nn.functional.gelu(layer(x)) + x
        return self.norm(x)


def _conv() -> tuple[nn.Module, tuple, dict]:
    torch.manual_seed(0)
    return ConvNet().eval(), (torch.randn(2, 3, 8, 8),), {}


def _kwdict() -> tuple[nn.Module, tuple, dict]:
    torch.manual_seed(0)
    return KwDict().eval(), (torch.randn(2, 8),), {"mask": torch.ones(2, 8),
                                                   "scale": torch.tensor(2.0)}


def _half() -> tuple[nn.Module, tuple, dict]:
    torch.manual_seed(0)
    return HalfStack().half().eval(), (torch.randn(2, 8).half(),), {}


@pytest.fixture(scope="module")
def opt() -> tuple[nn.Module, tuple, onnx.ModelProto]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.OPTConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=2, ffn_dim=32, num_attention_heads=2,
        max_position_embeddings=16, word_embed_proj_dim=16, use_cache=False,
        attn_implementation="eager")
    model = transformers.OPTForCausalLM(config).eval()
    args = (torch.randint(0, 64, (1, 6)),)
    return model, args, om.export(model, args).model_proto


def _isolate(proto: onnx.ModelProto, call_id: str,
             within: onnx.FunctionProto | None = None) -> onnx.FunctionProto:
    """A private copy of the function that the call node ``call_id`` calls."""
    for node in (within.node if within is not None else proto.graph.node):
        # inside a body call ids are relative to its module: match by the tail
        if any(p.key == "onnx_modular.call_id" and (p.value == call_id or (
                within is not None and call_id.endswith("." + p.value)))
               for p in node.metadata_props):
            original = next(f for f in proto.functions
                            if f.name == node.op_type and f.domain == node.domain)
            copy = proto.functions.add()
            copy.CopyFrom(original)
            copy.name = node.op_type = f"{original.name}_planted"
            return copy
    raise AssertionError(f"no call node {call_id}")


# ---- unseen models validate ok ---------------------------------------------------------------

@pytest.mark.parametrize("make", [_conv, _kwdict, _half], ids=["conv", "kwargs-dict", "fp16"])
@pytest.mark.parametrize("functions", ["all", "none"])
def test_unseen_models_validate_ok(make, functions, tmp_path):
    model, args, kwargs = make()
    res = om.export(model, args, kwargs or None, functions=functions)
    assert bool(res.model_proto.functions) == (functions == "all")
    rep = om.validate(model, args, res, kwargs=kwargs, localize=True)
    assert rep.ok, rep.summary()
    data = json.loads(json.dumps(rep.to_dict()))
    outputs = data["providers"]["CPUExecutionProvider"]["outputs"]
    assert all({"max_abs_err", "max_rel_err", "dtype"} <= set(o) for o in outputs)
    assert data["providers"]["CPUExecutionProvider"]["run_s"] >= 0
    if make is _kwdict:  # dict/tuple outputs flatten to 4; the int ones compare exactly
        assert [o["dtype"] for o in outputs] == ["float32", "float32", "int64", "int64"]
        assert all(o["max_abs_err"] == 0 for o in outputs[2:])
    text = str(rep)
    assert "CPU" in text and "OK:" in text
    rep.save(tmp_path / "r.md")
    rep.save(tmp_path / "r.html")
    assert "| CPU |" in (tmp_path / "r.md").read_text()


def test_opt_validates_and_localizes_planted_body_errors(opt):
    model, args, proto = opt
    assert om.validate(model, args, proto, providers="cpu").ok
    # an Add turned Sub in the attention body that only layer 1 calls
    bad = onnx.ModelProto()
    bad.CopyFrom(proto)
    fn = None
    for call_id in ("model.decoder", "model.decoder.layers.1",
                    "model.decoder.layers.0.self_attn"):  # shared bodies: layer 0's ids
        fn = _isolate(bad, call_id, fn)
    next(n for n in fn.node if n.op_type == "Add").op_type = "Sub"
    rep = om.validate(model, args, bad, providers="cpu")
    assert not rep.ok and rep.first_mismatch == "model.decoder.layers.1.self_attn"
    paths = [d.module_path for d in rep.localization.divergences]
    assert "model.decoder.layers.1" in paths
    assert not any(p.startswith("model.decoder.layers.0") for p in paths)
    # a constant changed in the one shared ReLU body: every layer uses it, layer 0 first
    bad = onnx.ModelProto()
    bad.CopyFrom(proto)
    relu = next(f for f in bad.functions if f.name == "ReLU")
    relu.node[0].op_type = "Sigmoid"
    rep = om.validate(model, args, bad, providers="cpu")
    assert rep.first_mismatch == "model.decoder.layers.0.activation_fn"


def test_conv_planted_epsilon_in_isolated_batchnorm():
    model, args, _ = _conv()
    proto = om.export(model, args).model_proto
    bn = _isolate(proto, "blocks.0.1", _isolate(proto, "blocks.2"))
    eps = next(a for a in bn.node[0].attribute if a.name == "epsilon")
    eps.f = 5.0
    rep = om.validate(model, args, proto, providers="cpu")
    assert not rep.ok and rep.first_mismatch == "blocks.2.1"


# ---- a flat export from shared bodies: never name the wrong module ---------------------------

def _flat_with_planted_weight() -> tuple[nn.Module, tuple, onnx.ModelProto]:
    model, args, _ = _conv()
    proto = om.export(model, args, functions="none").model_proto
    init = next(i for i in proto.graph.initializer if i.name == "blocks.1.0.weight")
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, init.name))
    return model, args, proto


def test_flat_export_with_copied_metadata_names_no_wrong_module():
    """Flat om.export inlines shared bodies, whose nested calls were built for blocks.0;
    inlining moves their labels to each call (emit/inline.py). Without that, localizing by
    them named 'head' (the error is in blocks.1.0); labels that still label two calls alike
    (flat files from elsewhere) make localization say it cannot tell."""
    model, args, proto = _flat_with_planted_weight()
    rep = om.validate(model, args, proto, providers="cpu")
    assert not rep.ok
    assert rep.first_mismatch in (None, "blocks.1.0")
    if rep.first_mismatch is None:
        assert "ambiguous" in rep.localization.note


def test_flat_export_localizes_like_the_hierarchical_one():
    model, args, proto = _flat_with_planted_weight()
    assert om.validate(model, args, proto, providers="cpu").first_mismatch == "blocks.1.0"


# ---- CUDA on a CPU-only onnxruntime ----------------------------------------------------------

@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU-only onnxruntime behaviour")
@pytest.mark.filterwarnings("ignore:Specified provider")
def test_cuda_explicit_is_an_error_default_is_a_stated_skip(monkeypatch):
    model, args, _ = _conv()
    proto = om.export(model, args, functions="none").model_proto
    with pytest.raises(om.OnnxModularError, match="onnxruntime-gpu") as e:
        om.validate(model, args, proto, providers=["CUDAExecutionProvider"])
    assert "\n" not in str(e.value)
    rep = om.validate(model, args, proto)  # default: CUDA is skipped, and the report says so
    assert rep.ok and rep.providers == ["CPUExecutionProvider"]
    assert "onnxruntime-gpu" in rep.to_dict()["skipped"]["CUDAExecutionProvider"]
    assert "CUDA skipped" in str(rep)
    # onnxruntime-gpu without a usable GPU lists CUDA, then falls back to CPU at session time
    monkeypatch.setattr(_ort, "available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    rep = om.validate(model, args, proto)
    assert rep.ok and "could not be initialized" in rep.skipped["CUDAExecutionProvider"]
    with pytest.raises(om.OnnxModularError, match="could not be initialized"):
        om.validate(model, args, proto, providers="cuda")


# ---- the command line ------------------------------------------------------------------------

MODEL_SRC = """
import torch
class Net(torch.nn.Module):
    def __init__(self):
        torch.manual_seed(0)
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))
    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x)) + x
        return x
def inputs():
    return (torch.randn(2, 8),)
def three():
    return (torch.randn(2, 8),) * 3
"""


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("cli")
    src = d / "net.py"
    src.write_text(MODEL_SRC)
    files = {"dir": d, "model": f"{src}:Net", "inputs": f"{src}:inputs",
             "three": f"{src}:three", "h": d / "h.onnx", "f": d / "f.onnx"}
    assert main(["export", files["model"], "--inputs", files["inputs"], "-o", str(files["h"])]) == 0
    assert main(["export", files["model"], "--inputs", files["inputs"], "-o", str(files["f"]),
                 "--flat"]) == 0
    (d / "empty.onnx").write_bytes(b"")
    (d / "text.onnx").write_text("not an onnx model\n")
    data = files["h"].read_bytes()
    (d / "trunc.onnx").write_bytes(data[: len(data) // 2])
    return files


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_cli_compare_exit_codes(cli_files, capsys):
    h, f, d = str(cli_files["h"]), str(cli_files["f"]), cli_files["dir"]
    assert main(["compare", h, f, "--report", str(d / "c.json")]) == 0
    assert json.loads((d / "c.json").read_text())["equivalent"] is True
    altered = onnx.load(f)
    next(n for n in altered.graph.node if n.op_type == "Relu").op_type = "Sigmoid"
    onnx.save(altered, str(d / "altered.onnx"))
    assert main(["compare", h, str(d / "altered.onnx")]) == 1
    capsys.readouterr()
    for name, words in [("trunc.onnx", "not a valid ONNX"), ("text.onnx", "not a valid ONNX"),
                        ("empty.onnx", "no ONNX graph"), ("missing.onnx", "no such file"),
                        (".", "directory")]:
        assert main(["compare", h, str(d / name)]) == 2, name
        assert words in _one_error_line(capsys)
    with pytest.raises(om.OnnxModularError):  # --debug: the exception, with its traceback
        main(["--debug", "compare", h, str(d / "text.onnx")])


def test_cli_validate_errors_are_one_line_on_stderr(cli_files, capsys):
    m, h, d = cli_files["model"], str(cli_files["h"]), cli_files["dir"]
    report = d / "r.json"
    cases = [
        (["--inputs", cli_files["three"], h], "takes 1 input(s)"),
        (["--input", "2x8:float64", h], "expects float32"),
        (["--input", "2x9", h], "dimension 1 to be 8"),
        (["--input", "2x-1", h], "dimensions must be >= 0"),
        (["--input", "2x8:flot", h], "unknown dtype"),
        (["--input", "2x8", str(d / "empty.onnx")], "no ONNX graph"),
        (["--input", "2x8", str(d / "trunc.onnx")], "not a valid ONNX"),
    ]
    for extra, words in cases:
        assert main(["validate", m, *extra, "--report", str(report)]) == 2, extra
        assert words in _one_error_line(capsys)
        assert not report.exists()
    assert main(["validate", m, "--input", "2x8", h, "--report",
                 str(d / "no" / "r.json")]) == 2
    assert "does not exist" in _one_error_line(capsys)
    with pytest.raises(om.OnnxModularError, match="takes 1 input"):
        main(["--debug", "validate", m, "--inputs", cli_files["three"], h])
    assert main(["validate", m, "--inputs", cli_files["inputs"], h, "--report",
                 str(report)]) == 0
    assert json.loads(report.read_text())["ok"] is True


def test_cli_inspect_empty_file_and_flat_model(cli_files, capsys):
    assert main(["inspect", str(cli_files["dir"] / "empty.onnx")]) == 2
    assert "no ONNX graph" in _one_error_line(capsys)
    assert main(["inspect", str(cli_files["f"])]) == 0
    assert "0 functions" in capsys.readouterr().out
    assert main(["inspect", str(cli_files["h"])]) == 0
    assert "layers.0" in capsys.readouterr().out
