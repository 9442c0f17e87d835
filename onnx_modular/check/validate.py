"""Validate an ONNX model against torch eager on ONNX Runtime execution providers.

Torch eager is the reference. The ONNX model runs on each provider (by default every
available one of CUDA and CPU); each output is compared within tolerances chosen by dtype.
When an output diverges, :mod:`onnx_modular.check.localize` names the first module call whose
outputs diverge, so that a user debugging an export looks at one module, not 2,000 nodes.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from onnx_modular import runtime as _ort
from onnx_modular._compat import tree_leaves
from onnx_modular._util import gc_paused
from onnx_modular.check.localize import (
    Localization,
    build_probe,
    judge,
    record_calls,
    to_numpy,
)
from onnx_modular.check.report import Report
from onnx_modular.diagnostics import DiagnosticContext, OnnxModularError
from onnx_modular.errors import rules

__all__ = ["OutputCheck", "ProviderResult", "ValidationReport", "run_validate", "validate"]


# ---- the report ------------------------------------------------------------------------------

@dataclasses.dataclass
class OutputCheck:
    """One model output on one provider against torch."""

    name: str
    shape: list[int]
    dtype: str
    rtol: float
    atol: float
    diff: _ort.Diff

    @property
    def ok(self) -> bool:
        return self.diff.ok

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": self.shape, "dtype": self.dtype,
                "rtol": self.rtol, "atol": self.atol, **self.diff.to_dict()}


@dataclasses.dataclass
class ProviderResult:
    """Every output on one execution provider, with session-creation and run time."""

    provider: str
    outputs: list[OutputCheck]
    session_s: float
    run_s: float

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    def to_dict(self) -> dict[str, Any]:
        return {"provider": self.provider, "ok": self.ok, "session_s": self.session_s,
                "run_s": self.run_s, "outputs": [o.to_dict() for o in self.outputs]}


@dataclasses.dataclass
class ValidationReport(Report):
    """The outcome of :func:`validate`: per provider and output, and the localization."""

    model: str
    results: list[ProviderResult]
    torch_s: float
    localization: Localization | None = None
    localization_provider: str | None = None
    #: default providers that were not checked, with the reason (e.g. no CUDA here)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def first_mismatch(self) -> str | None:
        """Module path of the first (deepest) diverging module call, or None."""
        loc = self.localization
        return loc.first.module_path if loc is not None and loc.first is not None else None

    @property
    def providers(self) -> list[str]:
        return [r.provider for r in self.results]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "ok": self.ok,
            "first_mismatch": self.first_mismatch,
            "torch_s": self.torch_s,
            "providers": {r.provider: r.to_dict() for r in self.results},
            "skipped": dict(self.skipped),
            "localization": None if self.localization is None else {
                "provider": self.localization_provider, **self.localization.to_dict()},
        }

    # -- rendering --------------------------------------------------------------------------

    def _rows(self) -> list[list[str]]:
        rows = []
        for r in self.results:
            for o in r.outputs:
                rows.append([
                    _ort.short_provider(r.provider), o.name, "x".join(map(str, o.shape)) or "()",
                    o.dtype, _fmt(o.diff.max_abs), _fmt(o.diff.max_rel),
                    f"{_tol(o.rtol)}/{_tol(o.atol)}", "ok" if o.ok else "FAIL", o.diff.note])
        return rows

    _HEAD = ["EP", "output", "shape", "dtype", "abs err", "rel err", "rtol/atol", "status",
             "note"]
    _LOC_HEAD = ["#", "module call", "type", "first diverging value", "max abs err",
                 "max rel err", "mismatched", "inputs"]

    def _loc_rows(self) -> list[list[str]]:
        loc = self.localization
        if loc is None:
            return []
        return [[str(i + 1), d.call_id, d.module_type.rsplit(".", 1)[-1], d.output,
                 _fmt(d.max_abs), _fmt(d.max_rel), str(d.mismatched),
                 "diverged" if d.inherited else "ok"]
                for i, d in enumerate(loc.divergences)]

    def _timings(self) -> str:
        parts = [f"{_ort.short_provider(r.provider)}: session {r.session_s * 1e3:.0f} ms, "
                 f"run {r.run_s * 1e3:.1f} ms" for r in self.results]
        return "; ".join([*parts, f"torch {self.torch_s * 1e3:.0f} ms"])

    def _skipped_line(self) -> str:
        return "; ".join(f"{_ort.short_provider(p)} skipped: {why}"
                         for p, why in self.skipped.items())

    def summary(self) -> str:
        if self.ok:
            return f"OK: {self.model} matches torch on {', '.join(self.providers)}"
        failed = [r.provider for r in self.results if not r.ok]
        where = f"; first diverging module: {self.first_mismatch}" if self.first_mismatch else ""
        if self.localization is not None and self.first_mismatch is None:
            where = f"; no module localized ({self.localization.note or 'no module diverged'})"
        return f"MISMATCH: {self.model} differs from torch on {', '.join(failed)}{where}"

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        rows = self._rows()
        show_note = any(row[-1] for row in rows)
        table = Table(title="ONNX Runtime vs torch eager", title_justify="left",
                      caption=self._timings(), caption_justify="left")
        for h in self._HEAD if show_note else self._HEAD[:-1]:
            table.add_column(h, justify="right" if "err" in h else "left",
                             no_wrap=h in ("EP", "status", "rtol/atol"))
        for row in rows:
            style = "green" if row[7] == "ok" else "bold red"
            table.add_row(*row[:7], Text(row[7], style=style), *row[8:8 + show_note])
        parts: list[Any] = [table]
        if self.localization is not None and self.localization.divergences:
            loc = Table(title=f"Diverging module calls on {self.localization_provider} "
                        "(execution order; bold: the first mismatch)", title_justify="left")
            for h in self._LOC_HEAD:
                loc.add_column(h, justify="right" if "err" in h or h == "mismatched" else "left")
            first = self.localization.divergences.index(self.localization.first) \
                if self.localization.first is not None else -1
            for i, row in enumerate(self._loc_rows()):
                loc.add_row(*row, style="bold" if i == first else None)
            parts.append(loc)
        if self.skipped:
            parts.append(Text(self._skipped_line(), style="yellow"))
        parts.append(Text(self.summary(), style="green" if self.ok else "bold red"))
        return Group(*parts)

    def to_markdown(self) -> str:
        lines = [f"# Validation of {self.model}", "", f"**{self.summary()}**", ""]
        lines += [*_md_table(self._HEAD, self._rows()), "", f"Timings: {self._timings()}"]
        if self.skipped:
            lines += ["", f"Not checked: {self._skipped_line()}"]
        if self.localization is not None:
            lines += ["", f"## Diverging module calls ({self.localization_provider})", ""]
            if self.localization.divergences:
                lines += _md_table(self._LOC_HEAD, self._loc_rows())
            else:
                lines.append(self.localization.note or "No module call diverges.")
        return "\n".join(lines) + "\n"



def _fmt(x: float) -> str:
    return f"{x:.3g}"


def _tol(x: float) -> str:
    return "0" if x == 0 else f"{x:.1e}".replace(".0e", "e").replace("e-0", "e-")


def _md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return out


def _error(reason: str, rule: Any = rules.BAD_INPUT) -> OnnxModularError:
    return DiagnosticContext().error(rule, reason=reason)


# ---- inputs ----------------------------------------------------------------------------------

def _signature_names(model: Any) -> list[str]:
    try:
        forward = model.forward if isinstance(model, torch.nn.Module) else model
        return [p.name for p in inspect.signature(forward).parameters.values()
                if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    except (TypeError, ValueError):
        return []


def _leaves(model: Any, args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> list[tuple[str | None, torch.Tensor]]:
    """Input tensors in the order torch.export flattens them, each with its parameter name."""
    names = _signature_names(model)
    leaves: list[tuple[str | None, torch.Tensor]] = []

    def add(name: str | None, value: Any) -> None:
        flat = [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]
        for t in flat:
            leaves.append((name if len(flat) == 1 else None, t))

    for i, a in enumerate(args):
        add(names[i] if i < len(names) else None, a)
    order = {n: i for i, n in enumerate(names)}
    for key in sorted(kwargs, key=lambda k: order.get(k, len(order))):
        add(key, kwargs[key])
    return leaves


def _declared_inputs(proto: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    initializers = {i.name for i in proto.graph.initializer}
    return [i for i in proto.graph.input if i.name not in initializers]


def to_feed(t: torch.Tensor) -> np.ndarray:
    """A numpy array ORT takes; bfloat16 goes through ml_dtypes."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def bind_inputs(proto: onnx.ModelProto, leaves: list[tuple[str | None, torch.Tensor]],
                label: str = "the ONNX model") -> dict[str, np.ndarray]:
    """Feeds by name where every name matches, else by position; count/dtype/rank checked."""
    declared = _declared_inputs(proto)
    if len(declared) != len(leaves):
        names = ", ".join(i.name for i in declared)
        raise _error(f"{label} takes {len(declared)} input(s) ({names}) but "
                     f"{len(leaves)} tensor(s) were given")
    by_name = {n: t for n, t in leaves if n is not None}
    if all(i.name in by_name for i in declared) and len(by_name) == len(declared):
        pairs = [(i, by_name[i.name]) for i in declared]
    else:
        pairs = [(i, t) for i, (_, t) in zip(declared, leaves, strict=True)]
    feeds: dict[str, np.ndarray] = {}
    for k, (info, tensor) in enumerate(pairs):
        where = f"input #{k} '{info.name}'"
        ttype = info.type.tensor_type
        if not info.type.HasField("tensor_type"):
            raise _error(f"{where} of {label} is not a tensor; only tensor inputs are supported")
        want = _ort.onnx_elem_name(ttype.elem_type)
        got = str(tensor.dtype).removeprefix("torch.")
        if want != got:
            raise _error(f"{where}: {label} expects {want}, got a {got} tensor")
        if ttype.HasField("shape"):
            dims = ttype.shape.dim
            if len(dims) != tensor.dim():
                raise _error(f"{where}: {label} expects rank {len(dims)}, got a tensor of "
                             f"shape {list(tensor.shape)} (rank {tensor.dim()})")
            for d, (dim, size) in enumerate(zip(dims, tensor.shape, strict=True)):
                if dim.HasField("dim_value") and dim.dim_value != size:
                    raise _error(f"{where}: {label} expects dimension {d} to be "
                                 f"{dim.dim_value}, got shape {list(tensor.shape)}")
        feeds[info.name] = to_feed(tensor)
    return feeds


