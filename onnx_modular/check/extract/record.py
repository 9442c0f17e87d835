"""What an extraction is: where and how it is written (:class:`Target`), what it wrote and
whether the module alone reproduces the mismatch (:class:`Extraction`), and how it reads:
its ``README.md`` and the one-line ``compare-io`` command."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from onnx_modular.check.call_stats import CallError
from onnx_modular.check.extract.folder import EXPECTED, INPUTS, MODULE, README
from onnx_modular.check.io_report import IOReport
from onnx_modular.check.numerics import is_float, tolerances_for
from onnx_modular.check.report import fmt_err
from onnx_modular.leaves import runtime


@dataclasses.dataclass(frozen=True)
class Target:
    """Where and how a repro is written, fixed once by :func:`~onnx_modular.check.extract.
    extract`: the folder as the user named it (the printed command spells it so), the
    provider the module alone runs on, the source model's label, and the tolerances the
    validation judged by."""

    directory: Path
    provider: str
    label: str
    rtol: float | None = None
    atol: float | None = None


@dataclasses.dataclass
class Port:
    """One input or output of the extracted module and where its value came from."""

    name: str
    shape: list[int]
    dtype: str
    source: str  # "torch input 0", "ONNX value (not a torch input)", "torch output 1"...


@dataclasses.dataclass
class Extraction:
    """What :func:`~onnx_modular.check.extract.extract` wrote, and whether the module
    alone reproduces the mismatch."""

    directory: Path
    call_id: str
    module_type: str
    kind: str  # "hierarchical" (a function body) or "flat" (the call's nodes)
    inputs: list[Port]
    outputs: list[Port]
    weights: int
    weight_bytes: int
    in_model: CallError | None  # the call's error inside the full model
    alone: IOReport  # the module alone on torch's inputs
    command: str

    @property
    def reproduces(self) -> bool:
        """The module alone diverges from torch on torch's own inputs."""
        return not self.alone.ok

    @property
    def files(self) -> list[Path]:
        return [self.directory / n for n in (MODULE, INPUTS, EXPECTED, README)]

    def __str__(self) -> str:
        state = (f"reproduces the mismatch (max abs err {fmt_err(self.alone.max_abs)})"
                 if self.reproduces else "matches torch on torch's inputs")
        return f"{self.call_id} extracted to {self.directory}: the module alone {state}"


def command(target: Target, prefix: str = "") -> str:
    """The compare-io command line, each path shell-quoted (a folder may hold a space)."""
    tol = "".join(f" --{k} {v:g}" for k, v in (("rtol", target.rtol), ("atol", target.atol))
                  if v is not None)
    short = runtime.short_provider(target.provider).lower()
    files = " ".join(shlex.quote(f"{prefix}{name}") for name in (MODULE, INPUTS, EXPECTED))
    return f"python -m onnx_modular compare-io {files} --providers {short}{tol}"


def readme(x: Extraction, target: Target) -> str:
    """The repro's ``README.md``: the verdict, the command, plain onnxruntime code, and
    the files' inputs and outputs with where each value came from."""
    provider = target.provider
    short = runtime.short_provider(provider)
    dtype = next((p.dtype for p in x.outputs if is_float(p.dtype)), "float32")
    # the snippet's tolerances, for its first float output
    r, a = tolerances_for(dtype, target.rtol, target.atol)
    if x.reproduces:
        verdict = "**reproduces the mismatch**"
    elif x.in_model is not None and not x.in_model.ok:
        verdict = ("**matches torch**: the error it shows in the full model came in with its "
                   "inputs, from upstream")
    else:
        verdict = "**matches torch**, as it does in the full model"
    lines = [f"# Repro: `{x.call_id}` ({x.module_type})", "",
             f"Extracted from `{target.label}` by `onnx_modular validate`: the {x.kind} "
             f"module call alone, fed the tensors that reached it in torch.", ""]
    if x.in_model is not None:
        e = x.in_model
        lines.append(f"- In the full model on {short}: max abs err {fmt_err(e.max_abs)}, max rel "
                     f"err {fmt_err(e.max_rel)} ({e.mismatched} of {e.size} values out of "
                     f"tolerance{'; its inputs had diverged already' if e.inherited else ''}).")
    lines += [f"- This module alone on {short}: max abs err {fmt_err(x.alone.max_abs)}, max rel "
              f"err {fmt_err(x.alone.max_rel)}: it {verdict}.", "",
              "## Reproduce", "", "From this directory (exit status 1: mismatch, 0: match, "
              "2: usage error):", "", "```sh", command(target), "```", "",
              "Without onnx_modular, with numpy and onnxruntime only:", "", "```python",
              "import numpy as np",
              "import onnxruntime as ort", "",
              f'session = ort.InferenceSession("{MODULE}", providers=["{provider}"])',
              f'inputs = dict(np.load("{INPUTS}"))',
              f'expected = np.load("{EXPECTED}")',
              "names = [o.name for o in session.get_outputs()]",
              "for name, got in zip(names, session.run(None, inputs)):",
              "    if name not in expected:",
              "        continue",
              "    want = expected[name]",
              "    if np.issubdtype(want.dtype, np.inexact):  # NaN matches only NaN",
              f"        ok = np.isclose(got.astype(np.float64), want, rtol={r:g}, "
              f"atol={a:g}, equal_nan=True)",
              "    else:  # integers and bool: exactly",
              "        ok = got == want",
              '    print(name, int((~ok).sum()), "of", ok.size, "values out of tolerance")',
              "```", ""]
    if any(p.dtype == "bfloat16" for p in x.inputs):
        lines += ["bfloat16 inputs are stored as their uint16 bit patterns (numpy has no "
                  "bfloat16): view them with `ml_dtypes.bfloat16` before feeding.", ""]
    lines += ["## Files", "", f"- `{MODULE}`: {x.weights} initializer(s) (the call's weights "
              f"and constants), {x.weight_bytes / 1e6:.2f} MB", "",
              "| input | shape | dtype | value |", "|---|---|---|---|"]
    lines += [f"| `{p.name}` | {list(p.shape)} | {p.dtype} | {p.source} |" for p in x.inputs]
    lines += ["", "| output | shape | dtype | expected |", "|---|---|---|---|"]
    lines += [f"| `{p.name}` | {list(p.shape)} | {p.dtype} | {p.source} |" for p in x.outputs]
    return "\n".join(lines) + "\n"
