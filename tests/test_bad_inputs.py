"""Hostile and mistaken inputs: the validator never says OK wrongly, and every bad input is
one line (exit 2 on the command line), found before the work where it can be."""

from __future__ import annotations

import errno
import math
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
from onnx import TensorProto, helper
from torch import nn

import onnx_modular as om
from onnx_modular.cli import main
from onnx_modular.leaves import _io, _util
from onnx_modular.leaves import runtime as _ort

NET = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = Block(), Block()

    def forward(self, x, *, scale=None):
        y = self.b(self.a(x))
        return y if scale is None else y * scale


def reference():
    torch.manual_seed(0)
    return Net().eval()


def planted():
    model = reference()
    with torch.no_grad():
        model.b.fc.weight.add_(1.0)
    return model


def with_kwargs():
    torch.manual_seed(1)
    return (torch.randn(2, 64),), {"scale": torch.tensor(3.0)}
"""

#: A model spec whose import leaves a mark: a command that fails before loading leaves none.
MARKS = """
from pathlib import Path
Path(__file__).with_name("LOADED").write_text("x")
from net import reference as Net
"""


@pytest.fixture
def net(tmp_path: Path, monkeypatch) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "net.py").write_text(NET)
    (src / "marks.py").write_text(MARKS)
    monkeypatch.syspath_prepend(str(src))
    for name in ("net", "marks"):  # imported afresh from this test's folder
        monkeypatch.delitem(sys.modules, name, raising=False)
    return src


def _one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


# ---- the validator's verdict -------------------------------------------------------------------

@pytest.mark.slow
def test_external_data_is_read_from_the_models_folder_whatever_the_cwd(
        net: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    """The probe session gets the model as bytes: ONNX Runtime looked for the data file in
    the current directory, where another export's file of that name was read instead."""
    import net as source  # written by the fixture

    x = torch.randn(2, 64)
    bad, good, elsewhere = tmp_path / "bad", tmp_path / "good", tmp_path / "cwd"
    for folder in (bad, good, elsewhere):
        folder.mkdir()
    om.export(source.planted(), (x,)).save(bad / "m.onnx", external_data_threshold=0)
    om.export(source.reference(), (x,)).save(good / "m.onnx", external_data_threshold=0)
    (data_name,) = [p.name for p in bad.iterdir() if p.suffix == ".data"]
    (decoy,) = [p for p in good.iterdir() if p.suffix == ".data"]
    shutil.copy(decoy, elsewhere / data_name)  # the right weights under the wrong model's name
    monkeypatch.chdir(elsewhere)

    rep = om.validate(source.reference(), (x,), str(bad / "m.onnx"), providers="cpu")
    assert not rep.ok and rep.first_mismatch == "b.fc"
    assert main(["validate", f"{net / 'net.py'}:reference", "--input", "2x64",
                 str(bad / "m.onnx"), "--providers", "cpu"]) == 1
    assert "first diverging module: b.fc" in capsys.readouterr().out

    (elsewhere / data_name).unlink()  # no file of that name here at all
    rep = om.validate(source.reference(), (x,), str(bad / "m.onnx"), providers="cpu")
    assert not rep.ok and rep.first_mismatch == "b.fc"


def test_a_proto_naming_external_data_without_a_file_is_refused(net: Path, tmp_path: Path) -> None:
    import net as source

    x = torch.randn(2, 64)
    om.export(source.reference(), (x,)).save(tmp_path / "m.onnx", external_data_threshold=0)
    proto = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    with pytest.raises(om.OnnxModularError, match="refers to external data .* pass the model's "
                       "path") as info:
        om.validate(source.reference(), (x,), proto, providers="cpu")
    assert "\n" not in str(info.value)


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["missing", "truncated", "outside"])
def test_external_data_is_checked_when_the_model_is_read_not_loaded(
        net: Path, tmp_path: Path, damage: str) -> None:
    """The weights stay on disk for ONNX Runtime to read (no copy in memory), but a missing,
    short or escaping data file still fails before the torch model runs."""
    import net as source

    x = torch.randn(2, 64)
    path = tmp_path / "m.onnx"
    om.export(source.reference(), (x,)).save(path, external_data_threshold=0)
    (data,) = [p for p in tmp_path.iterdir() if p.suffix == ".data"]
    loaded = _ort.load_model(path)
    external = [i for i in loaded.proto.graph.initializer
                if i.data_location == onnx.TensorProto.EXTERNAL]
    assert external and not any(i.raw_data for i in external)  # not read into the proto
    if damage == "missing":
        data.unlink()
    elif damage == "truncated":
        data.write_bytes(data.read_bytes()[:-1000])
    else:
        proto = onnx.load(str(path), load_external_data=False)
        (first, *_) = [i for i in proto.graph.initializer if i.external_data]
        for entry in first.external_data:
            if entry.key == "location":
                entry.value = "../" + entry.value
        onnx.save(proto, str(path))
    why = {"missing": "is not beside the model", "truncated": "truncated",
           "outside": "outside the model's folder"}[damage]
    with pytest.raises(om.OnnxModularError, match=f"not a valid ONNX file .*{why}"):
        om.validate(source.reference(), (x,), str(path), providers="cpu")


