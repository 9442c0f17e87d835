"""``hook -- PROGRAM``: the program starts as ``python PROGRAM`` would start it, which each
test checks against python itself (both run in a subprocess, their output compared)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from onnx_modular.cli import main

#: What a program sees of how it was started; ``sibling`` is a module beside it.
PROBE = """\
import sys, sibling
print("path[0]", sys.path[0])
print("__file__", __file__)
print("__name__", __name__)
print("argv", sys.argv)
print("sibling", sibling.VALUE)
print("__main__ is this module", sys.modules["__main__"].__dict__ is globals())
"""

#: A package run with -m: its __main__ imports relatively.
PACKAGE_MAIN = """\
import sys
from . import helper
print("path[0]", sys.path[0])
print("__file__", __file__)
print("__name__", __name__, __package__)
print("argv", sys.argv)
print("helper", helper.VALUE)
"""


@pytest.fixture
def programs(tmp_path: Path) -> Path:
    """``tmp_path/sub/{probe,sibling}.py``, ``sub/pkg`` (with ``__main__``), ``sub/bare``
    (a package without one), and ``tmp_path/link.py`` -> ``sub/probe.py``."""
    sub = tmp_path / "sub"
    (sub / "pkg").mkdir(parents=True)
    (sub / "bare").mkdir()
    (sub / "probe.py").write_text(PROBE)
    (sub / "sibling.py").write_text("VALUE = 42\n")
    (sub / "pkg" / "__init__.py").write_text("")
    (sub / "pkg" / "__main__.py").write_text(PACKAGE_MAIN)
    (sub / "pkg" / "helper.py").write_text("VALUE = 7\n")
    (sub / "bare" / "__init__.py").write_text("")
    (tmp_path / "link.py").symlink_to(sub / "probe.py")
    return tmp_path


def _python(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def _hooked(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return _python(["-m", "onnx_modular", "hook", "--", *args], cwd)


@pytest.mark.slow
@pytest.mark.parametrize(("folder", "args"), [
    (".", ["sub/probe.py", "a", "b"]),  # a script importing a module beside it
    ("sub", ["probe.py"]),  # from its own folder
    (".", ["link.py"]),  # through a symlink: path[0] is the target's folder
    ("sub", ["-m", "probe", "q"]),  # a module of the current directory
    ("sub", ["-m", "pkg", "z"]),  # a package's __main__, importing relatively
])
def test_the_program_starts_as_python_starts_it(programs: Path, folder: str,
                                                args: list[str]) -> None:
    expected = _python(args, programs / folder)
    assert expected.returncode == 0, expected.stderr
    done = _hooked(args, programs / folder)
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected.stdout


@pytest.mark.slow
@pytest.mark.parametrize("args", [
    ["-m", "no_such_module"], ["-m", "pkg.no_such_module"], ["-m", "no_such_pkg.mod"],
    ["-m", "bare"],  # a package without __main__
])
def test_a_module_that_cannot_start_gets_pythons_one_line(programs: Path,
                                                          args: list[str]) -> None:
    expected = _python(args, programs / "sub")
    done = _hooked(args, programs / "sub")
    assert expected.returncode == done.returncode == 1
    assert done.stderr == expected.stderr  # "<python>: No module named no_such_module"
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_missing_script_is_one_line_and_status_2_as_in_python(programs: Path) -> None:
    expected, done = _python(["nope.py"], programs), _hooked(["nope.py"], programs)
    assert done.returncode == expected.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert str(programs / "nope.py") in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("source", "status"), [
    ("import sys\nsys.exit('bye')\n", 1),
    ("import sys\nsys.exit(3)\n", 3),
    ("def f():\n    raise ValueError('boom')\nf()\n", 1),  # its traceback, its frames only
    ("x = (\n", 1),  # a syntax error
])
def test_the_program_ends_as_it_ends_under_python(programs: Path, source: str,
                                                  status: int) -> None:
    (programs / "ends.py").write_text(source)
    expected, done = _python(["ends.py"], programs), _hooked(["ends.py"], programs)
    assert done.returncode == expected.returncode == status
    assert done.stderr.startswith(expected.stderr)  # then the hook's summary
    assert "onnx_modular" not in done.stderr.removesuffix(
        "onnx_modular hook: the program made no torch.onnx export\n")


def test_sys_path_argv_and_main_are_put_back(programs: Path, monkeypatch) -> None:
    script = programs / "mutates.py"
    script.write_text("import sys\nsys.path.append('/elsewhere')\nsys.argv.append('x')\n"
                      "sys.path = ['replaced']\n")
    monkeypatch.chdir(programs)
    before = (list(sys.path), sys.path, list(sys.argv), sys.modules["__main__"])
    assert main(["hook", "--", "mutates.py"]) == 0
    assert (list(sys.path), sys.path, list(sys.argv), sys.modules["__main__"]) == before
