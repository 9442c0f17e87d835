"""Validate an ONNX model against torch eager on ONNX Runtime execution providers.

Torch eager is the reference. The ONNX model runs on each provider (by default every
available one of CUDA and CPU); each output is compared within tolerances chosen by dtype.
When an output diverges, :mod:`onnx_modular.check.localize` names the first module call whose
outputs diverge, so that a user debugging an export looks at one module, not 2,000 nodes.
This module runs the check through :mod:`~onnx_modular.check.runners` (torch eager, one
ORT session per provider, or a parts directory's models chained per provider); inputs are
bound in :mod:`~onnx_modular.check.inputs`, values judged in
:mod:`~onnx_modular.check.numerics`, and the report rendered in
:mod:`~onnx_modular.check.validation_report`. The command line prints the report.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from onnx_modular import runtime
from onnx_modular._checkpoint import Checkpoint, require_data
from onnx_modular._util import gc_paused
from onnx_modular.check.inputs import as_args, bind_inputs, leaves
from onnx_modular.check.localize import ProbeInAdvance, ValidationRun
from onnx_modular.check.numerics import check_tolerances, check_value
from onnx_modular.check.outcome import OutputCheck, ProviderResult
from onnx_modular.check.runners import (
    Inputs,
    PartsRunner,
    SessionRunner,
    TorchModel,
    TorchRunner,
    snapshot,
)
from onnx_modular.check.validation_report import ValidationReport
from onnx_modular.errors import fail, rules
from onnx_modular.parts.manifest import MANIFEST, load_manifest

__all__ = ["ValidationReport", "parts_directory", "validate"]


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

    ``onnx_model``: a path, an ``onnx.ModelProto`` or an export result (``.model_proto``);
    or a parts directory (``manifest.json``, written by a split or stages ``save``), whose
    parts are chained by :class:`~onnx_modular.parts.runner.SplitRunner` and checked end
    to end (accelerator parts on each provider, CPU regions on the CPU; no localization:
    it needs one model).
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
    parts = parts_directory(onnx_model)
    loaded = runtime.load_model(onnx_model) if parts is None else None
    chosen = runtime.resolve_providers(providers)
    # Only providers the user left to the default may be skipped; an explicit request for
    # one that cannot run is an error, never a silent CPU-only check.
    defaulted = providers is None
    skipped = runtime.unavailable_defaults(chosen) if defaulted else {}
    reference = model.module() if isinstance(model, torch.export.ExportedProgram) else model
    if not callable(reference):
        raise fail(f"model must be a torch.nn.Module or an ExportedProgram, "
                   f"got {type(model).__name__}")
    feeds = {} if loaded is None else bind_inputs(
        loaded.proto, leaves(reference, args, kwargs), f"ONNX model {loaded.label}")
    if weights is None:  # (a checkpoint is checked as the first run binds it)
        require_data(model, rules.VALIDATION)

    inputs = Inputs(args, kwargs, feeds)
    with gc_paused():
        if parts is not None:
            return _validate_parts(TorchRunner(model, weights), inputs, parts, chosen,
                                   rtol, atol, localize, defaulted, skipped)
        assert loaded is not None
        return _validate(TorchRunner(model, weights), inputs, loaded,
                         chosen, rtol, atol, localize, defaulted, skipped)


def parts_directory(onnx_model: object) -> Path | None:
    """``onnx_model`` as a parts directory (one holding ``manifest.json``), else None."""
    if not isinstance(onnx_model, (str, os.PathLike)):
        return None
    path = Path(onnx_model)
    try:
        return path if path.is_dir() and (path / MANIFEST).is_file() else None
    except OSError:  # a name too long for the file system: load_model says so
        return None


def _validate_parts(reference: TorchRunner, inputs: Inputs, directory: Path,
                    chosen: list[str], rtol: float | None, atol: float | None,
                    localize: bool | str, defaulted: bool, skipped: dict[str, str]
                    ) -> ValidationReport:
    """The chained parts against torch on each provider, end to end."""
    if localize is True:
        raise fail(f"'{directory}' is a parts directory: localization needs one ONNX model; "
                   "validate a part's model, or the unsplit export, to localize",
                   rules.VALIDATION)
    names = [o["name"] for o in load_manifest(directory)["outputs"]]
    expected = reference.run(inputs)
    _check_pairing(expected.values, len(names), str(directory))
    results = _provider_results(lambda provider: PartsRunner.open(directory, provider), names,
                                chosen, inputs, expected.values, rtol, atol, defaulted, skipped)
    return ValidationReport(str(directory), results, expected.seconds, skipped=skipped)


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
    _check_pairing(expected.values, len(loaded.proto.graph.output), f"ONNX model {loaded.label}")
    results = _provider_results(lambda provider: SessionRunner.open(loaded, provider, source),
                                [o.name for o in loaded.proto.graph.output], chosen, inputs,
                                expected.values, rtol, atol, defaulted, skipped)
    report = ValidationReport(loaded.label, results, expected.seconds, skipped=skipped)
    failing = [r.provider for r in results if not r.ok]
    provider = failing[0] if failing else results[-1].provider if results else None
    if provider is not None:
        report.run = ValidationRun(reference, inputs, loaded, provider, rtol, atol,
                                   fuse=bool(failing), calls=calls, advance=advance)
        if localize is True or (localize == "auto" and failing):
            report.relocalize()
    return report


def _check_pairing(expected: list[torch.Tensor], outputs: int, label: str) -> None:
    """Torch's outputs must be something to compare, one per ONNX output."""
    if expected and all(t.numel() == 0 for t in expected):
        raise fail(f"every output of the torch model is empty (shapes "
                   f"{', '.join(str(list(t.shape)) for t in expected)}) on these inputs: "
                   "there is nothing to compare; validate with inputs of non-zero size",
                   rules.VALIDATION)
    if len(expected) != outputs:
        raise fail(f"torch returns {len(expected)} tensor(s) but {label} "
                   f"has {outputs} output(s); they cannot be paired",
                   rules.VALIDATION)


def _provider_results(open_runner: Callable[[str], SessionRunner | PartsRunner],
                      output_names: list[str], chosen: list[str], inputs: Inputs,
                      expected: list[torch.Tensor], rtol: float | None, atol: float | None,
                      defaulted: bool, skipped: dict[str, str]) -> list[ProviderResult]:
    """Every output on each provider, one runner (its sessions made by ``open_runner``) at
    a time; a default provider that cannot start is noted in ``skipped``."""
    results = []
    for provider in chosen:
        try:
            session = open_runner(provider)
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