# ---- validate --------------------------------------------------------------------------------

def _as_args(args: Any) -> tuple[Any, ...]:
    if isinstance(args, tuple):
        return args
    if isinstance(args, list):
        return tuple(args)
    return (args,)


def _output_dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _onnx_dtype(array: np.ndarray) -> str:
    name = _ort.dtype_name(array)
    return "bfloat16" if name == "bfloat16" else name


def validate(
    model: Any,
    args: Any,
    onnx_model: Any,
    *,
    kwargs: dict[str, Any] | None = None,
    providers: str | Sequence[str] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    localize: bool | str = "auto",
) -> ValidationReport:
    """Run ``onnx_model`` on ORT and compare every output with ``model(*args, **kwargs)``.

    ``onnx_model``: a path, an ``onnx.ModelProto`` or an export result (``.model_proto``).
    ``providers``: None for every available one of CUDA and CPU; short names ("cpu",
    "cuda") work. ``rtol``/``atol`` override the per-dtype defaults for floating outputs.
    ``localize``: "auto" localizes only when an output diverges; True always; False never.
    """
    args = _as_args(args)
    kwargs = dict(kwargs or {})
    loaded = _ort.load_model(onnx_model)
    chosen = _ort.resolve_providers(providers)
    # Only providers the user left to the default may be skipped; an explicit request for
    # one that cannot run is an error, never a silent CPU-only check.
    defaulted = providers is None
    skipped = _ort.unavailable_defaults(chosen) if defaulted else {}
    reference = model.module() if isinstance(model, torch.export.ExportedProgram) else model
    if not callable(reference):
        raise _error(f"model must be a torch.nn.Module or an ExportedProgram, "
                     f"got {type(model).__name__}")
    feeds = bind_inputs(loaded.proto, _leaves(reference, args, kwargs),
                        f"ONNX model {loaded.label}")

    with gc_paused():
        return _validate(model, args, kwargs, loaded, chosen, feeds, rtol, atol, localize,
                         defaulted, skipped)


