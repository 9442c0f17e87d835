"""Validate an ONNX model against torch eager on ONNX Runtime execution providers.

Torch eager is the reference. The ONNX model runs on each provider (by default every
available one of CUDA and CPU); each output is compared within tolerances chosen by dtype.
When an output diverges, :mod:`onnx_modular.check.localize` names the first module call whose
outputs diverge, so that a user debugging an export looks at one module, not 2,000 nodes.

:class:`Validation` is the session: it owns what a check needs alive (the torch model, the
ONNX model, its sessions while they run, the probe built in advance, the localization's
values) from its start to :meth:`Validation.close`, and hands out plain records: its
:meth:`~Validation.run` and :meth:`~Validation.localize` return a
:class:`~onnx_modular.check.validation_report.ValidationReport` (frozen data, holding none
of them), :meth:`~Validation.extract` an ``Extraction``, :meth:`~Validation.node_data` a
dict. :func:`validate` is one session's ``run``. What is asked (tolerances, providers, when
to localize) is one :class:`~onnx_modular.check.options.CheckOptions`, built at the entry.

Checks run through :mod:`~onnx_modular.check.runners` (torch eager, one ORT session per
provider, or a parts directory's models chained per provider); inputs are bound in
:mod:`~onnx_modular.check.inputs`, values judged in :mod:`~onnx_modular.check.numerics`.
The command line prints the report.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import torch

from onnx_modular.check.extract import Extraction, extract
from onnx_modular.check.inputs import as_args, bind_inputs, leaves
from onnx_modular.check.judge import Localization
from onnx_modular.check.localize import ProbeInAdvance, ValidationRun, localize
from onnx_modular.check.numerics import check_value
from onnx_modular.check.options import CheckOptions, ProviderPlan, Tolerances
from onnx_modular.check.outcome import OutputCheck, ProviderResult
from onnx_modular.check.overlay import node_data
from onnx_modular.check.recorder import TorchCall
from onnx_modular.check.runners import (
    Inputs,
    Outputs,
    PartsRunner,
    SessionRunner,
    TorchModel,
    TorchRunner,
    snapshot,
)
from onnx_modular.check.validation_report import Reopen, ValidationReport
from onnx_modular.leaves import runtime
from onnx_modular.leaves._checkpoint import Checkpoint, require_data
from onnx_modular.leaves._log import timed
from onnx_modular.leaves._util import gc_paused
from onnx_modular.leaves.arguments import ExampleArgs, ExampleKwargs
from onnx_modular.leaves.errors import fail, rules
from onnx_modular.parts.manifest import MANIFEST, load_manifest

__all__ = ["CheckOptions", "Validation", "ValidationReport", "parts_directory", "validate"]


def validate(
    model: TorchModel,
    args: ExampleArgs,
    onnx_model: runtime.OnnxModelSource,
    *,
    kwargs: ExampleKwargs | None = None,
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

    The report is data: nothing of the run stays alive after this returns. To localize
    later, extract a call or draw the overlay, open a :class:`Validation` instead.
    """
    options = {"kwargs": kwargs, "providers": providers, "rtol": rtol, "atol": atol,
               "localize": localize, "weights": weights}
    with Validation(model, args, onnx_model, **options) as session:
        report = session.run()
    return dataclasses.replace(report, reopen=Reopen.of(Validation, (model, args, onnx_model),
                                                           options))


