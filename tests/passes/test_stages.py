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


@pytest.mark.slow
def test_a_node_decomposition_shares_across_stages_goes_to_its_first_reader(
        tmp_path) -> None:
    """XLM-RoBERTa (4 layers, dynamic batch and sequence): decomposition makes one
    ``scalar_tensor`` for the masks of every layer, its provenance in layer 3; the stage of
    layer 0 could not take it from a later stage (``KeyError: scalar_tensor_default``,
    found by a tester). It now sits in the first stage that reads it, and the chained
    stages match torch at another size."""
    import transformers

    torch.manual_seed(0)
    config = transformers.XLMRobertaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, max_position_embeddings=64)
    model = transformers.XLMRobertaModel(config).eval()
    ids = torch.randint(2, 128, (2, 8))
    dim = torch.export.Dim
    program = torch.export.export(model, (ids,), dynamic_shapes=(
        {0: dim("batch", min=1, max=8), 1: dim("seq", min=2, max=32)},))
    result = om.split_stages(program, (ids,), split_points={"encoder.layer.2": "beginning"})
    assert len(result.regions) == 2
    result.save(tmp_path)
    other = torch.randint(2, 128, (3, 5))
    got = om.SplitRunner(tmp_path).run(other)[0]
    with torch.no_grad():
        expected = model(other)[0]
    torch.testing.assert_close(torch.as_tensor(got), expected, atol=1e-5, rtol=1e-4)
