"""Repros of one module call: extract, compare-io, per-call error statistics, the overlay.

A 24-layer GPT-2 (tiny config) with an error planted in layer 17, exported hierarchical,
flat and with external data: the extracted layer alone must reproduce the mismatch with an
error of the same order, and a healthy layer extracted the same way must match, even one
that in the full model is fed diverging inputs.
"""

from __future__ import annotations

import json

import models
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import onnx_modular as om
from onnx_modular.check.extract import MARKER, check_directory
from onnx_modular.check.extract.folder import mark as _mark
from onnx_modular.cli import main

LAYERS = 24
PLANTED = "model.h.17.mlp.c_fc"


def _scaled(proto: onnx.ModelProto, name: str, factor: float) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    init = next(i for i in out.graph.initializer if i.name == name)
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * factor, name))
    return out


@pytest.fixture(scope="module")
def gpt2_24() -> tuple:
    model, args = models.gpt2(LAYERS)
    return model, args, {f: om.export(model, args, functions=f).model_proto
                         for f in ("all", "none")}


def _compare_io(directory, capsys) -> int:
    code = main(["compare-io", str(directory / "module.onnx"), str(directory / "inputs.npz"),
                 str(directory / "expected.npz"), "--providers", "cpu"])
    capsys.readouterr()
    return code


def _same_order(a: float, b: float) -> bool:
    return b / 10 <= a <= b * 10


@pytest.fixture
def validation():
    """Opens validation sessions that have run, closed when the test ends."""
    opened: list[om.Validation] = []

    def run(*args, **kwargs) -> om.Validation:
        opened.append(om.Validation(*args, **kwargs))
        opened[-1].run()
        return opened[-1]

    yield run
    for session in opened:
        session.close()


@pytest.mark.slow
@pytest.mark.parametrize("functions", ["all", "none"])
def test_planted_layer_reproduces_alone(gpt2_24, functions, tmp_path, capsys, validation):
    model, args, protos = gpt2_24
    bad = _scaled(protos[functions], f"{PLANTED}.weight", 1.5)
    v = validation(model, args, bad, providers="cpu")
    rep = v.report
    assert not rep.ok and rep.first_mismatch == PLANTED

    x = v.extract(tmp_path / "bad")
    assert x.call_id == PLANTED and x.kind == ("hierarchical" if functions == "all" else "flat")
    assert sorted(p.name for p in (tmp_path / "bad").iterdir()) == [
        MARKER, "README.md", "expected.npz", "inputs.npz", "module.onnx"]
    module = onnx.load(tmp_path / "bad" / "module.onnx")
    onnx.checker.check_model(module, full_check=True)
    assert [i.name for i in module.graph.input] == ["input_0"]
    assert [o.name for o in module.graph.output] == ["output_0"]
    assert "weight" in {i.name for i in module.graph.initializer}  # named relative to c_fc
    assert [p.source for p in x.inputs] == ["torch input 0"]
    # the module alone, on torch's own inputs, shows the error the full model showed
    assert x.reproduces and _same_order(x.alone.max_abs, x.in_model.max_abs)
    assert _compare_io(tmp_path / "bad", capsys) == 1
    readme = (tmp_path / "bad" / "README.md").read_text()
    assert "compare-io module.onnx inputs.npz expected.npz --providers cpu" in readme
    assert "reproduces the mismatch" in readme and "InferenceSession" in readme

    # a healthy layer before the error matches; so does one after it, which in the full
    # model is fed diverging inputs: the repro isolates the module from upstream drift
    for call in ("h.3", "model.h.20"):
        ok = v.extract(tmp_path / call, call=call)
        assert not ok.reproduces, call
        assert _compare_io(tmp_path / call, capsys) == 0, call
    assert not next(e for e in rep.localization.errors if e.call_id == "model.h.20").ok