class Validation:
    """A validation with a lifecycle: ``with om.Validation(model, args, onnx_model) as v:``.

    Takes :func:`validate`'s arguments; checks them and loads the ONNX model when made (a
    bad file, input or provider fails here, before torch runs). Then:

    - :meth:`run`: every output on every provider, localized as ``localize`` says; returns
      a :class:`ValidationReport` (also :attr:`report`, the latest one);
    - :meth:`localize`: localize now, on the provider that failed first (else the last one
      checked); returns a new report (the earlier one is unchanged);
    - :meth:`extract`: a repro of one module call in a folder (localizing if needed);
    - :meth:`node_data`: the errors as Model Explorer node data (localizing if needed);
    - :meth:`release`: let go of the localization's values (every call's outputs, torch's
      and ONNX's); :meth:`close` (on leaving the ``with``): of everything.

    Nothing outlives the session: each ORT session is closed when its run ends, the probe
    built in advance when :meth:`run` returns, the rest on :meth:`close`.
    """

    def __init__(self, model: TorchModel, args: ExampleArgs,
                 onnx_model: runtime.OnnxModelSource, *, kwargs: ExampleKwargs | None = None,
                 providers: str | Sequence[str] | None = None, rtol: float | None = None,
                 atol: float | None = None, localize: bool | str = "auto",
                 weights: Checkpoint | None = None) -> None:
        self.options = CheckOptions.of(providers=providers, rtol=rtol, atol=atol,
                                       localize=localize)
        # A forward that changes its inputs in place (x.relu_()) must not change what ONNX
        # Runtime is fed, nor what a second torch run (localization) sees: both sides read
        # this snapshot, torch through a fresh copy each run; the caller's tensors stay.
        inputs = Inputs(snapshot(as_args(args)), snapshot(dict(kwargs or {})))
        self._parts = parts_directory(onnx_model)
        self._loaded = runtime.load_model(onnx_model) if self._parts is None else None
        self._inputs = _bound(model, inputs, self._loaded)
        if weights is None:  # (a checkpoint is checked as the first run binds it)
            require_data(model, rules.VALIDATION)
        self._reference: TorchRunner | None = TorchRunner(model, weights)
        self._target: ValidationRun | None = None  # what localizing runs, once run
        self._localization: Localization | None = None  # with its values
        self._report: ValidationReport | None = None
        self._closed = False

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> Validation:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Let go of the torch model, the ONNX model, the inputs and every value kept;
        the reports handed out stay as they are."""
        self._closed = True
        self._reference = self._target = self._localization = self._loaded = None
        self._inputs = Inputs()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def report(self) -> ValidationReport | None:
        """The latest report (:meth:`run`, :meth:`localize`), None before :meth:`run`."""
        return self._report

    @property
    def source(self) -> runtime.LoadedModel | None:
        """The ONNX model checked (None for a parts directory, or once closed)."""
        return self._loaded

    @property
    def localization(self) -> Localization | None:
        """The latest localization with its values (``evidence``) while kept."""
        return self._localization

    # -- the check ------------------------------------------------------------------------------

    def run(self) -> ValidationReport:
        """Every output on every provider against torch, localized as asked."""
        reference = self._open()
        self._localization = self._target = None
        with gc_paused(), timed("validate") as log:
            if self._parts is not None:
                report = self._run_parts(reference, self._parts)
            else:
                report = self._run_model(reference)
            log.update(ok=report.ok, providers=",".join(report.providers),
                       localized=report.localization is not None)
        self._report = report
        return report

    def _run_parts(self, reference: TorchRunner, directory: Path) -> ValidationReport:
        """The chained parts against torch on each provider, end to end."""
        if self.options.localize is True:
            raise fail(f"'{directory}' is a parts directory: localization needs one ONNX "
                       "model; validate a part's model, or the unsplit export, to localize",
                       rules.VALIDATION)
        names = [o["name"] for o in load_manifest(directory)["outputs"]]
        expected = reference.run(self._inputs)
        paired, unchecked = check_pairing(expected, len(names), str(directory))
        results, skipped = check_providers(
            lambda provider: PartsRunner.open(directory, provider), names, self._inputs,
            paired, self.options.computing_in(reference.computes_in()))
        return ValidationReport(str(directory), results, expected.seconds, skipped=skipped,
                                unchecked=unchecked)

    def _run_model(self, reference: TorchRunner) -> ValidationReport:
        """One ORT session per provider; localized on a mismatch (or always, if asked)."""
        loaded = self._loaded
        options = self.options.computing_in(reference.computes_in())
        assert loaded is not None
        expected, calls = reference.run_recording(self._inputs,
                                                  record=options.always_localize)
        paired, unchecked = check_pairing(expected, len(loaded.proto.graph.output),
                                          f"ONNX model {loaded.label}")
        source = loaded.session_source()  # serialized once, before the probe's thread reads it
        # Asked for up front, the probe is built while the plain session is; not for a large
        # model (memory over speed: its sessions come one at a time, weights mapped)
        chosen = options.plan.providers
        advance = ProbeInAdvance(loaded, chosen[-1]) \
            if options.always_localize and chosen and not loaded.large else None
        try:
            results, skipped = check_providers(
                lambda provider: SessionRunner.open(loaded, provider, source),
                [o.name for o in loaded.proto.graph.output], self._inputs, paired, options)
            report = ValidationReport(loaded.label, results, expected.seconds, skipped=skipped,
                                      unchecked=unchecked)
            failing = [r.provider for r in results if not r.ok]
            provider = failing[0] if failing else results[-1].provider if results else None
            if provider is None:
                return report
            self._target = ValidationRun(reference, self._inputs, loaded, provider,
                                         options.tolerances, fuse=bool(failing))
            if options.always_localize or (options.localize == "auto" and failing):
                return self._localized(report, calls, advance)
            return report
        finally:
            if advance is not None:
                advance.close()  # taken or not: its thread and session end with the run

    # -- what needs the models: localization, extraction, the overlay -------------------------

    def localize(self) -> ValidationReport:
        """Localize now, on the provider that failed first (else the last one checked):
        a new report, the last one's verdicts with this localization."""
        report = self._report
        if report is None:
            raise fail("nothing to localize yet: run() the validation first",
                       rules.VALIDATION)
        return self._localized(report)

    def _localized(self, report: ValidationReport, calls: list[TorchCall] | None = None,
                   advance: ProbeInAdvance | None = None) -> ValidationReport:
        target = self._require_target("localize")
        self._localization = localize(target, calls, advance)
        self._report = dataclasses.replace(report, localization=self._localization,
                                           localization_provider=target.provider)
        return self._report

    def _evidence(self, what: str) -> Localization:
        """The localization with its values, localizing now if none is kept."""
        localization = self._localization
        if localization is None or localization.evidence is None:
            localization = self._localization = localize(self._require_target(what))
        return localization

    def extract(self, directory: str | Path, call: str | None = None) -> Extraction:
        """Write a repro of one module call into ``directory``: ``module.onnx`` (that call
        alone), ``inputs.npz`` (what reached it in torch), ``expected.npz`` (torch's
        outputs) and ``README.md`` (the command that shows the mismatch, and its size).

        ``call``: a call id or module path (``"h.17.attn"``; a unique tail will do); by
        default the first mismatch. A validation that did not localize (everything
        matched) localizes first, so a healthy call can be extracted to compare.
        """
        localization = self._evidence("extract from")
        target = self._target
        assert target is not None
        return extract(localization, target.loaded, target.provider, directory, call)

    def node_data(self) -> dict[str, Any]:
        """The errors as Model Explorer node data (see :mod:`onnx_modular.check.overlay`),
        localizing first if needed; the report is left as it is."""
        return node_data(self._evidence("draw the overlay of"))

    def release(self) -> None:
        """Let go of the values the localization kept for :meth:`extract` and the overlay
        (every module call's outputs, torch's and ONNX's); asked again, it localizes anew."""
        if self._localization is not None:
            self._localization = dataclasses.replace(self._localization, evidence=None)

    # -- state ----------------------------------------------------------------------------------

    def _open(self) -> TorchRunner:
        if self._closed or self._reference is None:
            raise fail("this validation is closed: open a new om.Validation",
                       rules.VALIDATION)
        return self._reference

    def _require_target(self, what: str) -> ValidationRun:
        """What localizing runs: the model and the provider chosen by :meth:`run`."""
        self._open()
        if self._parts is not None:
            raise fail(f"'{self._parts}' is a parts directory: nothing to {what} (it needs "
                       "one ONNX model; validate a part's model, or the unsplit export)",
                       rules.VALIDATION)
        if self._target is None:
            raise fail(f"nothing to {what} yet: run() the validation first"
                       if self._report is None else
                       f"no provider ran the model: nothing to {what}", rules.VALIDATION)
        return self._target


