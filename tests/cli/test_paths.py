"""No output replaces an input or a foreign file; paths a command names fail in one line.

Every flag that writes (a file, or a folder it fills) against every flag that reads, on every
subcommand, with the file spelled in every way a user can (``./x``, an absolute path, a
symlink, a hard link): exit 2 before any work, and the input byte for byte as it was.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import models
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import onnx_modular as om
from onnx_modular.check.extract import check_directory
from onnx_modular.cli import main
from onnx_modular.leaves import _io

#: subcommand -> (flags that write, flags that read); "MODEL" etc. are positionals.
SURFACES: dict[str, tuple[list[str], list[str]]] = {
    "export": (["-o", "--sarif", "--report"], ["MODEL", "--inputs"]),
    "validate": (["--report", "--node-data", "--extract"], ["MODEL", "--inputs", "MODEL.onnx"]),
    "compare": (["--report"], ["A.onnx", "B.onnx", "--inputs"]),
    "compare-io": (["--report"], ["MODEL.onnx", "INPUTS.npz", "EXPECTED.npz"]),
    "split": (["-o", "--triton"], ["MODEL", "--inputs", "--acc-ops"]),
}
PAIRS = [(cmd, w, r) for cmd, (writes, reads) in SURFACES.items() for w in writes for r in reads]
SPEC_READERS = {"MODEL", "--inputs"}  # they read file.py of a file.py:attr spec


def _argv(command: str, write: str, read: str, written: str, read_path: str,
          tmp: Path) -> list[str]:
    """A command line whose ``write`` flag names ``written`` and ``read`` reads ``read_path``;
    every other argument names a harmless file."""
    value = {r: str(tmp / f"other{i}.x") for i, r in enumerate(SURFACES[command][1])}
    value["MODEL"] = f"{tmp / 'other_model.py'}:Net"
    value["--inputs"] = f"{tmp / 'other_inputs.py'}:inputs"
    value[read] = f"{read_path}:attr" if read in SPEC_READERS else read_path
    argv = [command]
    positional = {"export": ["MODEL"], "validate": ["MODEL", "MODEL.onnx"],
                  "compare": ["A.onnx", "B.onnx"], "split": ["MODEL"],
                  "compare-io": ["MODEL.onnx", "INPUTS.npz", "EXPECTED.npz"]}[command]
    argv += [value[p] for p in positional]
    for flag in SURFACES[command][1]:
        if flag.startswith("--") and (flag == read or flag == "--inputs"):
            argv += [flag, value[flag]]
    if command == "split" and read != "--acc-ops":
        argv += ["--acc-ops", value["--acc-ops"]]
    outputs = {"export": {"-o": str(tmp / "out.onnx")}, "split": {"-o": str(tmp / "parts")}}
    for flag, default in outputs.get(command, {}).items():
        if flag != write:
            argv += [flag, default]
    argv += [write, written]
    if command == "export" and write == "--report":
        argv.append("--validate")
    return argv


def _spell(victim: Path, how: str, tmp: Path) -> str:
    """The victim's name as the output flag spells it."""
    if how == "plain":
        return str(victim)
    if how == "dot":
        return str(victim.parent / "." / victim.name)
    if how == "symlink":
        link = tmp / f"link-{victim.name}"
        link.symlink_to(victim)
        return str(link)
    if how == "hardlink":
        link = tmp / f"hard-{victim.name}"
        os.link(victim, link)
        return str(link)
    raise AssertionError(how)


@pytest.mark.slow
@settings(max_examples=len(PAIRS) * 3, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(PAIRS), st.sampled_from(["plain", "dot", "symlink", "hardlink"]))
def test_no_output_flag_replaces_an_input(tmp_path_factory, capsys, pair, how):
    command, write, read = pair
    tmp = tmp_path_factory.mktemp("case")
    victim = tmp / "victim.json"  # any input; .json so that --report's suffix is no excuse
    victim.write_bytes(b"the user's file")
    written = _spell(victim, how, tmp)
    argv = _argv(command, write, read, written, str(victim), tmp)
    assert main(argv) == 2, argv
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and ("replace" in err[0] or "not a directory" in err[0]), (argv, err)
    assert victim.read_bytes() == b"the user's file"


