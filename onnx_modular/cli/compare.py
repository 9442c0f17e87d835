"""``compare``: two ONNX models' structure and outputs; exit 0 equivalent, 1 differs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.markup import escape

from onnx_modular.check.compare import CompareReport, compare
from onnx_modular.check.inspect import load_onnx
from onnx_modular.check.module_diff import node_data
from onnx_modular.cli import common, paths
from onnx_modular.cli.loading import load_inputs
from onnx_modular.leaves._io import atomic_write_text
from onnx_modular.leaves.errors import fail, rules


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``compare A.onnx B.onnx [--inputs INPUTS] [--report FILE]``."""
    p = common.add_subcommand(subparsers, "compare", run,
                              help="structure and numerics of two ONNX models")
    p.add_argument("a", metavar="A.onnx")
    p.add_argument("b", metavar="B.onnx")
    p.add_argument("--inputs", help="package.module:attr or file.py:attr (default: random)")
    common.add_report(p)
    p.add_argument("--node-data", metavar="FILE",
                   help="write each module call's own error as Model Explorer node data for "
                   "B.onnx (where both models name their modules)")
    return p


def run(args: argparse.Namespace) -> int:
    """Compare on the given inputs (or random ones) and print the report."""
    paths.check_paths(reads={**paths.onnx_files("A.onnx", args.a),
                             **paths.onnx_files("B.onnx", args.b),
                             "--inputs": paths.spec_file(args.inputs) or args.inputs},
                      files={"--report": args.report, "--node-data": args.node_data})
    if args.report:
        common.check_report(args.report)
    if args.node_data:
        common.check_writable(args.node_data)
    inputs, kwargs = load_inputs(args.inputs) if args.inputs is not None else (None, {})
    with common.step("Comparing"):
        rep = compare(args.a, args.b, inputs, kwargs=kwargs)
    if args.node_data:
        _write_node_data(rep, args.b, args.node_data)
    return common.finish(rep, rep.equivalent, args.report)


def _write_node_data(rep: CompareReport, b: str, path: str) -> None:
    if rep.modules is None or not rep.modules.rows:
        why = rep.modules.note if rep.modules is not None else "model a or b names no modules"
        raise fail(f"--node-data: no module table to draw ({why})", rules.BAD_INPUT)
    data = node_data(load_onnx(b, load_external_data=False), rep.modules)
    atomic_write_text(Path(path), json.dumps(data, indent=1))
    common.out.print(escape(f"Model Explorer overlay: {path} (model-explorer {b} --extensions "
                            f"model_explorer_onnx --node_data_paths {path})"))
