"""``split``: accelerator/CPU regions (``--acc-ops``, ``--acc-ep``) or pipeline stages
(``--split-points``, ``--markers``), written as one model per part plus manifest.json."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from rich.markup import escape

from onnx_modular.api.split import SplitResult, split
from onnx_modular.api.stages import split_stages
from onnx_modular.cli import common
from onnx_modular.errors import fail, rules
from onnx_modular.parts.manifest import check_parts_directory
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
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--acc-ops", metavar="FILE", help="file listing supported aten ops")
    how.add_argument("--acc-ep", metavar="NAME", help="ONNX Runtime execution provider name")
    how.add_argument("--split-points", metavar="P",
                     help="pipeline stages, e.g. 'h.4:beginning,h.9:end'")
    how.add_argument("--markers", action="store_true",
                     help="pipeline stages at the model's om.pipe_split() markers")
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
    the split points.
    """
    check_parts_directory(args.output)
    support = None if args.split_points or args.markers else _support(args)
    points = parse_split_points(args.split_points) if args.split_points else None
    model, inputs, kwargs = common.load_model_and_inputs(args)
    with common.step("Splitting"):
        parts: SplitResult
        if support is None:
            parts = split_stages(model, inputs, split_points=points, kwargs=kwargs or None)
        else:
            parts = split(model, inputs, support=support, kwargs=kwargs or None,
                          min_acc_module_size=args.min_acc_size,
                          max_acc_splits=args.max_acc_splits)
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
    return common.EXIT_OK


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
