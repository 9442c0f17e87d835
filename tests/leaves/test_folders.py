"""The staged-folder transaction (``_io.folders``), on the real file system: a set of folders
is swapped in whole, an error puts the old set back, a writer killed at any step leaves what
the next recovery turns into the old set or the new one (never a mix), and what killed
writers left beside the folders goes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from onnx_modular.leaves._io import folders
from onnx_modular.leaves._io.folders import StagedFolders, recover, staged_folder

DEAD = 2**22 + 4321  # above the default pid_max: no such process


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root``: its path and text."""
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*"))
            if p.is_file()}


def fill(folder: Path, text: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "f").write_text(text)


def repository(tmp_path: Path) -> Path:
    """A folder holding an old set (``a``, ``b``, ``gone``) and a folder not of the set."""
    repo = tmp_path / "repo"
    for name in ("a", "b", "gone"):
        fill(repo / name, f"old {name}")
    fill(repo / "other", "not ours")
    return repo


def save_new_set(repo: Path) -> None:
    """``a`` and ``b`` replaced, ``c`` added (staged last), ``gone`` retired."""
    with StagedFolders(repo, repo, retire=["a", "b", "gone"]) as staged:
        for name in ("a", "b", "c"):
            fill(staged.folder(name), f"new {name}")


OLD = {"a/f": "old a", "b/f": "old b", "gone/f": "old gone", "other/f": "not ours"}
NEW = {"a/f": "new a", "b/f": "new b", "c/f": "new c", "other/f": "not ours"}


def test_one_folder_is_replaced_whole(tmp_path: Path) -> None:
    target = tmp_path / "out"
    with staged_folder(target) as staging:
        (staging / "x").write_text("first")
        (staging / "y").write_text("first")
    assert tree(target) == {"x": "first", "y": "first"}
    with staged_folder(target) as staging:
        assert staging.parent.parent == tmp_path and staging.name == "out"
        (staging / "z").write_text("second")
        assert tree(target) == {"x": "first", "y": "first"}  # nothing in before the end
    assert tree(target) == {"z": "second"}  # no file of the old folder left
    assert os.listdir(tmp_path) == ["out"]  # no temporaries beside it


def test_a_set_is_swapped_in_and_the_retired_folders_go(tmp_path: Path) -> None:
    repo = repository(tmp_path)
    save_new_set(repo)
    assert tree(repo) == NEW
    assert os.listdir(tmp_path) == ["repo"]


def test_an_exception_in_the_block_leaves_the_old_folder(tmp_path: Path) -> None:
    target = tmp_path / "out"
    fill(target, "old")
    with pytest.raises(RuntimeError, match="midway"), staged_folder(target) as staging:
        (staging / "f").write_text("new")
        raise RuntimeError("midway")
    assert tree(target) == {"f": "old"}
    assert os.listdir(tmp_path) == ["out"]


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), KeyboardInterrupt])
@pytest.mark.parametrize("at", ["move-old", "move-new", "clean"])
def test_an_error_during_the_swap_puts_the_old_set_back(tmp_path: Path, monkeypatch, error,
                                                        at: str) -> None:
    repo = repository(tmp_path)
    seen: list[str] = []

    def fail_on_second(what: str, name: str) -> None:
        seen.append(what)
        if seen.count(what) == (1 if at == "clean" else 2) and what == at:
            raise error

    monkeypatch.setattr(folders, "_step", fail_on_second)
    with pytest.raises(type(error) if isinstance(error, BaseException) else error):
        save_new_set(repo)
    # the swap was done once the last folder was in: an error after it keeps the new set
    assert tree(repo) == (NEW if at == "clean" else OLD)
    assert os.listdir(tmp_path) == ["repo"]


def test_the_callers_check_runs_under_the_lock_and_can_refuse(tmp_path: Path) -> None:
    target = tmp_path / "out"
    fill(target, "old")
    checked = []

    def check() -> None:
        checked.append(tree(target))
        raise ValueError("someone else's folder now")

    with pytest.raises(ValueError, match="someone else"), \
            staged_folder(target, check=check) as staging:
        (staging / "f").write_text("new")
    assert checked == [{"f": "old"}]
    assert tree(target) == {"f": "old"} and os.listdir(tmp_path) == ["out"]


def test_a_writer_killed_at_any_step_leaves_the_old_set_or_the_new_one(tmp_path: Path
                                                                       ) -> None:
    """A child process saves the new set and dies (``os._exit``: nothing of its own runs)
    at the k-th filesystem step; then the next recovery leaves exactly the old set or the
    new one, and nothing beside it."""
    outcomes = []
    for k in range(30):
        work = tmp_path / f"k{k}"
        repo = repository(work)
        pid = os.fork()
        if pid == 0:
            try:
                steps = iter(range(k))

                def die(*_: object, steps=steps) -> None:
                    if next(steps, None) is None:
                        os._exit(9)

                folders._step = die
                save_new_set(repo)
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        killed = os.waitstatus_to_exitcode(status) == 9
        seen = tree(repo)
        if "a/f" not in seen:  # the old folders left last staged first: b before a
            assert "b/f" not in seen, k
        if seen.get("c/f") == "new c":  # the folder moved in last: the set is complete
            assert {k: v for k, v in seen.items() if k.startswith(("a/", "b/"))} == {
                "a/f": "new a", "b/f": "new b"}
        recover(repo)
        after = tree(repo)
        assert after in (OLD, NEW), (k, after)
        assert os.listdir(work) == ["repo"], (k, os.listdir(work))
        recover(repo)  # a second recovery changes nothing
        assert tree(repo) == after
        outcomes.append("new" if after == NEW else "old")
        if not killed:
            break
    # every step was a kill point, and the last run finished the save
    assert outcomes[-1] == "new" and "old" in outcomes and len(outcomes) > 8, outcomes
    assert outcomes.count("new") >= 2  # killed after the swap, before the clean-up: new


