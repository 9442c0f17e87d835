"""compare-io on files it cannot use: one line and exit 2 (a usage error), never a traceback
and never exit 1 (which reads as "mismatch")."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_modular.cli import main


@pytest.fixture
def repro(tmp_path):
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    x = np.array([1.0, 2.0, 3.0], np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    np.savez(tmp_path / "ok.npz", y=x)
    return tmp_path


def _npz_with_header(path, shape: tuple[int, ...]) -> None:
    """An archive whose array header declares ``shape`` but holds 12 bytes of data."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<f4", "fortran_order": False,
                                                  "shape": shape})
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("y.npy", buffer.getvalue() + b"\0" * 12)


def _expect_usage_error(capsys, argv: list[str], words: str) -> None:
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and words in err[0], err
    assert "Traceback" not in err[0]


@pytest.mark.parametrize(("make", "words"), [
    (lambda p: np.savez(p, y=np.array(["a", "b", "c"])), "not numbers"),
    (lambda p: np.savez(p, y=np.zeros(3, dtype=[("a", "f4"), ("b", "i4")])), "not numbers"),
    (lambda p: np.savez(p), "holds no arrays"),
    (lambda p: _npz_with_header(p, (10**6, 10**6)), "GiB"),
    (lambda p: _npz_with_header(p, (5,)), "truncated"),
])
def test_unusable_expected_archives(repro, capsys, make, words):
    bad = repro / "bad.npz"
    make(str(bad))
    _expect_usage_error(capsys, ["compare-io", str(repro / "m.onnx"), str(repro / "in.npz"),
                                 str(bad)], words)


def test_a_npy_file_is_named_as_such(repro, capsys):
    np.save(repro / "y.npy", np.zeros(3, np.float32))
    _expect_usage_error(capsys, ["compare-io", str(repro / "m.onnx"), str(repro / "in.npz"),
                                 str(repro / "y.npy")], ".npy array")


def test_match_and_complex_mismatch(repro, capsys):
    assert main(["compare-io", str(repro / "m.onnx"), str(repro / "in.npz"),
                 str(repro / "ok.npz"), "--providers", "cpu"]) == 0
    capsys.readouterr()
    np.savez(repro / "c.npz", y=np.array([1.0, 2.0, 3.0], np.float32) + 5j)
    assert main(["compare-io", str(repro / "m.onnx"), str(repro / "in.npz"),
                 str(repro / "c.npz"), "--providers", "cpu", "--report",
                 str(repro / "r.md")]) == 1
    assert "expected values are complex" in capsys.readouterr().out
    assert "expected values are complex" in (repro / "r.md").read_text()
    np.savez(repro / "nan.npz", y=np.array([np.nan, 2.0, 3.0], np.float32))
    assert main(["compare-io", str(repro / "m.onnx"), str(repro / "in.npz"),
                 str(repro / "nan.npz"), "--providers", "cpu"]) == 1
    assert "expected NaN not matched" in capsys.readouterr().out
