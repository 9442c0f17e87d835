"""The one emit pipeline: an unoptimized translation -> the ONNX model a user gets.

Every output goes through it: ``om.export`` (hierarchical or flat), ``om.hook``, each split
region and pipeline stage, and the single-file split. Its steps are onnx_ir passes run in
one :class:`~onnx_ir.passes.Sequential`, so a failure names the step it happened in:

0. ``RepairSqueeze``: a Squeeze of a dimension torch did not squeeze (torch.onnx writes one
   ONNX forbids) loses that axis; each repair is a warning naming the node and its module.
1. ``FoldWeights``: fold what depends on weights and constants only (``Transpose(weight)``);
   inside a function the weight is an input and could no longer be folded.
2. ``Outline``: module calls -> nested local functions; equal bodies share one function.
3. ``Optimize``: onnxscript's optimizer, each unique body once (never inlined), after
   ``ParametrizeBeforeOptimizing`` made bodies of one signature that differ only in float
   scalars one function (a scale of 1.0 would be optimized away, the others not); then
   ``SimplifyOwnSizes``: the sizes a body computes for itself, as few and as constant as
   they can be (one Shape slice per run of dimensions, Reshapes copying their own dims);
   ``ShareConstants``: equal Constant nodes of a body become one (ORT makes each Constant
   of each call an initializer of its own).
4. ``MergeEqualFunctions``: bodies the optimizer made equal become one function, to a
   fixpoint (a parent merges once its children have).
5. ``ExplainDifferences``: each function of a class but the first says why it stayed apart.
6. ``InlineAll`` (flat output only): every call inlined, labels made absolute per copy.
7. ``TensorConstants``: every ``Constant(value_floats=...)`` (and its scalar siblings) in
   tensor form, the one form every tool reads.
8. ``Verify``: strict ONNX type and shape inference; a model ONNX Runtime would reject is an
   error naming the module and FX node, before anything is written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

import onnx_ir as ir
import torch

from onnx_modular.diagnostics import DiagnosticContext, Location, OnnxModularError
from onnx_modular.emit.explain import ExplainDifferences
from onnx_modular.emit.infra import Chains, EmitPassError
from onnx_modular.emit.inline import InlineAll
from onnx_modular.emit.merge import MergeEqualFunctions, ParametrizeBeforeOptimizing
from onnx_modular.emit.optimize import (
    FoldWeights,
    Optimize,
    ShareConstants,
    TensorConstants,
)
from onnx_modular.emit.outline import (
    Outline,
    OutlineReport,
    Select,
    Selection,
    selector,
)
from onnx_modular.emit.repair import Repair, RepairSqueeze
from onnx_modular.emit.sizes import SimplifyOwnSizes
from onnx_modular.emit.verify import Verify
from onnx_modular.leaves._log import timed
from onnx_modular.leaves.arguments import FunctionSelection
from onnx_modular.leaves.errors import fail, rules

__all__ = ["Chains", "EmitOptions", "EmitReport", "emit_model", "program_weights",
           "report_outline"]


@dataclasses.dataclass(frozen=True)
class EmitOptions:
    """What the user asked for (which calls become functions, dedupe, optimization) and
    what the caller knows of the part it emits (ops to avoid, sizes never empty)."""

    functions: FunctionSelection = "all"  # "all", "none" (flat), or classes, names, paths
    dedupe: bool = True
    optimize: bool = True
    #: ONNX op types the optimizer's rewrites must not create (an acc region's denied ops)
    avoid_ops: frozenset[str] = frozenset()
    #: symbolic sizes the user declared at 1 or more (``s72``): a computed shape may end
    #: in -1 beside them (:func:`~onnx_modular.emit.sizes.share_unflatten_shapes`)
    nonzero_sizes: frozenset[str] = frozenset()
    #: the model's modules, (path, qualified type): a ``functions=`` name that matched no
    #: call but names one of them is explained (its calls ran inside another recorded call)
    modules: tuple[tuple[str, str], ...] = ()

    @property
    def flat(self) -> bool:
        return isinstance(self.functions, str) and self.functions == "none"

    def selection(self) -> Select | None:
        """The calls to outline; a form ``functions=`` cannot take is one clear error."""
        try:
            # flat: outline everything, then inline it (invariant 2: same ops, topology)
            return selector("all" if self.flat else self.functions)
        except TypeError as e:
            raise fail(
                "functions= takes 'all', 'none', or an iterable of module classes, class "
                f"names or module paths, got {self.functions!r}",
                rules.UNSUPPORTED_INPUT) from e


@dataclasses.dataclass
class EmitReport:
    """What the pipeline did: filled by its passes as they run."""

    outline: OutlineReport | None = None
    repairs: list[Repair] = dataclasses.field(default_factory=list)


# ---- running it ------------------------------------------------------------------------------

def emit_model(model: ir.Model, chains: Chains, weights: frozenset[str] | set[str],
               options: EmitOptions, ctx: DiagnosticContext) -> EmitReport:
    """Run the pipeline on ``model`` (an unoptimized translation or a part of one), in place.

    ``chains``: FX node name -> its module calls (``module_call_chains`` of the program
    Modularize made, computed by the caller: ``api/spine.py``); ``weights``:
    initializer names of the program's parameters, buffers and lifted constants.
    """
    with ctx.recording_failures():
        select = options.selection()
        report = EmitReport()
        with ctx.scope("Emit"), timed("emit") as log:
            _run(ir.passes.Sequential(*_steps(options, chains, weights, select, report)), model)
            log["functions"] = len(model.functions)
    for repair in report.repairs:
        ctx.warn(rules.TRANSLATION, Location(module_path=repair.module_path,
                                             fx_node=repair.fx_node), reason=(
            f"node '{repair.fx_node}' in module '{repair.module_path or '<root>'}': "
            f"{repair.what}"))
    unmatched = isinstance(select, Selection) and select.unmatched()
    recorded = {call.module_path for chain in chains.values() for call in chain} \
        if unmatched and options.modules else set()
    report_outline(ctx, select, report.outline, options.modules, recorded)
    return report


def report_outline(ctx: DiagnosticContext, select: Select | None,
                   outline: OutlineReport | None, modules: Sequence[tuple[str, str]] = (),
                   recorded: Collection[str] = ()) -> None:
    """What outlining made, as diagnostics: a ``functions=`` name that matched nothing (a
    warning: a misspelt class would leave the model flat; where the model holds such a
    module, why it has no call), calls with no used output, the count of functions for
    calls. Shared by the pipeline and ``om.outline``."""
    if isinstance(select, Selection) and select.unmatched():
        ctx.warn(rules.UNOUTLINED, reason=(
            f"functions={select.unmatched()} matched no module call (by class, class "
            "name or module path)" + _uncalled(select, modules, recorded)))
    if outline is not None:
        for call_id in outline.skipped:
            ctx.note(rules.UNOUTLINED, Location(module_path=call_id),
                     reason=f"module call '{call_id}' has no output used outside it; "
                     "its nodes stay in the parent")
        ctx.note(rules.FUNCTION_SUMMARY, functions=outline.functions, calls=outline.calls)


def _uncalled(select: Selection, modules: Sequence[tuple[str, str]],
              recorded: Collection[str]) -> str:
    """Why a name the model holds matched no call: torch.export recorded none of its
    calls (made inside a ``torch.compiler.nested_compile_region``, whose inner calls carry
    no module of their own, or never made); names the enclosing call that was recorded."""
    kinds = dict(modules)
    hints = []
    for shown, paths in select.uncalled(modules).items():
        more = f" and {len(paths) - 2} more" if len(paths) > 2 else ""
        hint = (f"the model holds {shown} ({', '.join(map(repr, paths[:2]))}{more}) but "
                "torch.export recorded no call of it: it is never called, or only inside a "
                "torch.compiler.nested_compile_region, whose inner calls have no module of "
                "their own")
        parts = paths[0].split(".")
        outer = next((".".join(parts[:n]) for n in range(len(parts) - 1, 0, -1)
                      if ".".join(parts[:n]) in recorded), None)
        if outer is not None:
            kind = kinds.get(outer, "module").rsplit(".", 1)[-1]
            hint += f"; to outline the region, select the enclosing {kind} ('{outer}')"
        hints.append(hint)
    return "".join(f"; {hint}" for hint in hints)


def _steps(options: EmitOptions, chains: Chains, weights: frozenset[str] | set[str],
           select: Select | None, report: EmitReport) -> list[ir.passes.PassBase]:
    """The passes ``options`` ask for, in pipeline order."""
    steps: list[ir.passes.PassBase] = [RepairSqueeze(chains, report.repairs)]
    if options.optimize:
        steps.append(FoldWeights(frozenset(weights), chains, select))
    if options.optimize or not options.flat:
        steps.append(Outline(chains, select, options.dedupe, report,
                             own_sizes=not options.flat))
    if options.optimize:
        if options.dedupe and not options.flat:
            steps.append(ParametrizeBeforeOptimizing(report))
        steps.append(Optimize(options.avoid_ops))
        if not options.flat:
            steps.append(SimplifyOwnSizes(options.nonzero_sizes))
            steps.append(ShareConstants())
        if options.dedupe and not options.flat:  # flat: everything is inlined right after
            steps.append(MergeEqualFunctions(report))
    if options.dedupe and not options.flat:
        steps.append(ExplainDifferences())
    if options.flat:
        steps.append(InlineAll(options.optimize))
    steps.append(TensorConstants())
    steps.append(Verify())
    return steps


def _run(steps: ir.passes.Sequential, model: ir.Model) -> None:
    """Our own errors pass through as raised; anything else names the step it failed in,
    read from the error chain (:class:`EmitPassError` carries the step)."""
    try:
        steps(model)
        return
    except ir.passes.PassError as e:
        failure = e
    chain: list[BaseException] = []
    cause: BaseException | None = failure
    while cause is not None:
        chain.append(cause)
        cause = cause.__cause__
    ours = next((c for c in chain if isinstance(c, OnnxModularError)), None)
    if ours is not None:
        raise ours  # outside the handler: it keeps its own cause (no cycle through onnx_ir's)
    steps_failed = [c for c in chain if isinstance(c, EmitPassError)]
    failed = steps_failed[0] if steps_failed else None  # the pipeline's step, not a sub-pass
    innermost = steps_failed[-1] if steps_failed else None  # what actually went wrong there
    inner = (innermost.__cause__ if innermost is not None else None) or failure.__cause__ \
        or failure
    raise fail(f"{type(inner).__name__}: {inner}", rules.PASS_FAILED,
               pass_name=type(failed.step).__name__ if failed else "emit") from failure


def program_weights(program: torch.export.ExportedProgram) -> frozenset[str]:
    """Initializer names of the program's parameters, buffers and lifted constants."""
    return frozenset(spec.target for spec in program.graph_signature.input_specs
                     if spec.target is not None)

