"""Decomposing each distinct module call once (lower/repeats.py) gives the model a full
decomposition gives: same functions, same nodes in the same order, same numbers."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from models import ARCHITECTURES
from torch import nn

import onnx_modular as om
from onnx_modular.lower import repeats, translate
from onnx_modular.lower.capture import capture

pytestmark = pytest.mark.slow  # whole models: the full suite, not the inner loop


def _build(name: str) -> tuple[nn.Module, tuple]:
    arch = ARCHITECTURES[name]
    return arch(layers=3) if "transformers" in arch.tags else arch()


def _full(monkeypatch: pytest.MonkeyPatch) -> None:
    """Translate without the repeats shortcut: torch.onnx decomposes every call."""
    monkeypatch.setattr(translate, "_translate_once", lambda program, opset: None)


def _fingerprint(model: ir.Model) -> tuple:
    def body(graph: ir.Graph | ir.Function) -> list[tuple[str, str, int, int]]:
        return [(n.domain, n.op_type, len(n.inputs), len(n.outputs)) for n in graph]

    # weights keep their state-dict names; folded ones are named after decomposed nodes,
    # whose numbering follows the order decomposition made them in
    weights = sorted(name for name in model.graph.initializers if "." in name)
    folded = sorted((tuple(v.shape), v.dtype) for v in model.graph.initializers.values())
    # graph outputs are named after decomposed nodes too: their number is what is the same
    return (body(model.graph), [i.name for i in model.graph.inputs],
            len(model.graph.outputs), weights, folded,
            sorted((f.name, f.doc_string, tuple(body(f))) for f in model.functions.values()))


def test_weights_inputs_and_outputs_keep_their_places(monkeypatch: pytest.MonkeyPatch) -> None:
    """The last block is replaced too: the program's outputs and the weights put back after
    decomposition are where a full decomposition has them."""
    model, args = ARCHITECTURES["stack"]()
    once = translate.translate(capture(model, args)).program
    with monkeypatch.context() as m:
        _full(m)
        full = translate.translate(capture(model, args)).program
    assert once.graph_signature.input_specs == full.graph_signature.input_specs
    assert [n.name for n in once.graph.nodes if n.op == "placeholder"] == \
        [n.name for n in full.graph.nodes if n.op == "placeholder"]
    assert [s.kind for s in once.graph_signature.output_specs] == \
        [s.kind for s in full.graph_signature.output_specs]


def _run(model: ir.Model, args: tuple) -> list[np.ndarray]:
    session = ort.InferenceSession(ir.serde.serialize_model(model).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args, strict=True)}
    return session.run(None, feeds)


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_decomposing_repeats_once_gives_the_model_a_full_decomposition_gives(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, args = _build(name)
    once = om.export(model, args)
    with monkeypatch.context() as m:
        _full(m)
        full = om.export(model, args)
    assert _fingerprint(once.model) == _fingerprint(full.model)
    for a, b in zip(_run(once.model, args), _run(full.model, args), strict=True):
        np.testing.assert_array_equal(a, b)
    assert [(p, type(m).__name__) for p, m in once.graph_module.named_modules()] == \
        [(p, type(m).__name__) for p, m in full.graph_module.named_modules()]


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama", "vit"])
def test_every_layer_but_the_first_is_decomposed_as_a_copy(name: str) -> None:
    model, args = ARCHITECTURES[name](layers=4)
    reduced = repeats.reduce(capture(model, args))
    assert reduced is not None
    program, plan = reduced
    try:
        ops = [n.target for n in program.graph.nodes]
        layer = ARCHITECTURES[name].layer
        layer_copies = [r for r in plan.repeats
                        if str(r.frames[plan.representative_keys[r.group]][1][1])
                        .endswith("." + str(layer))]
        assert len(layer_copies) == 3  # layers 1, 2, 3 are copies of layer 0
        assert ops.count(torch.ops.onnx_modular.repeated_call.default) == len(plan.repeats)
        assert plan.weights  # the copies' weights wait outside the decomposition
    finally:
        plan.release()


class Counting(nn.Module):
    """Updates a buffer in place: a call with a side effect is never replaced."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return self.fc(x) + self.calls


