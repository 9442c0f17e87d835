"""Runners: one shape for everything a check runs, as Polygraphy's run-then-compare has it.

A runner has a ``name`` and turns one set of :class:`Inputs` into the model's outputs,
flat and timed (:class:`Outputs`): torch eager (the reference, optionally recording every
module call), one ONNX Runtime session (a provider, a localization probe), and chained part
models (:class:`~onnx_modular.parts.runner.SplitRunner`). ``validate``, ``compare`` and
``compare-io`` run through them and judge what comes back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Protocol, TypeAlias, TypeVar

import numpy as np
import torch

from onnx_modular.check.numerics import computes_in
from onnx_modular.check.options import Tolerances
from onnx_modular.check.recorder import TorchCall, record_calls
from onnx_modular.diagnostics import OnnxModularError
from onnx_modular.leaves import runtime
from onnx_modular.leaves._checkpoint import Checkpoint, bound_weights
from onnx_modular.leaves._compat import tensor_version, tree_leaves, tree_map
from onnx_modular.leaves.errors import fail
from onnx_modular.parts.runner import SplitRunner

__all__ = ["Inputs", "Outputs", "PartsRunner", "Runner", "SessionRunner", "TorchModel",
           "TorchRunner", "snapshot"]


#: the reference a check runs: a module, a program captured elsewhere, or a plain callable
TorchModel: TypeAlias = torch.nn.Module | torch.export.ExportedProgram | Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class Inputs:
    """One set of inputs in the two forms runners read: the torch call's ``args`` and
    ``kwargs`` (torch, chained parts), and ``feeds`` by ONNX input name (sessions)."""

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    feeds: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Outputs:
    """A run's outputs, flat in the model's output order, and how long the run took."""

    values: list[Any]
    seconds: float
    #: torch's outputs with the Python numbers among them as 0-d tensors (a size the model
    #: returns, ``x.shape[1]``, is an output of a dynamic export); None where it has none
    with_numbers: list[Any] | None = None


class Runner(Protocol):
    """Anything a check runs: a name to report, and one run on one set of inputs."""

    name: str

    def run(self, inputs: Inputs) -> Outputs: ...


def snapshot(value: Any) -> Any:
    """``value`` with every tensor in it copied (a pytree of inputs)."""
    return tree_map(lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, value)


@contextlib.contextmanager
def buffers_restored(model: Any) -> Iterator[None]:
    """A forward that updates its buffers (a running statistic, a step counter, a cache)
    leaves them as they were: checking a model must not change it, and each run (another
    provider, the localization's recording run) starts from the state the file holds."""
    if not isinstance(model, torch.nn.Module):
        yield
        return
    saved = [(module, name, buffer, tensor_version(buffer), buffer.detach().clone())
             for module in model.modules()
             for name, buffer in module.named_buffers(recurse=False)]
    try:
        yield
    finally:
        with torch.no_grad():
            for module, name, buffer, version, copy in saved:
                if getattr(module, name, None) is not buffer:  # reassigned, not updated
                    setattr(module, name, buffer)
                if tensor_version(buffer) != version:
                    buffer.copy_(copy)


class TorchRunner:
    """Torch eager, the reference: a module, an ``ExportedProgram`` or a plain callable.

    Each run reads a fresh copy of the inputs and leaves the model's buffers as it found them
    (a forward that changes either in place must not change what a second run sees);
    ``weights``, the checkpoint of a model on the meta device, is bound only while a run
    lasts. A failure of the model is a one-line error.
    """

    name = "torch"

    def __init__(self, model: TorchModel, weights: Checkpoint | None = None) -> None:
        self.model = model
        self.weights = weights

    def run(self, inputs: Inputs) -> Outputs:
        outputs, _ = self.run_recording(inputs, record=False)
        return outputs

    def run_recording(self, inputs: Inputs, record: bool = True
                      ) -> tuple[Outputs, list[TorchCall] | None]:
        """The outputs and, with ``record``, every module call (None where the model has
        no submodules to watch: a plain callable, a program that cannot be modularized)."""
        start = time.perf_counter()
        with bound_weights(self.model, self.weights):
            leaves, calls = self._eager(inputs, record)
        values = [t for t in leaves if isinstance(t, torch.Tensor)]
        numbers = [t if isinstance(t, torch.Tensor) else torch.tensor(t) for t in leaves
                   if isinstance(t, (torch.Tensor, bool, int, float))]
        return Outputs(values, time.perf_counter() - start,
                       numbers if len(numbers) > len(values) else None), calls

    def computes_in(self) -> str | None:
        """``float16``/``bfloat16`` where the model's parameters are mostly of that type
        (:func:`~onnx_modular.check.numerics.computes_in`); None for a plain callable.
        Parameters only: a buffer (a table gathered, a cache) kept in half precision by a
        float32 model makes it compute nothing in half precision."""
        model = self.model
        if isinstance(model, torch.export.ExportedProgram):
            names = model.graph_signature.parameters
            weights = [model.state_dict[name] for name in names if name in model.state_dict]
        elif isinstance(model, torch.nn.Module):
            weights = list(model.parameters())
        else:
            return None
        return computes_in(t for t in weights if isinstance(t, torch.Tensor))

    def _target(self, record: bool) -> tuple[Any, bool, bool]:
        """(what to call, whether it is modularized, whether to record)."""
        from onnx_modular.passes.modularize import modularize

        model = self.model
        if not isinstance(model, (torch.nn.Module, torch.export.ExportedProgram)):
            return model, False, False  # a plain callable has no submodules to watch
        if not isinstance(model, torch.export.ExportedProgram):
            return model, False, record
        if record:
            try:
                return modularize(model), True, True
            except Exception:  # localization is best effort; the reference still runs
                pass
        return model.module(), False, False

    def _eager(self, inputs: Inputs, record: bool) -> tuple[list[Any], list[TorchCall] | None]:
        """The flat outputs (every leaf) and the calls recorded."""
        target, modularized, record = self._target(record)
        args, kwargs = snapshot(inputs.args), snapshot(inputs.kwargs)
        calls = None
        with torch.no_grad(), buffers_restored(target):
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
        return list(tree_leaves(out)), calls


_Closing = TypeVar("_Closing", bound="_ClosedOnExit")


@dataclasses.dataclass(frozen=True, eq=False)
class ValidationRun:
    """What a validation ran, kept to localize on ``provider`` later
    (:mod:`~onnx_modular.check.localize`) and to measure each call's own error: torch and
    the inputs, the ONNX model checked and the tolerances. ``fuse``: the model failed, and may
    fail through a fusion, so its probe gets ORT's fusions too (a passing one's probe skips
    them: faster to build)."""

    reference: TorchRunner
    inputs: Inputs
    loaded: runtime.LoadedModel
    provider: str
    tolerances: Tolerances
    fuse: bool


class _ClosedOnExit:
    """As a context manager, the runner lets its sessions go on exit, so one model's
    weights leave before the next session's come."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Closing) -> _Closing:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


class SessionRunner(_ClosedOnExit):
    """One ONNX Runtime session, named after its provider; closed on leaving a ``with``.

    ``output_names``: the outputs to fetch (None: all of them, in the model's order).
    """

    def __init__(self, session: Any, name: str, session_s: float = 0.0,
                 output_names: list[str] | None = None) -> None:
        self.session: Any = session
        self.name = name
        self.session_s = session_s  # how long making the session took
        self.fetch = output_names

    @classmethod
    def open(cls, loaded: runtime.LoadedModel, provider: str, source: str | bytes | None = None,
             config: dict[str, str] | None = None, fuse: bool = True,
             output_names: list[str] | None = None) -> SessionRunner:
        """A session made for one check of ``loaded`` (or of ``source``, a probe derived
        from it) by :func:`onnx_modular.leaves.runtime.check_session`."""
        session, seconds = runtime.check_session(
            loaded, loaded.session_source() if source is None else source, provider, config,
            fuse=fuse)
        return cls(session, provider, seconds, output_names)

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.session.get_inputs()]

    @property
    def output_names(self) -> list[str]:
        """The names of what :meth:`run` returns, in order."""
        if self.fetch is not None:
            return list(self.fetch)
        return [o.name for o in self.session.get_outputs()]

    def run(self, inputs: Inputs) -> Outputs:
        values, seconds = runtime.run_session(self.session, inputs.feeds, self.fetch)
        return Outputs(values, seconds)

    def close(self) -> None:
        self.session = None


class PartsRunner(_ClosedOnExit):
    """Part models chained by a :class:`SplitRunner` (split regions or pipeline stages),
    read by position as the torch model's inputs; outputs come back flat."""

    def __init__(self, parts: SplitRunner, name: str = "parts", session_s: float = 0.0
                 ) -> None:
        self.parts = parts
        self.name = name
        self.session_s = session_s  # how long making the parts' sessions took

    @classmethod
    def open(cls, directory: str | os.PathLike[str], provider: str) -> PartsRunner:
        """The parts of ``directory``, accelerator parts on ``provider`` (CPU regions on
        the CPU), every session made now: a provider that cannot start fails here."""
        parts = SplitRunner(directory, acc_providers=provider)
        start = time.perf_counter()
        parts.open_sessions()
        return cls(parts, provider, time.perf_counter() - start)

    @property
    def output_names(self) -> list[str]:
        """The names of what :meth:`run` returns, in order (the manifest's outputs)."""
        return [o["name"] for o in self.parts.manifest["outputs"]]

    def close(self) -> None:
        self.parts.close()

    def run(self, inputs: Inputs) -> Outputs:
        start = time.perf_counter()
        out = self.parts.run(*inputs.args, **inputs.kwargs)
        return Outputs(list(tree_leaves(out)), time.perf_counter() - start)