def test_the_next_transaction_recovers_a_killed_one_first(tmp_path: Path) -> None:
    """A backup with its journal, two of three new folders moved in: the next transaction
    puts the old set back before it starts, then swaps its own in."""
    repo = repository(tmp_path)
    staging = tmp_path / f".repo.om{DEAD}-0a1b2c3d.tmp"
    backup = tmp_path / f".repo.om{DEAD}-old0a1b2c3d.tmp"
    backup.mkdir()
    (backup / "swap.json").write_text(json.dumps({
        "format": "onnx_modular.folders", "staging": staging.name, "home": "repo",
        "old": ["b", "a", "gone"], "new": ["a", "b", "c"]}))
    for name in ("b", "a", "gone"):
        os.rename(repo / name, backup / name)
    fill(staging / "c", "new c")
    for name in ("a", "b"):
        fill(repo / name, f"new {name}")
    assert tree(repo)["a/f"] == "new a" and "gone/f" not in tree(repo)  # a mix, until...
    seen = []
    with StagedFolders(repo, repo) as staged:
        seen.append(tree(repo))
        fill(staged.folder("d"), "d")
    assert seen == [OLD]
    assert tree(repo) == {**OLD, "d/f": "d"}
    assert os.listdir(tmp_path) == ["repo"]


def test_a_hidden_folder_of_an_earlier_release_is_put_back(tmp_path: Path) -> None:
    """Saves before journals renamed the old folder aside whole: killed between the two
    renames, that backup is the folder."""
    target = tmp_path / "parts"
    fill(target, "old")
    os.rename(target, tmp_path / f".parts.om{DEAD}-old0a1b2c.tmp")
    recover(target)
    assert tree(target) == {"f": "old"} and os.listdir(tmp_path) == ["parts"]


def test_a_triton_journal_of_an_earlier_release_is_rolled_back(tmp_path: Path) -> None:
    """``swap.json`` as Triton wrote it before the transaction (set id, ensemble, models):
    the old ensemble and a part were moved aside, one new part in, the rest staged."""
    repo = tmp_path / "repo"
    for name in ("m", "m_stage_0", "m_stage_1"):
        fill(repo / name, f"old {name}")
    old = tree(repo)
    backup = tmp_path / f".repo.om{DEAD}-old0a1b2c.tmp"
    staging = tmp_path / f".repo.om{DEAD}-0a1b2c3d.tmp"
    backup.mkdir()
    (backup / "swap.json").write_text(json.dumps(
        {"set_id": "1234", "ensemble": "m", "models": ["m_stage_0", "m_stage_1", "m"]}))
    os.rename(repo / "m", backup / "m")
    os.rename(repo / "m_stage_0", backup / "m_stage_0")
    fill(repo / "m_stage_0", "new m_stage_0")
    fill(staging / "m_stage_1", "new m_stage_1")
    fill(staging / "m", "new m")
    os.rename(repo / "m_stage_1", backup / "m_stage_1")  # (each old one out before any in)
    recover(repo)
    assert tree(repo) == old and os.listdir(tmp_path) == ["repo"]


def test_stale_temporaries_go_and_live_or_other_ones_stay(tmp_path: Path) -> None:
    target = tmp_path / "out"
    fill(target, "kept")
    stale = [tmp_path / f".out.om{DEAD}-0a1b2c3d.tmp",  # a killed writer's staging
             tmp_path / f".out.om{DEAD}-old0a1b2c3d.tmp"]  # a backup with no journal
    for path in stale:
        fill(path / "out", "half")
    live = tmp_path / f".out.om{os.getpid()}-0a1b2c3d.tmp"  # a writer still at work
    other = tmp_path / f".other.om{DEAD}-0a1b2c3d.tmp"  # another folder's
    for path in (live, other):
        fill(path, "x")
    with staged_folder(target) as staging:
        (staging / "f").write_text("new")
    assert not any(p.exists() for p in stale)
    assert live.exists() and other.exists()
    assert tree(target) == {"f": "new"}


def test_the_current_directory_keeps_its_inode(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "here"
    fill(target, "old")
    (target / "old-only").write_text("x")
    monkeypatch.chdir(target)
    inode = os.stat(".").st_ino
    with staged_folder(target.resolve(), keep_cwd=True) as staging:
        (staging / "f").write_text("new")
    assert os.stat(".").st_ino == inode and Path.cwd() == target.resolve()
    assert tree(target) == {"f": "new"}
    assert os.listdir(tmp_path) == ["here"]


def test_names_that_are_no_folder_are_refused(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="names no folder"):
        StagedFolders(Path("."), Path(".."))
    with StagedFolders(tmp_path / "r", tmp_path / "r") as staged:
        staged.folder("a")
        for bad in ("a", "", "..", "x/y"):
            with pytest.raises(ValueError, match="no new plain folder name"):
                staged.folder(bad)
    assert os.listdir(tmp_path / "r") == ["a"]
