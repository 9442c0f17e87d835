"""How a repro reads: the compare-io command (paths quoted, the tolerances the validation
used) and the README (the verdict, the command run from the folder, the inputs' sources)."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest

from onnx_modular.check.extract.record import Extraction, Port, Target, command, readme


def extraction(ok: bool) -> Extraction:
    alone = SimpleNamespace(ok=ok, max_abs=0.0 if ok else 0.25, max_rel=0.0 if ok else 0.5)
    return Extraction(Path("my repro"), "layers.1", "Linear", "flat",
                      [Port("input_0", [2, 8], "float32", "torch input 0")],
                      [Port("output_0", [2, 8], "float32", "torch output 0")],
                      2, 320, None, alone, "")  # type: ignore[arg-type]


def test_the_command_quotes_the_folder_and_names_the_tolerances() -> None:
    target = Target(Path("my repro"), "CPUExecutionProvider", "m.onnx", rtol=1e-3, atol=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        target.provider = "CUDAExecutionProvider"  # type: ignore[misc]
    line = command(target, prefix="my repro/")
    assert shlex.split(line)[4:7] == ["my repro/module.onnx", "my repro/inputs.npz",
                                      "my repro/expected.npz"]
    assert line.endswith("--providers cpu --rtol 0.001")
    assert command(Target(Path("x"), "CPUExecutionProvider", "m")).endswith(
        "compare-io module.onnx inputs.npz expected.npz --providers cpu")


def test_the_readme_says_whether_the_module_alone_reproduces() -> None:
    target = Target(Path("my repro"), "CPUExecutionProvider", "model.onnx")
    bad = readme(extraction(ok=False), target)
    assert bad.startswith("# Repro: `layers.1` (Linear)")
    assert "Extracted from `model.onnx`" in bad and "**reproduces the mismatch**" in bad
    assert "compare-io module.onnx inputs.npz expected.npz --providers cpu" in bad
    assert "| `input_0` | [2, 8] | float32 | torch input 0 |" in bad
    good = readme(extraction(ok=True), target)
    assert "**matches torch**, as it does in the full model" in good
    assert str(extraction(ok=False)).startswith("layers.1 extracted to my repro: the module "
                                                "alone reproduces the mismatch")
