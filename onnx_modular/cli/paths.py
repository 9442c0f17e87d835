"""Paths a command line names, checked before the work: none empty, none too long for the
file system, and no output replacing an input or another output.

Every subcommand states which flags read files and which write them (a file, or a folder it
fills or replaces) and calls :func:`check_paths` first: ``validate ... m.onnx --node-data
m.onnx`` would turn the model into JSON, ``export -o s.onnx --sarif s.onnx`` replace the
model by its log, ``split -o DIR --acc-ops DIR/ops.txt`` delete the op list with the old
parts. Two names are one file when they resolve to one (symlinks, ``./``, hard links).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from onnx_modular.leaves.errors import fail, rules

#: Used where the file system does not say (``os.pathconf``).
NAME_MAX, PATH_MAX = 255, 4096

#: ``flag -> path`` (None: the flag was not given).
Named = Mapping[str, "str | None"]


def check_name(flag: str, path: str, what: str = "path") -> None:
    """An empty path, or one the file system cannot hold (ENAMETOOLONG), in one line;
    ``what`` names it ("output path", "output directory")."""
    if not path:
        raise fail(f"{flag}: the {what} is empty", rules.BAD_INPUT)
    encoded = os.fsencode(path)
    existing = _existing_ancestor(Path(path))
    name_max = _pathconf(existing, "PC_NAME_MAX", NAME_MAX)
    path_max = _pathconf(existing, "PC_PATH_MAX", PATH_MAX)
    long = next((p for p in Path(path).parts if len(os.fsencode(p)) > name_max), None)
    if long is not None:
        raise fail(f"{flag}: the name '{long[:40]}...' is {len(os.fsencode(long))} bytes long; "
                   f"this file system allows {name_max}", rules.BAD_INPUT)
    if len(encoded) >= path_max:
        raise fail(f"{flag}: the path is {len(encoded)} bytes long; this file system allows "
                   f"{path_max - 1}", rules.BAD_INPUT)


def _existing_ancestor(path: Path) -> str:
    for parent in [path, *path.parents]:
        try:
            if parent.exists():
                return str(parent)
        except OSError:
            continue
    return "."


def _pathconf(path: str, name: str, default: int) -> int:
    try:
        value = os.pathconf(path, name)
    except (OSError, ValueError, AttributeError):
        return default
    return value if value and value > 0 else default


def same_file(a: str, b: str) -> bool:
    """``a`` and ``b`` name one file (or one folder), existing or about to be written."""
    try:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
    except OSError:
        pass
    return os.path.realpath(a) == os.path.realpath(b)


def inside(path: str, folder: str) -> bool:
    """``path`` is ``folder`` or lies below it."""
    real, top = os.path.realpath(path), os.path.realpath(folder)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def spec_file(spec: str | None) -> str | None:
    """The Python file a MODEL or INPUTS spec ``path/file.py:attr`` reads, if it names one."""
    if not spec or ":" not in spec:
        return None
    where = spec.rpartition(":")[0]
    return where if where.endswith(".py") or "/" in where or os.sep in where else None


def onnx_files(flag: str, path: str | None) -> dict[str, str]:
    """An ONNX file a flag reads, and the external data files it names (``onnx.load`` reads
    them too): an output must replace none of them."""
    if not path:
        return {flag: path} if path is not None else {}
    found = {flag: path}
    try:
        small = os.path.getsize(path) < 64 * 2**20  # a model with external data is small
    except OSError:
        return found
    if small:
        from onnx_modular.leaves._io import external_data_files

        folder = Path(path).parent
        for name in sorted(external_data_files(Path(path))):
            found[f"{flag} (its data file {name})"] = str(folder / name)
    return found


def check_paths(reads: Named, files: Named, folders: Named | None = None) -> None:
    """Every path checked by :func:`check_name`; then no output file (``files``) or output
    folder (``folders``: filled or replaced) is, or holds, an input (``reads``) or another
    output. Flags given as None were not given and are skipped."""
    folders = folders or {}
    for named, what in ((reads, "path"), (files, "output path"),
                        (folders, "output directory")):
        for flag, path in named.items():
            if path is not None:
                check_name(flag, path, what)
    reads = {f: p for f, p in reads.items() if p}
    files = {f: p for f, p in files.items() if p}
    folders = {f: p for f, p in folders.items() if p}
    for out_flag, out in files.items():
        for in_flag, source in reads.items():
            if same_file(out, source):
                raise fail(f"{out_flag} '{out}' is the file {in_flag} reads: writing it would "
                           "replace it; give another name", rules.BAD_INPUT)
    for out_flag, out in folders.items():
        if os.path.exists(out) and not os.path.isdir(out):
            raise fail(f"{out_flag}: cannot write to '{out}': it is a file, not a directory",
                       rules.BAD_INPUT)
        for in_flag, source in reads.items():
            if inside(source, out) or inside(out, source):
                raise fail(f"{out_flag} '{out}' holds {in_flag} '{source}': writing the "
                           "folder would replace it; give another folder", rules.BAD_INPUT)
    outputs = [*files.items(), *folders.items()]
    for i, (flag_a, a) in enumerate(outputs):
        for flag_b, b in outputs[i + 1:]:
            if same_file(a, b) or (flag_a in folders and inside(b, a)) or (
                    flag_b in folders and inside(a, b)):
                raise fail(f"{flag_a} '{a}' and {flag_b} '{b}' name one file: one output "
                           "would replace the other; give two names", rules.BAD_INPUT)
