"""The one emit pipeline: an unoptimized translation -> the ONNX model a user gets.

Every output goes through it: ``om.export`` (hierarchical or flat), ``om.hook``, each split
region and pipeline stage, and the single-file split. Its steps are onnx_ir passes run in
one :class:`~onnx_ir.passes.Sequential`, so a failure names the step it happened in:

1. ``FoldWeights``: fold what depends on weights and constants only (``Transpose(weight)``);
   inside a function the weight is an input and could no longer be folded.
2. ``Outline``: module calls -> nested local functions; equal bodies share one function.
3. ``Optimize``: onnxscript's optimizer, each unique body once (never inlined).
4. ``MergeEqualFunctions``: bodies the optimizer made equal become one function, to a
   fixpoint (a parent merges once its children have).
5. ``ExplainDifferences``: each function of a class but the first says why it stayed apart.
6. ``InlineAll`` (flat output only): every call inlined, labels made absolute per copy.
7. ``Verify``: strict ONNX type and shape inference; a model ONNX Runtime would reject is an
   error naming the module and FX node, before anything is written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import onnx_ir as ir
import torch

from onnx_modular.diagnostics import DiagnosticContext, Location, OnnxModularError
from onnx_modular.emit.explain import annotate_differences
from onnx_modular.emit.inline import RebasingInlinePass
from onnx_modular.emit.optimize import (
    finish_inlined,
    fold_weights,
    optimize,
    remove_unused_initializers,
)
from onnx_modular.emit.outline import (
    OutlineReport,
    Select,
    Selection,
    chains_per_node,
    merge_equal_functions,
    outline,
    selector,
)
from onnx_modular.emit.verify import verify
from onnx_modular.errors import rules
from onnx_modular.metadata import DIFFERS_FROM, CallInfo

Chains = Mapping[str, tuple[CallInfo, ...]]


@dataclasses.dataclass(frozen=True)
class EmitOptions:
    """What the user asked for: which calls become functions, dedupe, optimization."""

    functions: Any = "all"  # "all" | "none" (flat) | classes, class names or module paths
    dedupe: bool = True
    optimize: bool = True
    #: ONNX op types the optimizer's rewrites must not create (an acc region's denied ops)
    avoid_ops: frozenset[str] = frozenset()

    @property
    def flat(self) -> bool:
        return isinstance(self.functions, str) and self.functions == "none"

    def selection(self, ctx: DiagnosticContext) -> Select | None:
        """The calls to outline; a form ``functions=`` cannot take is one clear error."""
        try:
            # flat: outline everything, then inline it (invariant 2: same ops and topology)
            return selector("all" if self.flat else self.functions)
        except TypeError as e:
            raise ctx.error(rules.UNSUPPORTED_INPUT, reason=(
                "functions= takes 'all', 'none', or an iterable of module classes, class "
                f"names or module paths, got {self.functions!r}")) from e


@dataclasses.dataclass
class EmitReport:
    """What the pipeline did: filled by its passes as they run."""

    outline: OutlineReport | None = None
    graph_module: torch.fx.GraphModule | None = None  # the modularized program, if any


# ---- the passes ------------------------------------------------------------------------------

class EmitPassError(ir.passes.PassError):
    """A step failed: carries the step, so the error names it (not read from message text)."""

    def __init__(self, step: ir.passes.PassBase) -> None:
        super().__init__(f"the emit step {type(step).__name__} failed")
        self.step = step


def _shape(model: ir.Model) -> tuple[list[object], list[object]]:
    """What a pass may change, by identity: every node (subgraphs too) with its inputs,
    attributes, output names and metadata; functions, graph inputs/outputs, initializers and
    opsets. The first list keeps the objects alive, so their ids cannot be reused."""
    keep: list[object] = []
    key: list[object] = [tuple(model.opset_imports.items())]
    graphs: list[ir.Graph | ir.Function] = [model.graph, *model.functions.values()]
    for graph in graphs:
        keep += [graph, *graph.inputs, *graph.outputs]
        key += [id(graph), tuple(map(id, graph.inputs)), tuple(map(id, graph.outputs)),
                tuple(graph.metadata_props.items())]
        for node in ir.traversal.RecursiveGraphIterator(graph):
            attributes = tuple(node.attributes.values())
            keep += [node, *node.inputs, *attributes]
            key += [id(node), node.op_type, node.domain, tuple(map(id, node.inputs)),
                    tuple(map(id, attributes)), tuple(o.name for o in node.outputs),
                    tuple(node.metadata_props.items())]
    for name, value in model.graph.initializers.items():
        keep += [value, value.const_value]
        key += [name, id(value), id(value.const_value)]
    return keep, key


class EmitPass(ir.passes.InPlacePass):
    """A step of the pipeline: ``run`` changes the model in place; whether it did is read
    from the model (:func:`_shape` before and after), and a failure carries the step."""

    def run(self, model: ir.Model) -> None:
        raise NotImplementedError

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        alive, before = _shape(model)  # ``alive``: no id in ``before`` is reused meanwhile
        self.run(model)
        modified = _shape(model)[1] != before
        del alive
        return ir.passes.PassResult(model, modified=modified)

    def __call__(self, model_or_result: ir.Model | ir.passes.PassResult, /
                 ) -> ir.passes.PassResult:
        try:
            return super().__call__(model_or_result)
        except OnnxModularError:
            raise  # already says what went wrong, for the user
        except Exception as e:
            raise EmitPassError(self) from e


class FoldWeights(EmitPass):
    def __init__(self, weights: frozenset[str], chains: Chains, select: Select | None) -> None:
        super().__init__()
        self.weights, self.chains, self.select = weights, chains, select

    def run(self, model: ir.Model) -> None:
        nodes = list(model.graph)
        fold_weights(model, self.weights, chains_per_node(nodes, self.chains, self.select))


class Outline(EmitPass):
    def __init__(self, chains: Chains, select: Select | None, dedupe: bool,
                 report: EmitReport) -> None:
        super().__init__()
        self.chains, self.select, self.dedupe, self.report = chains, select, dedupe, report

    def run(self, model: ir.Model) -> None:
        self.report.outline = outline(model, self.chains, select=self.select, dedupe=self.dedupe)


class Optimize(EmitPass):
    def __init__(self, avoid: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.avoid = avoid

    def run(self, model: ir.Model) -> None:
        optimize(model, self.avoid)


class MergeEqualFunctions(EmitPass):
    def __init__(self, report: EmitReport) -> None:
        super().__init__()
        self.report = report

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        merged = merge_equal_functions(model, self.report.outline)
        return ir.passes.PassResult(model, modified=bool(merged))


class ExplainDifferences(EmitPass):
    """Every extra function of a class records what tells it from the first one."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        before = {key: f.metadata_props.get(DIFFERS_FROM) for key, f in model.functions.items()}
        annotate_differences(model)
        after = {key: f.metadata_props.get(DIFFERS_FROM) for key, f in model.functions.items()}
        return ir.passes.PassResult(model, modified=after != before)


