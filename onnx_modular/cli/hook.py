"""``hook -- PROGRAM ARGS...``: run an unchanged export pipeline with ``om.hook`` active.

PROGRAM runs in this interpreter, so its ``torch.onnx.export`` calls are the hooked ones: a
console script on PATH (``optimum-cli``), a ``file.py``, or ``-m module``. Its exit status
is passed through; what each export became is summarized on stderr at the end.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import dataclasses
import importlib.machinery
import importlib.util
import io
import os
import runpy
import shutil
import sys
import traceback
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.markup import escape

from onnx_modular.api.hook import HookSession, hook
from onnx_modular.cli import common
from onnx_modular.diagnostics import OnnxModularError
from onnx_modular.leaves.errors import fail


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``hook [--functions ...] [--no-dedupe] [--strict] -- PROGRAM ARGS...``."""
    p = common.add_subcommand(subparsers, "hook", run,
                              help="run an export pipeline (optimum-cli, a script, -m module) "
                              "with its torch.onnx exports made hierarchical")
    p.add_argument("--functions", default="all", type=common.functions_option,
                   help="all (default), none, or A,B: module classes, class names or paths")
    p.add_argument("--no-dedupe", action="store_true", help="one function per module call")
    p.add_argument("--strict", action="store_true",
                   help="an export that would stay flat is an error instead of a warning")
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="-- PROGRAM ARGS",
                   help="a console script on PATH, a file.py, or -m module, and its arguments")
    return p


def run(args: argparse.Namespace) -> int:
    """Run the program inside a hook; its exit status is ours."""
    program = list(args.program)
    if program[:1] == ["--"]:
        program = program[1:]
    if not program:
        common.usage_error("hook", "give the program to run after --, e.g. "
                           "'hook -- optimum-cli export onnx --model DIR OUT/'")
    main = _main_of(program)
    try:
        with _as_python_would(main), hook(functions=args.functions,
                                          dedupe=not args.no_dedupe,
                                          strict=args.strict) as session:
            status = _run_as_main(main)
    except _CannotStartError as e:  # python's own one line and status: nothing ran
        print(f"{sys.executable}: {e}", file=sys.stderr)
        return 1
    _summarize(session)
    return status


@dataclasses.dataclass(frozen=True)
class _Main:
    """PROGRAM as python starts it: a module (``-m``) or a script file, and its argv."""

    argv: list[str]
    module: str | None = None
    script: Path | None = None  # absolute, as python makes ``__file__``


class _CannotStartError(Exception):
    """``-m MODULE`` names nothing runnable: python says so in one line and exits 1."""


def _main_of(program: list[str]) -> _Main:
    """How to start PROGRAM as ``__main__``: a module, a script file, or a console script."""
    if program[0] == "-m":
        if len(program) < 2:
            common.usage_error("hook", "-m needs a module name")
        return _Main(program[1:], module=program[1])  # argv[0]: the module's file, later
    target = program[0]
    path = Path(target) if os.sep in target or Path(target).is_file() else None
    if path is None and target.endswith(".py"):
        path = Path(target)  # a script, as python reads it: not looked up on PATH
    if path is None:
        # this interpreter's own scripts first: a venv's console scripts sit beside python
        search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        found = shutil.which(target, path=search)
        if found is None:
            raise fail(f"'{target}' is neither a file nor a program on PATH")
        path = Path(found)
        program = [found, *program[1:]]  # argv[0] as a shell starting it gives it
    if not path.is_file():
        raise fail(f"can't open file '{os.path.abspath(path)}': "
                   f"{'it is not a file' if path.exists() else 'no such file'}")
    if not _is_python(path):
        raise fail(f"'{path}' is not a Python program: the hook acts only in this interpreter "
                   "(run a Python console script, a .py file or -m module)")
    return _Main(program, script=Path(os.path.abspath(path)))


def _is_python(path: Path) -> bool:
    if path.suffix == ".py":
        return True
    try:
        with path.open("rb") as f:
            first = f.readline(256)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


@contextlib.contextmanager
def _as_python_would(main: _Main) -> Iterator[None]:
    """``sys.path`` and ``sys.argv`` as ``python PROGRAM`` sets them, put back after:
    the script's folder (symlinks resolved) or, for ``-m``, the current directory first
    (``python -m onnx_modular`` took that one out for itself); none under ``python -P``."""
    saved_path, saved_entries, saved_argv = sys.path, list(sys.path), sys.argv
    if not sys.flags.safe_path:
        first = os.getcwd() if main.script is None else os.path.dirname(
            os.path.realpath(main.script))
        sys.path.insert(0, first)
    sys.argv = list(main.argv)
    try:
        yield
    finally:
        sys.path = saved_path
        sys.path[:] = saved_entries
        sys.argv = saved_argv


