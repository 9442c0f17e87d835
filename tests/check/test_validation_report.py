"""ValidationReport built from data (no model, no ONNX Runtime): ok, the first mismatch,
its renderings (text, JSON, Markdown, HTML) and saving by extension."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from onnx_modular.check.judge import judge
from onnx_modular.check.numerics import Diff
from onnx_modular.check.outcome import OutputCheck, ProviderResult
from onnx_modular.check.probe import OnnxCall, Probe
from onnx_modular.check.recorder import TorchCall
from onnx_modular.check.validation_report import ValidationReport, sparkline
from onnx_modular.diagnostics import OnnxModularError
from onnx_modular.leaves.metadata import CallInfo

CPU = "CPUExecutionProvider"


def _output(name: str, ok: bool, max_abs: float = 0.0, note: str = "") -> OutputCheck:
    return OutputCheck("float32", 1e-4, 1e-5, Diff(max_abs, max_abs, ok, 0 if ok else 3, note),
                       name, [2, 3])


def _localization():
    """Three ``pkg.Block`` layers under the root; ``h.1`` computes wrong, ``h.2`` is fed it."""
    x = torch.ones(3)
    outs = [torch.full((3,), float(i)) for i in range(3)]
    ins = [x, outs[0], outs[1]]
    torch_calls = [TorchCall(CallInfo("", "", "pkg.Model"), 0, None, [outs[2]],
                             [outs[2]._version], [x], [x._version])]
    torch_calls += [TorchCall(CallInfo(f"h.{i}", f"h.{i}", "pkg.Block"), 1, 0, [outs[i]],
                              [outs[i]._version], [ins[i]], [ins[i]._version])
                    for i in range(3)]
    calls = [OnnxCall(CallInfo("", "", "pkg.Model"), ["v2"], None, True, ["x"])]
    calls += [OnnxCall(CallInfo(f"h.{i}", f"h.{i}", "pkg.Block"), [f"v{i}"], 0, True,
                       ["x" if i == 0 else f"v{i - 1}"], site=("main", f"L{i}"))
              for i in range(3)]
    probe = Probe(b"", calls, {"x": -1, "v0": 0, "v1": 1, "v2": 2}, "flat")
    values = {"x": np.ones(3, np.float32), "v0": np.zeros(3, np.float32),
              "v1": np.full(3, 1.5, np.float32), "v2": np.full(3, 2.5, np.float32)}
    return judge(probe, values, torch_calls, None, None)


@pytest.fixture
def failing() -> ValidationReport:
    results = [ProviderResult(CPU, [_output("y", False, 0.5, "1 expected NaN not matched"),
                                    _output("z", True)], 0.01, 0.002)]
    return ValidationReport("tiny.onnx", results, 0.003, _localization(), CPU,
                            skipped={"CUDAExecutionProvider": "no CUDA here"})


def test_a_passing_report_is_ok_and_says_so() -> None:
    report = ValidationReport("m.onnx", [ProviderResult(CPU, [_output("y", True)], 0.0, 0.0)],
                              0.0)
    assert report.ok and report.first_mismatch is None and report.providers == [CPU]
    assert report.summary() == f"OK: m.onnx matches torch on {CPU}"
    assert report.source is None and report.node_data() == {}


def test_the_first_mismatch_is_the_call_where_the_error_arose(failing) -> None:
    assert not failing.ok
    assert failing.first_mismatch == "h.1"
    assert failing.summary() == (f"MISMATCH: tiny.onnx differs from torch on {CPU}; "
                                 "first diverging module: h.1")


def test_a_localization_that_found_no_module_says_why() -> None:
    empty = judge(Probe(b"", [], {}, "flat"), {}, [], None, None)
    report = ValidationReport("m", [ProviderResult(CPU, [_output("y", False, 1.0)], 0, 0)],
                              0.0, empty, CPU)
    assert report.first_mismatch is None
    assert "no module localized (no module call of the ONNX model could be paired" \
        in report.summary()


def test_to_dict_is_json_and_carries_the_localization(failing) -> None:
    d = json.loads(json.dumps(failing.to_dict(), allow_nan=False))
    assert (d["model"], d["ok"], d["first_mismatch"]) == ("tiny.onnx", False, "h.1")
    assert d["skipped"] == {"CUDAExecutionProvider": "no CUDA here"}
    assert [o["name"] for o in d["providers"][CPU]["outputs"]] == ["y", "z"]
    loc = d["localization"]
    assert loc["provider"] == CPU and loc["first_mismatch"] == "h.1"
    assert loc["stack"]["calls"] == ["h.0", "h.1", "h.2"]
    assert loc["stack"]["first_exceeding"] == "h.1"


def test_text_shows_the_outputs_the_divergences_the_stack_and_the_skipped(failing) -> None:
    text = str(failing)
    assert "ONNX Runtime vs torch eager" in text and "FAIL" in text
    assert "1 expected NaN not matched" in text  # the note column, shown when one has one
    assert "Diverging module calls on CPUExecutionProvider" in text
    assert "Error per Block call in the model" in text
    assert "h.1 (Block 2 of 3) first exceeds tolerance" in text
    assert "CUDA skipped: no CUDA here" in text
    assert text.rstrip().endswith("first diverging module: h.1")


def test_markdown_has_tables_and_every_call_in_a_details_block(failing) -> None:
    md = failing.to_markdown()
    assert md.startswith("# Validation of tiny.onnx\n")
    assert "| EP | output | shape | dtype |" in md and "| CPU | y | 2x3 | float32 |" in md
    assert "Not checked: CUDA skipped: no CUDA here" in md
    assert "## Diverging module calls (CPUExecutionProvider)" in md
    assert "<details><summary>all module calls</summary>" in md
    assert "&nbsp;&nbsp;h.1" in md  # indented by depth
    assert "FIRST" in md


def test_markdown_of_a_localization_without_divergences_says_so() -> None:
    empty = judge(Probe(b"", [], {}, "flat"), {}, [], None, None)
    report = ValidationReport("m", [ProviderResult(CPU, [_output("y", True)], 0, 0)], 0.0,
                              empty, CPU)
    assert "no module call of the ONNX model could be paired" in report.to_markdown()


@pytest.mark.parametrize("name", ["r.json", "r.md", "r.html"])
def test_save_by_extension(tmp_path, failing, name: str) -> None:
    failing.save(tmp_path / name)
    text = (tmp_path / name).read_text()
    if name.endswith(".json"):
        assert json.loads(text)["first_mismatch"] == "h.1"
    elif name.endswith(".md"):
        assert text == failing.to_markdown()
    else:
        assert "<html" in text.lower() and "h.1" in text


def test_save_as_model_explorer_writes_node_data(tmp_path, failing) -> None:
    failing.save(tmp_path / "n.json", format="model-explorer")
    data = json.loads((tmp_path / "n.json").read_text())
    assert data == failing.node_data() and set(data["main"]["results"]) == {"L0", "L1", "L2"}


def test_bad_formats_and_paths_are_one_line(tmp_path, failing) -> None:
    with pytest.raises(OnnxModularError, match="unknown report format 'svg'") as info:
        failing.save(tmp_path / "r.json", format="svg")
    assert "\n" not in str(info.value) and "OM0501" in str(info.value)
    with pytest.raises(OnnxModularError, match="use a .json, .md or .html"):
        failing.save(tmp_path / "r.txt")
    with pytest.raises(OnnxModularError, match="cannot write"):
        failing.save(tmp_path / "none" / "n.json", format="node-data")


def test_without_a_run_nothing_can_be_localized_or_extracted(tmp_path, failing) -> None:
    with pytest.raises(OnnxModularError, match="no model to localize"):
        failing.relocalize()
    with pytest.raises(OnnxModularError, match="no model to extract from"):
        failing.extract(tmp_path / "x")


def test_a_report_keeps_no_values_only_their_overlay(failing) -> None:
    """Given a localization with its values, a report keeps the overlay of them as data and
    lets the values go (a Validation session keeps them, and its release lets them go)."""
    assert _localization().evidence is not None
    assert failing.localization.evidence is None
    assert failing.localization == _localization()  # the same verdicts
    data = failing.node_data()
    failing.release()  # nothing to let go
    assert failing.node_data() == data and set(data["main"]["results"]) == {"L0", "L1", "L2"}


def test_a_report_is_frozen_data_that_pickles(failing) -> None:
    import dataclasses
    import pickle

    with pytest.raises(dataclasses.FrozenInstanceError):
        failing.localization = None  # type: ignore[misc]
    back = pickle.loads(pickle.dumps(failing))
    assert back.to_dict() == failing.to_dict() and back.node_data() == failing.node_data()
    assert str(back) == str(failing)


def test_sparkline_is_one_bar_per_decade() -> None:
    assert sparkline([0, 0, 0]) == ""
    assert sparkline([]) == ""
    line = sparkline([0, 1, 100])
    assert len(line) == 3 and line[0] == " " and line[2] == "█" and line[1] not in " █"
