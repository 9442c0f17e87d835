"""``om.hook``: unchanged ``torch.onnx.export`` calls return hierarchical models.

Two entries of torch.onnx are replaced (through :mod:`onnx_modular.leaves._compat`) while any hook
is open, and each replacement acts only for the thread (contextvars context) that opened one:

- the dynamo path's model-building step runs unoptimized, so every node still names its FX
  node, and the result goes through the same emit pipeline as :func:`onnx_modular.export`;
  ``verify=True`` and ``report=True`` then cover that hierarchical model;
- a ``dynamo=False`` call (the TorchScript path, which the released Optimum and Olive's
  default conversion take) is re-run on the dynamo path when none of its options is
  TorchScript-only, and kept only if its inputs, outputs and dynamic axes are what the
  call asked for.

An export that stays flat says why in a :class:`HookWarning` (an error with ``strict=True``).

ONNX Runtime's quantizers and transformers optimizer, run on a hierarchical model inside a
hook, work on its inlined form and write their result outlined again; Optimum's merge of two
decoders keeps their functions (:mod:`onnx_modular.api.hook_tools`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import inspect
import itertools
import os
import re
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnx_modular.api.arguments import FunctionSelection
from onnx_modular.api.hook_tools import Tools
from onnx_modular.api.spine import emit_whole, lower_onnx_program, needs_calls
from onnx_modular.api.torchscript_args import TorchScriptCall
from onnx_modular.diagnostics import (
    Diagnostic,
    DiagnosticContext,
    Level,
    OnnxModularError,
    to_sarif,
)
from onnx_modular.emit.optimize import optimize as optimize_keeping_functions
from onnx_modular.emit.pipeline import EmitOptions
from onnx_modular.leaves._compat import (
    replaced_torch_onnx_export,
    replaced_torchscript_export,
    size_oblivious,
    verify_onnx_program,
)
from onnx_modular.leaves.errors import fail, rules
from onnx_modular.lower.translate import MIN_HIERARCHICAL_OPSET

if TYPE_CHECKING:
    import torch

__all__ = ["HookSession", "HookWarning", "HookedExport", "hook"]

#: torch.onnx.export's own accuracy thresholds for ``verify=True``
_VERIFY_ABS, _VERIFY_REL = 5e-3, 1e-1


class HookWarning(UserWarning):
    """A hooked export stayed flat or lost something; the message says why."""


@dataclasses.dataclass(repr=False)
class HookedExport:
    """One ``torch.onnx.export`` call seen by a hook, and what came of it."""

    path: str | None  # the file it wrote: the call's ``f``, or where its program was saved
    functions: tuple[str, ...]  # the local functions of the model it returned/wrote
    flat_reason: str | None  # why it stayed flat, or None
    #: what lowering and the emit pipeline reported (as ``om.export``'s ``diagnostics``)
    diagnostics: list[Diagnostic]
    verification: list[tuple[str, float, float]] | None = None  # verify=True: name, abs, rel

    @property
    def hierarchical(self) -> bool:
        return bool(self.functions)

    def to_sarif(self) -> dict[str, Any]:
        return to_sarif(self.diagnostics)

    def __str__(self) -> str:
        where = self.path or "(in memory)"
        if self.flat_reason is not None:
            return f"{where}: flat ({self.flat_reason})"
        return f"{where}: hierarchical, {len(self.functions)} function(s)"

    __repr__ = __str__


@dataclasses.dataclass
class HookSession:
    """What one ``with om.hook(...)`` block saw: its exports, in order."""

    options: EmitOptions
    strict: bool
    exports: list[HookedExport] = dataclasses.field(default_factory=list)
    #: files ONNX Runtime's quantizers or transformers optimizer wrote from a hierarchical
    #: model (``api/hook_tools.py``): outlined again, or flat and why
    rewrites: list[HookedExport] = dataclasses.field(default_factory=list)
    #: warnings held back while torch.onnx runs quietly (a dynamo=False call), given after
    pending: list[str] | None = None

    def stays_flat(self, reason: str, path: str | None = None) -> None:
        """Record a flat export; warn, or raise under ``strict``."""
        if not self.strict:
            self.exports.append(HookedExport(path, (), reason, []))
        _warn_or_raise(self, f"this export stays flat: {reason}")

    def tool_outlined(self, path: str, functions: tuple[str, ...],
                      diagnostics: list[Diagnostic]) -> None:
        """Record a tool's file outlined again."""
        self.rewrites.append(HookedExport(path, functions, None, diagnostics))

    def tool_stays_flat(self, path: str, reason: str) -> None:
        """Record a tool's file left flat (its result, not its input); warn or raise."""
        self.rewrites.append(HookedExport(path, (), reason, []))
        _warn_or_raise(self, reason)


