"""emit/repair: torch's ``squeeze(dim)`` of a dimension not of size 1 does nothing; the
Squeeze torch.onnx writes for it (invalid ONNX) loses that axis, with a warning, and the
model ORT runs computes what torch computes."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
import torch

import onnx_modular as om
from onnx_modular.diagnostics import DiagnosticContext, Level
from onnx_modular.emit.pipeline import EmitOptions, emit_model
from onnx_modular.emit.repair import Repair, RepairSqueeze
from onnx_modular.emit.verify import verify

from .graphs import call, fx, model, run, value


def _squeeze(in_shape: tuple[int | str, ...], axes: list[int],
             out_shape: tuple[int | str, ...]) -> ir.Model:
    """``y = Neg(Squeeze(x, axes))`` as torch.onnx writes it: axes from a Constant node, the
    output's shape what torch computed."""
    x = value("x", [d if isinstance(d, int) else ir.SymbolicDim(d) for d in in_shape])
    constant = ir.node("Constant", [], attributes={
        "value": ir.tensor(np.array(axes, dtype=np.int64))}, name="axes")
    out = [d if isinstance(d, int) else ir.SymbolicDim(d) for d in out_shape]
    squeeze = fx("Squeeze", [x, constant.outputs[0]], "squeeze", out)
    neg = fx("Neg", squeeze.outputs, "neg", out)
    return model([x], neg.outputs, [constant, squeeze, neg])


def _repaired(m: ir.Model) -> list[Repair]:
    repairs: list[Repair] = []
    RepairSqueeze({"squeeze": (call("inner", "pkg.Inner"),)}, repairs)(m)
    return repairs


def _ops(m: ir.Model) -> list[str]:
    return [n.op_type for n in m.graph]


def test_a_squeeze_of_a_size_16_dimension_becomes_identity_and_runs() -> None:
    m = _squeeze((2, 16, 4), [1], (2, 16, 4))
    repairs = _repaired(m)
    assert _ops(m) == ["Identity", "Neg"]
    assert [(r.fx_node, r.module_path) for r in repairs] == [("squeeze", "inner")]
    assert "dimension 1 (size 16)" in repairs[0].what
    verify(m)
    x = np.random.default_rng(0).standard_normal((2, 16, 4)).astype(np.float32)
    (y,) = run(m, x=x)
    np.testing.assert_array_equal(y, -torch.from_numpy(x).squeeze(1).numpy())


def test_only_the_axes_of_size_other_than_1_are_dropped() -> None:
    m = _squeeze((2, 16, 1, 4), [1, -2], (2, 16, 4))
    _repaired(m)
    squeeze = next(n for n in m.graph if n.op_type == "Squeeze")
    assert ir.convenience.get_const_tensor(squeeze.inputs[1]).numpy().tolist() == [2]
    assert "axes" not in [n.name for n in m.graph]  # the old constant, unused, is gone
    verify(m)
    x = np.ones((2, 16, 1, 4), np.float32)
    assert run(m, x=x)[0].shape == (2, 16, 4)


def test_a_symbolic_dimension_torch_left_in_place_is_not_squeezed() -> None:
    m = _squeeze(("b", "s", 4), [1], ("b", "s", 4))  # same rank out: torch squeezed nothing
    assert len(_repaired(m)) == 1 and _ops(m) == ["Identity", "Neg"]
    assert run(m, x=np.ones((3, 5, 4), np.float32))[0].shape == (3, 5, 4)


@pytest.mark.parametrize(("in_shape", "axes", "out_shape"), [
    ((2, 1, 4), [1], (2, 4)),           # a true squeeze
    (("b", "s", 4), [1], ("b", 4)),      # torch squeezed the symbolic dimension
    ((2, 16, 4), [5], (2, 16, 4)),       # out of range: nothing torch-faithful to do
])
def test_a_valid_or_unprovable_squeeze_is_left_alone(
        in_shape: tuple[int | str, ...], axes: list[int], out_shape: tuple[int | str, ...]
) -> None:
    m = _squeeze(in_shape, axes, out_shape)
    assert _repaired(m) == [] and _ops(m) == ["Constant", "Squeeze", "Neg"]


def test_an_invalid_model_it_cannot_repair_is_refused_naming_node_and_module() -> None:
    """Squeeze of axis 5 of a rank-3 tensor, inside module ``inner``: emit refuses, in one
    line, before anything could be written."""
    m = _squeeze((2, 16, 4), [5], (2, 16, 4))
    ctx = DiagnosticContext()
    chains = {"squeeze": (call("inner", "pkg.Inner"),), "neg": ()}
    with pytest.raises(om.OnnxModularError) as caught:
        emit_model(m, chains, frozenset(), EmitOptions(), ctx)
    text = str(caught.value)
    assert text.startswith("error: OM0202 translation: the exported model is invalid in "
                           "module 'inner', node 'squeeze'") and "\n" not in text


class _Inner(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.squeeze(1) * 2


class _Squeezing(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + 1


@pytest.mark.slow
@pytest.mark.parametrize("functions", ["all", "none"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_squeeze_of_a_size_16_dim_exports_valid_and_runs_as_torch(
        functions: str, dynamic: bool, tmp_path: object) -> None:
    """diffusers' PixArt: ``squeeze(1)`` of ``[2, 16, 4]`` in a submodule; torch.onnx writes
    an invalid Squeeze, the written model passes strict inference and ORT matches torch."""
    import onnx
    import onnxruntime as ort

    x = torch.randn(2, 16, 4)
    shapes = {"x": {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}} \
        if dynamic else None
    ctx = DiagnosticContext()
    result = om.export(_Squeezing(), (x,), functions=functions, dynamic_shapes=shapes,
                       ctx=ctx)
    warned = [d for d in ctx.of_level(Level.WARNING) if "Squeeze" in d.message]
    assert len(warned) == 1 and "module 'inner'" in warned[0].message
    path = tmp_path / "m.onnx"  # type: ignore[operator]
    result.save(path)
    onnx.shape_inference.infer_shapes(onnx.load(str(path)), check_type=True,
                                      strict_mode=True)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for sample in (x, torch.randn(3, 5, 4)) if dynamic else (x,):
        (y,) = session.run(None, {session.get_inputs()[0].name: sample.numpy()})
        np.testing.assert_allclose(y, _Squeezing()(sample).numpy(), rtol=0, atol=0)