@pytest.mark.slow
@pytest.mark.parametrize("bad", [math.nan, -1.0, math.inf, -0.5, "1e-3", True])
def test_tolerances_must_be_finite_and_not_negative(bad: object) -> None:
    model, x = nn.Linear(4, 4).eval(), torch.randn(2, 4)
    proto = om.export(model, (x,)).model_proto
    for key in ("rtol", "atol"):
        with pytest.raises(om.OnnxModularError, match=f"{key} must be a"):
            om.validate(model, (x,), proto, providers="cpu", **{key: bad})
        with pytest.raises(om.OnnxModularError, match=f"{key} must be a"):
            om.compare(proto, proto, **{key: bad})


@pytest.mark.parametrize("text", ["nan", "NaN", "-1", "inf", "-inf", "x"])
def test_tolerance_flags_are_checked_when_parsed(text: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["validate", "net:reference", "--input", "2x64", "m.onnx", "--atol", text])
    assert exc.value.code == 2
    assert "--atol" in _one_line(capsys.readouterr().err)


def test_empty_outputs_are_not_a_pass(net: Path, tmp_path: Path, capsys) -> None:
    model = nn.Linear(4, 4).eval()
    empty = (torch.zeros(0, 4),)
    res = om.export(model, empty)
    assert any("size-0 dimension" in d.message for d in res.diagnostics)
    with pytest.raises(om.OnnxModularError, match="nothing to compare"):
        om.validate(model, empty, res, providers="cpu")
    assert main(["export", "net:reference", "--input", "0x64", "-o",
                 str(tmp_path / "z.onnx")]) == 2
    assert "a size-0 dimension makes an empty input" in _one_line(capsys.readouterr().err)


# ---- the command line: one line, before the work -----------------------------------------------

def test_an_input_too_large_for_memory_is_one_line(net: Path, tmp_path: Path, capsys) -> None:
    assert main(["export", "net:reference", "--input", "100000x100000",
                 "-o", str(tmp_path / "m.onnx")]) == 2
    assert "more than this machine's" in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "m.onnx").exists()


def test_an_op_list_that_is_not_utf8_is_one_line(net: Path, tmp_path: Path, capsys) -> None:
    ops = tmp_path / "ops.txt"
    ops.write_bytes(b"\xff\xfe aten.mm\n")
    assert main(["split", "marks:Net", "--input", "2x64", "--acc-ops", str(ops),
                 "-o", str(tmp_path / "parts")]) == 2
    assert "not UTF-8" in _one_line(capsys.readouterr().err)
    assert not (net / "LOADED").exists()


@pytest.mark.parametrize("argv, message", [
    (["export", "marks:Net", "--input", "2x64", "-o", ""], "output path is empty"),
    (["export", "marks:Net", "--input", "2x64", "-o", "{tmp}"], "it is a directory"),
    (["export", "marks:Net", "--input", "2x64", "-o", "{tmp}/no/m.onnx"], "does not exist"),
    (["export", "marks:Net", "--input", "2x64", "-o", "{tmp}/m.onnx", "--sarif", "{tmp}"],
     "it is a directory"),
    (["split", "marks:Net", "--input", "2x64", "--split-points", "b", "-o", "{tmp}/file"],
     "it is a file, not a directory"),
    (["split", "marks:Net", "--input", "2x64", "--split-points", "b", "-o", ""],
     "output directory is empty"),
    (["split", "marks:Net", "--input", "2x64", "--split-points", "b,b:end", "-o", "{tmp}/p"],
     "given twice"),
    (["split", "marks:Net", "--input", "2x64", "--acc-ep", "NoSuch", "-o", "{tmp}/p"],
     "registers no kernels"),
    (["export", "marks:Net", "--input", "2x64", "-o", "{tmp}/m.onnx", "--flat", "--opset",
      "99"], "7..28"),
])
def test_bad_outputs_and_flags_fail_before_the_model_is_loaded(net: Path, tmp_path: Path,
                                                               capsys, argv: list[str],
                                                               message: str) -> None:
    (tmp_path / "file").write_text("not a directory")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    line = _one_line(capsys.readouterr().err)
    assert message.split("..")[0] in line
    assert not (net / "LOADED").exists()