def _validate(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
              loaded: _ort.LoadedModel, chosen: list[str], feeds: dict[str, np.ndarray],
              rtol: float | None, atol: float | None, localize: bool | str,
              defaulted: bool, skipped: dict[str, str]) -> ValidationReport:
    start = time.perf_counter()
    calls = None
    if localize is True:
        expected, calls = _torch_run(model, args, kwargs, record=True)
    else:
        expected, _ = _torch_run(model, args, kwargs, record=False)
    torch_s = time.perf_counter() - start

    output_names = [o.name for o in loaded.proto.graph.output]
    if len(expected) != len(output_names):
        raise _error(f"torch returns {len(expected)} tensor(s) but ONNX model {loaded.label} "
                     f"has {len(output_names)} output(s); they cannot be paired",
                     rules.VALIDATION)

    results = []
    source = loaded.session_source()
    for provider in chosen:
        try:
            session, session_s = _ort.make_session(source, provider)
        except _ort.ProviderUnavailableError as exc:
            # onnxruntime-gpu lists CUDA even where no GPU or driver is present: a default
            # CUDA check that cannot start is skipped with its reason; CPU still runs
            if not defaulted:
                raise
            skipped[provider] = exc.diagnostic.message
            continue
        actual, run_s = _ort.run_session(session, feeds)
        checks = [_check(name, a, e, rtol, atol)
                  for name, a, e in zip(output_names, actual, expected, strict=True)]
        results.append(ProviderResult(provider, checks, session_s, run_s))

    report = ValidationReport(loaded.label, results, torch_s, skipped=skipped)
    failing = [r.provider for r in results if not r.ok]
    if localize is True or (localize == "auto" and failing):
        provider = failing[0] if failing else results[-1].provider
        if calls is None:
            _, calls = _torch_run(model, args, kwargs, record=True)
        report.localization = _localize(loaded, feeds, provider, calls, rtol, atol)
        report.localization_provider = provider
    return report


