"""leaves/_compat: the fixed costs of a torch.onnx export paid once change no file, and
what they patch is as it was afterwards."""

from __future__ import annotations

import contextlib

import onnx
import onnx_ir as ir
import pytest
import torch
from torch import nn

from onnx_modular.leaves import _compat
from onnx_modular.lower.capture import capture


class _Block(nn.Module):
    """Ops of several ONNX operators with default attributes (LayerNormalization's axis,
    Softmax's axis, Gelu's approximation), some of them twice."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(8), nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.gelu(self.up(self.norm(x)))
        return self.norm(x + self.down(h.softmax(-1) * h))


def _translated(program: torch.export.ExportedProgram) -> bytes:
    onnx_program = _compat.torch_onnx_export(program, None)
    return ir.to_proto(onnx_program.model).SerializeToString()


@pytest.mark.slow  # over the inner loop's session budget
def test_paying_the_fixed_costs_once_writes_the_same_file(monkeypatch) -> None:
    if _compat._EXPORTER is None:
        pytest.skip("this torch.onnx has no separate export step to patch")
    program = capture(_Block(), (torch.randn(2, 5, 8),))
    with_window = _translated(program)
    again = _translated(program)  # now from the cached tables and signatures
    monkeypatch.setattr(_compat, "export_window", contextlib.nullcontext)
    assert _translated(program) == with_window == again


def _patched() -> list[object]:
    from torch._export import utils as export_utils
    from torch.onnx._internal.exporter import _decomp

    return [ir.schemas.OpSignature.__dict__["from_op_schema"],
            _decomp.create_onnx_friendly_decomposition_table,
            export_utils._materialize_cpp_cia_ops]


def test_what_the_window_patches_is_restored_after_it_also_on_failure() -> None:
    before = _patched()
    with pytest.raises(RuntimeError), _compat.export_window():
        with _compat.export_window():  # nested: the outer one still holds them
            pass
        inside = _patched()
        assert all(a is not b for a, b in zip(inside, before, strict=True))
        add = onnx.defs.get_schema("Add", 14)
        signature = ir.schemas.OpSignature.from_op_schema
        assert signature(add) is signature(add)  # one signature per operator version
        raise RuntimeError("the export failed")
    assert _patched() == before


def test_windows_of_two_threads_ending_in_either_order_restore_what_was_there() -> None:
    before = _patched()
    first, second = _compat.export_window(), _compat.export_window()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # the first export ends while the second still runs
    assert _patched() != before
    second.__exit__(None, None, None)
    assert _patched() == before


def test_a_window_whose_patching_fails_leaves_nothing_behind(monkeypatch) -> None:
    before = _patched()

    def broken() -> list[object]:
        raise RuntimeError("a torch without what we patch")

    monkeypatch.setattr(_compat, "_patch_fixed_costs", broken)
    with pytest.raises(RuntimeError), _compat.export_window():
        pass
    monkeypatch.undo()
    with _compat.export_window():  # the next window patches again (no count left at 1)
        assert _patched() != before
    assert _patched() == before


def test_a_patch_failing_halfway_undoes_those_made_before_it(monkeypatch) -> None:
    before = _patched()

    def broken(make: object) -> object:
        raise RuntimeError("an onnx_ir this window does not know")

    monkeypatch.setattr(_compat, "_cached_signature", broken)  # the last of the patches
    with pytest.raises(RuntimeError), _compat.export_window():
        pass
    assert _patched() == before


class _Branching(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))


@pytest.mark.slow  # over the inner loop's session budget
def test_programs_handed_on_hold_plain_graph_modules_compile_can_trace() -> None:
    """torch.export runs inside the window: its programs' submodules (a cond's branches)
    are GraphModules with their code, which torch.compile traces, and a thread exporting
    outside any window meanwhile gets plain ones too."""
    from torch.fx._lazy_graph_module import _LazyGraphModule

    from onnx_modular.lower.translate import translate

    x = torch.randn(3, 4)
    program = capture(_Branching(), (x,))
    lowered = translate(program).program
    for gm in (program.graph_module, lowered.graph_module):
        assert not [m for m in gm.modules() if isinstance(m, _LazyGraphModule)]
    compiled = torch.compile(program.module(), backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), _Branching()(x))
    torch.testing.assert_close(compiled(-x.abs()), _Branching()(-x.abs()))


@pytest.mark.parametrize("dims, nonzero", [
    ({0: torch.export.Dim("b", min=1), 1: torch.export.Dim("s", min=2)}, {"b", "s"}),
    ({0: torch.export.Dim("b"), 1: torch.export.Dim("s", min=1)}, {"s"}),  # b may be 0
    ({0: torch.export.Dim.AUTO, 1: torch.export.Dim.DYNAMIC}, set()),  # torch's 2, not ours
], ids=["declared", "default-min-0", "auto"])
def test_sizes_never_empty_are_those_the_user_declared_so(dims: dict, nonzero: set) -> None:
    x = torch.randn(2, 5, 8)
    program = torch.export.export(nn.Linear(8, 4), (x,), dynamic_shapes=(dims,))
    names = _compat.dim_names(program)
    found = _compat.declared_nonzero((dims,), program)
    assert {names.get(symbol, symbol) for symbol in found} == nonzero