def test_the_marking_spec_marks_when_loaded(net: Path, tmp_path: Path) -> None:
    """The checks above mean something: a command that loads the model leaves the mark."""
    assert main(["export", "marks:Net", "--input", "2x64", "-o", str(tmp_path / "m.onnx")]) == 0
    assert (net / "LOADED").exists()


@pytest.mark.parametrize("flag, value", [("--max-acc-splits", "-5"), ("--max-acc-splits", "0"),
                                         ("--min-acc-size", "-1"), ("--min-acc-size", "x")])
def test_split_limits_are_checked_when_parsed(flag: str, value: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["split", "marks:Net", "--input", "2x64", "--acc-ep", "cpu", flag, value,
              "-o", "parts"])
    assert exc.value.code == 2
    assert flag in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize("kwargs, message", [
    ({"min_acc_module_size": -1}, "min_acc_module_size must be >= 0"),
    ({"max_acc_splits": -5}, "max_acc_splits must be -1"),
    ({"max_acc_splits": 0}, "max_acc_splits must be -1"),
    ({"max_acc_splits": 2.5}, "max_acc_splits must be an int"),
])
def test_split_limits_through_the_api(kwargs: dict, message: str) -> None:
    class Explodes(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise AssertionError("captured although the limits are wrong")

    with pytest.raises(om.OnnxModularError, match=message):
        om.split(Explodes(), (torch.randn(2, 4),), support={"deny": ["aten.sin"]}, **kwargs)


def test_disk_full_writing_sarif_after_the_model(net: Path, tmp_path: Path, monkeypatch,
                                                 capsys) -> None:
    out, sarif = tmp_path / "m.onnx", tmp_path / "d.sarif"
    real = Path.write_bytes

    def full(self: Path, data: bytes) -> int:
        if ".d.sarif." in self.name:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", full)
    assert main(["export", "net:reference", "--input", "2x64", "-o", str(out),
                 "--sarif", str(sarif)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "no space left" in line and f"the model {out} was written" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "src"]


@pytest.mark.slow
def test_disk_full_during_split_leaves_no_directory(net: Path, tmp_path: Path, monkeypatch,
                                                    capsys) -> None:
    calls = {"n": 0}
    real = _io.write_inline

    def full_on_second(model: object, file: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            file.write(b"\x00" * 100)  # the disk fills part way through the second part
            raise OSError(errno.ENOSPC, "No space left on device")
        real(model, file)

    monkeypatch.setattr(_io, "write_inline", full_on_second)
    assert main(["split", "net:reference", "--input", "2x64", "--split-points", "b",
                 "-o", str(tmp_path / "parts")]) == 2
    assert "no space left" in _one_line(capsys.readouterr().err)
    assert calls["n"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no parts, no temporaries


# ---- compare: given inputs kept whole, made-up inputs bounded ------------------------------------

def test_compare_inputs_keep_their_kwargs(net: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "kw.onnx"
    assert main(["export", "net:reference", "--inputs", "net:with_kwargs", "-o", str(out)]) == 0
    assert len(onnx.load(str(out)).graph.input) == 2
    assert main(["compare", str(out), str(out), "--inputs", "net:with_kwargs"]) == 0
    assert "EQUIVALENT" in capsys.readouterr().out


def _identity(dim: object) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [dim, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [dim, 2])
    model = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])],
                                                "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("dim, message", [
    (10**10, "more than this machine's"),
    (-5, "negative dimension"),
    ("100000*100000*100000", "evaluates beyond"),
    ("+".join(["1"] * 200_000), None),  # too long to evaluate: a symbol like any other
    ("(" * 500 + "1" + ")" * 500, None),
    ("s0**99", None),
    ("-s0", None),
])
def test_compare_checks_crafted_dims_before_allocating(dim: object, message: str | None) -> None:
    model = _identity(dim)
    if message is None:
        assert om.compare(model, model).equivalent
    else:
        with pytest.raises(om.OnnxModularError, match=message) as info:
            om.compare(model, model)
        assert "\n" not in str(info.value)


# ---- torch's own output stays off the terminal ---------------------------------------------------

