"""IOReport from data: saved outputs against a model's, per provider, and its renderings."""

from __future__ import annotations

import json

from onnx_modular.check.io_report import IOReport
from onnx_modular.check.numerics import Diff
from onnx_modular.check.outcome import OutputCheck, ProviderResult

CPU = "CPUExecutionProvider"


def _out(name: str, ok: bool, max_abs: float = 0.0, max_rel: float = 0.0,
         note: str = "", shape: list[int] | None = None) -> OutputCheck:
    return OutputCheck("float32", 1e-4, 1e-5, Diff(max_abs, max_rel, ok, 0 if ok else 1, note),
                       name, [2] if shape is None else shape)


def test_a_match_says_so_and_reports_no_error() -> None:
    report = IOReport("m.onnx", [ProviderResult(CPU, [_out("y", True)], 0.0, 0.0)])
    assert report.ok and report.max_abs == 0.0 and report.max_rel == 0.0
    assert report.summary() == "MATCH: m.onnx reproduces the expected outputs on CPU"


def test_a_mismatch_gives_the_worst_errors_over_every_provider() -> None:
    report = IOReport("m.onnx", [
        ProviderResult(CPU, [_out("y", False, 0.5, 0.1), _out("z", True, 1e-6, 2.0)], 0, 0),
        ProviderResult("CUDAExecutionProvider", [_out("y", True, 1e-7, 1e-7)], 0, 0)])
    assert not report.ok and report.max_abs == 0.5 and report.max_rel == 2.0
    assert report.summary() == ("MISMATCH: m.onnx differs from the expected outputs on CPU, "
                                "CUDA (max abs err 0.5, max rel err 2)")


def test_no_provider_no_error() -> None:
    report = IOReport("m", [])
    assert report.ok and report.max_abs == 0.0
    assert "| EP | output |" in report.to_markdown()  # a head without rows, no note column


def test_to_dict_lists_providers_and_what_was_not_compared() -> None:
    report = IOReport("m", [ProviderResult(CPU, [_out("y", True)], 0.5, 0.25)], ["extra"])
    d = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert d == {"model": "m", "ok": True, "not_compared": ["extra"],
                 "providers": {CPU: report.results[0].to_dict()}}


def test_the_note_column_appears_only_when_an_output_has_a_note() -> None:
    plain = IOReport("m", [ProviderResult(CPU, [_out("y", True, shape=[])], 0, 0)])
    md = plain.to_markdown()
    assert "| note |" not in md and "| CPU | y | () | float32 |" in md
    noted = IOReport("m", [ProviderResult(CPU, [_out("y", False, 1.0, note="NaN here"),
                                                _out("z", True)], 0, 0)], ["w"])
    md = noted.to_markdown()
    assert "| note |" in md and "NaN here" in md and "Not compared: w" in md
    text = str(noted)
    assert "NaN here" in text and "not compared (no expected value): w" in text
    assert "MISMATCH" in text
