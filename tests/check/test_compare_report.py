"""CompareReport from data: equivalence, structure, the summary and its renderings."""

from __future__ import annotations

import json
import math

import pytest

from onnx_modular.check.compare_report import CompareReport, ModelFacts, OutputDiff
from onnx_modular.check.numerics import Diff

CPU = "CPUExecutionProvider"


def _facts(label: str, topology: str = "abc123def456789", **ops: int) -> ModelFacts:
    return ModelFacts(label, 12345, 2, 10, 14, ops or {"MatMul": 2, "Relu": 1}, topology,
                      0.0125, 0.00025)


def _out(index: int, ok: bool, max_abs: float = 0.0, note: str = "") -> OutputDiff:
    return OutputDiff(index, f"y{index}", f"out{index}", "float32", 1e-4, 1e-5,
                      Diff(max_abs, max_abs, ok, 0 if ok else 1, note))


def test_same_outputs_and_topology_is_equivalent_with_the_same_structure() -> None:
    report = CompareReport(_facts("a.onnx"), _facts("b.onnx"), [_out(0, True)], CPU, [])
    assert report.equivalent and report.same_structure and report.exit_code == 0
    assert report.summary() == "EQUIVALENT (same structure after inlining)"


def test_equivalent_numbers_with_another_topology() -> None:
    report = CompareReport(_facts("a"), _facts("b", "zzz"), [_out(0, True)], CPU, [])
    assert report.equivalent and not report.same_structure
    assert report.summary() == "EQUIVALENT (different structure after inlining)"


def test_a_reason_or_a_failing_output_makes_it_different() -> None:
    reasons = CompareReport(_facts("a"), _facts("b"), [_out(0, True)], CPU,
                            ["input names differ"])
    assert not reasons.equivalent and reasons.exit_code == 1
    assert reasons.summary() == "DIFFERENT: input names differ"
    bad = CompareReport(_facts("a"), _facts("b"), [_out(0, True), _out(1, False, 0.25)],
                        CPU, [])
    assert bad.summary() == "DIFFERENT: output #1 (y1: max abs err 0.25)"


def test_to_dict_is_json_safe_with_both_models_facts() -> None:
    report = CompareReport(_facts("a"), _facts("b"), [_out(0, False, math.inf, "inf")], CPU,
                           [], ["x: float32 [2, 3] normal"])
    d = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert d["equivalent"] is False and d["same_structure"] is True
    assert d["a"]["label"] == "a" and d["a"]["op_histogram"] == {"MatMul": 2, "Relu": 1}
    assert d["outputs"][0]["max_abs_err"] == "inf" and d["inputs_drawn"] == [
        "x: float32 [2, 3] normal"]


def test_renderings_show_only_the_ops_whose_counts_differ() -> None:
    report = CompareReport(_facts("a.onnx", MatMul=2, Relu=1),
                           _facts("b.onnx", MatMul=2, Gelu=1), [_out(0, True)], CPU,
                           [], ["x: float32 [2] normal"])
    md = report.to_markdown()
    assert md.startswith("# Compare a.onnx and b.onnx\n")
    assert "| file size | 12,345 B | 12,345 B |" in md
    assert "| topology hash | abc123def456 | abc123def456 |" in md  # 12 characters
    assert "|   Gelu | 0 | 1 |" in md and "|   Relu | 1 | 0 |" in md
    assert "MatMul |" not in md
    assert "Random inputs (seed 0): x: float32 [2] normal" in md
    text = str(report)
    assert "Structure and cost" in text and "Outputs on CPU" in text
    assert "Random inputs (seed 0)" in text


@pytest.mark.parametrize("label", ["[bold]a[/bold]", "a|b"])
def test_names_from_files_are_text_not_markup(label: str) -> None:
    report = CompareReport(_facts(label), _facts("b"), [_out(0, True)], CPU, [])
    assert label in str(report)
