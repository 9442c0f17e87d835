"""``inspect``: an ONNX file's module tree, functions and call counts, without running it.

External data is not loaded: the structure is all this needs, and a multi-GB model
inspects as fast as a small one.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from onnx_modular.check.inspect import call_tree, function_table, load_onnx, summary
from onnx_modular.cli import common, paths


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``inspect MODEL.onnx [--json]``."""
    p = common.add_subcommand(subparsers, "inspect", run,
                              help="module/function tree and call counts of an ONNX file")
    p.add_argument("onnx", metavar="MODEL.onnx")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    return p


def run(args: argparse.Namespace) -> int:
    """Print the tree, the function table and the totals (or the totals as JSON)."""
    paths.check_paths(reads={"MODEL.onnx": args.onnx}, files={})
    model = load_onnx(args.onnx, load_external_data=False)
    facts = summary(model)
    if args.json:
        common.out.print_json(json.dumps(facts))
        return common.EXIT_OK
    common.out.print(call_tree(model))
    if model.functions:
        common.out.print(function_table(model))
    common.out.print(f"{facts['functions']} functions, {facts['calls']} call sites, "
                     f"{facts['main_graph_nodes']} main-graph nodes, "
                     f"{facts['function_nodes']} nodes in function bodies")
    if model.functions:
        common.out.print(f"[dim]{FUNCTIONS_UNDONE}[/dim]")
    return common.EXIT_OK


#: What a user of a hierarchical file should know before handing it to another tool.
FUNCTIONS_UNDONE = (
    "Note: ONNX Runtime's quantizer (quantize_dynamic, ORTQuantizer) skips nodes inside "
    "functions, and its transformers optimizer and torch's ONNXProgram.optimize() inline them: "
    "quantize or optimize the flat export (--flat), then 'outline' the result to get the "
    "functions back.")
