"""``hook -- PROGRAM ARGS...``: run an unchanged export pipeline with ``om.hook`` active.

PROGRAM runs in this interpreter, so its ``torch.onnx.export`` calls are the hooked ones: a
console script on PATH (``optimum-cli``), a ``file.py``, or ``-m module``. Its exit status
is passed through; what each export became is summarized on stderr at the end.
"""

from __future__ import annotations

import argparse
import os
import runpy
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any

from rich.markup import escape

from onnx_modular.api.hook import HookSession, hook
from onnx_modular.cli import common
from onnx_modular.diagnostics import OnnxModularError
from onnx_modular.errors import fail


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
    start = _starter(program)
    with hook(functions=args.functions, dedupe=not args.no_dedupe,
              strict=args.strict) as session:
        status = _run_as_main(start, program)
    _summarize(session)
    return status


def _starter(program: list[str]) -> Any:
    """How to start PROGRAM as ``__main__``: a module, a script file, or a console script."""
    if program[0] == "-m":
        if len(program) < 2:
            common.usage_error("hook", "-m needs a module name")
        module = program[1]
        del program[0]  # argv[0] becomes the module name, as python -m shows it
        return lambda: runpy.run_module(module, run_name="__main__", alter_sys=True)
    target = program[0]
    path = Path(target) if os.sep in target or Path(target).is_file() else None
    if path is None:
        # this interpreter's own scripts first: a venv's console scripts sit beside python
        search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        found = shutil.which(target, path=search)
        if found is None:
            raise fail(f"'{target}' is neither a file nor a program on PATH")
        path = Path(found)
    if not path.is_file():
        raise fail(f"'{target}' is not a file")
    if not _is_python(path):
        raise fail(f"'{path}' is not a Python program: the hook acts only in this interpreter "
                   "(run a Python console script, a .py file or -m module)")
    return lambda: runpy.run_path(str(path), run_name="__main__")


def _is_python(path: Path) -> bool:
    if path.suffix == ".py":
        return True
    try:
        with path.open("rb") as f:
            first = f.readline(256)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def _run_as_main(start: Any, argv: list[str]) -> int:
    """Run with ``sys.argv`` = the program's; SystemExit becomes the status, as Python does."""
    saved = sys.argv
    sys.argv = argv
    try:
        start()
    except SystemExit as e:
        if e.code is None:
            return 0
        if isinstance(e.code, int):
            return e.code
        print(e.code, file=sys.stderr)
        return 1
    except OnnxModularError:
        raise  # strict=True: one line, exit 2
    except Exception:  # the program's own failure: its traceback and exit 1, as python shows it
        traceback.print_exc()
        return 1
    finally:
        sys.argv = saved
    return 0


def _summarize(session: HookSession) -> None:
    exports = session.exports
    if not exports:
        common.err.print("onnx_modular hook: the program made no torch.onnx export")
        return
    common.err.print(f"onnx_modular hook: {len(exports)} export(s)")
    for record in exports:
        style = "yellow" if record.flat_reason is not None else "green"
        common.err.print(f"  [{style}]{escape(str(record))}[/{style}]", highlight=False)