def _bound(model: TorchModel, inputs: Inputs, loaded: runtime.LoadedModel | None) -> Inputs:
    """``inputs`` with their ONNX feeds (by input name) bound to ``loaded``'s inputs."""
    reference = model.module() if isinstance(model, torch.export.ExportedProgram) else model
    if not callable(reference):
        raise fail(f"model must be a torch.nn.Module or an ExportedProgram, "
                   f"got {type(model).__name__}")
    if loaded is None:
        return inputs
    feeds = bind_inputs(loaded.proto, leaves(reference, inputs.args, inputs.kwargs),
                        f"ONNX model {loaded.label}")
    return dataclasses.replace(inputs, feeds=feeds)


def parts_directory(onnx_model: object) -> Path | None:
    """``onnx_model`` as a parts directory (one holding ``manifest.json``), else None."""
    if not isinstance(onnx_model, (str, os.PathLike)):
        return None
    path = Path(onnx_model)
    try:
        return path if path.is_dir() and (path / MANIFEST).is_file() else None
    except OSError:  # a name too long for the file system: load_model says so
        return None


def check_pairing(outputs_of_torch: Outputs, outputs: int, label: str
                  ) -> tuple[list[torch.Tensor], str]:
    """Torch's outputs must be something to compare, one per ONNX output: its tensors, or,
    where the file has more outputs, its tensors and the numbers it returns (a size
    ``x.shape[1]`` is an output of a dynamic export). Returns those paired, and what torch
    returns that is not compared (the numbers, where the file outputs its tensors only:
    said in the report, never passed over in silence)."""
    expected = outputs_of_torch.values
    numbers = outputs_of_torch.with_numbers
    unchecked = ""
    if len(expected) != outputs and numbers is not None and len(numbers) == outputs:
        expected = numbers
    elif numbers is not None and len(expected) == outputs:
        count = len(numbers) - len(expected)
        unchecked = (f"torch also returns {count} number(s) the file has no output for "
                     "(sizes or flags the model returns beside its tensors): not compared")
    if expected and all(t.numel() == 0 for t in expected):
        raise fail(f"every output of the torch model is empty (shapes "
                   f"{', '.join(str(list(t.shape)) for t in expected)}) on these inputs: "
                   "there is nothing to compare; validate with inputs of non-zero size",
                   rules.VALIDATION)
    if len(expected) != outputs:
        numbered = "" if numbers is None else \
            f" and {len(numbers) - len(outputs_of_torch.values)} number(s)"
        raise fail(f"torch returns {len(outputs_of_torch.values)} tensor(s){numbered} but "
                   f"{label} has {outputs} output(s); they cannot be paired",
                   rules.VALIDATION)
    return expected, unchecked


