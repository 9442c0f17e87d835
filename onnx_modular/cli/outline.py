"""``outline``: the module hierarchy back in an ONNX file a tool flattened or rewrote.

Quantizers, ONNX Runtime's transformers optimizer, fp16 converters, slimmers and the version
converter work on flat models (or inline the functions they are given); ``outline`` rebuilds
the hierarchy from the module labels torch.onnx left on every node (:func:`om.outline`).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from onnx_modular.api.outline import outline
from onnx_modular.cli import common, paths
from onnx_modular.cli.export import summary_table
from onnx_modular.leaves.errors import fail, rules


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``outline IN.onnx -o OUT.onnx [--functions ...] [--no-dedupe] [--reference REF]``."""
    p = common.add_subcommand(subparsers, "outline", run,
                              help="rebuild the module functions of a flat or tool-rewritten "
                              "ONNX file from its module labels")
    p.add_argument("onnx", metavar="IN.onnx")
    common.add_output(p, "the hierarchical .onnx file to write")
    p.add_argument("--functions", default="all", type=common.functions_option,
                   help="all (default), or A,B: module classes, class names or paths")
    p.add_argument("--no-dedupe", action="store_true", help="one function per call")
    p.add_argument("--reference", metavar="REF.onnx",
                   help="for a tool that drops node metadata (onnxsim, onnxslim, the version "
                   "converter, ORT's optimized model): the labelled file that tool read")
    return p


def run(args: argparse.Namespace) -> int:
    """Outline, write, summarize."""
    paths.check_paths(reads={"IN.onnx": args.onnx, "--reference": args.reference},
                      files={"-o": args.output})
    if args.functions == "none":
        raise fail("--functions none would write the flat model back: give all, or "
                   "classes, class names or module paths", rules.BAD_INPUT)
    common.check_writable(args.output)
    start = time.perf_counter()
    with common.step(f"Outlining {args.onnx}"):
        result = outline(args.onnx, functions=args.functions, dedupe=not args.no_dedupe,
                         reference=args.reference)
    with common.step(f"Writing {args.output}"):
        result.save(args.output)
    common.print_warnings(result.diagnostics)
    common.out.print(summary_table(result, args.output, time.perf_counter() - start))
    return common.EXIT_OK
