"""``export``: a model to hierarchical (or flat) ONNX, optionally validated right after.

Every flag is checked before the export starts (output directory, SARIF and report names,
providers): an export can take minutes, and a typo should not cost them.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from onnx_modular.api.export import ExportResult, export
from onnx_modular.check.inspect import summary
from onnx_modular.check.validate import validate
from onnx_modular.cli import common, paths
from onnx_modular.cli.dynamic import add_dynamic, dynamic_shapes
from onnx_modular.diagnostics import DiagnosticContext, OnnxModularError
from onnx_modular.leaves._io import write_sarif
from onnx_modular.leaves.errors import fail, rules
from onnx_modular.lower.translate import check_opset


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``export MODEL --inputs INPUTS -o out.onnx [...]``."""
    p = common.add_subcommand(subparsers, "export", run,
                              help="export hierarchical (or flat) ONNX")
    common.add_model_inputs(p)
    common.add_output(p, "the .onnx file to write")
    add_dynamic(p)
    p.add_argument("--input-names", type=_names, metavar="A,B",
                   help="names of the file's first inputs (torch's otherwise)")
    p.add_argument("--output-names", type=_names, metavar="A,B",
                   help="names of the file's first outputs, e.g. logits")
    p.add_argument("--flat", action="store_true", help="no functions (same as --functions none)")
    p.add_argument("--functions", default="all",
                   help="all | none | comma-separated classes, class names or module paths")
    p.add_argument("--no-dedupe", action="store_true", help="one function per call")
    p.add_argument("--opset", type=int, default=None)
    p.add_argument("--validate", action="store_true", help="validate against ONNX Runtime after")
    common.add_providers(p, "for --validate: ")
    common.add_report(p, "for --validate: ")
    p.add_argument("--sarif", help="write the diagnostics as SARIF 2.1.0")
    return p


def run(args: argparse.Namespace) -> int:
    """Export, write, summarize; with ``--validate``, the report's exit code."""
    if not args.validate and (args.report or args.providers):
        flag = "--report" if args.report else "--providers"
        raise fail(f"{flag} applies to the validation: add --validate", rules.BAD_INPUT)
    paths.check_paths(
        reads={"MODEL": paths.spec_file(args.model), "--inputs": paths.spec_file(args.inputs)},
        files={"-o": args.output, "--sarif": args.sarif, "--report": args.report})
    if not args.functions.strip(" ,"):
        raise fail("--functions is empty: give all, none, or classes, class names or module "
                   "paths", rules.BAD_INPUT)
    common.check_writable(args.output)
    if args.sarif is not None:
        common.check_writable(args.sarif)
    if args.report:
        common.check_report(args.report)
    providers = common.providers(args.providers)
    ctx = DiagnosticContext()
    try:
        check_opset(args.opset, flat=_functions(args) == "none")
        model, inputs, kwargs = common.load_model_and_inputs(args)
        dynamic = dynamic_shapes(args.dynamic, model, inputs, kwargs)
        start = time.perf_counter()
        with common.step("Exporting (capture, translate, outline, optimize)"):
            result = export(model, inputs, kwargs or None, functions=_functions(args),
                            dedupe=not args.no_dedupe, dynamic_shapes=dynamic,
                            opset=args.opset, weights=args.weights,
                            input_names=args.input_names, output_names=args.output_names,
                            ctx=ctx)
    except OnnxModularError as e:
        if args.sarif:  # CI reads the failure and its file:line from the log
            ctx.record_failure(e)  # (those before the export, and the export's own, once)
            with contextlib.suppress(OnnxModularError):
                write_sarif(ctx.diagnostics, args.sarif)
        raise
    with common.step(f"Writing {args.output}"):
        result.save(args.output)
    elapsed = time.perf_counter() - start
    common.print_warnings(result.diagnostics)
    if args.sarif:
        try:
            write_sarif(list(result.diagnostics), args.sarif)
        except OnnxModularError as e:  # the model is in place: say so, not "nothing"
            raise fail(f"{e.diagnostic.message}; the model {args.output} was written, "
                       "only the SARIF log is missing", rules.BAD_INPUT) from e
    common.out.print(summary_table(result, args.output, elapsed))
    if not args.validate:
        return common.EXIT_OK
    with common.step("Validating against ONNX Runtime"):
        rep = validate(model, inputs, args.output, kwargs=kwargs, providers=providers,
                       weights=args.weights)
    return common.finish(rep, rep.ok, args.report)


def _names(text: str) -> list[str]:
    """``--input-names``/``--output-names``: comma-separated, none empty."""
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"'{text}' holds an empty name")
    return names


def _functions(args: argparse.Namespace) -> str | list[str]:
    """``--flat`` / ``--functions`` -> the ``functions=`` argument of :func:`export`."""
    if args.flat or args.functions == "none":
        return "none"
    if args.functions == "all":
        return "all"
    return [f.strip() for f in args.functions.split(",") if f.strip()]


def summary_table(result: ExportResult, output: str, elapsed: float) -> Table:
    """What was written, in the numbers a user checks first (functions vs call sites)."""
    facts = summary(result.model_proto)
    table = Table(title=Text(f"Exported {output}"), show_header=False)
    for key, value in [
        ("functions", facts["functions"]), ("call sites", facts["calls"]),
        ("main graph nodes", facts["main_graph_nodes"]),
        ("nodes in function bodies", facts["function_nodes"]),
        ("file size", f"{Path(output).stat().st_size / 1e6:.2f} MB"),
        ("time", f"{elapsed:.1f} s"),
    ]:
        table.add_row(key, str(value))
    return table
