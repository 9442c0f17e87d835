"""Validate an ONNX model against torch eager on ONNX Runtime execution providers.

Torch eager is the reference. The ONNX model runs on each provider (by default every
available one of CUDA and CPU); each output is compared within tolerances chosen by dtype.
When an output diverges, :mod:`onnx_modular.check.localize` names the first module call whose
outputs diverge, so that a user debugging an export looks at one module, not 2,000 nodes.
This module runs the check; inputs are bound in :mod:`~onnx_modular.check.inputs`, values
judged in :mod:`~onnx_modular.check.numerics`, and the report rendered in
:mod:`~onnx_modular.check.validation_report`. The command line prints the report.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from onnx_modular import runtime
from onnx_modular._checkpoint import (
    Checkpoint,
    bound_weights,
    check_checkpoint,
    meta_tensor,
)
from onnx_modular._compat import tree_leaves, tree_map
from onnx_modular._util import gc_paused
from onnx_modular.check.inputs import as_args, bind_inputs, leaves
from onnx_modular.check.localize import (
    Localization,
    Probe,
    TorchCall,
    build_probe,
    judge,
    record_calls,
)
from onnx_modular.check.numerics import check_tolerances, check_value
from onnx_modular.check.validation_report import OutputCheck, ProviderResult, ValidationReport
from onnx_modular.diagnostics import OnnxModularError
from onnx_modular.errors import fail, rules

__all__ = ["OutputCheck", "ProviderResult", "ValidationReport", "validate"]


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
    weights: Checkpoint | None = None,
) -> ValidationReport:
    """Run ``onnx_model`` on ORT and compare every output with ``model(*args, **kwargs)``.

    ``onnx_model``: a path, an ``onnx.ModelProto`` or an export result (``.model_proto``).
    ``providers``: None for every available one of CUDA and CPU; short names ("cpu",
    "cuda") work. ``rtol``/``atol`` override the per-dtype defaults for floating outputs.
    ``localize``: "auto" localizes only when an output diverges; True always; False never.
    ``weights``: the checkpoint of a ``model`` built on the meta device (as ``om.export``
    takes it): torch runs on its tensors mapped from their files, bound only while it runs.
    Keyword inputs feed the ONNX inputs in the order of the call, as torch.export flattens
    them (for an ExportedProgram: the order of the call it was captured with).
    """
    check_tolerances(rtol, atol)
    # A forward that changes its inputs in place (x.relu_()) must not change what ONNX
    # Runtime is fed, nor what a second torch run (localization) sees: both sides read this
    # snapshot, torch through a fresh copy each run, and the caller's tensors stay as given.
    args = _snapshot(as_args(args))
    kwargs = _snapshot(dict(kwargs or {}))
    loaded = runtime.load_model(onnx_model)
    chosen = runtime.resolve_providers(providers)
    # Only providers the user left to the default may be skipped; an explicit request for
    # one that cannot run is an error, never a silent CPU-only check.
    defaulted = providers is None
    skipped = runtime.unavailable_defaults(chosen) if defaulted else {}
    reference = model.module() if isinstance(model, torch.export.ExportedProgram) else model
    if not callable(reference):
        raise fail(f"model must be a torch.nn.Module or an ExportedProgram, "
                   f"got {type(model).__name__}")
    feeds = bind_inputs(loaded.proto, leaves(reference, args, kwargs),
                        f"ONNX model {loaded.label}")
    if weights is not None:
        check_checkpoint(model, weights)  # a mismatched checkpoint fails before any run
    elif isinstance(model, torch.nn.Module) and (on_meta := meta_tensor(model)) is not None:
        raise fail(f"'{on_meta}' of {type(model).__name__} is on the meta device (no data): "
                   "pass its checkpoint as weights= (--weights on the command line)",
                   rules.VALIDATION)

    with gc_paused():
        return _validate(model, args, kwargs, loaded, chosen, feeds, rtol, atol, localize,
                         defaulted, skipped, weights)


def _validate(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
              loaded: runtime.LoadedModel, chosen: list[str], feeds: dict[str, np.ndarray],
              rtol: float | None, atol: float | None, localize: bool | str,
              defaulted: bool, skipped: dict[str, str],
              weights: Checkpoint | None = None) -> ValidationReport:
    start = time.perf_counter()
    calls = None
    if localize is True:
        expected, calls = _torch_run(model, args, kwargs, record=True, weights=weights)
    else:
        expected, _ = _torch_run(model, args, kwargs, record=False, weights=weights)
    torch_s = time.perf_counter() - start
    # Asked for up front, the probe is built while the plain session is; not for a large
    # model (memory over speed: its sessions come one at a time, weights mapped)
    source = loaded.session_source()  # serialized once, before the probe's thread reads it
    advance = _ProbeInAdvance(loaded, chosen[-1]) \
        if localize is True and chosen and not loaded.large else None

    output_names = [o.name for o in loaded.proto.graph.output]
    if expected and all(t.numel() == 0 for t in expected):
        raise fail(f"every output of the torch model is empty (shapes "
                   f"{', '.join(str(list(t.shape)) for t in expected)}) on these inputs: "
                   "there is nothing to compare; validate with inputs of non-zero size",
                   rules.VALIDATION)
    if len(expected) != len(output_names):
        raise fail(f"torch returns {len(expected)} tensor(s) but ONNX model {loaded.label} "
                   f"has {len(output_names)} output(s); they cannot be paired",
                   rules.VALIDATION)

    results = []
    for provider in chosen:
        try:
            session, session_s = runtime.check_session(loaded, source, provider)
        except runtime.ProviderUnavailableError as exc:
            # onnxruntime-gpu lists CUDA even where no GPU or driver is present: a default
            # CUDA check that cannot start is skipped with its reason; CPU still runs
            if not defaulted:
                raise
            skipped[provider] = exc.diagnostic.message
            continue
        actual, run_s = runtime.run_session(session, feeds)
        del session  # its copy of the weights goes before the next session's comes
        checks = [_check(name, a, e, rtol, atol)
                  for name, a, e in zip(output_names, actual, expected, strict=True)]
        results.append(ProviderResult(provider, checks, session_s, run_s))

    report = ValidationReport(loaded.label, results, torch_s, skipped=skipped)
    failing = [r.provider for r in results if not r.ok]
    provider = failing[0] if failing else results[-1].provider if results else None

    def relocalize() -> Localization:
        """Localize on ``provider`` now (a report that did not, or let its values go)."""
        nonlocal calls
        assert provider is not None
        if calls is None:
            _, calls = _torch_run(model, args, kwargs, record=True, weights=weights)
        # A model that failed may fail through a fusion: its probe gets ORT's fusions too.
        # One that passed is localized on demand: the probe then skips them (faster to build).
        with gc_paused():
            ready = advance.take(provider, fuse=bool(failing)) if advance else None
            report.localization = _localize(loaded, feeds, provider, calls, rtol, atol,
                                            fuse=bool(failing), ready=ready)
        report.localization_provider = provider
        calls = None  # the localization's evidence holds them now
        return report.localization

    report.source = loaded
    report.relocalize = relocalize if provider is not None else None
    if localize is True or (localize == "auto" and failing):
        relocalize()
    return report


def _torch_run(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
               record: bool, weights: Checkpoint | None = None
               ) -> tuple[list[torch.Tensor], list[TorchCall] | None]:
    """Eager outputs as flat tensors; with ``record``, every module call's outputs too."""
    with bound_weights(model, weights):
        return _run_eager(model, args, kwargs, record)


