"""What every subcommand shares: the consoles, the parser, argument groups, early checks and
the printing of reports with their exit codes.

Shared here so that the same flag means the same thing, is checked the same way, and fails
with the same one line in every subcommand.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from onnx_modular.cli.loading import load_model, resolve_inputs
from onnx_modular.diagnostics import Diagnostic, Level, one_line
from onnx_modular.leaves import _io
from onnx_modular.leaves.errors import fail, rules
from onnx_modular.leaves.runtime import resolve_providers

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE = 0, 1, 2

# Piped into a file or a CI log, rich would assume 80 columns and cut trees and tables.
_WIDTH = None if sys.stdout.isatty() else 160
out = Console(soft_wrap=True, width=_WIDTH)
err = Console(stderr=True, soft_wrap=True, width=_WIDTH)

#: A subcommand's body: parsed arguments in, exit code out.
Run = Callable[[argparse.Namespace], int]


# ---- the parser --------------------------------------------------------------------------------

class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2, like every other user error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        err.print(f"[bold red]error:[/bold red] {self.prog}: {escape(one_line(message))}",
                  highlight=False)
        raise SystemExit(EXIT_USAGE)


def usage_error(command: str, message: str) -> None:
    """A usage error found after parsing (one line, exit 2), as argparse reports its own."""
    err.print(f"[bold red]error:[/bold red] onnx-modular {command}: {escape(message)}",
              highlight=False)
    raise SystemExit(EXIT_USAGE)


def _debug_option() -> argparse.ArgumentParser:
    """``--debug`` and ``--verbose`` after the subcommand too, where users append them.

    SUPPRESS keeps a subcommand given no ``--debug`` from resetting the top-level flag.
    """
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks")
    parent.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="log each stage and pass, and how long it took, on stderr")
    return parent


def add_subcommand(subparsers: Any, name: str, run: Run, help: str) -> argparse.ArgumentParser:
    """A subparser that accepts ``--debug`` and knows its ``run`` (``args.run``)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(name, help=help,
                                                            parents=[_debug_option()])
    parser.set_defaults(run=run)
    return parser


# ---- argument groups -----------------------------------------------------------------------------

def add_model_inputs(parser: argparse.ArgumentParser) -> None:
    """MODEL and its inputs, spelled the same in every subcommand that runs torch."""
    parser.add_argument("model", metavar="MODEL",
                        help="package.module:attr or path/file.py:attr (an nn.Module or a "
                        "factory)")
    parser.add_argument("--inputs", metavar="INPUTS",
                        help="package.module:attr or file.py:attr giving a tuple of tensors "
                        "or (args, kwargs)")
    parser.add_argument("--input", action="append", metavar="SHAPE:DTYPE", dest="random_inputs",
                        help="a random input, e.g. 1x8:int64 (repeat once per input)")
    parser.add_argument("--weights", metavar="PATH",
                        help="safetensors checkpoint (a file, or a directory of shards with "
                        "model.safetensors.index.json) for a MODEL built on the meta device")


def add_providers(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """``--providers``; read with :func:`providers`."""
    parser.add_argument("--providers", help=f"{prefix}cpu,cuda (default: all available)")


def add_report(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """``--report FILE``; check it with :func:`check_report` before the work."""
    parser.add_argument("--report", help=f"{prefix}write the report (.json, .md or .html)")


def tolerance(text: str) -> float:
    """``--rtol``/``--atol``: a finite number >= 0 (``nan`` would let every output pass)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got '{text}'")
    return value


def functions_option(text: str) -> str | list[str]:
    """``--functions all|none|A,B`` -> a ``functions=`` selection; empty is an error, not
    a silently flat export."""
    if text.strip() in ("all", "none"):
        return text.strip()
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give all, none, or module classes/paths A,B")
    return names


def add_tolerances(parser: argparse.ArgumentParser) -> None:
    """``--rtol``/``--atol``, checked when parsed."""
    parser.add_argument("--rtol", type=tolerance, help="relative tolerance (default: by dtype)")
    parser.add_argument("--atol", type=tolerance, help="absolute tolerance (default: by dtype)")


def add_output(parser: argparse.ArgumentParser, help: str) -> None:
    """``-o/--output``, required: a run that writes nothing is not what the user asked for."""
    parser.add_argument("-o", "--output", required=True, help=help)


# ---- checks before the work ----------------------------------------------------------------------

_REPORT_SUFFIXES = (".json", ".md", ".markdown", ".html", ".htm")


def check_writable(path: str) -> None:
    """Fail before the long work, not after it: an empty name, a directory, a missing or
    read-only folder are the same one line the save would give."""
    _io.check_writable(path)


def check_report(path: str) -> None:
    """A report name the report cannot be saved under fails before the long work."""
    check_writable(path)
    if Path(path).suffix.lower() not in _REPORT_SUFFIXES:
        raise fail(f"cannot write report '{path}': use a .json, .md or .html file name",
                   rules.BAD_INPUT)


def providers(text: str | None) -> list[str] | None:
    """``--providers cpu,cuda`` -> full EP names, checked now: an EP this onnxruntime lacks
    fails before the export, not after it. None leaves the choice to the default."""
    if not text:
        return None
    return resolve_providers([p.strip() for p in text.split(",") if p.strip()])


# ---- the work ------------------------------------------------------------------------------------

@contextlib.contextmanager
def step(message: str) -> Iterator[None]:
    """A spinner on stderr while a long step runs, then its duration.

    Both only on a terminal: redirected or captured, stderr then carries nothing but
    errors and warnings, so a user error there is exactly one line.
    """
    start = time.perf_counter()
    message = escape(message)  # it names the user's model and files: not markup
    with err.status(f"{message} ..."):
        yield
    if err.is_terminal:
        err.print(f"[green]✓[/green] {message} "
                  f"[dim]({time.perf_counter() - start:.1f}s)[/dim]", highlight=False)


def load_model_and_inputs(args: argparse.Namespace,
                          ) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """MODEL and its inputs (``--inputs`` or ``--input``) as one step: user code runs here."""
    with step(f"Loading {args.model}"):
        model = load_model(args.model)
        inputs, kwargs = resolve_inputs(args.inputs, args.random_inputs)
    return model, inputs, kwargs


# ---- results -------------------------------------------------------------------------------------

def print_warnings(diagnostics: Sequence[Diagnostic]) -> None:
    """Warnings (e.g. ``--functions`` naming no module) go to stderr, one line each: the
    exit code stays 0, but a selection that matched nothing must not pass silently."""
    for d in diagnostics:
        if d.level in (Level.WARNING, Level.ERROR):
            err.print(f"[yellow]{escape(str(d))}[/yellow]", highlight=False)


def finish(rep: Any, ok: bool, report: str | None) -> int:
    """Print a validate/compare report, save it if asked; 0 when ok, else 1 (a mismatch).

    Errors are not caught here: they reach :func:`onnx_modular.cli.main`, which prints one
    line on stderr (or, with ``--debug``, the traceback) and exits 2.
    """
    out.print(rep)
    if report:
        rep.save(report)
    return EXIT_OK if ok else EXIT_MISMATCH
