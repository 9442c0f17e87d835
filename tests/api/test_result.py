"""Split and stage results: one frozen record whose work is done by emit/, parts/ and the
renderer; the parts are emitted by the split, before it returns, and only read after."""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Callable
from pathlib import Path

import models
import pytest
from rich.console import Console

import onnx_modular as om
from onnx_modular.emit.regions import AccLimits, check_acc_model, op_types_in
from onnx_modular.leaves.errors import rules


@pytest.fixture(scope="module")
def stages() -> om.StagesResult:
    return om.split_stages(models.Stack(3).eval(), models.x8(),
                           split_points={"layers.1": "beginning"})


@pytest.fixture(scope="module")
def regions() -> om.SplitResult:
    return om.split(models.Stack(2).eval(), models.x8(), support=["aten.relu"])


@pytest.mark.slow
def test_stages_and_regions_are_one_frozen_type(stages: om.StagesResult,
                                                regions: om.SplitResult) -> None:
    assert om.StagesResult is om.SplitResult
    assert isinstance(stages, om.SplitResult) and isinstance(regions, om.StagesResult)
    assert (stages.kind, regions.kind) == ("stages", "split")
    assert repr(stages) == "StagesResult(split_points: stage_0({}) stage_1({}))".format(
        *(len(s.node_names) for s in stages.stages))
    assert repr(regions).startswith("SplitResult(")
    with pytest.raises(dataclasses.FrozenInstanceError):
        stages.how = "callback"  # type: ignore[misc]


@pytest.mark.slow
def test_regions_are_emitted_once_and_kept(stages: om.StagesResult) -> None:
    first = stages.region_graphs()
    assert stages.region_graphs() is first
    assert [g.name for g in first] == ["stage_0", "stage_1"]
    assert all(g.model.functions for g in first)  # hierarchical: the blocks are functions


def test_the_stage_manifest_says_how_and_where_weights_went(stages: om.StagesResult) -> None:
    manifest = stages.manifest()
    assert manifest["kind"] == "stages" and manifest["split_by"] == "split_points"
    assert manifest["shared_parameters"] == stages.shared_parameters() == {}
    for entry in manifest["regions"]:
        weights = stages.parameters_of()[entry["name"]]
        assert (entry["parameters"], entry["parameter_bytes"]) == (
            len(weights), sum(weights.values()))
    json.dumps(manifest)


def test_a_split_manifest_has_no_stage_fields(regions: om.SplitResult) -> None:
    manifest = regions.manifest()
    assert manifest["kind"] == "split"
    assert "split_by" not in manifest and "shared_parameters" not in manifest
    assert all("parameters" not in entry for entry in manifest["regions"])


def test_preview_prints_the_table_of_its_kind(stages: om.StagesResult,
                                              regions: om.SplitResult) -> None:
    for result, titles in ((stages, ["Stages (split_points)"]),
                           (regions, ["Operator support", "Regions"])):
        buf = io.StringIO()
        result.preview(Console(file=buf, width=120))
        text = buf.getvalue()
        assert all(title in text for title in titles)
        assert all(r.name in text for r in result.regions)


def test_an_acc_model_holding_a_forbidden_op_is_refused(regions: om.SplitResult) -> None:
    acc = next(g for g in regions.region_graphs() if g.is_acc)
    held = next(iter(op_types_in(acc.model)))
    check_acc_model(acc, AccLimits())  # nothing forbidden
    with pytest.raises(om.OnnxModularError, match=rules.DENIED_ON_ACC.id) as error:
        check_acc_model(acc, AccLimits(frozenset({held})))
    assert f"holds {held[1]}" in str(error.value) and "bug" in str(error.value)


def _uses(result: om.SplitResult, out: Path) -> list[Callable[[], object]]:
    """Every method of a result that reads its parts, as calls."""
    out.mkdir()
    return [lambda: result.save(out / "parts"), result.manifest,
            lambda: result.preview(Console(file=io.StringIO())), result.region_protos,
            result.single_model, lambda: result.save_single(out / "one.onnx"),
            result.parameters_of, result.shared_parameters, result.region_graphs]


@pytest.mark.slow  # over the inner loop's session budget
@pytest.mark.parametrize("how", ["split", "split_stages", "split_by"])
def test_every_emission_diagnostic_is_there_when_the_split_returns(tmp_path: Path,
                                                                  how: str) -> None:
    """Each part's emission reports under the part's name before the entry point returns;
    no method adds one, whichever runs first."""
    model, args = models.Stack(2).eval(), models.x8()
    make: dict[str, Callable[[], om.SplitResult]] = {
        "split": lambda: om.split(model, args, support=["aten.relu"]),
        "split_stages": lambda: om.split_stages(model, args,
                                                split_points={"layers.1": "beginning"}),
        "split_by": lambda: om.split_by(model, lambda n: int("layers.1" in str(
            n.meta.get("nn_module_stack", {}))), args),
    }
    first, second = make[how](), make[how]()
    assert len(first.regions) > 1
    emitted = {d.scope for d in first.diagnostics}
    assert {r.name for r in first.regions} <= emitted  # each part's emission, already
    count = len(first.diagnostics)
    assert len(second.diagnostics) == count
    for n, use in enumerate(_uses(first, tmp_path / "a")):
        use()
        assert len(first.diagnostics) == count, n
    for n, use in enumerate(reversed(_uses(second, tmp_path / "b"))):
        use()
        assert len(second.diagnostics) == count, n
    assert [d.message for d in first.diagnostics] == [d.message for d in second.diagnostics]