def check_providers(open_runner: Callable[[str], SessionRunner | PartsRunner],
                    output_names: list[str], inputs: Inputs, expected: list[torch.Tensor],
                    options: CheckOptions) -> tuple[list[ProviderResult], dict[str, str]]:
    """Every output on each provider of ``options.plan``, one runner (its sessions made by
    ``open_runner``) at a time; and the providers skipped, each with why (a default one
    this onnxruntime lacks, or one that cannot start)."""
    plan: ProviderPlan = options.plan
    results: list[ProviderResult] = []
    skipped = dict(plan.unavailable)
    for provider in plan.providers:
        try:
            session = open_runner(provider)
        except runtime.ProviderUnavailableError as exc:
            # onnxruntime-gpu lists CUDA even where no GPU or driver is present: a default
            # CUDA check that cannot start is skipped with its reason; CPU still runs
            if not plan.defaulted:
                raise
            skipped[provider] = exc.diagnostic.message
            continue
        with session:  # its copy of the weights goes before the next session's comes
            actual = session.run(inputs)
        checks = [_check(name, a, e, options.tolerances)
                  for name, a, e in zip(output_names, actual.values, expected, strict=True)]
        results.append(ProviderResult(provider, checks, session.session_s, actual.seconds))
    return results, skipped


def _check(name: str, actual: np.ndarray, expected: torch.Tensor,
           tolerances: Tolerances) -> OutputCheck:
    c = check_value(actual, expected, tolerances.rtol, tolerances.atol, reference="torch ",
                    computed_in=tolerances.computed_in)
    return OutputCheck.of(name, list(expected.shape), c)

