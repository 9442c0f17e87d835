"""The pre-export hook: unchanged torch.onnx.export calls return the hierarchical model."""

from __future__ import annotations

import models
import onnx
import pytest
import torch

import onnx_modular as om
from onnx_modular.lower.translate import quiet_torch_onnx


def _export(model, args, path=None):
    with quiet_torch_onnx():
        return torch.onnx.export(model, args, path, dynamo=True)


def test_hook_makes_torch_onnx_export_hierarchical(tmp_path, ort_outputs, assert_close) -> None:
    model, args = models.Stack(3).eval(), models.x8()
    path = tmp_path / "hooked.onnx"
    with om.hook(functions="all"):
        program = _export(model, args, str(path))
    names = [f.name for f in program.model.functions.values()]
    assert names.count("Block") == 1
    saved = onnx.load(str(path))
    assert {f.name for f in saved.functions} == set(names)
    onnx.checker.check_model(saved, full_check=True)
    assert_close(ort_outputs(path, args)[0], model(*args), 1e-5)
    # Outside the hook, torch.onnx is untouched: flat again.
    assert len(_export(model, args).model.functions) == 0


def test_hooks_nest_and_the_innermost_settings_apply() -> None:
    model, args = models.Stack(2).eval(), models.x8()
    with om.hook(functions="all"):
        with om.hook(functions=["Block"]):
            inner = _export(model, args)
        outer = _export(model, args)
    assert {f.name for f in inner.model.functions.values()} == {"Block"}
    assert {"Block", "LayerNorm", "Linear"} <= {f.name for f in outer.model.functions.values()}
    assert len(_export(model, args).model.functions) == 0


def test_om_export_inside_a_hook_is_not_hooked() -> None:
    """om.export translates through torch.onnx too; the hook's settings must not leak in."""
    model, args = models.Stack(2).eval(), models.x8()
    with om.hook(functions="none"):
        result = om.export(model, args)
    assert {"Block", "LayerNorm", "Linear"} <= set(result.function_names)
    assert sum(n.op_type == "Block" for n in result.model.graph) == 2


def test_hook_leaves_opsets_below_18_flat() -> None:
    model, args = models.Stack(1).eval(), models.x8()
    with om.hook(), quiet_torch_onnx(), pytest.warns(UserWarning, match="stays flat"):
        program = torch.onnx.export(model, args, dynamo=True, opset_version=17)
    assert len(program.model.functions) == 0
