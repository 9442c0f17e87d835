"""Ctrl-C while the command line starts ends it quietly, with exit status 130.

Importing torch takes a second or two, before ``cli.main`` and its handling of
KeyboardInterrupt exist: an interrupt then printed a traceback. Only a command-line run
(``python -m onnx_modular`` or the ``onnx-modular`` script) gets this handler, installed
right after :mod:`onnx_modular.leaves._safepath` has run (``signal`` is imported once the current
directory can no longer shadow it); ``cli.main`` gives Python's own handler back. A library
user's interrupts stay theirs.
"""

import os
import signal
import sys

from onnx_modular.leaves._safepath import PACKAGE, dash_m_target


def _quiet(signum: int, frame: object) -> None:
    """Ends the start-up: SystemExit unwinds the imports without a traceback."""
    sys.stderr.write("interrupted\n")
    sys.stderr.flush()
    raise SystemExit(130)


def is_command_line() -> bool:
    """This process runs the command line (and is still starting it)."""
    if sys.argv and sys.argv[0] == "-m":  # while ``-m`` locates the package
        target = dash_m_target(list(getattr(sys, "orig_argv", [])))
        return target is not None and (target == PACKAGE or target.startswith(PACKAGE + "."))
    return bool(sys.argv) and os.path.basename(sys.argv[0]) in ("onnx-modular",
                                                               "onnx-modular.exe")


def install() -> None:
    """The quiet handler, where Python's default one would print a traceback."""
    try:
        if is_command_line() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _quiet)
    except ValueError:  # not the main thread
        pass


def restore() -> None:
    """Python's handler again, once the command line can catch KeyboardInterrupt itself."""
    try:
        if signal.getsignal(signal.SIGINT) is _quiet:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:
        pass


install()
