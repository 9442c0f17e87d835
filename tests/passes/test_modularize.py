"""Modularize: exact outputs, one call_module per module call, both metadata formats."""

from __future__ import annotations

import copy
import operator

import models
import pytest
import torch
import torch.fx

import onnx_modular as om
from onnx_modular import DiagnosticContext, Level, module_call_chains
from onnx_modular.passes.modularize import iter_module_calls


def _export(model: torch.nn.Module, args: tuple, kwargs: dict | None = None):
    return torch.export.export(model, args, kwargs or {})


def _paths(gm: torch.fx.GraphModule) -> list[str]:
    return [sub.module_path for _, sub in iter_module_calls(gm)]


def _to_fx_tracer_format(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Rewrite export's nn_module_stack the way the FX symbolic tracer writes it."""
    gm = copy.deepcopy(gm)
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            node.meta["nn_module_stack"] = {
                path: (path, cls) for key, (path, cls) in stack.items() if path != ""}
    return gm


@pytest.mark.parametrize("decompose", [False, True])
def test_stack_exact_and_nested(decompose: bool, assert_close) -> None:
    model, args = models.Stack(3), models.x8()
    ep = _export(model, args)
    if decompose:
        ep = ep.run_decompositions()
    gm = om.modularize(ep)
    assert_close(gm(*args), ep.module()(*args), 0)
    assert_close(gm(*args), model(*args), 0)
    assert _paths(gm) == [
        "layers.0", "layers.0.norm", "layers.0.fc", "layers.1", "layers.1.norm", "layers.1.fc",
        "layers.2", "layers.2.norm", "layers.2.fc"]
    layer = gm.get_submodule("layers.0")  # each call's module at its module path
    assert layer.module_type == "models.Block"
    assert layer.fc.module_type == "torch.nn.modules.linear.Linear"
    # Parameters are attributes of the module that holds them, shared with the program.
    assert layer.fc.weight is ep.state_dict["layers.0.fc.weight"]


def test_shared_module_called_twice_gives_two_calls(assert_close) -> None:
    model, args = models.SharedTwice(), models.x8()
    ep = _export(model, args)
    gm = om.modularize(ep)
    assert_close(gm(*args), model(*args), 0)
    calls = [(n.target, sub.module_path, sub.call_id) for n, sub in iter_module_calls(gm)]
    assert [c[1] for c in calls] == ["shared", "shared"]
    assert calls[0][2] != calls[1][2]
    assert [c[0] for c in calls] == ["shared", "shared@1"]  # as torch.export.unflatten
    assert any(n.target == torch.ops.aten.sigmoid.default for n in gm.graph.nodes)


def test_multiple_outputs_kwargs_buffers_constants(assert_close) -> None:
    model, args = models.MultiOut(), models.x8()
    kwargs = {"bias": torch.randn(8)}
    ep = _export(model, args, kwargs)
    gm = om.modularize(ep)
    assert_close(gm(*args, **kwargs), ep.module()(*args, **kwargs), 0)
    two = gm.two
    assert two.module_path == "two"
    getitems = [n for n in gm.graph.nodes if n.target is operator.getitem and n.args[0].op ==
                "call_module"]
    assert len(getitems) == 2  # a two-output call is unpacked through getitem
    out = next(n for n in two.graph.nodes if n.op == "output")
    assert len(out.args[0]) == 2


def test_nested_containers(assert_close) -> None:
    model, args = models.Containers(), models.x8()
    gm = om.modularize(_export(model, args))
    assert_close(gm(*args), model(*args), 0)
    paths = _paths(gm)
    for expected in ["seq", "seq.0", "seq.1", "seq.1.0", "seq.1.1", "extra.0", "extra.1",
                     "heads.a", "heads.b"]:
        assert expected in paths
    assert gm.get_submodule("seq.1").module_path == "seq.1"


def test_inputs_in_first_use_order_outputs_in_creation_order(assert_close) -> None:
    class Inner(torch.nn.Module):
        def forward(self, a, b, c):
            u = c * 2
            v = a + b
            return v, u

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, a, b, c):
            v, u = self.inner(a, b, c)
            return u - v

    args = tuple(torch.randn(3) for _ in range(3))
    gm = om.modularize(_export(Outer(), args))
    assert_close(gm(*args), Outer()(*args), 0)
    placeholders = [n.name for n in gm.inner.graph.nodes if n.op == "placeholder"]
    assert placeholders == ["c", "a", "b"]
    out = next(n for n in gm.inner.graph.nodes if n.op == "output").args[0]
    assert [o.name for o in out] == ["mul", "add"]


def test_batchnorm_training_mutation_keeps_semantics(assert_close) -> None:
    model = models.ConvBN().train()
    args = (torch.randn(2, 3, 6, 6),)
    ep = _export(model, args)
    reference, modular = ep.module(), om.modularize(ep)
    reference = copy.deepcopy(reference)
    before = modular.bn.running_mean.clone()
    assert_close(modular(*args), reference(*args), 0)
    assert not torch.equal(modular.bn.running_mean, before)  # the update happened
    assert torch.equal(modular.bn.running_mean, reference.get_buffer("bn.running_mean"))
    assert int(modular.bn.num_batches_tracked) == 1


