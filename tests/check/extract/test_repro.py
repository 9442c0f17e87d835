"""Writing a repro: every file staged beside the folder and checked there, then swapped in
whole through the staged-folder transaction; the folder is checked again under its lock, so
a file someone put there meanwhile refuses the swap and nothing of theirs is replaced."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_modular.check.extract import repro as repro_module
from onnx_modular.check.extract.cut import Built, standalone_model
from onnx_modular.check.extract.folder import MARKER
from onnx_modular.check.extract.record import Target
from onnx_modular.check.extract.repro import Repro
from onnx_modular.leaves.errors import OnnxModularError

X = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
RELU = np.maximum(X, 0)
CALL = SimpleNamespace(call_id="act", module_type="ReLU")


def relu_repro(expected: np.ndarray) -> Repro:
    """``act`` (one Relu) with torch's input and ``expected`` as torch's output."""
    proto = helper.make_model(helper.make_graph([], "g", [], []),
                              opset_imports=[helper.make_opsetid("", 18)])
    proto.ir_version = 9
    built = Built([helper.make_node("Relu", ["input_0"], ["output_0"])], [], [], [],
                  [("input_0", "x")], [("output_0", "y")],
                  [helper.make_tensor_value_info("output_0", TensorProto.FLOAT, [2, 3])])
    model = standalone_model(proto, built, [], {"input_0": X}, {"output_0": RELU}, CALL,
                             "m.onnx")
    return Repro(CALL, "flat", built, model, [], {"input_0": (X, "torch input 0")},
                 {"output_0": (expected, "torch output 0")}, {"output_0": RELU})


def target(folder: Path) -> Target:
    return Target(folder, "CPUExecutionProvider", "m.onnx")


def test_a_repro_is_written_whole_and_replaced_whole(tmp_path: Path) -> None:
    folder = tmp_path / "x"
    first = repro_module._write(target(folder), relu_repro(RELU), None)
    assert not first.reproduces and first.directory == folder
    assert sorted(os.listdir(folder)) == sorted([MARKER, "README.md", "expected.npz",
                                                 "inputs.npz", "module.onnx"])
    assert json.loads((folder / MARKER).read_text())["call"] == "act"
    again = repro_module._write(target(folder), relu_repro(RELU + 1), None)
    assert again.reproduces and "**reproduces the mismatch**" in (
        folder / "README.md").read_text()
    assert again.command.startswith(f"python -m onnx_modular compare-io {folder}/module.onnx")
    assert os.listdir(tmp_path) == ["x"]  # no staging, no backup left


def test_a_file_put_in_the_folder_meanwhile_refuses_the_swap(tmp_path: Path,
                                                             monkeypatch) -> None:
    folder = tmp_path / "x"
    repro_module._write(target(folder), relu_repro(RELU), None)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    real = repro_module.save_model

    def and_someone_writes(*args: object, **kwargs: object) -> None:
        (folder / "train.py").write_text("print('mine')")  # while the repro is staged
        real(*args, **kwargs)

    monkeypatch.setattr(repro_module, "save_model", and_someone_writes)
    with pytest.raises(OnnxModularError, match=r"no earlier extraction wrote.*\(train.py\)"):
        repro_module._write(target(folder), relu_repro(RELU + 1), None)
    after = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert after == {**before, "train.py": b"print('mine')"}
    assert os.listdir(tmp_path) == ["x"]


def test_a_full_disk_leaves_the_folder_as_it_was(tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "x"
    repro_module._write(target(folder), relu_repro(RELU), None)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def full(*_: object, **__: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(repro_module, "save_model", full)
    with pytest.raises(OnnxModularError, match="no space left on the device .*left as it was"):
        repro_module._write(target(folder), relu_repro(RELU + 1), None)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert os.listdir(tmp_path) == ["x"]