class Transposing(nn.Module):
    """Returns a view of its input: its output aliases an input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(0, 1)


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.counting = nn.ModuleList([Counting() for _ in range(3)])
        self.views = nn.ModuleList([Transposing() for _ in range(2)])
        self.plain = nn.ModuleList([Plain() for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.counting:
            x = m(x)
        for m in self.views:
            x = m(x)
        for m in self.plain:
            x = m(x)
        return x


def _replaced_paths(program: torch.export.ExportedProgram) -> set[str]:
    reduced = repeats.reduce(program)
    if reduced is None:
        return set()
    _, plan = reduced
    plan.release()
    return {str(r.frames[plan.representative_keys[r.group]][1][0]) for r in plan.repeats}


def test_calls_with_side_effects_or_aliasing_outputs_are_decomposed_as_they_are() -> None:
    torch.manual_seed(0)
    model, x = Mixed().eval(), torch.randn(8, 8)
    program = capture(model, (x,))
    replaced = _replaced_paths(program)
    assert {"plain.1", "plain.2"} <= replaced  # and the Linear calls inside the others
    assert not replaced & {"counting.1", "counting.2", "views.1"}
    expected = Mixed().eval()
    expected.load_state_dict(model.state_dict())
    want = expected(x).detach().numpy()
    result = om.export(model, (x,))
    np.testing.assert_allclose(_run(result.model, (x,))[0], want, rtol=1e-5, atol=1e-6)


def test_symbolic_shapes_are_decomposed_as_they_are() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*[Plain() for _ in range(3)]).eval()
    x = torch.randn(4, 8)
    batch = torch.export.Dim("batch", min=2)
    program = capture(model, (x,), dynamic_shapes=({0: batch},))
    assert _replaced_paths(program) == set()
    assert _replaced_paths(capture(model, (x,))) == {"1", "2"}
    result = om.export(model, (x,), dynamic_shapes=({0: batch},))
    y = torch.randn(6, 8)
    np.testing.assert_allclose(_run(result.model, (y,))[0], model(y).detach().numpy(),
                               rtol=1e-5, atol=1e-6)


def test_the_same_export_gives_the_same_bytes() -> None:
    model, args = ARCHITECTURES["llama"](layers=3)
    first = om.export(model, args).model_proto.SerializeToString()
    second = om.export(model, args).model_proto.SerializeToString()
    assert first == second


class ScalesInPlace(nn.Module):
    """Updates only tensors it made (Falcon's ``scores /= scale``): still a function of its
    inputs, so replaced."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        h /= 2.0
        h += x
        h[:, 0] = 0.0  # through a view of its own tensor
        return torch.relu(h)


class ReturnsItsOwnView(nn.Module):
    """Returns a view of a tensor it made (OPT's reshaped output): replaced."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).view(8, 2, 4).transpose(1, 2).reshape(8, 8)


class UpdatesItsInput(nn.Module):
    """Writes into a view of its input: the caller sees it, so never replaced."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x[:, 1] = 1.0
        return x * 2


class TwoViewsOfOne(nn.Module):
    """Two outputs sharing one storage: an update to one after the call reaches the other."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.fc(x)
        return h.view(8, 8), h.t()


class SharesItsInput(nn.Module):
    """``b.set_(x)`` makes its own tensor a view of its input, which no schema annotates:
    the update after it reaches the caller, so never replaced."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = torch.zeros_like(x)
        b.set_(x)
        b.mul_(2.0)
        return self.fc(b)


class InPlaceStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scales = nn.ModuleList([ScalesInPlace() for _ in range(3)])
        self.views = nn.ModuleList([ReturnsItsOwnView() for _ in range(2)])
        self.updates = nn.ModuleList([UpdatesItsInput() for _ in range(2)])
        self.pairs = nn.ModuleList([TwoViewsOfOne() for _ in range(2)])
        self.shares = nn.ModuleList([SharesItsInput() for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in [*self.scales, *self.views]:
            x = m(x)
        for m in self.updates:
            x = m(x + 0)  # a tensor of the caller's, updated by the callee
        for m in self.pairs:
            a, b = m(x)
            a.mul_(3.0)  # the caller updates one output: the other sees it
            x = a + b
        for m in self.shares:
            x = m(x) + x  # the caller reads x after the call updated it
        return x


def test_calls_updating_only_their_own_tensors_are_replaced_and_compute_the_same() -> None:
    torch.manual_seed(0)
    model, x = InPlaceStack().eval(), torch.randn(8, 8)
    replaced = _replaced_paths(capture(model, (x,)))
    assert {"scales.1", "scales.2", "views.1"} <= replaced
    assert not replaced & {"updates.1", "pairs.1", "shares.1", "shares.2"}
    with torch.no_grad():
        want = model(x).numpy()
    result = om.export(model, (x,))
    np.testing.assert_allclose(_run(result.model, (x,))[0], want, rtol=1e-5, atol=1e-6)
