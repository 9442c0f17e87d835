"""``python -m onnx_modular`` / ``onnx-modular``: export, split, validate, compare, outline, hook.

Each subcommand does one thing, in its own module (``add_parser`` and ``run``); what they
share lives in :mod:`~onnx_modular.cli.common`. User errors print one line and exit 2
(``validate``/``compare`` use 1 for a numerical mismatch); ``--debug`` shows the whole
chained traceback instead; ``--verbose`` logs each stage and pass with its duration.
Files are written atomically: a failure leaves none.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence

from rich.markup import escape

from onnx_modular.cli import (
    common,
    compare,
    compare_io,
    export,
    hook,
    inspect,
    outline,
    split,
    triton_run,
    validate,
)
from onnx_modular.diagnostics import OnnxModularError
from onnx_modular.leaves import _interrupt, _log

__all__ = ["build_parser", "main"]

#: In the order ``--help`` lists them: the pipeline's, then the tools'.
_SUBCOMMANDS = (export, split, validate, compare, compare_io, inspect, outline, hook,
                triton_run)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; each subcommand adds its own parser."""
    parser = common.Parser(prog="onnx-modular",
                           description=__doc__.splitlines()[0].replace("``", ""))
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log each stage and pass, and how long it took, on stderr")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=common.Parser)
    for command in _SUBCOMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; a user error becomes one line on stderr and exit code 2.

    With ``--debug`` the error is re-raised as it is, so Python prints the whole chain,
    down to the user's own frames (errors keep their cause with ``raise ... from e``).
    """
    _interrupt.restore()  # everything is imported: KeyboardInterrupt is caught below
    try:
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt:
        common.err.print("interrupted")
        return 130
    with _log.shown_on(sys.stderr) if args.verbose else contextlib.nullcontext():
        try:
            return args.run(args)
        except (OnnxModularError, OSError) as e:  # OSError: a path no early check foresaw
            if args.debug:
                raise
            message = str(e) if isinstance(e, OnnxModularError) else f"error: {e}"
            common.err.print(f"[bold red]{escape(message)}[/bold red]", highlight=False)
            return common.EXIT_USAGE
        except KeyboardInterrupt:
            common.err.print("interrupted")
            return 130
