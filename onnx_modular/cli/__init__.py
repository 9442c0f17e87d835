"""``python -m onnx_modular`` / ``onnx-modular``: export, split, validate, compare, inspect.

Each subcommand does one thing. User errors print one line and exit non-zero (2 for bad
usage or unreadable input; ``validate``/``compare`` use 1 for a numerical mismatch);
``--debug`` shows the traceback instead. Files are written atomically: a failure leaves none.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from onnx_modular.diagnostics import OnnxModularError

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE = 0, 1, 2

# Piped into a file or a CI log, rich would assume 80 columns and cut trees and tables.
_WIDTH = None if sys.stdout.isatty() else 160
out = Console(soft_wrap=True, width=_WIDTH)
err = Console(stderr=True, soft_wrap=True, width=_WIDTH)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        err.print(f"[bold red]error:[/bold red] {self.prog}: {escape(message)}", highlight=False)
        raise SystemExit(EXIT_USAGE)


@contextlib.contextmanager
def _step(message: str) -> Iterator[None]:
    """A spinner on stderr while a long step runs, then its duration.

    Both only on a terminal: redirected or captured, stderr then carries nothing but
    errors and warnings, so a user error there is exactly one line.
    """
    start = time.perf_counter()
    with err.status(f"{message} ..."):
        yield
    if err.is_terminal:
        err.print(f"[green]✓[/green] {message} "
                  f"[dim]({time.perf_counter() - start:.1f}s)[/dim]", highlight=False)


def _add_model_inputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL",
                   help="package.module:attr or path/file.py:attr (an nn.Module or a factory)")
    p.add_argument("--inputs", metavar="INPUTS",
                   help="package.module:attr or file.py:attr giving a tuple of tensors "
                   "or (args, kwargs)")
    p.add_argument("--input", action="append", metavar="SHAPE:DTYPE", dest="random_inputs",
                   help="a random input, e.g. 1x8:int64 (repeat once per input)")


def _providers(text: str | None) -> list[str] | None:
    """``--providers cpu,cuda`` -> full EP names, checked now: an EP this onnxruntime lacks
    fails before the export, not after it."""
    if not text:
        return None
    from onnx_modular.runtime import resolve_providers

    return resolve_providers([p.strip() for p in text.split(",") if p.strip()])


_REPORT_SUFFIXES = (".json", ".md", ".markdown", ".html", ".htm")


def _check_report(path: str) -> None:
    """A report name the report cannot be saved under fails before the long work."""
    from onnx_modular.cli.loading import user_error

    _check_writable(path)
    if Path(path).suffix.lower() not in _REPORT_SUFFIXES:
        raise user_error(f"cannot write report '{path}': use a .json, .md or .html file name")


def _print_warnings(diagnostics: Sequence[Any]) -> None:
    """Warnings (e.g. ``--functions`` naming no module) go to stderr, one line each: the
    exit code stays 0, but a selection that matched nothing must not pass silently."""
    from onnx_modular.diagnostics import Level

    for d in diagnostics:
        if d.level in (Level.WARNING, Level.ERROR):
            err.print(f"[yellow]{escape(str(d))}[/yellow]", highlight=False)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="onnx-modular", description=__doc__.splitlines()[0].replace("``", ""))
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    # ``--debug`` is also accepted after the subcommand, where users append it; SUPPRESS
    # keeps a subcommand without it from resetting the top-level flag to False.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("export", help="export hierarchical (or flat) ONNX",
                       parents=[common])
    _add_model_inputs(p)
    p.add_argument("-o", "--output", required=True, help="the .onnx file to write")
    p.add_argument("--flat", action="store_true", help="no functions (same as --functions none)")
    p.add_argument("--functions", default="all",
                   help="all | none | comma-separated classes, class names or module paths")
    p.add_argument("--no-dedupe", action="store_true", help="one function per call")
    p.add_argument("--opset", type=int, default=None)
    p.add_argument("--validate", action="store_true", help="validate against ONNX Runtime after")
    p.add_argument("--providers", help="for --validate: cpu,cuda (default: all available)")
    p.add_argument("--report", help="for --validate: write the report (.json or .md)")
    p.add_argument("--sarif", help="write the diagnostics as SARIF 2.1.0")

    p = sub.add_parser("split", help="split into accelerator/CPU regions or pipeline stages",
                       parents=[common])
    _add_model_inputs(p)
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--acc-ops", metavar="FILE", help="file listing supported aten ops")
    how.add_argument("--acc-ep", metavar="NAME", help="ONNX Runtime execution provider name")
    how.add_argument("--split-points", metavar="P",
                     help="pipeline stages, e.g. 'h.4:beginning,h.9:end'")
    how.add_argument("--markers", action="store_true",
                     help="pipeline stages at the model's om.pipe_split() markers")
    p.add_argument("--min-acc-size", type=int, default=1)
    p.add_argument("--max-acc-splits", type=int, default=-1)
    p.add_argument("--preview", action="store_true", help="print the support/region preview")
    p.add_argument("-o", "--output", required=True, help="the directory to write")

    p = sub.add_parser("validate", help="compare torch eager with ONNX Runtime",
                       parents=[common])
    _add_model_inputs(p)
    p.add_argument("onnx", metavar="MODEL.onnx")
    p.add_argument("--providers", help="cpu,cuda (default: all available)")
    p.add_argument("--rtol", type=float)
    p.add_argument("--atol", type=float)
    p.add_argument("--report", help="write the report (.json or .md)")
    _add_repro_flags(p)

    p = sub.add_parser("compare-io", help="run an ONNX model on saved inputs and compare "
                       "with saved outputs (an extracted repro)", parents=[common])
    p.add_argument("onnx", metavar="MODEL.onnx")
    p.add_argument("inputs", metavar="INPUTS.npz", help="arrays named after the inputs")
    p.add_argument("expected", metavar="EXPECTED.npz", help="arrays named after the outputs")
    p.add_argument("--providers", help="cpu,cuda (default: all available)")
    p.add_argument("--rtol", type=float)
    p.add_argument("--atol", type=float)
    p.add_argument("--report", help="write the report (.json or .md)")

    p = sub.add_parser("compare", help="structure and numerics of two ONNX models",
                       parents=[common])
    p.add_argument("a", metavar="A.onnx")
    p.add_argument("b", metavar="B.onnx")
    p.add_argument("--inputs", help="package.module:attr or file.py:attr (default: random)")
    p.add_argument("--report", help="write the report (.json or .md)")

    p = sub.add_parser("inspect", help="module/function tree and call counts of an ONNX file",
                       parents=[common])
    p.add_argument("onnx", metavar="MODEL.onnx")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    return parser


# ---- subcommands -----------------------------------------------------------------------------

def _load(args: argparse.Namespace) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    from onnx_modular.cli.loading import load_model, resolve_inputs

    with _step(f"Loading {args.model}"):
        model = load_model(args.model)
        inputs, kwargs = resolve_inputs(args.inputs, args.random_inputs)
    return model, inputs, kwargs


def _check_writable(path: str) -> None:
    """Fail before the long work, not after it."""
    from onnx_modular.cli.loading import user_error

    directory = Path(path).parent
    if not directory.is_dir():
        raise user_error(f"cannot write '{path}': directory '{directory}' does not exist")
    if not os.access(directory, os.W_OK):
        raise user_error(f"cannot write '{path}': directory '{directory}' is not writable")


def _functions(args: argparse.Namespace) -> Any:
    if args.flat or args.functions == "none":
        return "none"
    if args.functions == "all":
        return "all"
    return [f.strip() for f in args.functions.split(",") if f.strip()]


def cmd_export(args: argparse.Namespace) -> int:
    import onnx_modular as om
    from onnx_modular.check.inspect import summary
    from onnx_modular.cli.loading import user_error

    if not args.validate and (args.report or args.providers):
        flag = "--report" if args.report else "--providers"
        raise user_error(f"{flag} applies to the validation: add --validate")
    _check_writable(args.output)
    if args.sarif:
        _check_writable(args.sarif)
    if args.report:
        _check_report(args.report)
    providers = _providers(args.providers)
    model, inputs, kwargs = _load(args)
    start = time.perf_counter()
    with _step("Exporting (capture, translate, outline, optimize)"):
        result = om.export(model, inputs, kwargs or None, functions=_functions(args),
                           dedupe=not args.no_dedupe, opset=args.opset)
    with _step(f"Writing {args.output}"):
        result.save(args.output)
    elapsed = time.perf_counter() - start
    _print_warnings(result.diagnostics)
    if args.sarif:
        from onnx_modular.diagnostics import write_sarif

        write_sarif(list(result.diagnostics), args.sarif)
    facts = summary(result.model_proto)
    table = Table(title=f"Exported {args.output}", show_header=False)
    for key, value in [
        ("functions", facts["functions"]), ("call sites", facts["calls"]),
        ("main graph nodes", facts["main_graph_nodes"]),
        ("nodes in function bodies", facts["function_nodes"]),
        ("file size", f"{Path(args.output).stat().st_size / 1e6:.2f} MB"),
        ("time", f"{elapsed:.1f} s"),
    ]:
        table.add_row(key, str(value))
    out.print(table)
    if not args.validate:
        return EXIT_OK
    from onnx_modular.check.validate import validate

    with _step("Validating against ONNX Runtime"):
        rep = validate(model, inputs, args.output, kwargs=kwargs, providers=providers)
    return _finish(rep, rep.ok, args.report)


def _finish(rep: Any, ok: bool, report: str | None) -> int:
    """Print a validate/compare report, save it if asked; 0 when ok, else 1 (a mismatch).

    Errors are not caught here: they reach :func:`main`, which prints one line on stderr
    (or, with ``--debug``, the traceback) and exits 2.
    """
    out.print(rep)
    if report:
        rep.save(report)
    return EXIT_OK if ok else EXIT_MISMATCH


def cmd_split(args: argparse.Namespace) -> int:
    import onnx_modular as om

    model, inputs, kwargs = _load(args)
    with _step("Splitting"):
        if args.split_points or args.markers:
            points = _parse_split_points(args.split_points) if args.split_points else None
            parts = om.split_stages(model, inputs, split_points=points, kwargs=kwargs or None)
        else:
            if args.acc_ops:
                from onnx_modular.support.operator_support import load_support_file

                support: Any = load_support_file(args.acc_ops)
            else:
                support = args.acc_ep if args.acc_ep.startswith("ort:") else f"ort:{args.acc_ep}"
            parts = om.split(model, inputs, support=support, kwargs=kwargs or None,
                             min_acc_module_size=args.min_acc_size,
                             max_acc_splits=args.max_acc_splits)
    if args.markers and len(parts.stages) < 2:
        from onnx_modular.cli.loading import user_error

        raise user_error(f"--markers: {args.model} has no om.pipe_split() marker that cuts "
                         "its forward(); add om.pipe_split() calls or use --split-points")
    _print_warnings(getattr(parts, "diagnostics", ()))
    if args.preview and hasattr(parts, "preview"):
        parts.preview(console=out)
    with _step(f"Writing {args.output}"):
        parts.save(args.output)
    regions = getattr(parts, "regions", None) or getattr(parts, "stages", [])
    out.print(f"{len(regions)} part(s) and manifest.json written to {args.output}")
    return EXIT_OK


def _parse_split_points(text: str) -> dict[str, str]:
    from onnx_modular.cli.loading import user_error

    points: dict[str, str] = {}
    for item in text.split(","):
        path, _, where = item.strip().partition(":")
        where = where or "beginning"
        if not path or where not in ("beginning", "end"):
            raise user_error(f"bad split point '{item}': expected PATH:beginning or PATH:end")
        points[path] = where
    return points


def _add_repro_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--extract", metavar="DIR",
                   help="write a repro of the first diverging module call (module.onnx, "
                   "inputs.npz, expected.npz, README.md) into DIR")
    p.add_argument("--call", metavar="CALL",
                   help="with --extract: the module call to extract (e.g. h.17.attn)")
    p.add_argument("--node-data", metavar="FILE",
                   help="write the errors per module as Model Explorer node data (.json)")


def _check_repro_flags(args: argparse.Namespace) -> None:
    """Flags that cannot work fail before the long work."""
    from onnx_modular.cli.loading import user_error

    if args.call and not args.extract:
        raise user_error("--call names the module call to extract: add --extract DIR")
    if args.extract:
        target = Path(args.extract)
        if target.exists() and not target.is_dir():
            raise user_error(f"--extract: '{target}' is a file, not a directory")
        _check_writable(str(target))
    if args.node_data:
        _check_writable(args.node_data)


def _repro(rep: Any, args: argparse.Namespace) -> None:
    """After the report: the overlay, and the extracted repro with the command to run it."""
    if args.node_data:
        rep.save(args.node_data, format="model-explorer")
        out.print(f"Model Explorer overlay: {args.node_data} (model-explorer {args.onnx} "
                  f"--extensions model_explorer_onnx --node_data_paths {args.node_data})",
                  highlight=False)
    if not args.extract or (rep.ok and not args.call):
        if args.extract:
            out.print("Nothing extracted: every output matches torch (name a call with "
                      "--call to extract one anyway).", highlight=False)
        return
    if not rep.ok and rep.localization is not None and rep.localization.first is None \
            and not args.call:
        out.print(f"Nothing extracted: {rep.localization.note or 'no module call diverges'}",
                  highlight=False)
        return
    with _step(f"Extracting into {args.extract}"):
        x = rep.extract(args.extract, call=args.call)
    out.print(f"[bold]{escape(str(x))}[/bold]")
    out.print(f"Extracted {x.call_id} to {x.directory}/ (module.onnx, inputs.npz, "
              "expected.npz, README.md)", highlight=False)
    out.print(f"Reproduce with: {x.command}", highlight=False, soft_wrap=True)


def cmd_validate(args: argparse.Namespace) -> int:
    from onnx_modular.check.validate import validate
    from onnx_modular.runtime import load_model

    if args.report:
        _check_report(args.report)
    _check_repro_flags(args)
    providers = _providers(args.providers)
    loaded = load_model(args.onnx)  # a corrupt file fails here, before the model is built
    model, inputs, kwargs = _load(args)
    with _step("Validating against ONNX Runtime"):
        rep = validate(model, inputs, loaded, kwargs=kwargs,
                       providers=providers, rtol=args.rtol, atol=args.atol)
    code = _finish(rep, rep.ok, args.report)
    _repro(rep, args)
    return code


def cmd_compare_io(args: argparse.Namespace) -> int:
    from onnx_modular.check.compare_io import compare_io

    if args.report:
        _check_report(args.report)
    with _step("Running and comparing"):
        rep = compare_io(args.onnx, args.inputs, args.expected,
                         providers=_providers(args.providers), rtol=args.rtol, atol=args.atol)
    return _finish(rep, rep.ok, args.report)


def cmd_compare(args: argparse.Namespace) -> int:
    from onnx_modular.check.compare import compare

    if args.report:
        _check_report(args.report)
    inputs = None
    if args.inputs:
        from onnx_modular.cli.loading import load_inputs

        inputs = load_inputs(args.inputs)[0]
    with _step("Comparing"):
        rep = compare(args.a, args.b, inputs)
    return _finish(rep, rep.equivalent, args.report)


def cmd_inspect(args: argparse.Namespace) -> int:
    from onnx_modular.check.inspect import call_tree, function_table, load_onnx, summary

    model = load_onnx(args.onnx, load_external_data=False)
    if args.json:
        out.print_json(json.dumps(summary(model)))
        return EXIT_OK
    out.print(call_tree(model))
    if model.functions:
        out.print(function_table(model))
    facts = summary(model)
    out.print(f"{facts['functions']} functions, {facts['calls']} call sites, "
              f"{facts['main_graph_nodes']} main-graph nodes, "
              f"{facts['function_nodes']} nodes in function bodies")
    return EXIT_OK


COMMANDS = {"export": cmd_export, "split": cmd_split, "validate": cmd_validate,
            "compare-io": cmd_compare_io, "compare": cmd_compare, "inspect": cmd_inspect}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (OnnxModularError, FileNotFoundError, PermissionError, IsADirectoryError) as e:
        if args.debug:
            raise
        message = str(e) if isinstance(e, OnnxModularError) else f"error: {e}"
        err.print(f"[bold red]{escape(message)}[/bold red]", highlight=False)
        return EXIT_USAGE
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
