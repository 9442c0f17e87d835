"""The folder a repro goes to: a new folder, an empty one, or an earlier repro of ours,
unchanged since; never one holding other files, which the repro would replace, whatever
their names. ``.onnx_modular-extraction.json`` (:data:`MARKER`) lists what an extraction
wrote, each file's size and time, so the next one into the folder replaces exactly those
files, unchanged, and refuses a folder holding any other (a user's own ``README.md`` or
``module.onnx`` included)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from onnx_modular.leaves._io import atomic_write_text, file_stamp
from onnx_modular.leaves.errors import fail, rules

MODULE, INPUTS, EXPECTED, README = "module.onnx", "inputs.npz", "expected.npz", "README.md"
#: What an extraction wrote, in the folder: how the next one knows the files are its own.
MARKER = ".onnx_modular-extraction.json"
MARKER_FORMAT = "onnx_modular.extraction"

#: What a repro folder holds (``module.onnx.<id>.data``: the weights of a module over 2 GB).
_REPRO_FILE = re.compile(rf"^({re.escape(MODULE)}|{re.escape(INPUTS)}|{re.escape(EXPECTED)}|"
                         rf"{re.escape(README)}|{re.escape(MODULE)}\.[0-9a-f]+\.data)$")


def check_directory(directory: str | Path) -> Path:
    """The folder a repro may be written to, resolved (``.`` and symlinks), or one line
    saying why not: a new folder, an empty one or an earlier repro of ours, unchanged since
    (:data:`MARKER` lists its files; it is replaced as a whole); never a folder holding
    other files, which the repro would replace, whatever their names."""
    if not str(directory):
        raise fail("cannot extract to '': the folder name is empty", rules.BAD_INPUT)
    given = Path(directory)
    if given.exists() and not given.is_dir():
        raise fail(f"cannot extract to '{given}': it is a file, not a directory",
                   rules.BAD_INPUT)
    target = given.resolve()
    if target.is_dir():
        foreign = _foreign(target)
        if foreign:
            shown = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
            raise fail(f"cannot extract to '{given}': it holds files no earlier extraction "
                       f"wrote, or changed since ({shown}), which it would replace; give an "
                       "empty or new folder", rules.BAD_INPUT)
    parent = target.parent
    if not parent.is_dir():
        raise fail(f"cannot extract to '{given}': directory '{parent}' does not exist",
                   rules.BAD_INPUT)
    if not os.access(parent, os.W_OK) or (target.is_dir() and not os.access(target, os.W_OK)):
        raise fail(f"cannot extract to '{given}': it is not writable", rules.BAD_INPUT)
    return target


def _stamp(path: Path) -> list[int]:
    """What a file of ours looks like as written (the link itself, not what it names): a
    file the user replaced or edited since is no longer ours."""
    return file_stamp(path, follow_symlinks=False)


def _foreign(folder: Path) -> list[str]:
    """Entries of ``folder`` that are not files of an earlier extraction, as its marker
    lists them (repro file names only, regular files, unchanged)."""
    entries = sorted(e.name for e in folder.iterdir())
    try:
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
        ours = marker["files"] if marker.get("format") == MARKER_FORMAT else {}
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        ours = {}
    if not isinstance(ours, dict) or not ours:
        return entries
    return [name for name in entries if name != MARKER and not (
        _REPRO_FILE.match(name) and (folder / name).is_file()
        and not (folder / name).is_symlink() and ours.get(name) == _stamp(folder / name))]


def mark(staging: Path, call_id: str) -> None:
    """The marker of the files just staged (written last: they no longer change)."""
    files = {e.name: _stamp(e) for e in sorted(staging.iterdir()) if _REPRO_FILE.match(e.name)}
    atomic_write_text(staging / MARKER, json.dumps(
        {"format": MARKER_FORMAT, "call": call_id, "files": files}, indent=1))