def _run_eager(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
               record: bool) -> tuple[list[torch.Tensor], list[TorchCall] | None]:
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
    args, kwargs = _snapshot(args), _snapshot(kwargs)
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
            raise fail(f"the torch model failed on the given inputs: "
                       f"{type(exc).__name__}: {runtime.first_line(exc)}") from exc
    flat = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    return flat, calls


def _snapshot(value: Any) -> Any:
    """``value`` with every tensor in it copied (a pytree of inputs)."""
    return tree_map(lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, value)


def _check(name: str, actual: np.ndarray, expected: torch.Tensor,
           rtol: float | None, atol: float | None) -> OutputCheck:
    c = check_value(actual, expected, rtol, atol, reference="torch ")
    return OutputCheck.of(name, list(expected.shape), c)


class _ProbeInAdvance:
    """The probe and its session, built on a thread while the plain session is built.

    ONNX Runtime lets go of the GIL while it builds a session, so on two cores the probe's
    Python inlining and its session overlap the plain session (``scripts/bench_validate.py``).
    Started after the torch run: its hooks would fight the inlining for the GIL, and torch's
    threads wait on a core that ORT keeps busy. Built without fusions, for a passing model;
    a failing one gets a fused session anew.
    """

    def __init__(self, loaded: runtime.LoadedModel, provider: str) -> None:
        self.provider = provider
        self._loaded = loaded
        self._probe: Probe | None = None
        self._session: Any = None
        self._error: BaseException | None = None  # raised by the session, not the probe
        self._probe_error: Exception | None = None
        self._worker = threading.Thread(target=self._build, name="onnx_modular-probe",
                                        daemon=True)
        self._worker.start()

    def _build(self) -> None:
        try:
            self._probe = build_probe(self._loaded.proto, self._loaded.model_bytes())
        except Exception as exc:
            self._probe_error = exc
            return
        if self._probe.kind == "none":
            return
        try:
            self._session, _ = runtime.check_session(
                self._loaded, self._probe.model_bytes, self.provider,
                self._loaded.session_config(), fuse=False)
        except BaseException as exc:
            self._error = exc

    def take(self, provider: str, fuse: bool
             ) -> tuple[Probe | None, Any, Exception | None] | None:
        """(probe, session or None, why the probe could not be built) once built; None
        when it was built for another provider."""
        self._worker.join()
        if provider != self.provider:
            return None
        if self._error is not None:
            raise self._error
        if fuse and self._probe is not None and self._probe.kind != "none":
            return self._probe, None, None  # the probe stands; its session is made again
        return self._probe, self._session, self._probe_error  # type: ignore[return-value]


def _localize(loaded: runtime.LoadedModel, feeds: dict[str, np.ndarray], provider: str,
              calls: list[TorchCall] | None, rtol: float | None,
              atol: float | None, fuse: bool = True,
              ready: tuple[Probe | None, Any, Exception | None] | None = None
              ) -> Localization:
    """One ORT session on the inlined model with every call output exposed."""
    if not calls:
        return Localization("none", 0, [], None, "the torch model has no submodule calls")
    probe, session, error = ready if ready is not None else (None, None, None)
    if probe is None and error is None:
        try:
            probe = build_probe(loaded.proto, loaded.model_bytes())
        except Exception as exc:
            error = exc
    if probe is None:
        assert error is not None
        return Localization("none", 0, [], None,
                            f"could not inline the model: {runtime.first_line(error)}")
    if probe.kind == "none":
        return Localization("none", 0, [], None, probe.note or
                            "the ONNX model carries no module metadata to localize with")
    if session is None:
        session, _ = runtime.check_session(loaded, probe.model_bytes, provider,
                                           loaded.session_config(), fuse=fuse)
    names = [o.name for o in session.get_outputs()]
    values, _ = runtime.run_session(session, feeds)
    return judge(probe, {**feeds, **dict(zip(names, values, strict=True))}, calls, rtol, atol)
