"""Validate an ONNX model against torch eager on ONNX Runtime execution providers.

Torch eager is the reference. The ONNX model runs on each provider (by default every
available one of CUDA and CPU); each output is compared within tolerances chosen by dtype.
When an output diverges, :mod:`onnx_modular.check.localize` names the first module call whose
outputs diverge, so that a user debugging an export looks at one module, not 2,000 nodes.
This module runs the check through :mod:`~onnx_modular.check.runners` (torch eager, one
ORT session per provider); inputs are bound in :mod:`~onnx_modular.check.inputs`, values
judged in :mod:`~onnx_modular.check.numerics`, and the report rendered in
:mod:`~onnx_modular.check.validation_report`. The command line prints the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from onnx_modular import runtime
from onnx_modular._checkpoint import Checkpoint, check_checkpoint, meta_tensor
from onnx_modular._util import gc_paused
from onnx_modular.check.inputs import as_args, bind_inputs, leaves
from onnx_modular.check.localize import ProbeInAdvance, ValidationRun
from onnx_modular.check.numerics import check_tolerances, check_value
from onnx_modular.check.runners import Inputs, SessionRunner, TorchModel, TorchRunner, snapshot
from onnx_modular.check.validation_report import OutputCheck, ProviderResult, ValidationReport
from onnx_modular.errors import fail, rules

__all__ = ["OutputCheck", "ProviderResult", "ValidationReport", "validate"]


def validate(
    model: TorchModel,
    args: Any,
    onnx_model: runtime.OnnxModelSource,
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
    args = snapshot(as_args(args))
    kwargs = snapshot(dict(kwargs or {}))
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
        return _validate(TorchRunner(model, weights), Inputs(args, kwargs, feeds), loaded,
                         chosen, rtol, atol, localize, defaulted, skipped)


def _validate(reference: TorchRunner, inputs: Inputs, loaded: runtime.LoadedModel,
              chosen: list[str], rtol: float | None, atol: float | None,
              localize: bool | str, defaulted: bool, skipped: dict[str, str]
              ) -> ValidationReport:
    expected, calls = reference.run_recording(inputs, record=localize is True)
    # Asked for up front, the probe is built while the plain session is; not for a large
    # model (memory over speed: its sessions come one at a time, weights mapped)
    source = loaded.session_source()  # serialized once, before the probe's thread reads it
    advance = ProbeInAdvance(loaded, chosen[-1]) \
        if localize is True and chosen and not loaded.large else None
    _check_pairing(expected.values, loaded)
    results = _provider_results(loaded, source, chosen, inputs, expected.values, rtol, atol,
                                defaulted, skipped)
    report = ValidationReport(loaded.label, results, expected.seconds, skipped=skipped)
    failing = [r.provider for r in results if not r.ok]
    provider = failing[0] if failing else results[-1].provider if results else None
    if provider is not None:
        report.run = ValidationRun(reference, inputs, loaded, provider, rtol, atol,
                                   fuse=bool(failing), calls=calls, advance=advance)
        if localize is True or (localize == "auto" and failing):
            report.relocalize()
    return report


def _check_pairing(expected: list[torch.Tensor], loaded: runtime.LoadedModel) -> None:
    """Torch's outputs must be something to compare, one per ONNX output."""
    outputs = loaded.proto.graph.output
    if expected and all(t.numel() == 0 for t in expected):
        raise fail(f"every output of the torch model is empty (shapes "
                   f"{', '.join(str(list(t.shape)) for t in expected)}) on these inputs: "
                   "there is nothing to compare; validate with inputs of non-zero size",
                   rules.VALIDATION)
    if len(expected) != len(outputs):
        raise fail(f"torch returns {len(expected)} tensor(s) but ONNX model {loaded.label} "
                   f"has {len(outputs)} output(s); they cannot be paired",
                   rules.VALIDATION)


def _provider_results(loaded: runtime.LoadedModel, source: str | bytes, chosen: list[str],
                      inputs: Inputs, expected: list[torch.Tensor], rtol: float | None,
                      atol: float | None, defaulted: bool, skipped: dict[str, str]
                      ) -> list[ProviderResult]:
    """Every output on each provider, one session at a time; a default provider that
    cannot start is noted in ``skipped``."""
    output_names = [o.name for o in loaded.proto.graph.output]
    results = []
    for provider in chosen:
        try:
            session = SessionRunner.open(loaded, provider, source)
        except runtime.ProviderUnavailableError as exc:
            # onnxruntime-gpu lists CUDA even where no GPU or driver is present: a default
            # CUDA check that cannot start is skipped with its reason; CPU still runs
            if not defaulted:
                raise
            skipped[provider] = exc.diagnostic.message
            continue
        with session:  # its copy of the weights goes before the next session's comes
            actual = session.run(inputs)
        checks = [_check(name, a, e, rtol, atol)
                  for name, a, e in zip(output_names, actual.values, expected, strict=True)]
        results.append(ProviderResult(provider, checks, session.session_s, actual.seconds))
    return results


def _check(name: str, actual: np.ndarray, expected: torch.Tensor,
           rtol: float | None, atol: float | None) -> OutputCheck:
    c = check_value(actual, expected, rtol, atol, reference="torch ")
    return OutputCheck.of(name, list(expected.shape), c)
