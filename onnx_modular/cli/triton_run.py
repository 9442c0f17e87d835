"""``triton-run``: run a model whose stages several Triton servers serve, chained by the
client (:class:`~onnx_modular.parts.triton_runner.TritonRunner`), on inputs from an ``.npz``."""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape

from onnx_modular.check.compare_io import load_npz, npz_bytes
from onnx_modular.cli import common
from onnx_modular.leaves._io import atomic_write_bytes
from onnx_modular.leaves.errors import fail, rules
from onnx_modular.parts.triton_runner import TritonRunner


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``triton-run REPO INPUTS.npz --endpoint [PART=]HOST:PORT ... [-o OUT.npz]``."""
    p = common.add_subcommand(subparsers, "triton-run", run,
                              help="chain the stages of a Triton repository served by "
                              "several servers")
    p.add_argument("repo", metavar="REPO", help="the repository save_triton (split --triton) "
                   "wrote, or the parts directory")
    p.add_argument("inputs", metavar="INPUTS.npz", help="arrays named after the model inputs")
    p.add_argument("--endpoint", action="append", required=True, metavar="[PART=]HOST:PORT",
                   help="the server of a part (stage_0=10.0.0.1:8000), or of every part not "
                   "named (HOST:PORT alone); repeat per server")
    p.add_argument("--name", help="the ensemble (where the repository holds several)")
    p.add_argument("--protocol", choices=("http", "grpc"), default="http")
    p.add_argument("-o", "--output", help="write the outputs to this .npz")
    return p


def parse_endpoints(items: list[str]) -> dict[str, str]:
    """``["stage_0=h:1", "h:2"]`` -> ``{"stage_0": "h:1", "*": "h:2"}``."""
    out: dict[str, str] = {}
    for item in items:
        part, sep, url = item.rpartition("=")
        key = part if sep else "*"
        if not url or (sep and not part):
            raise fail(f"--endpoint '{item}': expected PART=HOST:PORT or HOST:PORT",
                       rules.BAD_INPUT)
        if key in out:
            raise fail(f"--endpoint: {'every other part' if key == '*' else key} is given "
                       "twice", rules.BAD_INPUT)
        out[key] = url
    return out


def run(args: argparse.Namespace) -> int:
    """Read the inputs, run the chain, print (and write) the outputs."""
    endpoints = parse_endpoints(args.endpoint)
    if args.output:
        common.check_writable(args.output)
    runner = TritonRunner(args.repo, endpoints, name=args.name, protocol=args.protocol)
    arrays = load_npz(args.inputs, "inputs")
    missing = [n for n in runner.inputs if n not in arrays]
    if missing:
        raise fail(f"'{args.inputs}' has no array '{missing[0]}' (the model's inputs: "
                   f"{', '.join(runner.inputs)})", rules.BAD_INPUT)
    with common.step("Running the stages"):
        result = runner.run(*(arrays[n] for n in runner.inputs))
    runner.close()
    outputs = dict(zip(runner.outputs, result if isinstance(result, tuple) else (result,)))
    for name, value in outputs.items():
        common.out.print(f"{escape(name)}: {value.dtype} {list(value.shape)}", highlight=False)
    if args.output:
        atomic_write_bytes(args.output, npz_bytes(outputs))
    return common.EXIT_OK
