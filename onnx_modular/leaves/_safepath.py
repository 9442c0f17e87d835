"""Keep ``python -m onnx_modular`` from importing the current directory's modules.

``python -m`` puts the current directory first on ``sys.path``, so a ``rich.py`` or
``torch.py`` lying there would be imported in place of the library, and run, by a command
such as ``inspect`` that runs no user code at all; the ``onnx-modular`` console script does
not do that. ``onnx_modular/__init__.py`` imports this module before anything else, and
importing it drops that entry while ``-m`` is still locating this package. The command line
adds the directory back only to import a MODEL or INPUTS spec (``pkg.mod:attr``), so both
entry points resolve specs alike. Only ``os`` and ``sys`` are imported here (no
``__future__`` either): Python has loaded them before any directory is searched.
"""

import os
import sys

PACKAGE = __name__.split(".")[0]  # the top-level package, whichever module this is
#: Short options of the interpreter that take an argument (``-c`` ends the options).
_WITH_ARGUMENT = "cmWX"


def dash_m_target(argv: list[str]) -> str | None:
    """The module ``python [options] -m MODULE ...`` runs, from ``sys.orig_argv``."""
    args = iter(argv[1:])
    for arg in args:
        if arg == "--check-hash-based-pycs":
            next(args, None)
            continue
        if arg.startswith("--") and arg != "--":
            continue  # a long option without an argument
        if not arg.startswith("-") or arg in ("-", "--"):
            return None  # a script, stdin, or the end of the options
        for i, flag in enumerate(arg[1:], start=2):
            if flag not in _WITH_ARGUMENT:
                continue
            value = arg[i:] or next(args, None)
            if flag == "m":
                return value
            if flag == "c":
                return None
            break  # -W / -X and their argument
    return None


def drop_working_directory() -> bool:
    """Remove the entry ``-m`` put first on ``sys.path`` when it is running this package."""
    if sys.flags.safe_path or not sys.argv or sys.argv[0] != "-m":
        return False  # -P, or not while ``-m`` locates its module
    target = dash_m_target(list(getattr(sys, "orig_argv", [])))
    if target is None or (target != PACKAGE and not target.startswith(PACKAGE + ".")):
        return False
    if sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]
        return True
    return False


drop_working_directory()
