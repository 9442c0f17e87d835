"""``compare``: two ONNX models' structure and outputs; exit 0 equivalent, 1 differs."""

from __future__ import annotations

import argparse
from typing import Any

from onnx_modular.check.compare import compare
from onnx_modular.cli import common, paths
from onnx_modular.cli.loading import load_inputs


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``compare A.onnx B.onnx [--inputs INPUTS] [--report FILE]``."""
    p = common.add_subcommand(subparsers, "compare", run,
                              help="structure and numerics of two ONNX models")
    p.add_argument("a", metavar="A.onnx")
    p.add_argument("b", metavar="B.onnx")
    p.add_argument("--inputs", help="package.module:attr or file.py:attr (default: random)")
    common.add_report(p)
    return p


def run(args: argparse.Namespace) -> int:
    """Compare on the given inputs (or random ones) and print the report."""
    paths.check_paths(reads={**paths.onnx_files("A.onnx", args.a),
                             **paths.onnx_files("B.onnx", args.b),
                             "--inputs": paths.spec_file(args.inputs) or args.inputs},
                      files={"--report": args.report})
    if args.report:
        common.check_report(args.report)
    inputs, kwargs = load_inputs(args.inputs) if args.inputs is not None else (None, {})
    with common.step("Comparing"):
        rep = compare(args.a, args.b, inputs, kwargs=kwargs)
    return common.finish(rep, rep.equivalent, args.report)
