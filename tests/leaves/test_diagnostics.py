"""Diagnostics and the pass framework: rules, levels, locations, SARIF, pre/post-conditions."""

from __future__ import annotations

import json

import models
import pytest
import torch
import torch.fx

from onnx_modular.diagnostics import (
    DiagnosticContext,
    Level,
    Location,
    OnnxModularError,
)
from onnx_modular.leaves._io import write_sarif
from onnx_modular.leaves.errors import fail, rules
from onnx_modular.passes import PassBase, PassConditionError, PassManager, PassResult


class _Relu2Sigmoid(PassBase):
    def call(self, graph_module, ctx):
        changed = False
        for node in graph_module.graph.nodes:
            if node.target == torch.ops.aten.relu.default:
                node.target = torch.ops.aten.sigmoid.default
                ctx.note(rules.TRANSLATION, Location.of_node(node, "layers.0"),
                         reason="relu replaced")
                changed = True
        graph_module.recompile()
        return PassResult(graph_module, changed)


class _NeedsRelu(PassBase):
    def requires(self, graph_module):
        if not any(n.target == torch.ops.aten.relu.default for n in graph_module.graph.nodes):
            raise PassConditionError("a relu node")

    def call(self, graph_module, ctx):
        return PassResult(graph_module, False)


class _Broken(PassBase):
    def call(self, graph_module, ctx):
        raise ValueError("boom")


def _program_gm() -> torch.fx.GraphModule:
    return torch.export.export(models.Stack(1), models.x8()).module()


def test_manager_threads_module_and_records_located_diagnostics() -> None:
    ctx = DiagnosticContext()
    result = PassManager([_Relu2Sigmoid()], ctx)(_program_gm())
    assert result.modified
    diag = ctx.diagnostics[0]
    assert diag.level == Level.NOTE and diag.location.module_path == "layers.0"
    assert diag.location.fx_node == "relu"
    assert diag.location.source_file and diag.location.source_file.endswith("models.py")
    assert diag.location.source_line and diag.location.source_line > 0
    assert "OM0202" in str(diag) and "node 'relu'" in str(diag)
    assert diag.scope == "_Relu2Sigmoid"  # the pass that reported it


def test_precondition_failure_names_rule_and_pass() -> None:
    gm = _program_gm()
    PassManager([_Relu2Sigmoid()])(gm)
    with pytest.raises(OnnxModularError, match=r"OM0002 .*_NeedsRelu requires: a relu node"):
        PassManager([_NeedsRelu()])(gm)


def test_internal_failure_becomes_a_pass_failed_error() -> None:
    ctx = DiagnosticContext()
    with pytest.raises(OnnxModularError, match="OM0001.*_Broken.*ValueError: boom"):
        PassManager([_Broken()], ctx)(_program_gm())
    assert ctx.diagnostics[-1].level == Level.ERROR


def test_verbose_keeps_graph_before_and_after() -> None:
    ctx = DiagnosticContext(verbose=True)
    PassManager([_Relu2Sigmoid()], ctx)(_program_gm())
    snapshots = [d for d in ctx.diagnostics if d.rule is rules.GRAPH_SNAPSHOT]
    assert len(snapshots) == 2
    assert "relu" in snapshots[0].detail and "sigmoid" in snapshots[1].detail


def test_sarif_structure(tmp_path) -> None:
    ctx = DiagnosticContext()
    PassManager([_Relu2Sigmoid()], ctx)(_program_gm())
    ctx.warn(rules.MODULE_CALL_SPLIT, Location(module_path="a"), module="a", pieces=2)
    path = tmp_path / "run.sarif"
    write_sarif(ctx.diagnostics, str(path))
    log = json.loads(path.read_text())
    assert log["version"] == "2.1.0"
    run = log["runs"][0]
    rule_ids = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert rule_ids == ["OM0102", "OM0202"]
    results = run["results"]
    assert [r["ruleId"] for r in results] == ["OM0202", "OM0102"]
    assert [r["level"] for r in results] == ["note", "warning"]
    assert results[1]["message"]["text"].startswith("Module call 'a'")
    physical = results[0]["locations"][0]["physicalLocation"]
    assert physical["artifactLocation"]["uri"].endswith("models.py")
    assert physical["region"]["startLine"] > 0
    logical = results[0]["locations"][0]["logicalLocations"]
    assert {"fullyQualifiedName": "layers.0", "kind": "module"} in logical
    assert results[0]["properties"] == {"pass": "_Relu2Sigmoid"}
    assert "properties" not in results[1]  # reported outside any pass


def test_sarif_write_to_missing_directory_fails_cleanly(tmp_path) -> None:
    with pytest.raises(OnnxModularError, match="does not exist"):
        write_sarif([], str(tmp_path / "nope" / "x.sarif"))
    assert not (tmp_path / "nope").exists()


# ---- one way to raise: fail(), recorded by the scope it leaves --------------------------------

def test_an_error_leaving_a_scope_is_recorded_once_under_that_scope() -> None:
    ctx = DiagnosticContext()
    with pytest.raises(OnnxModularError, match="OM0501 bad-input: no inputs") as e, \
            ctx.scope("Outer"), ctx.scope("Inner"):
        raise fail("no inputs", rules.BAD_INPUT, Location(module_path="layers.0"))
    assert ctx.diagnostics == [e.value.diagnostic]
    assert e.value.diagnostic.scope == "Inner" and e.value.diagnostic.level == Level.ERROR
    results = ctx.to_sarif()["runs"][0]["results"]
    assert len(results) == 1 and results[0]["properties"] == {"pass": "Inner"}
    assert results[0]["ruleId"] == "OM0501"


def test_an_error_recorded_already_is_not_recorded_again() -> None:
    ctx = DiagnosticContext()
    with pytest.raises(OnnxModularError), ctx.recording_failures(), ctx.scope("Pass"), \
            ctx.recording_failures():
        raise fail("twice through", rules.SPLIT_POINT)
    assert len(ctx.diagnostics) == 1 and ctx.diagnostics[0].scope == "Pass"
    assert not hasattr(ctx, "error")  # one way to raise: fail(...)


def test_failures_are_recorded_outside_any_scope_where_asked() -> None:
    ctx = DiagnosticContext()
    with pytest.raises(OnnxModularError), ctx.recording_failures():
        raise fail("bad", rules.UNSUPPORTED_INPUT)
    assert len(ctx.diagnostics) == 1 and ctx.diagnostics[0].scope is None
    with pytest.raises(OnnxModularError):
        raise fail("not in the context")
    assert len(ctx.diagnostics) == 1


def test_fail_fills_the_rule_template_fields_beyond_reason() -> None:
    error = fail("a relu node", rules.PRECONDITION, pass_name="Outline")
    assert error.diagnostic.message == "Pass Outline requires: a relu node"
    assert str(error) == "error: OM0002 precondition-failed: Pass Outline requires: a relu node"