@pytest.mark.parametrize(("command", "flags"), [
    ("validate", ["--report", "r.json", "--node-data", "r.json"]),
    ("export", ["-o", "r.json", "--sarif", "r.json"]),
    ("export", ["-o", "m.onnx", "--report", "./m.onnx", "--validate"]),
    ("split", ["-o", "parts", "--triton", "parts/repo"]),
])
def test_two_outputs_naming_one_file(tmp_path, capsys, monkeypatch, command, flags):
    monkeypatch.chdir(tmp_path)
    base = {"validate": ["m.py:Net", "m.onnx", "--input", "2x8"],
            "export": ["m.py:Net", "--input", "2x8"],
            "split": ["m.py:Net", "--input", "2x8", "--num-stages", "2"]}[command]
    assert main([command, *base, *flags]) == 2
    assert "one file" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


EMPTY = [
    ["validate", "m.py:Net", "m.onnx", "--input", "2x8", "--extract", ""],
    ["validate", "m.py:Net", "m.onnx", "--input", "2x8", "--node-data", ""],
    ["validate", "m.py:Net", "m.onnx", "--input", "2x8", "--report", ""],
    ["export", "m.py:Net", "--input", "2x8", "-o", "m.onnx", "--sarif", ""],
    ["export", "m.py:Net", "--input", "2x8", "-o", "m.onnx", "--functions", ""],
    ["split", "m.py:Net", "--input", "2x8", "--num-stages", "2", "-o", "p", "--triton", ""],
    ["compare", "a.onnx", "b.onnx", "--report", ""],
    ["compare", "a.onnx", "b.onnx", "--inputs", ""],
    ["compare-io", "m.onnx", "", "e.npz"],
    ["inspect", ""],
]
LONG = "x" * 300


@pytest.mark.parametrize("argv", [
    *EMPTY,
    ["export", "m.py:Net", "--input", "2x8", "-o", f"{LONG}.onnx"],
    ["split", "m.py:Net", "--input", "2x8", "--num-stages", "2", "-o", LONG],
    ["split", "m.py:Net", "--input", "2x8", "--num-stages", "2", "-o", "p", "--triton", LONG],
    ["inspect", f"{LONG}.onnx"],
    ["validate", "m.py:Net", "m.onnx", "--input", "2x8", "--report", f"{LONG}.json"],
    ["validate", "m.py:Net", "m.onnx", "--input", "2x8", "--node-data", LONG],
    ["validate", "m.py:Net", "m.onnx", "--input", "2x8", "--extract", f"d/{LONG}"],
    ["compare-io", f"{LONG}.onnx", "i.npz", "e.npz"],
    ["compare", "a.onnx", "b.onnx", "--report", f"{LONG}.json"],
    ["split", "m.py:Net", "--input", "2x8", "--max-stage-bytes", "1e400", "-o", "p"],
], ids=lambda argv: " ".join(a[:12] for a in argv)[:60])
def test_empty_long_and_huge_values_are_one_line(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert list(tmp_path.iterdir()) == []


# ---- --extract: folders -------------------------------------------------------------------------

def test_extract_folder_rules(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert check_directory(empty) == empty.resolve()
    assert check_directory(tmp_path / "new") == (tmp_path / "new").resolve()
    mine = tmp_path / "mine"  # an earlier repro is ours only with its marker: test_extract
    mine.mkdir()
    (mine / "README.md").write_text("my notes")
    (mine / "train.py").write_text("print('mine')")
    with pytest.raises(om.OnnxModularError, match=r"no earlier extraction wrote, or changed "
                       r"since \(README.md, train.py\)"):
        check_directory(mine)
    monkeypatch.chdir(empty)
    assert check_directory(".") == empty.resolve()
    with pytest.raises(om.OnnxModularError, match="empty"):
        check_directory("")


@pytest.mark.slow
def test_parts_never_replace_a_folder_of_other_files(tmp_path):
    model, args = models.net()
    result = om.split_stages(model, args, split_points={"layers.1": "beginning"})
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "train.py").write_text("print('mine')")
    with pytest.raises(om.OnnxModularError, match="not a parts directory"):
        result.save(mine)
    assert (mine / "train.py").read_text() == "print('mine')"
    out = result.save(tmp_path / "parts")
    assert result.save(out) == out  # an earlier set is replaced


@pytest.fixture(scope="module")
def failing() -> Iterator[om.Validation]:
    """A validation session that failed in layers.1.fc, localized (closed at the end)."""
    model, args = models.net()
    proto = models.hierarchical(model, weight_scale={1: 1.5})
    with om.Validation(model, args, proto, providers="cpu") as session:
        rep = session.run()
        assert not rep.ok
        yield session


def test_extract_twice_into_a_folder_with_a_space(failing, tmp_path, capsys, monkeypatch):
    folder = tmp_path / "my repro"
    first = failing.extract(folder)
    again = failing.extract(folder)  # the printed repro can be run twice
    assert again.call_id == first.call_id
    assert sorted(p.name for p in folder.iterdir()) == [
        ".onnx_modular-extraction.json", "README.md", "expected.npz", "inputs.npz",
        "module.onnx"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left
    argv = shlex.split(again.command)  # quoted: the space does not split the path
    assert argv[:4] == ["python", "-m", "onnx_modular", "compare-io"]
    assert main(argv[3:]) == 1  # the repro reproduces
    capsys.readouterr()
    monkeypatch.chdir(folder)  # into the current directory, which keeps its inode
    failing.extract(".")
    assert Path.cwd() == folder and (folder / "module.onnx").is_file()


def test_extract_after_the_data_file_went_is_one_line(tmp_path):
    model, args = models.net()
    proto = models.hierarchical(model, weight_scale={1: 1.5})
    path = tmp_path / "m.onnx"
    onnx.save_model(proto, str(path), save_as_external_data=True, location="m.data",
                    size_threshold=0)
    with om.Validation(model, args, path, providers="cpu") as session:
        session.run()
        (tmp_path / "m.data").unlink()
        with pytest.raises(om.OnnxModularError, match="cannot read the external data"):
            session.extract(tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_full_disk_during_extract_leaves_the_folder_as_it_was(failing, tmp_path, monkeypatch):
    import errno

    from onnx_modular.check.extract import repro as extract_module

    folder = tmp_path / "repro"
    failing.extract(folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(extract_module, "save_model", full)
    with pytest.raises(om.OnnxModularError, match="no space left"):
        failing.extract(folder, call="layers.0")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repro"]


# ---- saves to one path ------------------------------------------------------------------------

def _save(path: str, scale: float) -> None:
    """A model whose weights go to a data file (ir.save keeps tiny ones inline)."""
    _linear(scale).save(path, external_data_threshold=0)


def _linear(scale: float) -> om.ExportResult:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()).eval()
    with torch.no_grad():
        model[0].weight.mul_(scale)
    return om.export(model, (torch.randn(2, 64),))


@pytest.mark.slow
def test_writers_racing_to_one_path_leave_no_orphan_data(tmp_path, monkeypatch):
    """Two saves with external data to one path, both past writing their data before either
    publishes: the model left standing has its data file, and it is the only one (each
    used to remove only the data file the target named when it started)."""
    import threading

    target = tmp_path / "m.onnx"
    _linear(0.5).save(target, external_data_threshold=0)  # an earlier save is there
    results = [_linear(1.0), _linear(2.0)]
    barrier = threading.Barrier(2)
    real = _io.ir_save_external

    def both_written(model, path, name):
        real(model, path, name)
        barrier.wait(timeout=120)

    monkeypatch.setattr(_io, "ir_save_external", both_written)
    errors: list[BaseException] = []

    def save(result: om.ExportResult) -> None:
        try:
            result.save(target, external_data_threshold=0)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=save, args=(r,)) for r in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors
    data = sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".data"))
    assert data == sorted(_io.external_data_files(target)) and len(data) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    onnx.checker.check_model(str(target))