class Verify(EmitPass):
    """Strict ONNX type and shape inference: a model ONNX Runtime would reject is an error
    here, naming the module and FX node, before anything is written."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        verify(model)
        return ir.passes.PassResult(model, modified=False)


class InlineAll(EmitPass):
    """The flat model: every call inlined; constants shared as initializers again."""

    def __init__(self, optimized: bool) -> None:
        super().__init__()
        self.optimized = optimized

    def run(self, model: ir.Model) -> None:
        RebasingInlinePass()(model)
        if self.optimized:
            finish_inlined(model)
        remove_unused_initializers(model.graph)
        used = {n.domain for n in model.graph.all_nodes()}
        for domain in list(model.opset_imports):
            if domain not in ("", "ai.onnx") and domain not in used:
                model.opset_imports.pop(domain, None)


# ---- running it ------------------------------------------------------------------------------

def emit_model(model: ir.Model, chains: Chains, weights: frozenset[str] | set[str],
               options: EmitOptions, ctx: DiagnosticContext) -> EmitReport:
    """Run the pipeline on ``model`` (an unoptimized translation or a part of one), in place.

    ``chains``: FX node name -> its module calls (``module_call_chains`` of the program
    Modularize made, computed by the caller: ``api/spine.py``); ``weights``:
    initializer names of the program's parameters, buffers and lifted constants.
    """
    select = options.selection(ctx)
    report = EmitReport()
    steps: list[ir.passes.PassBase] = []
    if options.optimize:
        steps.append(FoldWeights(frozenset(weights), chains, select))
    if options.optimize or not options.flat:
        steps.append(Outline(chains, select, options.dedupe, report))
    if options.optimize:
        steps.append(Optimize(options.avoid_ops))
        if options.dedupe and not options.flat:  # flat: everything is inlined right after
            steps.append(MergeEqualFunctions(report))
    if options.dedupe and not options.flat:
        steps.append(ExplainDifferences())
    if options.flat:
        steps.append(InlineAll(options.optimize))
    steps.append(Verify())
    with ctx.scope("Emit"):
        _run(ir.passes.Sequential(*steps), model, ctx)
    if isinstance(select, Selection) and select.unmatched():
        ctx.warn(rules.UNOUTLINED, reason=(
            f"functions={select.unmatched()} matched no module call (by class, class "
            "name or module path)"))
    if report.outline is not None:
        for call_id in report.outline.skipped:
            ctx.note(rules.UNOUTLINED, Location(module_path=call_id),
                     reason=f"module call '{call_id}' has no output used outside it; "
                     "its nodes stay in the parent")
        ctx.note(rules.FUNCTION_SUMMARY, functions=report.outline.functions,
                 calls=report.outline.calls)
    return report


def _run(steps: ir.passes.Sequential, model: ir.Model, ctx: DiagnosticContext) -> None:
    """Our own errors pass through; anything else names the step it failed in, read from
    the error chain (:class:`EmitPassError` carries the step)."""
    try:
        steps(model)
    except ir.passes.PassError as e:
        chain: list[BaseException] = []
        cause: BaseException | None = e
        while cause is not None:
            chain.append(cause)
            cause = cause.__cause__
        ours = next((c for c in chain if isinstance(c, OnnxModularError)), None)
        if ours is not None:
            raise ours from e
        failed = next((c for c in chain if isinstance(c, EmitPassError)), None)
        inner = (failed.__cause__ if failed is not None else None) or e.__cause__ or e
        raise ctx.error(rules.PASS_FAILED,
                        pass_name=type(failed.step).__name__ if failed else "emit",
                        reason=f"{type(inner).__name__}: {inner}") from e


def program_weights(program: torch.export.ExportedProgram) -> frozenset[str]:
    """Initializer names of the program's parameters, buffers and lifted constants."""
    return frozenset(spec.target for spec in program.graph_signature.input_specs
                     if spec.target is not None)

