"""The command line: one-line user errors, exit codes, no partial files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from onnx_modular import OnnxModularError
from onnx_modular.cli import main
from onnx_modular.cli.loading import load_inputs, load_model, random_input, resolve_inputs


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "onnx_modular", *argv], capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_model_that_does_not_import_fails_in_one_line_and_writes_nothing(tmp_path) -> None:
    out = tmp_path / "m.onnx"
    proc = _run("export", "no_such_pkg.models:Net", "--input", "2x8", "-o", str(out))
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot import module 'no_such_pkg.models'" in lines[0]
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_debug_shows_the_traceback(tmp_path) -> None:
    proc = _run("--debug", "export", "no_such_pkg:Net", "--input", "2x8",
                "-o", str(tmp_path / "m.onnx"))
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_file_spec_with_a_broken_file(tmp_path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\nraise RuntimeError('oops at import')\n")
    with pytest.raises(OnnxModularError, match=r"cannot import .*broken.py.*oops at import"):
        load_model(f"{broken}:Net")


def test_file_spec_model_and_inputs(tmp_path) -> None:
    src = tmp_path / "mymodel.py"
    src.write_text(
        "import torch\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.fc = torch.nn.Linear(8, 2)\n"
        "    def forward(self, x, *, scale):\n"
        "        return self.fc(x) * scale\n"
        "def inputs():\n"
        "    return (torch.randn(2, 8),), {'scale': torch.tensor(2.0)}\n")
    model = load_model(f"{src}:Net")
    args, kwargs = load_inputs(f"{src}:inputs")
    assert isinstance(model, torch.nn.Module) and not model.training
    assert model(*args, **kwargs).shape == (2, 2)
    with pytest.raises(OnnxModularError, match="has no attribute 'Missing'"):
        load_model(f"{src}:Missing")
    with pytest.raises(OnnxModularError, match="not of the form"):
        load_model("justaname")


def test_random_inputs() -> None:
    t = random_input("2x8:int64")
    assert t.shape == (2, 8) and t.dtype == torch.int64
    assert torch.equal(t, random_input("2x8:int64"))  # seeded
    assert random_input("3:float16").dtype == torch.float16
    with pytest.raises(OnnxModularError, match="unknown dtype 'int128'"):
        random_input("2x8:int128")
    with pytest.raises(OnnxModularError, match="bad shape"):
        random_input("2xq:int64")
    with pytest.raises(OnnxModularError, match="no inputs"):
        resolve_inputs(None, None)


def test_inspect_missing_and_corrupt_files(tmp_path, capsys) -> None:
    assert main(["inspect", str(tmp_path / "missing.onnx")]) == 2
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07garbage that is not protobuf\xff\xff")
    assert main(["inspect", str(corrupt)]) == 2
    assert main(["inspect", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no such ONNX file" in err and "not a readable ONNX model" in err
    assert "is a directory" in err


def test_usage_errors_exit_2(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["frobnicate"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["split", "m:x", "--input", "2x8", "-o", "d"])  # no --acc-ops/--acc-ep/...
    assert exc.value.code == 2


def test_unwritable_output_fails_before_work(tmp_path) -> None:
    target = tmp_path / "no" / "such" / "dir" / "m.onnx"
    assert main(["export", "onnx_modular.examples:tiny_gpt", "--input", "2x8:int64",
                 "-o", str(target)]) == 2
    assert not Path(tmp_path / "no").exists()


RAISES_IN_FORWARD = """
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        return self.helper(x)

    def helper(self, x):
        raise ValueError("user bug in helper")
"""


def test_user_errors_keep_their_cause_for_debug(tmp_path, capsys) -> None:
    """One line without --debug; with it, the chain reaches the user's own frame."""
    import traceback

    import onnx
    from onnx import TensorProto, helper

    src = tmp_path / "raises.py"
    src.write_text(RAISES_IN_FORWARD)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    onnx.save(model, tmp_path / "m.onnx")
    argv = ["validate", f"{src}:Model", "--input", "2x8:float32", str(tmp_path / "m.onnx")]

    assert main(argv) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "user bug in helper" in lines[0]

    with pytest.raises(OnnxModularError) as info:
        main([*argv, "--debug"])
    shown = "".join(traceback.format_exception(info.value))
    assert str(src) in shown and "in helper" in shown

    with pytest.raises(OnnxModularError) as info:
        random_input("2xq:int64")
    assert isinstance(info.value.__cause__, ValueError)