@pytest.mark.slow
def test_planted_in_a_copied_body_extracts_that_body(gpt2_24, tmp_path, capsys, validation):
    """A residual Add turned Sub in the body only layer 17 calls: extracting layer 17 takes
    its own (planted) body, not the body the other 23 layers share."""
    model, args, protos = gpt2_24
    bad = onnx.ModelProto()
    bad.CopyFrom(protos["all"])
    block = models.isolate_call(bad, "model.h.17", models.isolate_call(bad, "model"))
    [n for n in block.node if n.op_type == "Add"][-1].op_type = "Sub"
    v = validation(model, args, bad, providers="cpu")
    rep = v.report
    assert rep.first_mismatch == "model.h.17"
    x = v.extract(tmp_path / "x")
    module = onnx.load(tmp_path / "x" / "module.onnx")
    assert "Sub" in {n.op_type for n in module.graph.node}
    assert {f.name for f in module.functions} >= {"LayerNorm", "GPT2Attention", "GPT2MLP"}
    assert x.reproduces and _same_order(x.alone.max_abs, x.in_model.max_abs)
    assert _compare_io(tmp_path / "x", capsys) == 1
    assert _compare_io_ok(v, tmp_path / "h16", "model.h.16", capsys)


def _compare_io_ok(v, directory, call, capsys) -> bool:
    v.extract(directory, call=call)
    return _compare_io(directory, capsys) == 0