#: The open hooks of this context, innermost last (per thread: a new thread starts empty).
_open: contextvars.ContextVar[tuple[HookSession, ...]] = contextvars.ContextVar(
    "onnx_modular_hooks", default=())
_install_lock = threading.Lock()
_users = 0
_installed = contextlib.ExitStack()


def _active() -> HookSession | None:
    sessions = _open.get()
    return sessions[-1] if sessions else None


_tools = Tools(_active)  # ORT's tools and Optimum's merge, patched while any hook is open


# ---- the dynamo path -------------------------------------------------------------------------

def _hierarchical(original: Callable[..., Any]) -> Callable[..., Any]:
    def export_hierarchical(*args: Any, optimize: bool = True, opset_version: int | None = None,
                            verify: bool = False, report: bool = False,
                            artifacts_dir: Any = ".", **kwargs: Any) -> Any:
        session = _active()
        if session is None:
            return original(*args, optimize=optimize, opset_version=opset_version,
                            verify=verify, report=report, artifacts_dir=artifacts_dir, **kwargs)
        if opset_version is not None and opset_version < MIN_HIERARCHICAL_OPSET:
            session.stays_flat(f"opset {opset_version} < {MIN_HIERARCHICAL_OPSET} cannot hold "
                               "the module functions")
            onnx_program = original(*args, optimize=optimize, opset_version=opset_version,
                                    verify=verify, report=report, artifacts_dir=artifacts_dir,
                                    **kwargs)
            _record_saves(onnx_program, session.exports[-1])
            return onnx_program
        with _failure_reports_only(artifacts_dir if report else None) as staging:
            onnx_program = original(*args, optimize=False, opset_version=opset_version,
                                    verify=False, report=report,
                                    artifacts_dir=staging or artifacts_dir, **kwargs)
        record = _emit(onnx_program, session, optimize)
        _record_saves(onnx_program, record)
        if verify:
            record.verification = _verify(onnx_program)
        if report:
            _write_report(Path(artifacts_dir), onnx_program, record)
        return onnx_program

    return export_hierarchical


def _emit(onnx_program: torch.onnx.ONNXProgram, session: HookSession,
          optimize: bool) -> HookedExport:
    """The hook's emit pipeline on torch.onnx's unoptimized model; its findings kept."""
    options = EmitOptions(session.options.functions, session.options.dedupe, optimize)
    ctx = DiagnosticContext()  # one per export: its diagnostics are the record's
    with ctx.recording_failures():  # (the selection was checked as the hook opened)
        lowered = lower_onnx_program(onnx_program, ctx, with_calls=needs_calls(options))
        emit_whole(lowered, options, ctx)
    functions = tuple(sorted({f.name for f in onnx_program.model.functions.values()}))
    _tools.notice_libraries()  # a library imported since the hook opened (Optimum's merge)
    record = HookedExport(None, functions, None, ctx.diagnostics)
    session.exports.append(record)
    for diagnostic in ctx.of_level(Level.WARNING):
        _warn_or_raise(session, str(diagnostic))
    if not functions and not options.flat:
        record.flat_reason = "no module call became a function"
        _warn_or_raise(session, f"this export stays flat: {record.flat_reason} (functions="
                       f"{options.functions!r})")
    _keep_functions_on_optimize(onnx_program)
    return record


def _record_saves(onnx_program: torch.onnx.ONNXProgram, record: HookedExport) -> None:
    """Record the file the program is first saved to: torch.onnx saves it to the call's
    ``f`` after the step the hook replaces, which never sees ``f``."""
    save = onnx_program.save

    def save_recorded(destination: Any, *args: Any, **kwargs: Any) -> None:
        save(destination, *args, **kwargs)
        if record.path is None:
            record.path = os.fspath(destination)

    onnx_program.save = save_recorded


def _warn_or_raise(session: HookSession, message: str) -> None:
    if session.strict:
        raise fail(f"onnx_modular.hook: {message} (strict=True)", rules.EXPORT_FAILED)
    if session.pending is not None:
        session.pending.append(message)
        return
    warnings.warn(f"onnx_modular.hook: {message}", HookWarning, stacklevel=5)


