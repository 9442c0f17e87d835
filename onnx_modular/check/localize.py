"""Localization start to end: torch's module calls, the probe run on one provider, judged.

:mod:`~onnx_modular.check.recorder` records torch's calls, :mod:`~onnx_modular.check.probe`
exposes every ONNX call's outputs, :mod:`~onnx_modular.check.judge` pairs and compares
them; this module runs the three in order, then :mod:`~onnx_modular.check.own` (each call
alone on torch's inputs of it: the error it adds, where the judge sees what it receives).
A :class:`~onnx_modular.check.validate.Validation` session keeps a :class:`ValidationRun`
(what it ran, frozen), so it can localize later (to extract a healthy call, or to draw the
overlay); the probe built in advance is the session's too, and closed by it before its
``run`` returns.
"""

from __future__ import annotations

import threading

from onnx_modular.check.call_stats import OwnErrors
from onnx_modular.check.judge import Localization, judge
from onnx_modular.check.own import own_errors
from onnx_modular.check.probe import Probe, build_probe
from onnx_modular.check.recorder import TorchCall
from onnx_modular.check.runners import SessionRunner, ValidationRun
from onnx_modular.leaves import runtime
from onnx_modular.leaves._util import gc_paused

__all__ = ["ProbeInAdvance", "ValidationRun", "localize"]

#: A probe, its session (None: to be made) and why the probe could not be built.
Ready = tuple[Probe | None, SessionRunner | None, Exception | None]


class ProbeInAdvance:
    """The probe and its session, built on a thread while the plain session is built.

    ONNX Runtime lets go of the GIL while it builds a session, so on two cores the probe's
    Python inlining and its session overlap the plain session (``scripts/bench_validate.py``).
    Started after the torch run: its hooks would fight the inlining for the GIL, and torch's
    threads wait on a core that ORT keeps busy. Built without fusions, for a passing model;
    a failing one gets a fused session anew.

    Its owner closes it (:meth:`close`: the thread joined, a session nobody took closed)
    before the run that started it returns, taken or not: nothing it built outlives that run.
    """

    def __init__(self, loaded: runtime.LoadedModel, provider: str) -> None:
        self.provider = provider
        self._loaded: runtime.LoadedModel | None = loaded
        self._probe: Probe | None = None
        self._session: SessionRunner | None = None
        self._error: BaseException | None = None  # raised by the session, not the probe
        self._probe_error: Exception | None = None
        self._worker = threading.Thread(target=self._build, name="onnx_modular-probe",
                                        daemon=True)
        self._worker.start()

    def _build(self) -> None:
        loaded = self._loaded
        assert loaded is not None
        try:
            self._probe = _build_probe(loaded)
        except Exception as exc:
            self._probe_error = exc
            return
        if self._probe.kind == "none":
            return
        try:
            self._session = _probe_session(loaded, self.provider, self._probe, fuse=False)
        except BaseException as exc:
            self._error = exc

    def take(self, provider: str, fuse: bool) -> Ready | None:
        """(probe, session or None, why the probe could not be built) once built; None
        when it was built for another provider. The session is handed out once (its taker
        closes it); one ``fuse`` does not want is closed here."""
        self._worker.join()
        if provider != self.provider:
            return None
        if self._error is not None:
            raise self._error
        session, self._session = self._session, None
        if fuse and self._probe is not None and self._probe.kind != "none":
            if session is not None:
                session.close()
            return self._probe, None, None  # the probe stands; its session is made again
        return self._probe, session, self._probe_error

    def close(self) -> None:
        """Wait for the thread, close a session nobody took, and let go of the model."""
        self._worker.join()
        if self._session is not None:
            self._session.close()
        self._session = self._probe = self._loaded = None
        self._error = self._probe_error = None

    @property
    def alive(self) -> bool:
        """Whether its thread still runs (never, once closed)."""
        return self._worker.is_alive()


def localize(run: ValidationRun, calls: list[TorchCall] | None = None,
             advance: ProbeInAdvance | None = None) -> Localization:
    """Localize on ``run.provider`` now: torch's ``calls`` (recorded again when not given),
    the probe (the one built in ``advance`` when it fits; its owner closes it), judged;
    and each call's own error."""
    if calls is None:
        _, calls = run.reference.run_recording(run.inputs)
    with gc_paused():
        ready = advance.take(run.provider, fuse=run.fuse) if advance is not None else None
        localization = _localize(run, calls, ready)
        localization.own = _own(run, calls, localization)
    return localization


def _own(run: ValidationRun, calls: list[TorchCall], localization: Localization
         ) -> OwnErrors:
    """Each call's own error; a failure to measure it leaves the localization standing."""
    evidence = localization.evidence
    # a flat model's probe keeps the model's value names: its values serve the pairing
    values = evidence.values if evidence is not None and not evidence.probe.inlined else None
    try:
        return own_errors(run, calls, onnx_values=values,
                          propagated={e.call_id: e.max_abs for e in localization.errors})
    except Exception as exc:
        return OwnErrors([], None, f"not measured: {runtime.first_line(exc)}")


def _build_probe(loaded: runtime.LoadedModel) -> Probe:
    return build_probe(loaded.proto, loaded.model_bytes())


def _probe_session(loaded: runtime.LoadedModel, provider: str, probe: Probe, fuse: bool
                   ) -> SessionRunner:
    return SessionRunner.open(loaded, provider, probe.model_bytes, loaded.session_config(),
                              fuse=fuse)


def _localize(run: ValidationRun, calls: list[TorchCall] | None, ready: Ready | None
              ) -> Localization:
    """One ORT session on the inlined model with every call output exposed."""
    if not calls:
        return Localization("none", 0, [], None, "the torch model has no submodule calls")
    probe, session, error = ready if ready is not None else (None, None, None)
    if probe is None and error is None:
        try:
            probe = _build_probe(run.loaded)
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
        session = _probe_session(run.loaded, run.provider, probe, fuse=run.fuse)
    with session:
        values = session.run(run.inputs).values
        names = session.output_names
    feeds = run.inputs.feeds
    return judge(probe, {**feeds, **dict(zip(names, values, strict=True))}, calls,
                 run.tolerances.rtol, run.tolerances.atol)