@pytest.mark.slow
def test_external_data_weights_come_from_the_models_directory(gpt2_24, tmp_path, capsys,
                                                             validation):
    model, args, protos = gpt2_24
    bad = _scaled(protos["all"], f"{PLANTED}.weight", 1.5)
    src = tmp_path / "model"
    src.mkdir()
    onnx.save_model(bad, src / "m.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location="m.onnx.data", size_threshold=0)
    assert (src / "m.onnx.data").is_file()
    v = validation(model, args, src / "m.onnx", providers="cpu")
    rep = v.report
    assert rep.first_mismatch == PLANTED
    x = v.extract(tmp_path / "x")
    module = onnx.load(tmp_path / "x" / "module.onnx", load_external_data=False)
    assert all(i.data_location != onnx.TensorProto.EXTERNAL for i in module.graph.initializer)
    assert x.reproduces and _compare_io(tmp_path / "x", capsys) == 1


def test_weights_stored_outside_need_the_models_path(tmp_path, validation):
    model, args = models.net()
    proto = models.hierarchical(model, weight_scale={1: 1.5})
    onnx.save_model(proto, tmp_path / "m.onnx", save_as_external_data=True,
                    location="m.data", size_threshold=0)
    v = validation(model, args, tmp_path / "m.onnx", providers="cpu")
    stub = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    v.source.proto = stub  # as if only the references had been read
    v.source.path = None
    with pytest.raises(om.OnnxModularError, match="external data") as e:
        v.extract(tmp_path / "x")
    assert "\n" not in str(e.value)


def test_extract_from_a_report_that_matched_and_bad_names(tmp_path, validation):
    model, args = models.net()
    v = validation(model, args, models.hierarchical(model), providers="cpu")
    rep = v.report
    assert rep.ok and rep.localization is None
    with pytest.raises(om.OnnxModularError, match="no module call diverges"):
        v.extract(tmp_path / "x")
    x = v.extract(tmp_path / "x", call="layers.1")  # localizes now
    assert not x.reproduces and x.kind == "hierarchical"
    assert [p.name for p in x.inputs] == ["x"]  # the body's own input name
    with pytest.raises(om.OnnxModularError, match="did you mean layers.1"):
        v.extract(tmp_path / "y", call="layer.1")
    with pytest.raises(om.OnnxModularError, match="ambiguous"):
        v.extract(tmp_path / "y", call="fc")
    (tmp_path / "file").write_text("")
    with pytest.raises(om.OnnxModularError, match="not a directory"):
        v.extract(tmp_path / "file", call="layers.1")


@pytest.mark.slow
def test_compare_io_usage_errors(gpt2_24, tmp_path, capsys, validation):
    model, args, protos = gpt2_24
    v = validation(model, args, protos["all"], providers="cpu")
    v.extract(tmp_path, call="model.h.2.ln_1")
    d = tmp_path
    cases = [
        ([d / "module.onnx", d / "expected.npz", d / "expected.npz"], "missing input_0"),
        ([d / "module.onnx", d / "inputs.npz", d / "inputs.npz"], "not outputs of"),
        ([d / "module.onnx", d / "nope.npz", d / "expected.npz"], "no such file"),
        ([d / "module.onnx", d / "README.md", d / "expected.npz"], "not a numpy"),
        ([d / "README.md", d / "inputs.npz", d / "expected.npz"], "not a valid ONNX"),
    ]
    for files, words in cases:
        assert main(["compare-io", *map(str, files)]) == 2, words
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err
    assert main(["compare-io", *(str(d / n) for n in ("module.onnx", "inputs.npz",
                                                      "expected.npz"))]) == 0
    capsys.readouterr()
    with np.load(d / "inputs.npz") as data:
        np.savez(d / "f64.npz", input_0=data["input_0"].astype(np.float64))
    assert main(["compare-io", str(d / "module.onnx"), str(d / "f64.npz"),
                 str(d / "expected.npz")]) == 2
    assert "expects float32" in capsys.readouterr().err


# ---- per-module error statistics -------------------------------------------------------------

@pytest.mark.slow
def test_error_statistics_roll_up_per_call_in_execution_order(gpt2_24, tmp_path):
    model, args, protos = gpt2_24
    rep = om.validate(model, args, _scaled(protos["all"], f"{PLANTED}.weight", 1.5),
                      providers="cpu")
    data = json.loads(json.dumps(rep.to_dict()))["localization"]
    calls = data["calls"]
    assert [c["order"] for c in calls] == sorted(c["order"] for c in calls)
    assert len(calls) == data["calls_checked"] > LAYERS * 9
    first = next(c for c in calls if c["call_id"] == PLANTED)
    assert first["ok"] is False and first["dtypes"] == "float32"
    assert sum(first["abs_err_hist"]) == first["size"]
    assert len(first["abs_err_hist"]) == len(data["abs_err_hist_edges"]) + 1
    blocks = [c for c in calls if c["module_type"].endswith("GPT2Block")]
    assert [c["ok"] for c in blocks] == [True] * 17 + [False] * 7
    assert max(c["max_abs_err"] for c in blocks[:17]) < 1e-5 < blocks[17]["max_abs_err"]
    stack = data["stack"]
    assert stack["first_exceeding"] == "model.h.17" and len(stack["calls"]) == LAYERS
    assert "model.h.17 (GPT2Block 18 of 24) first exceeds tolerance" in stack["summary"]
    assert "model.h.18 ... model.h.23" in stack["summary"]
    text = str(rep)
    assert "Error per GPT2Block call in model" in text and "first exceeds" in text
    md = rep.to_markdown()
    assert "## Error by module call" in md and "| 18 | model.h.17 |" in md
    rep.save(tmp_path / "r.html")
    assert "first exceeds tolerance" in (tmp_path / "r.html").read_text()


@pytest.mark.slow
def test_error_too_small_to_fail_a_block_still_shows_where_it_leaps(gpt2_24):
    model, args, protos = gpt2_24
    rep = om.validate(model, args, _scaled(protos["none"], f"{PLANTED}.weight", 1.01),
                      providers="cpu")
    assert rep.first_mismatch == PLANTED
    stack = rep.localization.stack()
    assert stack.first_bad is None and stack.calls[stack.jump].call_id == "model.h.17"
    assert "leaps at model.h.17" in stack.summary


# ---- the overlay ------------------------------------------------------------------------------

def _adapter_ids(path) -> dict[str, set[str]]:
    """Graph id -> node ids as Model Explorer's ONNX adapter draws the model."""
    main_module = pytest.importorskip("model_explorer_onnx.main")
    graphs = main_module.ONNXAdapter().convert(str(path), {})["graphs"]
    return {g.id: {n.id for n in g.nodes} for g in graphs}


@pytest.mark.slow
@pytest.mark.parametrize("functions", ["all", "none"])
def test_model_explorer_overlay(gpt2_24, functions, tmp_path, validation):
    model, args, protos = gpt2_24
    path = tmp_path / "m.onnx"
    onnx.save(_scaled(protos[functions], f"{PLANTED}.weight", 1.5), path)
    v = validation(model, args, path, providers="cpu")
    rep = v.report
    rep.save(tmp_path / "errors.json", format="model-explorer")
    data = json.loads((tmp_path / "errors.json").read_text())
    for graph in data.values():
        assert graph["gradient"][0]["stop"] == 0 and graph["gradient"][-1]["stop"] == 1
        assert all(isinstance(r["value"], float) for r in graph["results"].values())
    if functions == "all":
        layers = data["[function]transformers.models.gpt2.modeling_gpt2::GPT2Model"]["results"]
        assert set(layers) >= {f"h.{i}" for i in range(LAYERS)}
        assert max(layers[f"h.{i}"]["value"] for i in range(17)) < layers["h.17"]["value"]
        # the shared MLP body shows the call inside the diverging layer
        mlp = data["[function]transformers.models.gpt2.modeling_gpt2::GPT2MLP"]["results"]
        c_fc = next(e for e in rep.localization.errors if e.call_id == PLANTED)
        assert mlp["c_fc"]["value"] == pytest.approx(np.log10(c_fc.max_abs), abs=1e-3)
    else:  # values sit on the nodes that make each call's outputs
        results, ev = data["main_graph"]["results"], v.localization.evidence

        def value_of(call_id: str) -> float:
            k = next(k for k, j in ev.mapping.items() if ev.torch_calls[j].call_id == call_id)
            made = set(ev.probe.calls[k].results)
            return results[next(n.name for n in ev.probe.graph.node if made & set(n.output))][
                "value"]

        assert value_of("model.h.17") > max(value_of(f"model.h.{i}") for i in range(17))
    ids = _adapter_ids(path)
    for graph, entry in data.items():
        assert set(entry["results"]) <= ids[graph], graph


@pytest.mark.slow
def test_overlay_and_extract_on_a_flat_torch_onnx_export(tmp_path, capsys, validation):
    model, args = models.gpt2(3)
    import torch

    proto = torch.onnx.export(model, args, dynamo=True, verbose=False).model_proto
    v = validation(model, args, _scaled(proto, "model.h.1.mlp.c_fc.weight", 1.5),
                   providers="cpu")
    rep = v.report
    assert rep.first_mismatch == "model.h.1.mlp.c_fc"
    assert rep.localization.kind == "flat"
    assert rep.node_data()["main_graph"]["results"]
    x = v.extract(tmp_path / "x")
    assert x.kind == "flat" and x.reproduces
    assert _compare_io(tmp_path / "x", capsys) == 1


def test_exported_program_as_the_reference(tmp_path, capsys, validation):
    """A modularized program's GraphModules compile on their first call, calling
    themselves once more: still one call each, so layers group and calls pair."""
    import torch

    model, args = models.net()
    proto = _scaled(om.export(model, args).model_proto, "layers.1.fc.weight", 1.5)
    v = validation(torch.export.export(model, args), args, proto, providers="cpu")
    rep = v.report
    assert rep.first_mismatch == "layers.1.fc"
    assert [e.call_id for e in rep.localization.stack().calls] == [
        "layers.0", "layers.1", "layers.2"]
    x = v.extract(tmp_path / "x")
    assert x.reproduces and _compare_io(tmp_path / "x", capsys) == 1
    assert not v.extract(tmp_path / "y", call="layers.2").reproduces


MODEL_SRC = """
import torch
class Net(torch.nn.Module):
    def __init__(self):
        torch.manual_seed(0)
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))
    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x)) + x
        return x
def inputs():
    torch.manual_seed(1)
    return (torch.randn(2, 8),)
"""


def test_cli_validate_extract_prints_the_repro_command(tmp_path, capsys):
    src = tmp_path / "net.py"
    src.write_text(MODEL_SRC)
    model, inputs = f"{src}:Net", f"{src}:inputs"
    good = tmp_path / "m.onnx"
    assert main(["export", model, "--inputs", inputs, "-o", str(good)]) == 0
    bad = tmp_path / "bad.onnx"
    onnx.save(_scaled(onnx.load(good), "layers.1.weight", 1.5), bad)
    capsys.readouterr()

    x, nd = tmp_path / "x", tmp_path / "errors.json"
    assert main(["validate", model, "--inputs", inputs, str(bad), "--extract", str(x),
                 "--node-data", str(nd)]) == 1
    out = capsys.readouterr().out
    command = (f"python -m onnx_modular compare-io {x}/module.onnx {x}/inputs.npz "
               f"{x}/expected.npz --providers cpu")
    lines = out.strip().splitlines()
    assert lines[-1] == f"Reproduce with: {command}"
    assert lines[-2].startswith(f"Extracted layers.1 to {x}/ (module.onnx, inputs.npz")
    assert f"--node_data_paths {nd}" in out and json.loads(nd.read_text())
    assert main(command.split()[3:]) == 1

    # a named healthy call, from a model that matches
    capsys.readouterr()
    assert main(["validate", model, "--inputs", inputs, str(good), "--extract",
                 str(tmp_path / "ok"), "--call", "layers.2"]) == 0
    assert "matches torch" in capsys.readouterr().out
    assert main(["validate", model, "--inputs", inputs, str(good), "--extract",
                 str(tmp_path / "none")]) == 0
    assert "Nothing extracted" in capsys.readouterr().out
    assert not (tmp_path / "none").exists()
    # flags that cannot work fail first, in one line
    assert main(["validate", model, "--inputs", inputs, str(good), "--call", "x"]) == 2
    assert "add --extract" in capsys.readouterr().err
    assert main(["validate", model, "--inputs", inputs, str(good), "--extract",
                 str(src)]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_outputs_changed_in_place_cannot_be_extracted(tmp_path, validation):
    import torch

    torch.manual_seed(0)
    model, args = models.InPlace().eval(), (torch.randn(2, 4),)
    v = validation(model, args, om.export(model, args), providers="cpu")
    with pytest.raises(om.OnnxModularError, match="changed in place") as e:
        v.extract(tmp_path / "x", call="inner")
    assert "\n" not in str(e.value)
    assert not v.extract(tmp_path / "y", call="after").reproduces


def test_bfloat16_values_survive_npz():
    """numpy has no bfloat16: stored as uint16 bits, read back by the declared type."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    import io

    from onnx_modular.check.compare_io import _as_declared, npz_bytes

    a = np.array([1.5, -2.25, 3e-3], dtype=ml_dtypes.bfloat16)
    with np.load(io.BytesIO(npz_bytes({"x": a}))) as data:
        stored = data["x"]
    assert stored.dtype == np.uint16
    back = _as_declared("x", stored, "bfloat16")
    assert back.dtype == a.dtype and np.array_equal(back.view(np.uint16), a.view(np.uint16))
    with pytest.raises(om.OnnxModularError, match="expects float32"):
        _as_declared("x", stored, "float32")


# ---- the folder: ours, or refused --------------------------------------------------------------

REPRO = ("module.onnx", "inputs.npz", "expected.npz", "README.md")


def test_a_folder_of_the_users_files_named_like_a_repro_is_refused(tmp_path):
    """A user's own module.onnx and README.md used to be replaced: names alone do not make
    files ours, only the marker an extraction writes beside them."""
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("module.onnx", "README.md"):
        (mine / name).write_text(f"my {name}")
    with pytest.raises(om.OnnxModularError, match=r"no earlier extraction wrote, or changed "
                       r"since \(README.md, module.onnx\)"):
        check_directory(mine)
    assert (mine / "README.md").read_text() == "my README.md"


def test_an_earlier_extraction_unchanged_is_ours_and_a_changed_one_is_not(tmp_path):
    repro = tmp_path / "repro"
    repro.mkdir()
    for name in REPRO:
        (repro / name).write_bytes(b"x")
    _mark(repro, "layers.1")
    assert check_directory(repro) == repro.resolve()
    (tmp_path / "link").symlink_to(repro)
    assert check_directory(tmp_path / "link") == repro.resolve()
    (repro / "README.md").write_text("my notes on the repro")  # the user's now
    with pytest.raises(om.OnnxModularError, match=r"\(README.md\)"):
        check_directory(repro)
    (repro / "README.md").unlink()
    assert check_directory(repro) == repro.resolve()  # a file of ours gone: fine
    (repro / "train.py").write_text("print('mine')")
    with pytest.raises(om.OnnxModularError, match=r"\(train.py\)"):
        check_directory(repro)
    (repro / "train.py").unlink()
    (repro / MARKER).write_text("{}")  # a marker listing nothing makes nothing ours
    with pytest.raises(om.OnnxModularError, match="no earlier extraction wrote"):
        check_directory(repro)


@pytest.mark.slow
def test_extract_never_replaces_the_users_files_and_re_extracts_into_its_own(tmp_path,
                                                                            validation):
    model, args = models.net()
    proto = models.hierarchical(model, weight_scale={1: 1.5})
    v = validation(model, args, proto, providers="cpu")
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("module.onnx", "README.md"):
        (mine / name).write_text(f"my {name}")
    with pytest.raises(om.OnnxModularError, match="no earlier extraction wrote"):
        v.extract(mine)
    assert {p.name: p.read_text() for p in mine.iterdir()} == {
        "module.onnx": "my module.onnx", "README.md": "my README.md"}
    ours = tmp_path / "ours"
    first = v.extract(ours)
    again = v.extract(ours, call="layers.0")
    assert (first.call_id, again.call_id) == ("layers.1.fc", "layers.0")
    marker = json.loads((ours / MARKER).read_text())
    assert marker["call"] == "layers.0" and sorted(marker["files"]) == sorted(REPRO)