NOISY = """
import torch
import torch.nn.functional as F


class DataDependent(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x + 1
        return x - 1


class Deprecated(torch.nn.Module):
    def forward(self, x):
        return F.upsample(x, scale_factor=2)


class CopyConstruct(torch.nn.Module):
    def forward(self, x):
        return torch.tensor(x) + 1
"""


@pytest.mark.slow
@pytest.mark.parametrize("name, code", [("DataDependent", 2), ("Deprecated", 0),
                                        ("CopyConstruct", 0)])
def test_library_output_stays_off_the_terminal(tmp_path: Path, capfd, name: str,
                                               code: int) -> None:
    """torch.export prints the partial graph and logs through its own handler before our
    one line; user code under trace warns on a successful export."""
    src = tmp_path / "noisy.py"
    src.write_text(NOISY)
    with warnings.catch_warnings(record=True) as caught:  # pytest would hide them
        warnings.simplefilter("always")
        assert main(["export", f"{src}:{name}", "--input", "1x2x4x4",
                     "-o", str(tmp_path / "m.onnx")]) == code
    err = capfd.readouterr().err
    assert [str(w.message) for w in caught] == []
    if code:
        assert "GuardOnDataDependentSymNode" in _one_line(err)
    else:
        assert err == ""


# ---- opsets --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_flat_opset_the_converter_cannot_reach_names_the_op() -> None:
    model, x = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval(), (torch.randn(2, 4),)
    with pytest.raises(om.OnnxModularError, match="functions='none' for a flat model"):
        om.export(model, x, opset=7)
    with pytest.raises(om.OnnxModularError, match="no adapter taking Relu below opset 14; "
                       "the lowest opset this model reaches is 14") as info:
        om.export(model, x, opset=7, functions="none")
    assert "\n" not in str(info.value)
    proto = om.export(model, x, opset=14, functions="none").model_proto
    assert {o.domain: o.version for o in proto.opset_import}[""] == 14
    for opset in (0, 6, 99, True):
        with pytest.raises(om.OnnxModularError, match=r"not an ONNX opset .* give 7\.\."):
            om.export(model, x, opset=opset, functions="none")


# ---- what runs from the current directory --------------------------------------------------------

@pytest.mark.slow
def test_python_m_does_not_import_the_current_directory(tmp_path: Path) -> None:
    model = _identity(3)
    onnx.save(model, tmp_path / "m.onnx")
    (tmp_path / "rich.py").write_text(
        "from pathlib import Path\nPath(__file__).with_name('RAN').write_text('x')\n"
        "raise SystemExit('the rich.py of the current directory ran')\n")
    package_root = str(Path(om.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": package_root}
    proc = subprocess.run([sys.executable, "-m", "onnx_modular", "inspect", "m.onnx"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "RAN").exists()


def test_module_specs_are_found_in_the_current_directory_without_it_on_sys_path(
        tmp_path: Path, monkeypatch) -> None:
    """The console script has no current directory on sys.path; ``python -m`` no longer
    either: both look a ``pkg.mod:attr`` spec up there, for that import only."""
    from onnx_modular.cli.loading import load_model

    (tmp_path / "here_only.py").write_text(NET)
    monkeypatch.chdir(tmp_path)
    cwd = os.getcwd()
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", cwd)])
    assert isinstance(load_model("here_only:reference"), nn.Module)
    assert cwd not in sys.path and "" not in sys.path


@pytest.mark.parametrize("argv, target", [
    (["py", "-m", "onnx_modular", "inspect"], "onnx_modular"),
    (["py", "-monnx_modular.cli"], "onnx_modular.cli"),
    (["py", "-X", "importtime", "-Bm", "onnx_modular"], "onnx_modular"),
    (["py", "-Wignore", "--check-hash-based-pycs", "always", "-m", "x"], "x"),
    (["py", "-c", "code", "-m", "onnx_modular"], None),
    (["py", "script.py", "-m", "onnx_modular"], None),
])
def test_the_module_python_m_runs_is_read_from_its_options(argv: list[str],
                                                           target: str | None) -> None:
    from onnx_modular.leaves._safepath import dash_m_target

    assert dash_m_target(argv) == target


def test_memory_check_refuses_what_cannot_fit(monkeypatch) -> None:
    monkeypatch.setattr(_util, "memory_bytes", lambda: 1024)
    _util.check_allocation([16, 16], 4, "x")
    with pytest.raises(om.OnnxModularError, match="needs .* more than"):
        _util.check_allocation([16, 17], 4, "x")
