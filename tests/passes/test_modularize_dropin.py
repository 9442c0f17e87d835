"""Modularize as a drop-in for ``torch.export.unflatten``: the model's state-dict keys and
kinds, the program's input guards, ``meta["val"]`` on every call, code ready for
``torch.compile``, and state of its own. Behaviours of torch's own unflatten tests, on
models built here."""

from __future__ import annotations

import copy

import models
import pytest
import torch
from torch import nn

import onnx_modular as om
from onnx_modular.passes.modularize import iter_module_calls


def _export(model: nn.Module, args: tuple, **kwargs) -> torch.export.ExportedProgram:
    return torch.export.export(model, args, **kwargs)


def _perturbed(model: nn.Module) -> nn.Module:
    """A copy whose floating state-dict entries all moved a little."""
    other = copy.deepcopy(model)
    g = models.seeded(1)
    with torch.no_grad():
        for t in other.state_dict(keep_vars=True).values():
            if t.is_floating_point():
                t.add_(0.01 * torch.randn(t.shape, generator=g, dtype=t.dtype))
    return other


def _non_persistent(model: nn.Module) -> set[str]:
    return {f"{path}.{name}" if path else name for path, m in model.named_modules()
            for name in m._non_persistent_buffers_set}


class Counter(nn.Module):
    """A submodule that counts its calls in a buffer and reads a non-persistent one."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(4))
        self.register_buffer("offset", torch.full((4,), 0.5), persistent=False)

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        self.calls.add_(1)
        y = self.lin(x) + self.offset + self.calls
        return y if scale is None else y * scale


class Tangle(nn.Module):
    """What unflatten's tests exercise at once: a Sequential, a module called twice (the
    second call with a parameter of the parent), a ModuleList with an entry never called,
    a weight tied across modules, a ParameterList and a constant tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.sub_net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
        self.shared = Counter()
        self.scale = nn.Parameter(torch.full((4,), 1.5))
        self.blocks = nn.ModuleList([Counter(), Counter()])
        self.tied = nn.Linear(4, 4)
        self.tied.weight = self.sub_net[0].weight
        self.extra = nn.ParameterList([nn.Parameter(torch.ones(4)), nn.Parameter(torch.ones(4))])
        self.table = torch.arange(4.0)  # a constant: no state-dict entry

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.shared(self.sub_net(x))
        x = self.shared(x, self.scale)
        x = self.tied(self.blocks[1](x)) * self.extra[1] + self.table
        return x, x.sum()


class Aliased(nn.Module):
    """One module instance under two names, called under each."""

    def __init__(self) -> None:
        super().__init__()
        block = nn.Linear(4, 4)
        self.first = block
        self.second = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x)))


HAND = {
    "tangle": lambda: (Tangle(), (torch.randn(2, 4, generator=models.seeded(0)),)),
    "aliased": lambda: (Aliased(), (torch.randn(2, 4, generator=models.seeded(0)),)),
}


def _build(name: str) -> tuple[nn.Module, tuple]:
    if name in HAND:
        return HAND[name]()
    return models.ARCHITECTURES[name]()


ALL = [*models.ARCHITECTURES, *HAND]


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL)
def test_state_dict_is_the_models(name: str, assert_close) -> None:
    """Keys, order and kinds of eager's state dict; a strict load of other weights gives
    what the model gives with them; outputs equal ep.module()'s exactly (invariant 1)."""
    model, args = _build(name)
    ep = _export(model, args)
    reference = copy.deepcopy(ep.module())
    gm = om.modularize(ep)
    assert_close(gm(*args), reference(*args), 0)

    assert list(gm.state_dict()) == list(model.state_dict())
    non_persistent = _non_persistent(model)
    assert set(ep.graph_signature.non_persistent_buffers) <= non_persistent
    for fqn in non_persistent:  # still a buffer of its module, out of the state dict
        owner, _, field = fqn.rpartition(".")
        assert field in gm.get_submodule(owner)._non_persistent_buffers_set, fqn

    other = _perturbed(model)
    gm = om.modularize(_export(model, args))
    gm.load_state_dict(other.state_dict(), strict=True)
    assert_close(gm(*args), other(*args), 1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tangle", "stack", "containers", "gpt2", "bert"])
def test_calls_sit_at_their_module_paths(name: str) -> None:
    """A module's first call is its module, at its path; other calls hold no state."""
    model, args = _build(name)
    gm = om.modularize(_export(model, args))
    for _, sub in iter_module_calls(gm):
        if "@" in sub.call_id or "#" in sub.call_id:
            assert not list(sub.parameters()) and not list(sub.buffers())
        else:
            assert gm.get_submodule(sub.module_path) is sub
    if name == "tangle":
        ids = [sub.call_id for _, sub in iter_module_calls(gm)]
        assert ids[ids.index("shared"):][:3] == ["shared", "shared.lin", "shared@1"]
        assert gm.get_submodule("shared@1").module_path == "shared"
        assert type(gm.get_submodule("blocks.0")) is nn.Module  # never called: a container


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tangle", "stack", "multi_out", "gpt2", "convnet"])
def test_every_call_has_meta_val(name: str) -> None:
    """A call's ``meta["val"]``: its value, a tuple of values for several outputs."""
    if name == "multi_out":
        model, args, kwargs = models.MultiOut(), models.x8(), {"bias": torch.randn(8)}
    else:
        (model, args), kwargs = _build(name), {}
    gm = om.modularize(_export(model, args, kwargs=kwargs))
    several = 0
    for node, sub in iter_module_calls(gm):
        out = next(n for n in sub.graph.nodes if n.op == "output").args[0]
        val = node.meta.get("val")
        if isinstance(out, tuple):
            several += 1
            assert isinstance(val, tuple) and len(val) == len(out)
            assert all(isinstance(v, torch.Tensor) for v in val)
            items = {u.args[1]: u.meta["val"] for u in node.users}
            assert all(val[i] is v for i, v in items.items())
        else:
            assert isinstance(val, torch.Tensor), node.name
    assert several or name not in ("tangle", "multi_out")


def _dynamic_batch(model: nn.Module, args: tuple) -> torch.export.ExportedProgram:
    batch = torch.export.Dim("batch", min=2, max=64)
    return _export(model, args, dynamic_shapes=({0: batch},))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["stack", "gpt2"])
