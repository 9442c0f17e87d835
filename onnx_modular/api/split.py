"""``om.split``: accelerator/CPU regions of a model, as a runnable GraphModule and ONNX files.

The model is lowered once (:func:`onnx_modular.api.spine.lower`); a PassManager runs
PlanRegions (the regions of the decomposed program's flat module) and CutRegions on it;
each ONNX node follows its FX node into a region, and every region model goes through the
same emit pipeline as ``om.export`` (folded, outlined into module functions, optimized, equal
functions merged) before ``split`` returns. The result
(:class:`~onnx_modular.api.result.SplitResult`) holds them and saves one
standalone model per region plus ``manifest.json`` (the format :class:`SplitRunner` reads,
shared with pipeline stages), or one model of region functions.
"""

from __future__ import annotations

import torch

from onnx_modular.api.arguments import ExampleArgs, ExampleKwargs, Model, SupportSpec
from onnx_modular.api.render import print_preview
from onnx_modular.api.result import SplitResult, emitted_result
from onnx_modular.api.spine import Subject, lower
from onnx_modular.diagnostics import DiagnosticContext, records_failures
from onnx_modular.emit.regions import AccLimits, RegionEmission
from onnx_modular.leaves._checkpoint import Checkpoint
from onnx_modular.lower.translate import check_opset
from onnx_modular.passes.split import SplitLimits, SplitPass, SplitPlan
from onnx_modular.support.matching import forbidden_onnx_ops
from onnx_modular.support.onnx_index import SupportContext, fx_to_onnx_nodes
from onnx_modular.support.operator_support import (
    CALLABLE_OPS,
    OnnxOp,
    OperatorSupport,
    onnx_op_types,
    resolve_support,
)

__all__ = ["SplitResult", "print_preview", "split"]


@records_failures
def split(model: Model, args: ExampleArgs = (), *, support: SupportSpec,
          min_acc_module_size: int = 1, max_acc_splits: int = -1,
          allow_non_tensor: bool = False, skip_fusion: bool = False,
          kwargs: ExampleKwargs | None = None, opset: int | None = None,
          hierarchical: bool = True, weights: Checkpoint | None = None,
          ctx: DiagnosticContext | None = None) -> SplitResult:
    """Split ``model`` into alternating accelerator/CPU regions (splitter_base semantics).

    ``support``: an :class:`OperatorSupport`, a callable ``fx.Node -> bool``, an iterable of
    op names (allow list), ``{"allow": [...], "deny": [...]}`` or ``"ort:<ExecutionProvider>"``.
    ``max_acc_splits`` > 0 caps the number of regions (acc and CPU, as splitter_base counts).
    ``hierarchical``: module calls lying wholly in a region become functions of its model.
    ``weights``: the checkpoint of a model built on the meta device (as for ``om.export``):
    each region's weights are read from their mapped files as its model is written.
    """
    assert ctx is not None  # made by @records_failures when the caller gives none
    limits = SplitLimits.checked(min_acc_module_size, max_acc_splits, allow_non_tensor,
                                 skip_fusion)
    op_support = resolve_support(support)
    check_opset(opset, flat=False, what="a split model")
    lowered = lower(Subject(model, args, kwargs, weights=weights), opset, ctx)
    flat_module = lowered.program.module()
    context = SupportContext(fx_to_onnx_nodes(lowered.model), dict(lowered.model.opset_imports))
    split_pass = SplitPass(op_support, context=context, limits=limits)
    result = split_pass(flat_module, ctx)  # PlanRegions, then CutRegions, by a PassManager
    assert result.plan is not None
    forbidden = _forbidden_ops(op_support, result.plan, flat_module, context)
    emission = RegionEmission(hierarchical, AccLimits(forbidden, op_support.entries))
    return emitted_result(result, flat_module, lowered, ctx, emission)


def _forbidden_ops(support: OperatorSupport, plan: SplitPlan,
                   flat_module: torch.fx.GraphModule,
                   context: SupportContext) -> frozenset[OnnxOp]:
    """The ONNX ops no acc region's model may hold, given where the plan put each node."""
    nodes = [n for n in flat_module.graph.nodes if n.op in CALLABLE_OPS]
    acc_names = {name for r in plan.regions if r.is_acc for name in r.node_names}
    acc_ops: set[OnnxOp] = set()
    for n in nodes:
        if n.name in acc_names:
            acc_ops |= onnx_op_types(n, context)
    unsupported = set(plan.unsupported_nodes)
    return forbidden_onnx_ops(support, nodes, {n for n in nodes if n.name in unsupported},
                              context, acc_ops)
