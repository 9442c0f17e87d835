"""``compare-io``: run an ONNX model on saved inputs and compare with saved outputs (the
repro ``validate --extract`` writes); exit 0 match, 1 mismatch, 2 usage error."""

from __future__ import annotations

import argparse
from typing import Any

from onnx_modular.check.compare_io import compare_io
from onnx_modular.cli import common, paths


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``compare-io MODEL.onnx INPUTS.npz EXPECTED.npz [--providers ...]``."""
    p = common.add_subcommand(subparsers, "compare-io", run,
                              help="run an ONNX model on saved inputs and compare with saved "
                              "outputs (an extracted repro)")
    p.add_argument("onnx", metavar="MODEL.onnx")
    p.add_argument("inputs", metavar="INPUTS.npz", help="arrays named after the inputs")
    p.add_argument("expected", metavar="EXPECTED.npz", help="arrays named after the outputs")
    common.add_providers(p)
    common.add_tolerances(p)
    common.add_report(p)
    return p


def run(args: argparse.Namespace) -> int:
    """Run and compare; print the report."""
    paths.check_paths(reads={**paths.onnx_files("MODEL.onnx", args.onnx),
                             "INPUTS.npz": args.inputs, "EXPECTED.npz": args.expected},
                      files={"--report": args.report})
    if args.report:
        common.check_report(args.report)
    with common.step("Running and comparing"):
        rep = compare_io(args.onnx, args.inputs, args.expected,
                         providers=common.providers(args.providers), rtol=args.rtol,
                         atol=args.atol)
    return common.finish(rep, rep.ok, args.report)