def test_every_call_module_node_is_a_module_with_a_graph_and_meta_val(name: str) -> None:
    """As torch's own unflatten tests walk ``unflatten``'s result: every ``call_module``
    node, the input guard's included, calls a module with a graph and has ``meta["val"]``
    (the guard was a ``GuardsFn`` submodule: no graph, no value)."""
    model, args = _build(name)
    gm = om.modularize(_export(model, args))
    calls = [(gm, n) for n in gm.graph.nodes if n.op == "call_module"]
    for module in gm.modules():
        if isinstance(module, torch.fx.GraphModule) and module is not gm:
            calls += [(module, n) for n in module.graph.nodes if n.op == "call_module"]
    assert calls
    for owner, node in calls:
        assert hasattr(owner.get_submodule(str(node.target)), "graph"), node.name
        assert "val" in node.meta, node.name


@pytest.mark.slow
@pytest.mark.parametrize("name", ["stack", "tangle", "gpt2", "conv_bn"])
def test_input_guards_hold(name: str, assert_close) -> None:
    """An input the program was not made for raises as ep.module() does; one it was made
    for runs (a batch inside the dynamic range, not above it)."""
    model, args = _build(name)
    (x,) = args
    static = _export(model, args)
    for gm in (static.module(), om.modularize(static)):
        with pytest.raises(AssertionError, match="Guard failed"):
            gm(torch.cat([x, x[:1]]))
    if name == "gpt2":
        return  # transformers' attention mask specializes the batch
    dynamic = _dynamic_batch(copy.deepcopy(model), args)
    bigger = (torch.cat([x, x, x]),)
    assert_close(om.modularize(dynamic)(*bigger), dynamic.module()(*bigger), 0)
    for gm in (dynamic.module(), om.modularize(dynamic)):
        with pytest.raises(AssertionError, match="Guard failed"):
            gm(torch.cat([x] * 40))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["stack", "tangle", "containers", "llama"])
def test_fresh_result_compiles_fullgraph(name: str, assert_close) -> None:
    """No lazy code: a fresh result and a fresh call's module compile on their first call."""
    model, args = _build(name)
    ep = _export(model, args)
    expected = copy.deepcopy(ep.module())(*args)
    compiled = torch.compile(om.modularize(ep), backend="eager", fullgraph=True)
    assert_close(compiled(*args), expected, 0)

    seen: dict[str, tuple] = {}
    probe = om.modularize(ep)
    node, sub = next(iter_module_calls(probe))
    sub.register_forward_pre_hook(lambda _m, a: seen.setdefault("args", a))
    probe(*args)
    fresh = om.modularize(ep).get_submodule(str(node.target))
    torch._dynamo.reset()
    out = torch.compile(fresh, backend="eager", fullgraph=True)(*seen["args"])
    assert_close(out, sub(*seen["args"]), 0)


@pytest.mark.parametrize("name", ["conv_bn", "tangle"])
def test_running_changes_no_other_result(name: str) -> None:
    """Buffers are the result's own, as unflatten's: running one result changes neither
    the program nor a second result; parameters are the program's (not copied)."""
    model, args = _build(name)
    model.train()
    ep = _export(model, args)
    before = {k: v.clone() for k, v in ep.state_dict.items()}
    first, second = om.modularize(ep), om.modularize(ep)
    reference = torch.export.unflatten(ep)
    fresh = copy.deepcopy(second.state_dict())
    out = first(*args)
    reference(*args)
    changed = [k for k, v in first.state_dict().items() if not torch.equal(v, fresh[k])]
    assert changed, "the model updates a buffer when it runs"
    assert all(torch.equal(v, before[k]) for k, v in ep.state_dict.items())
    assert all(torch.equal(v, fresh[k]) for k, v in second.state_dict().items())
    for k in changed:  # unflatten updates the same buffers the same way
        assert torch.equal(first.state_dict()[k], reference.state_dict()[k]), k
    name_of_param = next(n for n, _ in model.named_parameters())
    assert first.get_parameter(name_of_param) is ep.state_dict[name_of_param]
    assert torch.equal(second(*args)[0] if isinstance(out, tuple) else second(*args),
                       out[0] if isinstance(out, tuple) else out)
