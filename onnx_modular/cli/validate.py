"""``validate``: torch eager against ONNX Runtime on each provider; exit 1 on a mismatch.

The ONNX file is read before the model is built, so a corrupt file fails in a second, not
after the user's model has been constructed.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape

from onnx_modular.check.extract import check_directory
from onnx_modular.check.validate import Validation, ValidationReport, parts_directory
from onnx_modular.check.validation_report import write_node_data
from onnx_modular.cli import common, paths
from onnx_modular.leaves.errors import fail, rules
from onnx_modular.leaves.runtime import load_model
from onnx_modular.parts.manifest import load_manifest


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``validate MODEL --inputs INPUTS MODEL.onnx [--providers ...] [--rtol X] [--atol X]
    [--localize]``."""
    p = common.add_subcommand(subparsers, "validate", run,
                              help="compare torch eager with ONNX Runtime")
    common.add_model_inputs(p)
    p.add_argument("onnx", metavar="MODEL.onnx",
                   help="the ONNX file, or a parts directory (manifest.json) a split or "
                   "stages save wrote, checked end to end")
    common.add_providers(p)
    common.add_tolerances(p)
    common.add_report(p)
    p.add_argument("--localize", action="store_true",
                   help="localize even when every output matches: the module tables (each "
                   "call's error in the model, and its own error on torch's inputs of it) "
                   "are printed; on a mismatch they always are")
    p.add_argument("--extract", metavar="DIR",
                   help="write a repro of the first diverging module call (module.onnx, "
                   "inputs.npz, expected.npz, README.md) into DIR")
    p.add_argument("--call", metavar="CALL",
                   help="with --extract: the module call to extract (e.g. h.17.attn)")
    p.add_argument("--node-data", metavar="FILE",
                   help="write the errors per module as Model Explorer node data (.json)")
    return p


def run(args: argparse.Namespace) -> int:
    """Validate and print the report: 0 when every output matches, 1 when one does not."""
    parts = parts_directory(args.onnx)
    onnx_reads = paths.onnx_files("MODEL.onnx", args.onnx) if parts is None else {
        f"MODEL.onnx (its file {f.name})": str(f) for f in sorted(parts.iterdir())}
    paths.check_paths(
        reads={"MODEL": paths.spec_file(args.model), "--inputs": paths.spec_file(args.inputs),
               **onnx_reads},
        files={"--report": args.report, "--node-data": args.node_data},
        folders={"--extract": args.extract})
    if args.report:
        common.check_report(args.report)
    _check_repro_flags(args, parts is not None)
    providers = common.providers(args.providers)
    # a corrupt file (or manifest) fails here, before the model is built
    if parts is not None:
        load_manifest(parts)
    loaded = load_model(args.onnx) if parts is None else parts
    model, inputs, kwargs = common.load_model_and_inputs(args)
    with Validation(model, inputs, loaded, kwargs=kwargs, providers=providers,
                    rtol=args.rtol, atol=args.atol,
                    localize=True if args.localize else "auto",
                    weights=args.weights) as session:
        with common.step("Validating against ONNX Runtime"):
            rep = session.run()
        code = common.finish(rep, rep.ok, args.report)
        _repro(session, rep, args)
    return code


def _check_repro_flags(args: argparse.Namespace, parts: bool) -> None:
    """Flags that cannot work fail before the long work."""
    for flag, value in (("--extract", args.extract), ("--node-data", args.node_data),
                        ("--localize", args.localize or None)):
        if parts and value is not None:
            raise fail(f"{flag} needs one ONNX model, and {args.onnx} is a parts directory: "
                       "validate a part's model, or the unsplit export, for it",
                       rules.BAD_INPUT)
    if args.call and args.extract is None:
        raise fail("--call names the module call to extract: add --extract DIR",
                   rules.BAD_INPUT)
    if args.extract is not None:
        check_directory(args.extract)  # new, empty or an earlier repro: replaced whole
    if args.node_data:
        common.check_writable(args.node_data)


def _repro(session: Validation, rep: ValidationReport, args: argparse.Namespace) -> None:
    """After the report: the overlay, and the extracted repro with the command to run it
    (the session localizes for them where the report did not)."""
    out = common.out
    if args.node_data:
        write_node_data(args.node_data, session.node_data())
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
    with common.step(f"Extracting into {args.extract}"):
        extraction = session.extract(args.extract, call=args.call)
    out.print(f"[bold]{escape(str(extraction))}[/bold]")
    out.print(f"Extracted {extraction.call_id} to {extraction.directory}/ (module.onnx, "
              "inputs.npz, expected.npz, README.md)", highlight=False, markup=False)
    out.print(f"Reproduce with: {extraction.command}", highlight=False, soft_wrap=True,
              markup=False)