@pytest.mark.slow
def test_orphans_of_a_killed_writer_go_with_the_next_save(tmp_path):
    target = tmp_path / "m.onnx"
    _save(str(target), 1.0)
    orphan = tmp_path / "m.onnx.0badc0de.data"  # a writer killed after moving its data in
    orphan.write_bytes(b"\0" * 16)
    unrelated = tmp_path / "m.onnx.notes.data"  # not a name the package gives: kept
    unrelated.write_bytes(b"keep")
    _save(str(target), 2.0)
    assert not orphan.exists() and unrelated.exists()


@pytest.mark.slow
def test_a_save_over_a_private_model_keeps_it_private(tmp_path):
    target = tmp_path / "m.onnx"
    model, args = models.net()
    result = om.export(model, args)
    result.save(target)
    os.chmod(target, 0o600)
    result.save(target)
    assert (target.stat().st_mode & 0o777) == 0o600
    _save(str(target), 1.0)
    assert (target.stat().st_mode & 0o777) == 0o600
    data = tmp_path / next(iter(_io.external_data_files(target)))
    assert (data.stat().st_mode & 0o777) == 0o600


# ---- SARIF -------------------------------------------------------------------------------------

def test_sarif_is_written_when_the_export_fails(tmp_path, capsys):
    src = tmp_path / "bad model.py"
    src.write_text("import torch\n"
                   "class Net(torch.nn.Module):\n"
                   "    def forward(self, x):\n"
                   "        return [x] if x.sum() > 0 else x\n")
    sarif = tmp_path / "log.sarif"
    assert main(["export", f"{src}:Net", "--input", "2x8", "-o", str(tmp_path / "m.onnx"),
                 "--sarif", str(sarif)]) == 2
    capsys.readouterr()
    log = json.loads(sarif.read_text())
    results = log["runs"][0]["results"]
    assert results and results[-1]["level"] == "error"
    for rule in log["runs"][0]["tool"]["driver"]["rules"]:
        text = rule["messageStrings"]["default"]["text"]
        assert "{reason}" not in text and "{functions}" not in text


