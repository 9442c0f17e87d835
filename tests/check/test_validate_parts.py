"""validate on a parts directory: the chained parts against torch, end to end, with a
verdict that cannot be OK when a part is wrong."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

import onnx_modular as om
from onnx_modular.check.validate import parts_directory
from onnx_modular.cli import main

MODEL_PY = """
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.sin(self.a(x)))
"""


def _model_class(path: Path) -> type[nn.Module]:
    spec = importlib.util.spec_from_file_location("parts_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Model


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, nn.Module, tuple]:
    """m.py's model split acc / cpu (sin) / acc, and stages of it, saved beside m.py."""
    root = tmp_path_factory.mktemp("parts")
    (root / "m.py").write_text(MODEL_PY)
    model, args = _model_class(root / "m.py")().eval(), (torch.randn(2, 8),)
    om.split(model, args, support={"deny": ["aten.sin"]}).save(root / "split")
    om.split_stages(model, args, split_points={"b": "beginning"}).save(root / "stages")
    return root, model, args


def _plant_error(directory: Path) -> None:
    """Scale one weight of the last part: that part, and so the chain, is now wrong."""
    manifest = json.loads((directory / "manifest.json").read_text())
    file = directory / manifest["regions"][-1]["file"]
    proto = onnx.load(str(file))
    init = max(proto.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, init.name))
    onnx.save(proto, str(file))


def test_split_and_stages_directories_match_torch(saved) -> None:
    root, model, args = saved
    for name in ("split", "stages"):
        report = om.validate(model, args, root / name, providers="cpu")
        assert report.ok and report.model == str(root / name)
        assert [o.name for o in report.results[0].outputs] == \
            [o["name"] for o in json.loads((root / name / "manifest.json").read_text())["outputs"]]
        assert report.localization is None


def test_a_wrong_part_is_never_ok(saved, tmp_path) -> None:
    root, model, args = saved
    bad = tmp_path / "split"
    bad.mkdir()
    for f in (root / "split").iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    _plant_error(bad)
    report = om.validate(model, args, bad, providers="cpu")
    assert not report.ok and not report.results[0].outputs[0].ok
    assert report.summary().startswith(f"MISMATCH: {bad} differs from torch on CPU")


def test_what_cannot_work_on_parts_is_one_line(saved) -> None:
    root, model, args = saved
    with pytest.raises(om.OnnxModularError, match="OM0401.*parts directory.*localization"):
        om.validate(model, args, root / "split", localize=True)

    class TwoOut(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return model(x), x

    with pytest.raises(om.OnnxModularError, match="returns 2 tensor.*has 1 output"):
        om.validate(TwoOut(), args, root / "split", providers="cpu")
    with pytest.raises(om.OnnxModularError, match="CUDA"):  # never a silent CPU-only check
        om.validate(model, args, root / "split", providers="cuda")


def test_only_a_folder_with_a_manifest_is_a_parts_directory(saved, tmp_path) -> None:
    root, model, args = saved
    assert parts_directory(root / "split") == root / "split"
    assert parts_directory(str(root / "split")) == root / "split"
    assert parts_directory(tmp_path) is None and parts_directory(root / "m.py") is None
    with pytest.raises(om.OnnxModularError, match="directory"):
        om.validate(model, args, tmp_path, providers="cpu")


def test_command_line_validates_a_parts_directory(saved, tmp_path, capsys) -> None:
    root, _, _ = saved
    argv = ["validate", f"{root / 'm.py'}:Model", "--input", "2x8:float32"]
    assert main([*argv, str(root / "split"), "--providers", "cpu"]) == 0
    assert "OK" in capsys.readouterr().out
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in (root / "split").iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    _plant_error(bad)
    assert main([*argv, str(bad), "--providers", "cpu"]) == 1
    capsys.readouterr()
    assert main([*argv, str(root / "split"), "--extract", str(tmp_path / "x")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "--extract needs one ONNX model" in err[0]
    assert not (tmp_path / "x").exists()
