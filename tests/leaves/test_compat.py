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
    from torch.fx import _lazy_graph_module as lazy
    from torch.onnx._internal.exporter import _decomp

    return [ir.schemas.OpSignature.__dict__["from_op_schema"],
            _decomp.create_onnx_friendly_decomposition_table,
            export_utils._materialize_cpp_cia_ops, lazy._use_lazy_graph_module_flag]


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


def test_the_program_a_translation_hands_on_has_its_code() -> None:
    from onnx_modular.lower.translate import translate

    program = translate(capture(_Block(), (torch.randn(2, 5, 8),))).program
    for module in program.graph_module.modules():
        if isinstance(module, torch.fx.GraphModule):
            # (reading ``code`` would generate it: asked first whether it still must be)
            assert not getattr(module, "_needs_recompile", lambda: False)()
