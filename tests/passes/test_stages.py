"""Where pipeline stages cut the captured graph: markers, split points, callbacks."""

from __future__ import annotations

import models
import pytest
import torch
from models import Marked

import onnx_modular as om
from onnx_modular.lower import markers
from onnx_modular.passes import stages


def _ep(model: torch.nn.Module, args: tuple) -> torch.export.ExportedProgram:
    return torch.export.export(model, args)


def test_pipe_split_is_identity_at_run_time_and_kept_by_export() -> None:
    model, x = Marked(4), torch.randn(2, 4)
    hidden = torch.relu(model.b(model.a(x)))
    expected = model.c(hidden) + hidden
    assert torch.equal(model(x), expected)
    ep = _ep(model, (x,))
    assert sum(markers.is_marker(n) for n in ep.graph.nodes) == 3
    assignment = stages.from_markers(ep)
    assert assignment.count == 3
    assert assignment.stage_of["linear"] == 0
    assert assignment.stage_of["relu"] == 1 and assignment.stage_of["linear_2"] == 2
    clean = markers.without_markers(ep)
    assert not any(markers.is_marker(n) for n in clean.graph.nodes)
    assert torch.equal(clean.module()(x), expected)
    assert sum(markers.is_marker(n) for n in ep.graph.nodes) == 3  # the input is untouched


def test_split_points_beginning_and_end() -> None:
    model, args = models.Stack(4), models.x8()
    ep = _ep(model, args)
    begin = stages.from_split_points(ep, {"layers.2": "beginning"})
    end = stages.from_split_points(ep, {"layers.1": "end"})
    assert begin.stage_of == end.stage_of and begin.count == 2
    layer_of = {}
    for node in ep.graph.nodes:
        stack = node.meta.get("nn_module_stack") or {}
        paths = [v[0] for v in stack.values()
                 if v[0].startswith("layers.") and v[0].count(".") == 1]
        if paths:
            layer_of[node.name] = int(paths[0].split(".")[1])
    for name, layer in layer_of.items():
        assert begin.stage_of[name] == (0 if layer < 2 else 1)
    three = stages.from_split_points(ep, {"layers.1": "beginning", "layers.2": "end"})
    assert three.count == 3


def test_split_point_errors_name_the_module() -> None:
    model = Marked(4)
    ep = _ep(model, (torch.randn(2, 4),))
    names = {n for n, _ in model.named_modules()}
    with pytest.raises(om.OnnxModularError, match="'layers.9' names no module"):
        stages.from_split_points(ep, {"layers.9": "beginning"}, module_names=names)
    with pytest.raises(om.OnnxModularError, match="'unused': the module never runs"):
        stages.from_split_points(ep, {"unused": "end"}, module_names=names)
    with pytest.raises(om.OnnxModularError, match="'middle' is not one of beginning, end"):
        stages.from_split_points(ep, {"a": "middle"}, module_names=names)


def test_callback_orders_partitions_by_dependency() -> None:
    model, args = models.Stack(3), models.x8()
    ep = _ep(model, args)

    def by_layer(node: torch.fx.Node) -> int:
        stack = node.meta.get("nn_module_stack") or {}
        layers = [v[0] for v in stack.values() if v[0].count(".") == 1]
        return 10 - int(layers[0].split(".")[1]) if layers else 10  # ids run backwards

    assignment = stages.from_callback(ep, by_layer)
    assert assignment.count == 3
    first = next(n.name for n in ep.graph.nodes if n.op == "call_function")
    assert assignment.stage_of[first] == 0  # layer 0 (id 10) comes first: data flows forward


def test_callback_cycle_is_a_clear_error() -> None:
    model, args = models.Stack(1), models.x8()
    ep = _ep(model, args)
    names = [n.name for n in ep.graph.nodes if n.op == "call_function"]
    # alternate partitions along a chain: 0 -> 1 -> 0 is a cycle between partitions
    ids = {name: i % 2 for i, name in enumerate(names)}
    with pytest.raises(om.OnnxModularError, match="cycle"):
        stages.from_callback(ep, lambda n: ids[n.name])
    with pytest.raises(om.OnnxModularError, match="callback failed on node"):
        stages.from_callback(ep, lambda n: 1 // 0)