def _run_as_main(main: _Main) -> int:
    """Run as python runs it; SystemExit becomes the status, an exception its traceback
    (the program's frames, as python prints them) and status 1."""
    try:
        if main.module is not None:
            runpy.run_module(_runnable(main.module), run_name="__main__", alter_sys=True)
        else:
            _run_script(main.script)
    except SystemExit as e:
        if e.code is None:
            return 0
        if isinstance(e.code, int):
            return e.code
        print(e.code, file=sys.stderr)
        return 1
    except (OnnxModularError, _CannotStartError):
        raise  # strict=True: one line, exit 2; -m naming nothing: python's line, exit 1
    except Exception as e:  # the program's own failure: its traceback and exit 1
        traceback.print_exception(type(e), e, _program_frames(e.__traceback__))
        return 1
    return 0


def _runnable(module: str) -> str:
    """The module ``python -m module`` runs (``pkg.__main__`` for a package), or
    :class:`_CannotStartError` with python's message; an error raised by a package that is
    imported on the way is the program's own."""
    if module.startswith("."):
        raise _CannotStartError("Relative module names not supported")
    try:
        spec = importlib.util.find_spec(module)
    except ImportError as e:
        if e.name is None or (e.name != module and not module.startswith(e.name + ".")):
            raise  # an import inside a package's __init__ failed: its traceback
        raise _CannotStartError(f"Error while finding module specification for {module!r} "
                           f"({type(e).__name__}: {e})") from e
    except ValueError as e:  # an empty name, or a module without __spec__
        raise _CannotStartError(f"Error while finding module specification for {module!r} "
                           f"({type(e).__name__}: {e})") from e
    if spec is None:
        raise _CannotStartError(f"No module named {module}")
    if spec.submodule_search_locations is not None:
        if module == "__main__" or module.endswith(".__main__"):
            raise _CannotStartError("Cannot use package as __main__ module")
        try:
            _runnable(module + ".__main__")
        except _CannotStartError as e:
            raise _CannotStartError(f"{e}; {module!r} is a package and cannot be directly "
                               "executed") from None
        return module
    if spec.loader is None:
        raise _CannotStartError(f"No code object available for {module}")
    return module


def _run_script(script: Path) -> None:
    """Run a script file in a fresh ``__main__`` module, as python does: ``__file__``
    absolute (as given, not resolved), no ``__spec__``, ``sys.modules['__main__']`` the
    script's own module while it runs (pickle, multiprocessing)."""
    with io.open_code(str(script)) as f:
        source = f.read()
    code = compile(source, str(script), "exec", dont_inherit=True)
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=str(script), __cached__=None, __spec__=None,
                           __package__=None, __builtins__=builtins,
                           __loader__=importlib.machinery.SourceFileLoader("__main__",
                                                                           str(script)))
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    try:
        exec(code, module.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


#: Files whose frames come before the program's: this launcher's and runpy's.
_LAUNCHER_FILES = frozenset({__file__, runpy.run_module.__code__.co_filename})


def _program_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback from the program's first frame on (python shows no launcher frame)."""
    while tb is not None and tb.tb_frame.f_code.co_filename in _LAUNCHER_FILES:
        tb = tb.tb_next
    return tb


def _summarize(session: HookSession) -> None:
    exports = session.exports
    if not exports:
        common.err.print("onnx_modular hook: the program made no torch.onnx export")
    else:
        common.err.print(f"onnx_modular hook: {len(exports)} export(s)")
    for record in exports:
        style = "yellow" if record.flat_reason is not None else "green"
        common.err.print(f"  [{style}]{escape(str(record))}[/{style}]", highlight=False)
    if session.rewrites:  # files a quantizer, optimizer or merge wrote from hierarchical ones
        common.err.print(f"onnx_modular hook: {len(session.rewrites)} file(s) a tool rewrote "
                         "(quantized, optimized, merged), kept hierarchical")
        for record in session.rewrites:
            style = "yellow" if record.flat_reason is not None else "green"
            common.err.print(f"  [{style}]{escape(str(record))}[/{style}]", highlight=False)
