"""``validate``: torch eager against ONNX Runtime on each provider; exit 1 on a mismatch.

The ONNX file is read before the model is built, so a corrupt file fails in a second, not
after the user's model has been constructed.
"""

from __future__ import annotations

import argparse
from typing import Any

from onnx_modular.check.validate import validate
from onnx_modular.cli import common
from onnx_modular.runtime import load_model


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``validate MODEL --inputs INPUTS MODEL.onnx [--providers ...] [--rtol X] [--atol X]``."""
    p = common.add_subcommand(subparsers, "validate", run,
                              help="compare torch eager with ONNX Runtime")
    common.add_model_inputs(p)
    p.add_argument("onnx", metavar="MODEL.onnx")
    common.add_providers(p)
    common.add_tolerances(p)
    common.add_report(p)
    return p


def run(args: argparse.Namespace) -> int:
    """Validate and print the report: 0 when every output matches, 1 when one does not."""
    if args.report:
        common.check_report(args.report)
    providers = common.providers(args.providers)
    loaded = load_model(args.onnx)  # a corrupt file fails here, before the model is built
    model, inputs, kwargs = common.load_model_and_inputs(args)
    with common.step("Validating against ONNX Runtime"):
        rep = validate(model, inputs, loaded, kwargs=kwargs,
                       providers=providers, rtol=args.rtol, atol=args.atol)
    return common.finish(rep, rep.ok, args.report)