def test_nodes_without_module_stack_stay_in_parent_with_a_note(assert_close) -> None:
    model, args = models.Stack(2), models.x8()
    gm = _export(model, args).module()
    stripped = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target == torch.ops.aten.relu.default:
            del node.meta["nn_module_stack"]
            stripped.append(node.name)
    ctx = DiagnosticContext()
    result = om.modularize(gm, ctx)
    assert_close(result(*args), model(*args), 0)
    notes = [d for d in ctx.diagnostics if d.rule.name == "missing-module-stack"]
    assert len(notes) == 1 and notes[0].level == Level.NOTE
    chains = module_call_chains(result)
    for name in stripped:  # between the layer's own calls: stays inside that layer
        assert [c.module_path for c in chains[name]] in (["layers.0"], ["layers.1"])


def test_graph_without_any_module_stack() -> None:
    def f(x):
        return torch.relu(x) + 1

    gm = torch.fx.symbolic_trace(f)
    ctx = DiagnosticContext()
    result = om.modularize(gm, ctx)
    x = torch.randn(4)
    assert torch.equal(result(x), f(x))
    assert _paths(result) == []


def _annotated_graph(order: list[str], deps: dict[str, list[str]],
                     stacks: dict[str, list[str]]) -> torch.fx.GraphModule:
    """A hand-built graph: node -> its inputs, node -> module paths it runs in."""
    g = torch.fx.Graph()
    env = {"x": g.placeholder("x")}
    for name in order:
        inputs = [env[d] for d in deps[name]]
        node = g.call_function(torch.add, (inputs[0], inputs[1] if len(inputs) > 1 else 1.0))
        node.name = name
        if name in stacks:  # [] = the root module itself
            node.meta["nn_module_stack"] = {"L__self__": ("", "M"), **{
                f"L__self__{p}": (p, f"pkg.{p.upper()}") for p in stacks[name]}}
        env[name] = node
    g.output(env[order[-1]])
    return torch.fx.GraphModule(torch.nn.Module(), g)


def test_interleaved_call_is_grouped_whole_when_dependencies_allow() -> None:
    # a1, a2 belong to module "a"; "free" sits between them and does not depend on "a".
    gm = _annotated_graph(
        ["a1", "free", "a2", "out"],
        {"a1": ["x"], "free": ["x"], "a2": ["a1"], "out": ["a2", "free"]},
        {"a1": ["a"], "free": [], "a2": ["a"]})
    ctx = DiagnosticContext()
    result = om.modularize(gm, ctx)
    x = torch.randn(3)
    assert torch.equal(result(x), gm(x))
    assert _paths(result) == ["a"]
    assert not ctx.of_level(Level.WARNING)


def test_interleaved_call_is_split_with_warning_when_dependencies_forbid() -> None:
    gm = _annotated_graph(
        ["a1", "mid", "a2", "out"],
        {"a1": ["x"], "mid": ["a1"], "a2": ["mid"], "out": ["a2"]},
        {"a1": ["a"], "mid": [], "a2": ["a"]})
    ctx = DiagnosticContext()
    result = om.modularize(gm, ctx)
    x = torch.randn(3)
    assert torch.equal(result(x), gm(x))
    assert _paths(result) == ["a", "a"]
    warnings = ctx.of_level(Level.WARNING)
    assert len(warnings) == 1 and "'a'" in warnings[0].message


def test_fx_symbolic_trace_format_with_leaf_modules(assert_close) -> None:
    model, args = models.Stack(2), models.x8()
    traced = torch.fx.symbolic_trace(model)
    result = om.modularize(traced)
    assert_close(result(*args), model(*args), 0)
    assert _paths(result) == ["layers.0", "layers.1"]
    leaves = [n for n in result.get_submodule("layers.0").graph.nodes if n.op == "call_module"]
    assert [str(n.target) for n in leaves] == ["norm", "fc"]


def test_rejects_other_inputs_with_a_clear_error() -> None:
    with pytest.raises(om.OnnxModularError, match=r"OM0104.*ExportedProgram"):
        om.modularize(torch.nn.Linear(2, 2))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(models.names("core")))
def test_transformers_architectures(name: str, assert_close) -> None:
    model, args = models.ARCHITECTURES[name](layers=2)
    ep = _export(model, args)
    gm = om.modularize(ep)
    assert_close(gm(*args), ep.module()(*args), 0)
    calls = list(iter_module_calls(gm))
    assert calls, "no module call found"
    for _, sub in calls:
        assert isinstance(sub.module_path, str) and sub.module_path
        assert "." in sub.module_type
    layer_types = {sub.module_type.rsplit(".", 1)[-1] for _, sub in calls}
    expected = models.ARCHITECTURES[name].layer
    assert expected in layer_types
    layers = [sub for _, sub in calls if sub.module_type.endswith(expected)]
    assert len(layers) == 2 and len({s.module_path for s in layers}) == 2

    decomposed = ep.run_decompositions()
    assert_close(om.modularize(decomposed)(*args), decomposed.module()(*args), 0)

    # The same architecture through the FX symbolic tracer's metadata format.
    fx_format = om.modularize(_to_fx_tracer_format(ep.module()))
    assert_close(fx_format(*args), ep.module()(*args), 0)
    assert sorted(_paths(fx_format)) == sorted(sub.module_path for _, sub in calls)
