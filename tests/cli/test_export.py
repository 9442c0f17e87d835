"""The CLI on a real model: export, inspect, split, report files."""

from __future__ import annotations

import itertools
import json

import onnx
import pytest

from onnx_modular.cli import main

pytestmark = pytest.mark.slow  # whole models: the full suite, not the inner loop

MODEL = "onnx_modular.examples:tiny_gpt"
INPUTS = "onnx_modular.examples:tiny_gpt_inputs"


def test_export_inspect_and_sarif(tmp_path, capsys) -> None:
    out, sarif = tmp_path / "tiny.onnx", tmp_path / "run.sarif"
    assert main(["export", MODEL, "--inputs", INPUTS, "-o", str(out), "--sarif", str(sarif)]) == 0
    model = onnx.load(str(out))
    assert "Block" in {f.name for f in model.functions}
    printed = capsys.readouterr().out
    assert "functions" in printed and "file size" in printed
    log = json.loads(sarif.read_text())
    assert log["version"] == "2.1.0" and log["runs"][0]["results"]
    assert main(["inspect", str(out)]) == 0
    tree = capsys.readouterr().out
    assert "blocks.0: Block" in tree and "body shown above" in tree
    # TinyGPT has 4 blocks: the first expanded, the other three folded into one line
    assert "blocks.1 ... blocks.3: Block x3" in tree and "blocks.2" not in tree
    assert "quantizer" in tree and "--flat" in tree  # tools that undo functions, named
    assert main(["inspect", str(out), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["functions"] == len(model.functions)


def test_export_flat_with_random_inputs(tmp_path, capsys) -> None:
    out = tmp_path / "flat.onnx"
    assert main(["export", MODEL, "--input", "1x8:int64", "-o", str(out), "--flat"]) == 0
    assert not onnx.load(str(out)).functions
    assert main(["inspect", str(out)]) == 0
    assert "quantizer" not in capsys.readouterr().out  # a flat file needs no such note


def test_export_functions_subset(tmp_path) -> None:
    out = tmp_path / "sub.onnx"
    assert main(["export", MODEL, "--inputs", INPUTS, "-o", str(out),
                 "--functions", "Block,head"]) == 0
    assert {f.name for f in onnx.load(str(out)).functions} == {"Block", "Linear"}


def test_inputs_that_do_not_fit_fail_cleanly(tmp_path, capsys) -> None:
    out = tmp_path / "bad.onnx"
    code = main(["export", MODEL, "--input", "2x8x3:float32", "-o", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    assert "torch.export failed on TinyGPT" in err and "Traceback" not in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_split_with_an_ops_file_writes_regions_and_manifest(tmp_path, capsys) -> None:
    ops = tmp_path / "acc_ops.txt"
    ops.write_text("# everything but GELU runs on the accelerator\n!aten.gelu\n")
    out = tmp_path / "parts"
    assert main(["split", MODEL, "--inputs", INPUTS, "--acc-ops", str(ops), "--preview",
                 "-o", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    kinds = [r["kind"] for r in manifest["regions"]]
    assert kinds[0] == "acc" and "cpu" in kinds
    assert all(a != b for a, b in itertools.pairwise(kinds))  # regions alternate
    for region in manifest["regions"]:
        assert (out / region["file"]).is_file()
    assert "_run_on_cpu_1" in capsys.readouterr().out  # the preview table


def test_split_with_an_execution_provider(tmp_path) -> None:
    out = tmp_path / "ep"
    assert main(["split", MODEL, "--inputs", INPUTS, "--acc-ep", "CPUExecutionProvider",
                 "-o", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert [r["kind"] for r in manifest["regions"]] == ["acc"]


def test_export_with_dynamic_axes_runs_at_other_sizes(tmp_path, capsys) -> None:
    """``--dynamic`` is ``dynamic_shapes`` on the command line: the file's axes carry the
    names and it computes torch's numbers at a batch and a length it was not exported at."""
    import numpy as np
    import onnxruntime as ort
    import torch

    from onnx_modular.examples import tiny_gpt

    out = tmp_path / "dyn.onnx"
    assert main(["export", MODEL, "--input", "2x8:int64", "-o", str(out),
                 "--dynamic", "input_ids:0=batch,1=seq", "--output-names", "logits",
                 "--input-names", "tokens", "--validate", "--providers", "cpu"]) == 0
    graph = onnx.load(str(out)).graph
    assert [d.dim_param for d in graph.input[0].type.tensor_type.shape.dim] == ["batch", "seq"]
    assert (graph.input[0].name, graph.output[0].name) == ("tokens", "logits")
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    ids = torch.randint(0, 64, (3, 5))
    (got,) = session.run(None, {"tokens": ids.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(got, tiny_gpt()(ids).numpy(), rtol=1e-4, atol=1e-5)
    assert main(["export", MODEL, "--input", "2x8:int64", "-o", str(tmp_path / "x.onnx"),
                 "--dynamic", "tokens:0=batch"]) == 2
    assert "takes no input 'tokens' (its inputs: input_ids" in capsys.readouterr().err
