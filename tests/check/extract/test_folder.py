"""The folder a repro goes to: the marker lists exactly the repro files staged (a module's
data file included), with their size and time; a file is ours only as listed, a regular
file, unchanged; anything else in the folder refuses it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from onnx_modular.check.extract.folder import MARKER, MARKER_FORMAT, check_directory, mark
from onnx_modular.leaves.errors import OnnxModularError

REPRO = ("module.onnx", "module.onnx.0a1b2c3d.data", "inputs.npz", "expected.npz", "README.md")


def staged(folder: Path) -> Path:
    folder.mkdir()
    for name in REPRO:
        (folder / name).write_bytes(name.encode())
    return folder


def test_the_marker_lists_the_repro_files_with_their_size_and_time(tmp_path: Path) -> None:
    folder = staged(tmp_path / "x")
    (folder / "notes.txt").write_text("not a repro file")
    mark(folder, "layers.1")
    marker = json.loads((folder / MARKER).read_text())
    assert marker["format"] == MARKER_FORMAT and marker["call"] == "layers.1"
    assert sorted(marker["files"]) == sorted(REPRO)
    st = os.stat(folder / "README.md")
    assert marker["files"]["README.md"] == [st.st_size, st.st_mtime_ns]
    with pytest.raises(OnnxModularError, match=r"\(notes.txt\)"):
        check_directory(folder)  # a file the marker does not list is not ours
    (folder / "notes.txt").unlink()
    assert check_directory(folder) == folder.resolve()


def test_a_file_of_ours_touched_or_turned_link_is_no_longer_ours(tmp_path: Path) -> None:
    folder = staged(tmp_path / "x")
    mark(folder, "layers.1")
    st = os.stat(folder / "inputs.npz")
    os.utime(folder / "inputs.npz", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(OnnxModularError, match=r"changed since \(inputs.npz\)"):
        check_directory(folder)
    os.utime(folder / "inputs.npz", ns=(st.st_atime_ns, st.st_mtime_ns))  # as written
    assert check_directory(folder) == folder.resolve()
    (tmp_path / "elsewhere").write_bytes(b"README.md")
    (folder / "README.md").unlink()
    (folder / "README.md").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OnnxModularError, match=r"\(README.md\)"):
        check_directory(folder)


def test_new_empty_and_unwritable_folders(tmp_path: Path) -> None:
    assert check_directory(tmp_path / "new") == (tmp_path / "new").resolve()
    (tmp_path / "empty").mkdir()
    assert check_directory(tmp_path / "empty") == (tmp_path / "empty").resolve()
    with pytest.raises(OnnxModularError, match="does not exist"):
        check_directory(tmp_path / "no" / "x")
    (tmp_path / "file").write_text("")
    with pytest.raises(OnnxModularError, match="it is a file"):
        check_directory(tmp_path / "file")
