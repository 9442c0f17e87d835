"""Capture: an ``nn.Module`` and example inputs -> ``torch.export.ExportedProgram``.

The first stage of the pipeline. Export is non-strict (no TorchDynamo tracing of the Python
code), which is what torch.onnx does too; an ExportedProgram from another pipeline is taken
as it is. Any export failure becomes one line that names the model class.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from typing import Any

import torch

from onnx_modular.diagnostics import DiagnosticContext, Location
from onnx_modular.leaves._checkpoint import (
    Checkpoint,
    bound_weights,
    check_checkpoint,
    require_data,
)
from onnx_modular.leaves._compat import (
    ExportUserError,
    dims_from_names,
    is_constraint_violation,
    program_guards,
    quiet_libraries,
    size_oblivious,
    tree_leaves,
)
from onnx_modular.leaves.arguments import DynamicShapes, ExampleArgs, ExampleKwargs, Model
from onnx_modular.leaves.errors import fail, rules


def capture(model: Model, args: ExampleArgs = (), kwargs: ExampleKwargs | None = None,
            dynamic_shapes: DynamicShapes | None = None,
            ctx: DiagnosticContext | None = None, *,
            weights: Checkpoint | None = None,
            meta_ok: bool = False) -> torch.export.ExportedProgram:
    """``torch.export.export(..., strict=False)``; an ExportedProgram passes through.

    ``weights``: the checkpoint of a model built on the meta device; the program holds its
    tensors, mapped from their files (:mod:`onnx_modular.leaves._checkpoint`), and the model gets
    its own back. ``meta_ok``: the caller reads shapes only (a stage plan), so a model on
    the meta device needs no checkpoint.
    """
    ctx = ctx if ctx is not None else DiagnosticContext()
    if weights is not None:
        check_checkpoint(model, weights)  # one line naming the parameter, before any work
    elif not meta_ok:
        require_data(model, rules.UNSUPPORTED_INPUT, Location(module_path=""))
    if isinstance(model, torch.export.ExportedProgram):
        _warn_unchecked_guards(model, ctx)
        return model
    if not isinstance(model, torch.nn.Module):
        raise fail(rule=rules.UNSUPPORTED_INPUT, reason=(
            f"the model must be an nn.Module or an ExportedProgram, got {type(model).__name__}"))
    if not isinstance(args, tuple):
        args = tuple(args) if isinstance(args, list) else (args,)
    try:
        with quiet_libraries(), bound_weights(model, weights):
            # (failures print graphs and log before our one line)
            program = _export(model, args, kwargs, dynamic_shapes, ctx)
    except Exception as e:
        raise fail(rule=rules.EXPORT_FAILED, location=failing_module(model, e), reason=(
            f"torch.export failed on {type(model).__name__}: {type(e).__name__}: "
            f"{_telling_line(e)}")) from e
    check_outputs(program, type(model).__name__)
    _warn_empty_inputs(args, kwargs, ctx)
    _warn_unchecked_guards(program, ctx)
    return program


_BOUND = re.compile(r"^[\w\[\]'.()]+ [<>]=? -?\d+$")  # a range: the file fails outside it


def _warn_unchecked_guards(program: torch.export.ExportedProgram,
                           ctx: DiagnosticContext) -> None:
    """Conditions torch.export specialized a dynamic program under (``Dim.DYNAMIC`` lets it
    make ``float(x.shape[1] // 8)`` the constant 4.0, keeping the axis dynamic): torch's
    program raises where they fail, the ONNX file checks nothing and computes other
    numbers. A plain bound (``size()[1] <= 64``) is left out: past it the file fails too."""
    guards = [g.replace("L['", "").replace("']", "") for g in program_guards(program)]
    guards = [g for g in guards if not _BOUND.match(g)]
    if guards:
        ctx.warn(rules.UNSUPPORTED_INPUT, Location(module_path=""), reason=(
            f"torch.export specialized the program under {'; '.join(guards[:3])}"
            f"{f' and {len(guards) - 3} more' if len(guards) > 3 else ''}: the file cannot "
            "check it and computes other numbers than the model where it fails (torch's "
            "program raises); make that dimension static, or give it a Dim(...) and "
            "torch.export says what to fix"))


def _export(model: torch.nn.Module, args: tuple[Any, ...], kwargs: ExampleKwargs | None,
            dynamic_shapes: DynamicShapes | None, ctx: DiagnosticContext
            ) -> torch.export.ExportedProgram:
    """Non-strict export, captured as torch.onnx captures where dynamic shapes meet a
    constraint torch's guards raise: once more without size specialization (MobileBERT's
    ``seq - 1 != 1``, Wav2Vec2's frame arithmetic), then with the dimensions torch's
    suggested fixes make static (Funnel's sequence); a warning says which. The first error
    is raised if all fail.

    Captured without autograd, as the file runs and as ``validate`` computes its reference:
    with gradients on, torch's decomposition of ``scaled_dot_product_attention`` gives other
    strides than its capture, and T5's ``reshape`` after it became a ``view`` no tensor can
    take (torch.onnx fails the same way unless called under ``torch.no_grad()``)."""
    def export(shapes: Any, defer: bool = False) -> torch.export.ExportedProgram:
        with torch.no_grad():
            return torch.export.export(model, args, kwargs or {}, dynamic_shapes=shapes,
                                       strict=False,
                                       prefer_deferred_runtime_asserts_over_guards=defer)

    dynamic_shapes = dims_from_names(dynamic_shapes)  # {0: "batch"}, as torch.onnx takes it
    try:
        return export(dynamic_shapes)
    except Exception as first:
        # torch can fail while wording a constraint violation (LongT5's local attention:
        # an AssertionError about a derived Dim), so any failure with dynamic shapes retries
        if dynamic_shapes is None or (isinstance(first, ExportUserError)
                                      and not _violation(first)):
            raise
        program, second = _without_specialization(export, dynamic_shapes, first, ctx)
        for error in [e for e in (first, second) if _violation(e)] if program is None else []:
            program = _as_suggested(export, dynamic_shapes, error, ctx)
            if program is not None:
                break
        if program is None and second is not None:
            program = _deferring_guards(export, dynamic_shapes, second, ctx)
        if program is None:
            raise
        return program


def _violation(error: BaseException | None) -> bool:
    """A constraint violation of torch.export's (guards that fail for sizes marked dynamic)."""
    return isinstance(error, ExportUserError) and is_constraint_violation(error)


def _deferring_guards(export: Callable[..., torch.export.ExportedProgram], shapes: Any,
                      violation: BaseException, ctx: DiagnosticContext
                      ) -> torch.export.ExportedProgram | None:
    """The export with the guards torch could not prove made runtime assertions, as
    torch.onnx captures (LongT5's local attention: ``seq % 5 != 0``, where padding to its
    blocks adds nothing); ONNX holds no assertion, so a warning lists what the file
    assumes. None where it still fails."""
    try:
        with size_oblivious():
            program = export(shapes, defer=True)
    except Exception:
        return None
    assumed = sorted(_unproven_guards(violation), key=len)  # the plainest first
    listed = "; ".join(assumed[:3]) + (f" and {len(assumed) - 3} more" if len(assumed) > 3
                                       else "")
    ctx.warn(rules.UNSUPPORTED_INPUT, Location(module_path=""), reason=(
        "dynamic_shapes: torch.export could not prove its guards for every size marked "
        "dynamic, so they were captured as runtime assertions, as torch.onnx captures; "
        f"the file checks none of them and assumes {listed or 'them'}: validate at sizes "
        "that break them if you use such sizes"))
    return program


_UNPROVEN = re.compile(r"Not all values of (\w+) = (\S+) in .* satisfy the generated guard "
                       r"(.*?)\.?$")


def _unproven_guards(violation: BaseException) -> list[str]:
    """The guards of a constraint violation torch could not prove, written with the
    ``Dim`` names (``(seq % 5) != 0``, not ``(L['input_ids'].size()[1] % 5) != 0``)."""
    found = [m.groups() for line in str(violation).splitlines()
             if (m := _UNPROVEN.search(line.strip()))]
    sources = {source: name for name, source, _ in found}
    guards: list[str] = []
    for _, _, guard in found:
        for source, name in sources.items():
            guard = guard.replace(source, name)
        if guard not in guards:
            guards.append(guard)
    return guards


def _without_specialization(export: Callable[..., torch.export.ExportedProgram],
                            shapes: Any, first: BaseException, ctx: DiagnosticContext
                            ) -> tuple[torch.export.ExportedProgram | None,
                                       BaseException | None]:
    """The program captured without size specialization, or None and the error (whose
    suggested fixes may differ from the first's: LongT5's first error has none)."""
    try:
        with size_oblivious():
            program = export(shapes)
    except Exception as e:
        return None, e
    head, reason, _ = _constraint_parts(first)
    why = reason or (head if isinstance(first, ExportUserError) else
                     f"torch.export failed with it: {type(first).__name__}: {head}")
    ctx.warn(rules.UNSUPPORTED_INPUT, Location(module_path=""), reason=(
        f"dynamic_shapes: captured without size specialization, as torch.onnx captures "
        f"({why}): the file assumes those sizes are never 0 or 1 where the model "
        "branches on them; validate at such sizes if you use them"))
    return program, None


def _as_suggested(export: Callable[..., torch.export.ExportedProgram], shapes: Any,
                  first: BaseException, ctx: DiagnosticContext
                  ) -> torch.export.ExportedProgram | None:
    """The export with torch's suggested fixes applied (``seq = 8``), with and without
    size specialization; None where there are none or it still fails."""
    try:
        refined = torch.export.dynamic_shapes.refine_dynamic_shapes_from_suggested_fixes(
            getattr(first, "msg", str(first)), shapes)
    except Exception:
        return None
    for oblivious in (False, True):
        try:
            with size_oblivious() if oblivious else contextlib.nullcontext():
                program = export(refined)
        except Exception:
            continue
        ctx.warn(rules.UNSUPPORTED_INPUT, Location(module_path=""), reason=(
            "dynamic_shapes: the model fixes what was marked dynamic, so it is exported as "
            f"torch suggests ({'; '.join(_constraint_parts(first)[2])}); "
            "the file takes only those sizes there"))
        return program
    return None


def _constraint_parts(error: BaseException) -> tuple[str, str | None, list[str]]:
    """An export error's first line, and what a constraint violation adds below it: the
    first reason (``You marked seq as dynamic but your code specialized it ...``, ``Not all
    values of s ... satisfy the generated guard ...``) and torch's suggested fixes."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    first = lines[0] if lines else ""
    reason = next((line.removeprefix("- ") for line in lines[1:]
                   if line.startswith(("- ", "Not all values"))), None)
    fixes: list[str] = []
    if "Suggested fixes:" in lines:
        for line in lines[lines.index("Suggested fixes:") + 1:]:
            if "=" not in line or line.startswith("The error above"):
                break
            fixes.append(line)
    return first, reason, fixes


def _telling_line(error: BaseException) -> str:
    """:func:`_constraint_parts` as one line."""
    first, reason, fixes = _constraint_parts(error)
    return " ".join([first, *([reason] if reason else []),
                     *([f"Suggested fixes: {'; '.join(fixes)}"] if fixes else [])])


def _warn_empty_inputs(args: tuple[Any, ...], kwargs: ExampleKwargs | None,
                       ctx: DiagnosticContext) -> None:
    """torch.export fixes a size-0 dimension of an example input: the model would take only
    empty tensors there. Legal, but rarely meant, so it is said."""
    for k, t in enumerate(t for t in tree_leaves((args, kwargs or {}))
                          if isinstance(t, torch.Tensor)):
        if 0 in t.shape:
            ctx.warn(rules.UNSUPPORTED_INPUT, Location(module_path=""), reason=(
                f"example input #{k} has shape {list(t.shape)}: torch.export fixes its "
                "size-0 dimension, so the exported model takes only empty tensors there"))


def check_outputs(program: torch.export.ExportedProgram, name: str) -> None:
    """ONNX outputs are tensors: a forward that returns nothing, or a Python constant, would
    export into a model without outputs or fail deep inside torch.onnx."""
    from torch.export.graph_signature import ConstantArgument, OutputKind

    outputs = [spec for spec in program.graph_signature.output_specs
               if spec.kind == OutputKind.USER_OUTPUT]
    for k, spec in enumerate(outputs):
        if isinstance(spec.arg, ConstantArgument) and spec.arg.value is not None:
            value = spec.arg.value
            raise fail(rule=rules.UNSUPPORTED_INPUT, location=Location(module_path=""), reason=(
                f"output #{k} of {name}.forward() is a constant Python "
                f"{type(value).__name__} ({value!r:.40}), not a tensor: ONNX outputs are "
                "tensors; return torch.tensor(...) or leave it out"))
    if not [s for s in outputs if not isinstance(s.arg, ConstantArgument)]:
        raise fail(rule=rules.UNSUPPORTED_INPUT, location=Location(module_path=""), reason=(
            f"{name}.forward() returns no tensor (None or only in-place updates): an ONNX "
            "model needs at least one output"))


def failing_module(model: torch.nn.Module, error: BaseException) -> Location:
    """Where in the model export failed: the innermost ``forward`` of one of its modules in
    the failure's frames (non-strict export runs the user's Python), with its source line."""
    paths = {id(module): name for name, module in model.named_modules()}
    # torch's frames and ours (``_export`` takes the model first too) are not the model's
    skipped = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))
    found = Location(module_path="")
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        tb = cause.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            code = frame.f_code  # a method's first argument, whatever its name
            owner = frame.f_locals.get(code.co_varnames[0]) if code.co_argcount else None
            if (owner is not None and id(owner) in paths
                    and not code.co_filename.startswith(skipped)):
                found = Location(module_path=paths[id(owner)],
                                 source_file=code.co_filename, source_line=tb.tb_lineno)
            tb = tb.tb_next
        cause = cause.__cause__ or cause.__context__
    return found