def _keep_functions_on_optimize(onnx_program: torch.onnx.ONNXProgram) -> None:
    """``ONNXProgram.optimize()`` inlines every function; on a hooked program it optimizes
    each body instead, so a pipeline that calls it keeps the hierarchy."""
    def optimize() -> None:
        optimize_keeping_functions(onnx_program.model)

    onnx_program.optimize = optimize


@contextlib.contextmanager
def _failure_reports_only(artifacts_dir: Any) -> Iterator[str | None]:
    """torch.onnx writes its report into a staging folder: a failure's report moves to
    ``artifacts_dir``; a success's (of the flat model, before emission) is dropped, since the
    hook writes its own. None: no report asked, nothing staged."""
    if artifacts_dir is None:
        yield None
        return
    target = Path(artifacts_dir)
    staging = tempfile.mkdtemp(prefix=".onnx_modular-report-")
    succeeded = False
    try:
        yield staging
        succeeded = True
    finally:
        for item in Path(staging).iterdir():
            if succeeded and item.suffix == ".md":
                continue
            target.mkdir(parents=True, exist_ok=True)
            shutil.move(str(item), target / item.name)
        shutil.rmtree(staging, ignore_errors=True)


def _verify(onnx_program: torch.onnx.ONNXProgram) -> list[tuple[str, float, float]]:
    """torch.onnx's ``verify=True`` on the hierarchical model; its thresholds, and a
    warning (torch only logs) when they are passed."""
    results = verify_onnx_program(onnx_program)
    for name, abs_diff, rel_diff in results:
        if not (abs_diff < _VERIFY_ABS and rel_diff < _VERIFY_REL):  # NaN fails too
            warnings.warn(f"onnx_modular.hook: verify=True: output '{name}' differs from "
                          f"torch by {abs_diff:.3g} (abs), {rel_diff:.3g} (rel)", HookWarning,
                          stacklevel=4)
    return results