def _torch_run(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
               record: bool) -> tuple[list[torch.Tensor], list[Any] | None]:
    """Eager outputs as flat tensors; with ``record``, every module call's outputs too."""
    from onnx_modular.passes.modularize import modularize

    target, modularized = model, False
    if record and not isinstance(model, (torch.nn.Module, torch.export.ExportedProgram)):
        record = False  # a plain callable has no submodules to watch
    if isinstance(model, torch.export.ExportedProgram):
        target = model.module()
        if record:
            try:
                target, modularized = modularize(model), True
            except Exception:  # localization is best effort; the reference still runs
                record = False
    calls = None
    with torch.no_grad():
        try:
            if record:
                out, calls = record_calls(target, lambda: target(*args, **kwargs),
                                          modularized=modularized)
            else:
                out = target(*args, **kwargs)
        except OnnxModularError:
            raise
        except Exception as exc:
            raise _error(f"the torch model failed on the given inputs: "
                         f"{type(exc).__name__}: {_ort._first_line(exc)}") from None
    flat = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    return flat, calls


def _check(name: str, actual: np.ndarray, expected: torch.Tensor,
           rtol: float | None, atol: float | None) -> OutputCheck:
    dtype = _output_dtype(expected)
    r, a = _ort.tolerances_for(dtype, rtol, atol)
    d = _ort.diff(actual, to_numpy(expected), r, a)
    got = _onnx_dtype(actual)
    if got != dtype and d.ok:
        d = dataclasses.replace(d, ok=False, note=f"dtype {got} != torch {dtype}")
    return OutputCheck(name, list(expected.shape), dtype, r, a, d)


def _localize(loaded: _ort.LoadedModel, feeds: dict[str, np.ndarray], provider: str,
              calls: list[Any] | None, rtol: float | None, atol: float | None) -> Localization:
    """One ORT session on the inlined model with every call output exposed."""
    if not calls:
        return Localization("none", 0, [], None, "the torch model has no submodule calls")
    try:
        probe = build_probe(loaded.proto, loaded.model_bytes())
    except Exception as exc:
        return Localization("none", 0, [], None,
                            f"could not inline the model: {_ort._first_line(exc)}")
    if probe.kind == "none":
        return Localization("none", 0, [], None, probe.note or
                            "the ONNX model carries no module metadata to localize with")
    session, _ = _ort.make_session(probe.model_bytes, provider, loaded.session_config())
    names = [o.name for o in session.get_outputs()]
    values, _ = _ort.run_session(session, feeds)
    return judge(probe, {**feeds, **dict(zip(names, values, strict=True))}, calls, rtol, atol)


# ---- the command line's entry ---------------------------------------------------------------

def run_validate(
    model: Any,
    args: Any,
    onnx_model: Any,
    *,
    kwargs: dict[str, Any] | None = None,
    providers: str | Sequence[str] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    report: str | Path | None = None,
    console: Any = None,
) -> int:
    """Validate, print the report, optionally save it; exit code 0 ok, 1 mismatch, 2 error."""
    from rich.console import Console
    from rich.text import Text

    console = console or Console()
    try:
        rep = validate(model, args, onnx_model, kwargs=kwargs, providers=providers,
                       rtol=rtol, atol=atol)
        console.print(rep)
        if report is not None:
            rep.save(report)
    except OnnxModularError as exc:
        console.print(Text(str(exc), style="bold red"), soft_wrap=True)
        return 2
    return 0 if rep.ok else 1