def test_sarif_uris_and_placeholders():
    from onnx_modular.diagnostics import Location, sarif_template
    from onnx_modular.leaves.errors import rules

    assert rules.FUNCTION_SUMMARY.to_sarif()["messageStrings"]["default"]["text"] == \
        "{0} function(s) for {1} module call(s)"
    assert sarif_template("a {{b}} {x} {y} {x}") == "a {{b}} {0} {1} {0}"
    uri = Location(source_file="/home/me/my models/modèle.py", source_line=3).to_sarif()[
        "physicalLocation"]["artifactLocation"]["uri"]
    assert uri == "file:///home/me/my%20models/mod%C3%A8le.py"
    rel = Location(source_file="src/a b.py", source_line=1).to_sarif()[
        "physicalLocation"]["artifactLocation"]["uri"]
    assert rel == "src/a%20b.py"


# ---- Ctrl-C --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_ctrl_c_while_the_command_line_starts_is_quiet(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(om.__file__).parent.parent)}
    proc = subprocess.Popen([sys.executable, "-m", "onnx_modular", "inspect", "none.onnx"],
                            cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)  # torch is still importing
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 2:  # it had finished starting: the normal one-line error
        pytest.skip("the command started before the interrupt")
    assert proc.returncode == 130 and "Traceback" not in err, err


def test_compare_io_model_with_external_data_is_checked_too(tmp_path, capsys):
    graph = helper.make_graph([helper.make_node("Add", ["x", "k"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              [onnx.numpy_helper.from_array(np.ones(4, np.float32), "k")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.save_model(model, str(tmp_path / "m.onnx"), save_as_external_data=True,
                    location="m.json", size_threshold=0)
    before = (tmp_path / "m.json").read_bytes()
    np.savez(tmp_path / "i.npz", x=np.ones(4, np.float32))
    np.savez(tmp_path / "e.npz", y=np.full(4, 2, np.float32))
    assert main(["compare-io", str(tmp_path / "m.onnx"), str(tmp_path / "i.npz"),
                 str(tmp_path / "e.npz"), "--report", str(tmp_path / "m.json")]) == 2
    assert "data file" in capsys.readouterr().err
    assert (tmp_path / "m.json").read_bytes() == before


def test_two_extractions_into_one_folder_leave_one_whole_repro(failing, tmp_path):
    """Each extraction stages its files and swaps the folder in: whichever comes last, the
    folder holds one call's module, inputs, expected values and README, never a mix."""
    import shutil
    import threading

    # one extraction first: the lazy imports it triggers parse Python sources (torch's
    # overloads), and CPython 3.11's ast is not thread-safe ("AST constructor recursion
    # depth mismatch"); this test is about the folder, not about imports
    failing.extract(tmp_path / "warm", call="layers.0")
    shutil.rmtree(tmp_path / "warm")
    folder = tmp_path / "x"
    errors: list[BaseException] = []

    def run(call: str) -> None:
        try:
            failing.extract(folder, call=call)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(c,)) for c in ("layers.0", "layers.2") * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors
    module = onnx.load(folder / "module.onnx")
    call = {p.key: p.value for p in module.metadata_props}["onnx_modular.extracted_call"]
    assert f"`{call}`" in (folder / "README.md").read_text()
    assert sorted(p.name for p in folder.iterdir()) == [
        ".onnx_modular-extraction.json", "README.md", "expected.npz", "inputs.npz",
        "module.onnx"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x"]


def test_names_too_long_are_one_line_in_the_api_too(tmp_path):
    model, args = models.net()
    long = tmp_path / ("x" * 300)
    with pytest.raises(om.OnnxModularError, match="too long"):
        om.export(model, args).save(long)
    with pytest.raises(om.OnnxModularError, match="too long"):
        om.compare_io(long, {}, {})
    with pytest.raises(om.OnnxModularError, match="too long"):
        om.compare(long, long)
    with pytest.raises(om.OnnxModularError, match="too long"):
        om.compare_io(models.hierarchical(model).SerializeToString(), long, long)