def _write_report(directory: Path, onnx_program: torch.onnx.ONNXProgram,
                  record: HookedExport) -> Path:
    """A markdown report of the hierarchical model: functions, verification, the model."""
    from onnx_modular.check.inspect import function_stats

    directory.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    path = directory / f"onnx_export_{stamp}_onnx_modular.md"
    for n in itertools.count(1):  # two exports in one second keep both reports
        if not path.exists():
            break
        path = directory / f"onnx_export_{stamp}_onnx_modular_{n}.md"
    lines = ["# PyTorch ONNX Conversion Report (onnx_modular.hook)", "",
             f"Hierarchical: {record.hierarchical}; {len(record.functions)} local function(s).",
             "", "## Functions", "", "| function | calls | differs from |", "|---|---|---|"]
    lines += [f"| {s.name} | {s.calls} | {s.differs_from} |"
              for s in function_stats(onnx_program.model_proto)]
    if record.verification is not None:
        lines += ["", "## Verification (ONNX Runtime vs torch)", "",
                  "| output | max abs diff | max rel diff |", "|---|---|---|"]
        lines += [f"| {n} | {a:.3g} | {r:.3g} |" for n, a, r in record.verification]
    if record.diagnostics:
        lines += ["", "## Diagnostics", ""] + [f"- {d}" for d in record.diagnostics]
    lines += ["", "## ONNX model", "", "```", str(onnx_program.model), "```", ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


# ---- the TorchScript path ---------------------------------------------------------------------

def _through_dynamo(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    def export_torchscript_call(*args: Any, **kwargs: Any) -> Any:
        session = _active()
        if session is None:
            return original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        call = TorchScriptCall(dict(bound.arguments))
        f = call["f"]
        path = os.fspath(f) if isinstance(f, (str, os.PathLike)) else None
        reason = call.torchscript_only()
        if reason is None:
            reason = _export_on_the_dynamo_path(call, session)
            if reason is None:
                session.exports[-1].path = path
                return None
        session.stays_flat(reason, path)
        return original(*args, **kwargs)

    return export_torchscript_call


def _export_on_the_dynamo_path(call: TorchScriptCall, session: HookSession) -> str | None:
    """Export ``call`` hierarchically and save it; None when done, else why it could not."""
    from onnx_modular.lower.translate import quiet_torch_onnx

    functions = call.functions()
    options = session.options if functions is None else EmitOptions(functions,
                                                                      session.options.dedupe)
    inner = HookSession(options, session.strict, session.exports, pending=[])
    token = _open.set((*_open.get(), inner))
    try:
        with quiet_torch_onnx(), call.export_mode():
            onnx_program = _first_export_that_works(call)
    except OnnxModularError as e:
        if session.strict:
            raise
        return f"onnx_modular could not emit it: {_first_line(e)}"
    except Exception as e:  # the TorchScript exporter may still take it
        return f"the dynamo exporter failed: {_first_line(e)}"
    finally:
        _open.reset(token)
        for message in inner.pending or ():  # torch.onnx ran quietly: give them now
            warnings.warn(f"onnx_modular.hook: {message}", HookWarning, stacklevel=4)
    mismatch = call.interface_mismatch(onnx_program.model)
    if mismatch is not None:
        session.exports.pop()
        return f"the dynamo export differs from the TorchScript one: {mismatch}"
    _drop_unused_inputs(onnx_program.model.graph)
    fixed = call.name_axes(onnx_program.model)
    if fixed:
        warnings.warn("onnx_modular.hook: axes the model fixes stay fixed where dynamic_axes "
                      "named them: " + ", ".join(f"'{n}' axis {a} = {size}"
                                                 for n, a, size in fixed[:6]),
                      HookWarning, stacklevel=4)
    call.save(onnx_program)
    return None


def _drop_unused_inputs(graph: Any) -> None:
    """Remove the inputs nothing reads, as the TorchScript exporter does (an unused
    ``forward`` argument, whose ``input_names`` entry goes with it)."""
    used = [v for v in graph.inputs if v.uses() or v.is_graph_output()]
    if len(used) < len(graph.inputs):
        graph.inputs.clear()
        graph.inputs.extend(used)


def _first_export_that_works(call: TorchScriptCall) -> torch.onnx.ONNXProgram:
    """torch.onnx.export(dynamo=True) of ``call``, trying in turn: axes named alike as one
    dimension, then each on its own; without size specialization where an example size is
    0 or 1, then with it (a model may branch on that size). The first error is raised."""
    import torch

    oblivious = [True, False] if call.specializes() else [False]
    first: Exception | None = None
    for no_specialization in oblivious:
        for shared in (True, False):
            try:
                with size_oblivious() if no_specialization else contextlib.nullcontext():
                    return torch.onnx.export(call["model"], dynamo=True,
                                             **call.dynamo_arguments(shared_dims=shared))
            except OnnxModularError:
                raise
            except Exception as e:
                first = first or e
    assert first is not None
    raise first


def _first_line(error: BaseException) -> str:
    """The error and its root cause, one line each (torch.onnx's own message is a banner)."""
    root = error
    while root.__cause__ is not None:
        root = root.__cause__
    text = f"{type(error).__name__}: {_text(error)}"
    if root is not error:
        text += f" (caused by {type(root).__name__}: {_text(root)})"
    return text


def _text(error: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip()
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return (lines or [""])[0][:240]


# ---- the context manager ----------------------------------------------------------------------

def _install() -> None:
    global _users
    with _install_lock:
        if _users == 0:
            _installed.enter_context(replaced_torch_onnx_export(_hierarchical))
            _installed.enter_context(replaced_torchscript_export(_through_dynamo))
            _installed.enter_context(_tools.installed())
        _users += 1


def _uninstall() -> None:
    global _users
    with _install_lock:
        _users -= 1
        if _users == 0:
            _installed.close()


@contextlib.contextmanager
def hook(functions: FunctionSelection = "all", dedupe: bool = True, strict: bool = False
         ) -> Iterator[HookSession]:
    """Make unchanged ``torch.onnx.export`` calls of this thread return hierarchical models.

    ``dynamo=True`` calls are emitted hierarchically (optimized per function when the caller
    asked for optimization, the default); ``dynamo=False`` calls too, where no option is
    TorchScript-only and the result has the interface they asked for. An export that stays
    flat warns (:class:`HookWarning`) or, with ``strict=True``, raises.

    The hook is per thread (contextvars context): other threads, and threads this one
    starts, see plain torch.onnx unless they run in a copy of this context
    (``contextvars.copy_context().run``). Hooks nest: the innermost applies; leaving a hook
    out of order removes that hook alone. Yields a :class:`HookSession` recording each export.
    """
    # A bad selection fails here, at the ``with``, not inside torch.onnx.export after
    # seconds of capture and translation (where torch would wrap it in its own report).
    options = EmitOptions(functions, dedupe)
    options.selection()
    session = HookSession(options, strict)
    _install()
    _open.set((*_open.get(), session))
    try:
        yield session
    finally:
        _open.set(tuple(s for s in _open.get() if s is not session))
        _uninstall()

