"""The spine: every entry point lowers its model once (capture, translation, Modularize),
emission reads the module calls lowering made, and the hook keeps its diagnostics."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import Any

import models
import pytest
import torch

import onnx_modular as om
from onnx_modular.api import spine
from onnx_modular.leaves.errors import rules
from onnx_modular.lower import translate
from onnx_modular.lower.markers import is_marker
from onnx_modular.lower.translate import quiet_torch_onnx
from onnx_modular.passes.modularize import Modularize


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often torch.export, torch.onnx's translation and the Modularize pass run,
    counted where every caller goes through."""
    counted: Counter[str] = Counter()

    def counting(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            counted[name] += 1
            return function(*args, **kwargs)
        return call

    monkeypatch.setattr(torch.export, "export", counting("capture", torch.export.export))
    monkeypatch.setattr(translate, "torch_onnx_export",
                        counting("translate", translate.torch_onnx_export))
    monkeypatch.setattr(Modularize, "call", counting("modularize", Modularize.call))
    return counted


def _stack() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return models.Stack(2).eval(), models.x8()


def _split(model: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> om.SplitResult:
    return om.split(model, args, support=["aten.relu"])


def _stages(model: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> om.StagesResult:
    return om.split_stages(model, args, split_points={"layers.1": "beginning"})


def _split_by(model: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> om.StagesResult:
    return om.split_by(model, lambda node: int("layers.1" in str(node.meta.get(
        "nn_module_stack", {}))), args)


def _balanced(model: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> om.StagesResult:
    return om.split_stages(model, args, num_stages=2)


@pytest.mark.slow
@pytest.mark.parametrize("entry", [_split, _stages, _split_by, _balanced],
                         ids=["split", "split_stages", "split_by", "balanced"])
def test_parts_are_lowered_once_and_emitted_from_it(entry: Callable[..., om.SplitResult],
                                                    calls: Counter[str], tmp_path) -> None:
    model, args = _stack()
    result = entry(model, args)
    result.save(tmp_path / "parts")  # emitting every part reads the chains lowering made
    result.save_single(tmp_path / "single.onnx")
    assert calls == {"capture": 1, "translate": 1, "modularize": 1}


def test_export_lowers_once(calls: Counter[str]) -> None:
    om.export(*_stack())
    assert calls == {"capture": 1, "translate": 1, "modularize": 1}


def test_a_flat_unoptimized_export_is_not_modularized(calls: Counter[str]) -> None:
    result = om.export(*_stack(), functions="none", optimize_model=False)
    assert calls == {"capture": 1, "translate": 1}
    assert result.graph_module is None and not result.model.functions


@pytest.mark.slow
def test_lowered_holds_the_translation_and_each_nodes_module_calls() -> None:
    model = models.Marked().eval()
    lowered = spine.lower(spine.Subject(model, models.x8()))
    assert not any(is_marker(n) for n in lowered.program.graph.nodes)  # markers dropped
    assert lowered.graph_module is not None
    paths = {call.module_path for chain in lowered.chains.values() for call in chain}
    assert {"a", "b", "c"} <= paths
    assert lowered.weights == set(model.state_dict())  # the unused module's too
    with pytest.raises(dataclasses.FrozenInstanceError):
        lowered.chains = {}  # type: ignore[misc]
    cheap = spine.lower(spine.Subject(lowered.program), with_calls=False)
    assert cheap.graph_module is None and cheap.chains == {}


@pytest.mark.slow
def test_the_hook_keeps_each_exports_diagnostics(calls: Counter[str]) -> None:
    model, args = _stack()
    with om.hook() as session, quiet_torch_onnx():
        torch.onnx.export(model, args, dynamo=True)
        torch.onnx.export(model, args, dynamo=True)
    first, second = session.exports
    assert calls["modularize"] == 2 and calls["translate"] == 0  # torch.onnx translated
    assert first.diagnostics is not second.diagnostics  # a context per export
    summaries = [d for d in first.diagnostics if d.rule == rules.FUNCTION_SUMMARY]
    assert len(summaries) == 1 and "function" in summaries[0].message
    sarif = first.to_sarif()
    assert [r["ruleId"] for r in sarif["runs"][0]["results"]] == [
        d.rule.id for d in first.diagnostics]
