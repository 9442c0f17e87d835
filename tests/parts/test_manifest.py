"""A parts directory is written and read as one set: never a mix of two saves, nothing read
from outside the directory, each session made once however many threads share a runner."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

import onnx_modular as om
from onnx_modular.leaves import _io, runtime
from onnx_modular.parts import manifest as manifest_module


class Chain(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        with torch.no_grad():
            self.a.weight.mul_(scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.sin(self.a(x)))


X = torch.randn(2, 8)


def parts(scale: float) -> tuple[nn.Module, om.SplitResult]:
    torch.manual_seed(0)
    model = Chain(scale).eval()
    return model, om.split(model, (X,), support={"deny": ["aten.sin"]})


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.slow
def test_a_second_save_replaces_the_whole_set(tmp_path: Path) -> None:
    out = tmp_path / "parts"
    _, first = parts(1.0)
    first.save(out)
    model, second = parts(3.0)
    second.save(out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(os.listdir(out)) == sorted(["manifest.json"] + [
        r["file"] for r in manifest["regions"]])
    assert [p.name for p in tmp_path.iterdir()] == ["parts"]  # no temporaries left
    torch.testing.assert_close(om.SplitRunner(out).run(X), model(X), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_second_save_keeps_files_the_first_did_not_write(tmp_path: Path) -> None:
    """A save replaces the folder as a whole: a file of yours beside the parts (found by a
    tester: gone after the second save) makes it refuse, naming the file, and leaves the
    folder as it was."""
    out = tmp_path / "parts"
    _, first = parts(1.0)
    first.save(out)
    (out / "my_notes.txt").write_text("mine")
    before = snapshot(out)
    _, second = parts(3.0)
    with pytest.raises(om.OnnxModularError, match=r"my_notes\.txt.*move them"):
        second.save(out)
    assert snapshot(out) == before


@pytest.mark.slow
@pytest.mark.parametrize("failing_part", [0, 1, 2])
def test_an_interrupted_save_leaves_the_old_set(tmp_path: Path, monkeypatch,
                                               failing_part: int) -> None:
    out = tmp_path / "parts"
    old_model, old = parts(1.0)
    old.save(out)
    before = snapshot(out)
    _, new = parts(3.0)
    real = manifest_module.save_model
    calls = {"n": 0}

    def failing(model: object, path: Path, **kwargs: object) -> None:
        if calls["n"] == failing_part:
            raise OSError(28, "No space left on device")
        calls["n"] += 1
        real(model, path, **kwargs)

    monkeypatch.setattr(manifest_module, "save_model", failing)
    with pytest.raises(om.OnnxModularError, match="No space left"):
        new.save(out)
    assert snapshot(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["parts"]
    torch.testing.assert_close(om.SplitRunner(out).run(X), old_model(X), rtol=1e-4,
                               atol=1e-5)


@pytest.mark.slow
def test_a_part_from_another_save_is_refused(tmp_path: Path) -> None:
    _, first = parts(1.0)
    _, second = parts(3.0)
    first.save(tmp_path / "a")
    second.save(tmp_path / "b")
    name = first.regions[-1].name + ".onnx"
    shutil.copy(tmp_path / "b" / name, tmp_path / "a" / name)  # a mix of two saves
    with pytest.raises(om.OnnxModularError, match="belongs to another save"):
        om.SplitRunner(tmp_path / "a").run(X)


@pytest.mark.slow
def test_a_save_killed_between_its_renames_is_undone(tmp_path: Path) -> None:
    out = tmp_path / "parts"
    model, result = parts(1.0)
    result.save(out)
    dead = 2**22 + 4321
    os.rename(out, tmp_path / f".parts.om{dead}-old0a1b2c.tmp")  # the old set, hidden
    torch.testing.assert_close(om.SplitRunner(out).run(X), model(X), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("file", ["../outside.onnx", "/etc/passwd", "sub/part.onnx", ".."])
def test_files_outside_the_directory_are_refused(tmp_path: Path, file: str) -> None:
    out = tmp_path / "parts"
    _, result = parts(1.0)
    result.save(out)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["regions"][0]["file"] = file
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(om.OnnxModularError, match="not a plain file name"):
        om.SplitRunner(out)


@pytest.mark.slow
def test_a_symbolic_link_out_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "parts"
    _, result = parts(1.0)
    result.save(out)
    first = result.regions[0].name + ".onnx"
    elsewhere = tmp_path / "elsewhere.onnx"
    shutil.move(out / first, elsewhere)
    (out / first).symlink_to(elsewhere)
    with pytest.raises(om.OnnxModularError, match="symbolic link"):
        om.SplitRunner(out)


@pytest.mark.slow
@pytest.mark.parametrize("edit, message", [
    (lambda m: m["regions"][0].pop("file"), "has no 'file'"),
    (lambda m: m.__setitem__("regions", {"a": 1}), "lists no regions"),
    (lambda m: m["regions"].__setitem__(0, 7), "is not an object"),
    (lambda m: m["regions"][0].__setitem__("kind", "gpu"), "kind 'gpu'"),
    (lambda m: m["regions"][0].__setitem__("inputs", "x"), "inputs must be a list"),
    (lambda m: m.__setitem__("version", "2"), "manifest version '2'"),
    (lambda m: m["regions"].append(dict(m["regions"][0])), "used twice"),
])
def test_malformed_manifests_are_one_line(tmp_path: Path, edit, message: str) -> None:
    out = tmp_path / "parts"
    _, result = parts(1.0)
    result.save(out)
    manifest = json.loads((out / "manifest.json").read_text())
    edit(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(om.OnnxModularError, match=message) as info:
        om.SplitRunner(out)
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_threads_sharing_a_runner_make_each_session_once(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "parts"
    model, result = parts(1.0)
    result.save(out)
    made: list[str] = []
    real = runtime.make_session

    def counting(source: object, *args: object, **kwargs: object) -> object:
        made.append(str(source))
        return real(source, *args, **kwargs)

    monkeypatch.setattr(runtime, "make_session", counting)
    runner = om.SplitRunner(out)
    expected = model(X)
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def work() -> None:
        try:
            barrier.wait()
            for _ in range(3):
                torch.testing.assert_close(runner.run(X), expected, rtol=1e-4, atol=1e-5)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(made) == sorted(set(made)) and len(made) == len(result.regions)


class Wide(nn.Module):
    """Chain with weights over onnx_ir's 256 bytes: they can go to a data file."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 32)
        self.b = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.sin(self.a(x)))


@pytest.mark.slow
def test_large_parts_are_saved_with_external_data(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(manifest_module, "EXTERNAL_DATA_ABOVE", 0)
    out = tmp_path / "parts"
    torch.manual_seed(0)
    model = Wide().eval()
    result = om.split(model, (X,), support={"deny": ["aten.sin"]})
    result.save(out)
    data = {p.name for p in out.iterdir() if p.suffix == ".data"}
    named = set().union(*(_io.external_data_files(p) for p in out.glob("*.onnx")))
    assert data and data == named  # every data file is a part's, and no part lacks its own
    torch.testing.assert_close(om.SplitRunner(out).run(X), model(X), rtol=1e-4, atol=1e-5)
