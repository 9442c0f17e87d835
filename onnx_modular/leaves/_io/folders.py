"""Folders replaced as one set: a reader sees the old folders or the new ones, never a mix,
whatever fails on the way; a writer killed at any point is undone (or finished) by the next
transaction or read in the same place.

A transaction is anchored at a path: every temporary is ``.<anchor>.om<pid>-*.tmp`` beside
it (:func:`~onnx_modular.leaves._io.temp_name`), and it replaces folders ``<home>/<name>``. One
folder (a parts directory, an extracted repro) is the anchor itself, ``home`` its parent;
a set (a Triton repository's models) lives inside the anchor, ``home`` the anchor, and
nothing of the transaction ever sits inside it (Triton fails on a folder it cannot load).

1. On entry, killed transactions on the anchor are recovered (below) and the staging
   folder ``.<anchor>.om<pid>-<hex>.tmp`` is made; :meth:`StagedFolders.folder` gives the
   caller one empty folder in it per name, to write into.
2. On success, under a lock on the anchor's parent: recovery again, the caller's
   ``check``, then the backup ``.<anchor>.om<pid>-old<hex>.tmp`` appears whole with its
   journal (``swap.json``: the staging folder, ``home``, the names moved aside and those
   moved in, in order). The folders being replaced (and those retired) move into it, the
   one staged last first; the staged folders move in, in the order they were staged (the
   one staged last, which readers start from, last). Then the backup is discarded.
3. On an exception, staging is removed; one during the moves first puts everything back.

Recovery (:func:`recover`, run first by every transaction and by readers): a backup whose
writer is gone is read. If every staged folder was moved in, the set is the new one and the
backup is dropped; else the new folders go back to staging and the old ones home (the one
moved out first last), then the temporaries are removed. A backup without a journal is the
old folder itself, hidden by a save of an earlier release between its two renames: it is
renamed back where the folder is missing.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from onnx_modular.leaves._io import clean_stale_temporaries, directory_lock, pid_alive, temp_name
from onnx_modular.leaves._log import timed

_JOURNAL = "swap.json"
_FORMAT = "onnx_modular.folders"
_BACKUP = "old"  # the tag of a backup's temporary name


def _step(what: str, name: str) -> None:
    """A filesystem step of a transaction: ``stage``, ``journal``, ``move-old``,
    ``move-new``, ``clean`` (tests inject faults and kills here)."""


class StagedFolders:
    """Folders ``home/<name>`` replaced as one set (see the module's description).

    ``retire``: names in ``home`` that leave with the old set (a stage the new set no longer
    has); ``check``: called under the lock just before the swap (what another writer did
    meanwhile is refused there); ``keep_cwd``: one folder that is, or holds, the current
    directory keeps its inode (its files are replaced one by one), so a shell in it is not
    left in a removed folder.
    """

    def __init__(self, anchor: Path, home: Path, *, retire: Sequence[str] = (),
                 check: Callable[[], object] | None = None, keep_cwd: bool = False) -> None:
        if anchor.name in ("", ".", ".."):
            raise OSError(errno.EINVAL, f"'{anchor}' names no folder to write")
        self.anchor, self.home = anchor, home
        self.parent = anchor.parent
        self.retire, self.check, self.keep_cwd = list(retire), check, keep_cwd
        self.staging = self.parent / temp_name(anchor)
        self.staged: list[str] = []
        self._backup_left = False

    def __enter__(self) -> StagedFolders:
        with directory_lock(self.parent):
            _recover(self.anchor)
        self.staging.mkdir()
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        try:
            if kind is None:
                with timed(f"swap in {self.anchor}"):
                    self._commit()
        finally:
            if not self._backup_left:  # else the next recovery needs it
                shutil.rmtree(self.staging, ignore_errors=True)

    def folder(self, name: str) -> Path:
        """A new, empty folder that becomes ``home/name`` when the transaction succeeds."""
        if not _plain(name) or name in self.staged:
            raise ValueError(f"{name!r} is no new plain folder name")
        _step("stage", name)
        (self.staging / name).mkdir()
        self.staged.append(name)
        return self.staging / name

    def _commit(self) -> None:
        names = self.staged
        if not names:
            raise ValueError("a transaction with nothing staged")
        with directory_lock(self.parent):
            _recover(self.anchor)
            if self.check is not None:
                self.check()
            self.home.mkdir(exist_ok=True)
            if self.keep_cwd and len(names) == 1 and _holds_cwd(self.home / names[0]):
                _replace_in_place(self.home / names[0], self.staging / names[0])
                return
            old = [n for n in [*reversed(names), *self.retire]
                   if os.path.lexists(self.home / n)]
            old = list(dict.fromkeys(old))
            backup = self._backup(names, old)
            try:
                for name in old:
                    _step("move-old", name)
                    os.rename(self.home / name, backup / name)
                for name in names:
                    _step("move-new", name)
                    os.rename(self.staging / name, self.home / name)
            except BaseException:
                self._backup_left = True
                _roll_back(self.home, self.staging, backup, names, old)
                _discard(backup, self.anchor)
                self._backup_left = False
                raise
            try:
                _step("clean", names[-1])
            finally:  # the set is in: whatever happens now, the old one goes
                _discard(backup, self.anchor)

    def _backup(self, names: list[str], old: list[str]) -> Path:
        """The backup folder, holding its journal from the moment it has its name."""
        pending = self.parent / temp_name(self.anchor)
        journal = {"format": _FORMAT, "staging": self.staging.name,
                   "home": os.path.relpath(self.home, self.parent), "old": old, "new": names}
        backup = self.parent / temp_name(self.anchor, _BACKUP)
        try:
            pending.mkdir()
            (pending / _JOURNAL).write_text(json.dumps(journal), encoding="utf-8")
            os.rename(pending, backup)
        except BaseException:
            shutil.rmtree(pending, ignore_errors=True)
            raise
        _step("journal", names[-1])
        return backup


@contextlib.contextmanager
def staged_folder(target: Path, *, check: Callable[[], object] | None = None,
                  keep_cwd: bool = False) -> Iterator[Path]:
    """One folder replaced whole: yields an empty folder to write into, which becomes
    ``target`` (the old one, if any, removed) when the block succeeds. A set of one
    :class:`StagedFolders`; recover it with ``recover(target)``."""
    with StagedFolders(target, target.parent, check=check, keep_cwd=keep_cwd) as staged:
        yield staged.folder(target.name)


def recover(anchor: Path) -> None:
    """Undo (or finish) what killed transactions on ``anchor`` left, and remove their
    temporaries; a reader runs it before reading."""
    with directory_lock(anchor.parent):
        _recover(anchor)


def _recover(anchor: Path) -> None:
    parent = anchor.parent
    pattern = re.compile(rf"^\.{re.escape(anchor.name)}\.om(\d+)-{_BACKUP}[0-9a-f]+\.tmp$")
    try:
        entries = sorted(parent.iterdir())
    except OSError:
        return
    for entry in entries:
        match = pattern.match(entry.name)
        if match is None or entry.is_symlink() or not entry.is_dir() \
                or pid_alive(int(match[1])):
            continue
        journal = _journal(entry, anchor, match[1])
        if journal is None:  # an earlier release's: the old folder itself
            if not os.path.lexists(anchor):
                os.rename(entry, anchor)
            continue
        staging = parent / journal["staging"]
        if staging.is_dir() and any(os.path.lexists(staging / n) for n in journal["new"]):
            _roll_back(parent / journal["home"], staging, entry, journal["new"],
                       journal["old"])
        _discard(entry, anchor)
    clean_stale_temporaries(parent, anchor.name)  # rolled back sets, staging, backups


def _roll_back(home: Path, staging: Path, backup: Path, new: Sequence[str],
               old: Sequence[str]) -> None:
    """The new folders back to staging, the old ones home (the first moved out, last):
    each step a rename, so a roll back killed midway is finished by the next one."""
    for name in reversed(new):
        if not os.path.lexists(staging / name) and os.path.lexists(home / name):
            os.rename(home / name, staging / name)
    for name in reversed(old):
        if os.path.lexists(backup / name) and not os.path.lexists(home / name):
            os.rename(backup / name, home / name)


def _discard(backup: Path, anchor: Path) -> None:
    """The backup out of recovery's sight in one rename, then removed."""
    with contextlib.suppress(OSError):
        gone = backup.parent / temp_name(anchor)
        os.rename(backup, gone)
        shutil.rmtree(gone, ignore_errors=True)


def _journal(backup: Path, anchor: Path, pid: str) -> dict[str, Any] | None:
    """The backup's journal, or None where it has none (an earlier release's backup)."""
    try:
        journal = json.loads((backup / _JOURNAL).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(journal, dict):
        return None
    if journal.get("format") != _FORMAT:
        journal = _earlier_journal(journal, backup, anchor, pid)
    if journal is None or not isinstance(journal.get("old"), list) \
            or not isinstance(journal.get("new"), list) \
            or journal.get("home") not in (".", anchor.name) \
            or not all(_plain(n) for n in [*journal["old"], *journal["new"],
                                           journal.get("staging")]):
        return None
    return journal


def _earlier_journal(journal: dict[str, Any], backup: Path, anchor: Path, pid: str
                     ) -> dict[str, Any] | None:
    """The journal of a Triton save of an earlier release (``set_id``, ``ensemble``,
    ``models``: the new set, the ensemble last), read as this one's: it moved the old
    ensemble out first, then the rest of the old set, into the backup."""
    models, ensemble = journal.get("models"), journal.get("ensemble")
    if not isinstance(models, list) or not isinstance(ensemble, str):
        return None
    pattern = re.compile(rf"^\.{re.escape(anchor.name)}\.om{pid}-[0-9a-f]{{8}}\.tmp$")
    staging = next((e.name for e in sorted(anchor.parent.iterdir())
                    if pattern.match(e.name) and e.is_dir()), "")
    kept = sorted(p.name for p in backup.iterdir() if p.is_dir())
    old = [n for n in kept if n == ensemble] + [n for n in kept if n != ensemble]
    return {"staging": staging or temp_name(anchor), "home": anchor.name, "old": old,
            "new": models}


def _plain(name: object) -> bool:
    return isinstance(name, str) and Path(name).name == name and name not in ("", ".", "..")


def _holds_cwd(folder: Path) -> bool:
    cwd, real = Path.cwd().resolve(), folder.resolve()
    return real == cwd or real in cwd.parents


def _replace_in_place(folder: Path, staged: Path) -> None:
    """The staged files in place of ``folder``'s, one by one (it keeps its inode): not one
    step, but under the lock, and only where the caller's check made every file its own."""
    for entry in sorted(folder.iterdir()):
        if not (staged / entry.name).exists():
            entry.unlink()
    for entry in sorted(staged.iterdir()):
        os.replace(entry, folder / entry.name)
