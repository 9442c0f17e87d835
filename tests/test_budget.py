"""The inner loop's budget (tests/conftest.py): a test outside `slow` that takes more CPU
than its budget fails under `-m "not slow"`, naming the budget; marked slow it is not run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs pytest twice in a subprocess

BUSY = '''
import time, pytest

def _burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass

def test_quick():
    _burn(0.01)

def test_busy():
    _burn(0.6)

@pytest.mark.slow
def test_busy_but_slow():
    _burn(0.6)
'''


def _run(tmp_path: Path, budget: str) -> subprocess.CompletedProcess[str]:
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_busy.py").write_text(BUSY)
    env = {**os.environ, "OM_TEST_BUDGET": budget}
    command = [sys.executable, "-m", "pytest", "-m", "not slow", "-q", "-p", "no:cacheprovider",
               "-W", "ignore::pytest.PytestUnknownMarkWarning", str(tmp_path)]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_test_over_its_budget_fails_naming_it(tmp_path: Path) -> None:
    run = _run(tmp_path, "0.3")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 failed, 1 passed, 1 deselected" in run.stdout
    assert "test_busy took" in run.stdout and "budget of 0.3 s per test: mark it slow" \
        in run.stdout


def test_budget_zero_turns_the_check_off(tmp_path: Path) -> None:
    run = _run(tmp_path, "0")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed, 1 deselected" in run.stdout
