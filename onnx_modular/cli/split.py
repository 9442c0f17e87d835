"""``split``: accelerator/CPU regions (``--acc-ops``, ``--acc-ep``) or pipeline stages
(``--split-points``, ``--markers``), written as one model per part plus manifest.json."""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable
from typing import Any

from rich.markup import escape

from onnx_modular.api.split import SplitResult, split
from onnx_modular.api.stages import plan_stages, split_stages
from onnx_modular.cli import common, paths
from onnx_modular.leaves._util import parse_bytes
from onnx_modular.leaves.errors import fail, rules
from onnx_modular.lower.capture import capture
from onnx_modular.parts.manifest import check_parts_directory
from onnx_modular.parts.triton import TritonBatchingWarning, check_repository_path
from onnx_modular.support.operator_support import (
    OperatorSupport,
    load_support_file,
    resolve_support,
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``split MODEL --inputs INPUTS (--acc-ops F | --acc-ep N | --split-points P | --markers)``."""
    p = common.add_subcommand(subparsers, "split", run,
                              help="split into accelerator/CPU regions or pipeline stages")
    common.add_model_inputs(p)
    how = p.add_mutually_exclusive_group()
    how.add_argument("--acc-ops", metavar="FILE",
                     help="file listing supported ops (aten.gelu, onnx::MatMul; !name denies)")
    how.add_argument("--acc-ep", metavar="NAME", help="ONNX Runtime execution provider name")
    how.add_argument("--split-points", metavar="P",
                     help="pipeline stages, e.g. 'h.4:beginning,h.9:end'")
    how.add_argument("--markers", action="store_true",
                     help="pipeline stages at the model's om.pipe_split() markers")
    p.add_argument("--num-stages", type=int, metavar="N",
                   help="N pipeline stages balanced by weight bytes, cut between blocks")
    p.add_argument("--max-stage-bytes", metavar="SIZE",
                   help="pipeline stages of at most SIZE weight bytes each (2GB, 512MiB)")
    p.add_argument("--triton", metavar="DIR",
                   help="also write a Triton model repository (a model per part + ensemble)")
    p.add_argument("--triton-kind", choices=("auto", "gpu", "cpu"), default=None,
                   help="instances of the accelerator parts in the Triton repository: auto "
                   "(default: GPUs where the server has them, else CPU), gpu or cpu; CPU "
                   "regions are always cpu")
    p.add_argument("--triton-batch-dim", metavar="NAME", default=None,
                   help="state that the dynamic dimension NAME (the Dim the program was "
                   "exported with, or its s<N> symbol; every input's first) is the batch: "
                   "batch in Triton where the analysis cannot prove it (ops that mix rows "
                   "along it still refuse)")
    p.add_argument("--min-acc-size", type=_count(0), default=1, metavar="N",
                   help="acc regions of fewer nodes go to the CPU (default 1)")
    p.add_argument("--max-acc-splits", type=_count(1, -1), default=-1, metavar="N",
                   help="at most N regions, or -1 for no limit (default)")
    p.add_argument("--preview", action="store_true", help="print the support/region preview")
    common.add_output(p, "the directory to write")
    return p


def _count(least: int, sentinel: int | None = None) -> Callable[[str], int]:
    """An argparse type: an int >= ``least`` (or ``sentinel``), so a negative value fails
    when parsed instead of meaning "no limit" without a word."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
        if value < least and value != sentinel:
            also = f" (or {sentinel} for no limit)" if sentinel is not None else ""
            raise argparse.ArgumentTypeError(f"must be >= {least}{also}, got {value}")
        return value
    return parse


def run(args: argparse.Namespace) -> int:
    """Split, optionally preview, write the parts and the manifest.

    Every flag is checked before the model is loaded: the output directory, the op list,
    the split points, the stage budget.
    """
    num_stages, budget = _balanced_options(args)
    paths.check_paths(
        reads={"MODEL": paths.spec_file(args.model), "--inputs": paths.spec_file(args.inputs),
               "--acc-ops": args.acc_ops},
        files={}, folders={"-o": args.output, "--triton": args.triton})
    check_parts_directory(args.output)
    if args.triton_kind and args.triton is None:
        common.usage_error("split", "argument --triton-kind: needs --triton DIR")
    if args.triton_batch_dim is not None and args.triton is None:
        common.usage_error("split", "argument --triton-batch-dim: needs --triton DIR")
    if args.triton is not None:
        check_repository_path(args.triton)  # '' included: a flag given is not ignored
    balanced = num_stages is not None or budget is not None
    support = None if balanced or args.split_points or args.markers else _support(args)
    points = parse_split_points(args.split_points) if args.split_points else None
    model, inputs, kwargs = common.load_model_and_inputs(args)
    if balanced:
        with common.step("Capturing and planning the stages"):
            program = capture(model, inputs, kwargs or None, weights=args.weights)
            plan = plan_stages(program, num_stages=num_stages, max_stage_bytes=budget)
        common.out.print(str(plan), highlight=False)  # the plan, before the long work
    with common.step("Splitting"):
        parts: SplitResult
        if balanced:
            parts = split_stages(program, num_stages=num_stages, max_stage_bytes=budget)
        elif support is None:
            parts = split_stages(model, inputs, split_points=points, kwargs=kwargs or None,
                                 weights=args.weights)
        else:
            parts = split(model, inputs, support=support, kwargs=kwargs or None,
                          min_acc_module_size=args.min_acc_size,
                          max_acc_splits=args.max_acc_splits, weights=args.weights)
    if args.markers and len(parts.regions) < 2:
        raise fail(f"--markers: {args.model} has no om.pipe_split() marker that cuts its "
                   "forward(); add om.pipe_split() calls or use --split-points", rules.BAD_INPUT)
    common.print_warnings(parts.diagnostics)
    if args.preview:
        parts.preview(console=common.out)
    with common.step(f"Writing {args.output}"):
        parts.save(args.output)
    common.out.print(f"{len(parts.regions)} part(s) and manifest.json written to "
                     f"{escape(args.output)}")
    if args.triton is not None:
        with common.step(f"Writing the Triton model repository {args.triton}"), \
                warnings.catch_warnings():  # the note is printed below, once
            warnings.simplefilter("ignore", TritonBatchingWarning)
            repo = parts.save_triton(args.triton, kind=args.triton_kind,
                                     batch_dim=args.triton_batch_dim)
        common.out.print(f"Triton model repository written to {args.triton}: "
                         f"{', '.join(repo.models)} (ensemble '{repo.ensemble}'); serve it "
                         f"with tritonserver --model-repository {args.triton}",
                         highlight=False)
        if repo.note:
            common.err.print(f"[yellow]Triton: {escape(repo.note)}[/yellow]", highlight=False)
    return common.EXIT_OK


def _balanced_options(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """``--num-stages`` / ``--max-stage-bytes``, checked before any work; exactly one way
    of splitting is given."""
    chosen = [f for f, v in (("--acc-ops", args.acc_ops), ("--acc-ep", args.acc_ep),
                             ("--split-points", args.split_points),
                             ("--markers", args.markers)) if v]
    balanced = args.num_stages is not None or args.max_stage_bytes is not None
    if bool(chosen) == balanced:  # argparse's groups cannot say "one of these, or those"
        message = ("one of the arguments --acc-ops --acc-ep --split-points --markers "
                   "--num-stages --max-stage-bytes is required" if not chosen else
                   f"argument {chosen[0]}: not allowed with --num-stages/--max-stage-bytes")
        common.usage_error("split", message)
    if args.num_stages is not None and args.num_stages < 1:
        raise fail(f"--num-stages must be at least 1, got {args.num_stages}", rules.BAD_INPUT)
    budget = None
    if args.max_stage_bytes is not None:
        try:
            budget = parse_bytes(args.max_stage_bytes)
        except ValueError as e:
            raise fail(f"--max-stage-bytes: {e}", rules.BAD_INPUT) from e
        if budget < 1:
            raise fail(f"--max-stage-bytes must be positive, got {args.max_stage_bytes}",
                       rules.BAD_INPUT)
    return args.num_stages, budget


def _support(args: argparse.Namespace) -> OperatorSupport | str:
    """``--acc-ops FILE`` or ``--acc-ep NAME`` -> the ``support=`` argument of :func:`split`."""
    if args.acc_ops:
        return load_support_file(args.acc_ops)
    return resolve_support(args.acc_ep if args.acc_ep.startswith("ort:")
                           else f"ort:{args.acc_ep}")


def parse_split_points(text: str) -> dict[str, str]:
    """``"h.4:beginning,h.9:end"`` -> ``{"h.4": "beginning", "h.9": "end"}`` (beginning if
    no side is given)."""
    points: dict[str, str] = {}
    for item in text.split(","):
        path, _, where = item.strip().partition(":")
        where = where or "beginning"
        if not path or where not in ("beginning", "end"):
            raise fail(f"bad split point '{item}': expected PATH:beginning or PATH:end",
                       rules.BAD_INPUT)
        if path in points:
            raise fail(f"split point '{path}' is given twice", rules.BAD_INPUT)
        points[path] = where
    return points
