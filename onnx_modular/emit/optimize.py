"""Optimization around outlining.

Before: fold what depends on weights and constants only (``Transpose(weight)`` of every
Linear), as the flat optimizer would; inside a function the weight is an input and could no
longer be folded. After: the full optimizer, on each unique function body once, never inlined.
"""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common
import onnxscript.optimizer
from onnxscript.optimizer import _constant_folding


def fold_weights(model: ir.Model) -> None:
    """Constant-fold the flat graph (no shape inference: it is only about constant inputs)."""
    _constant_folding.FoldConstantsPass(
        shape_inference=False,
        input_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT,
        output_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT,
    )(model)
    ir.passes.common.RemoveUnusedNodesPass()(model)


def optimize(model: ir.Model) -> None:
    """Constant folding, rewrites and dead-code removal on the main graph and every body.

    With ``inline=False`` a body shared by 48 layers is optimized once, which is what makes
    hierarchical export cheaper than the flat optimizer's pass over 48 copies.
    """
    onnxscript.optimizer.optimize_ir(model, inline=False)
    remove_unused_initializers(model.graph)


def remove_unused_initializers(graph: ir.Graph) -> None:
    """Folding and deduplication can leave weights nobody reads; ORT would warn about each."""
    keep = set(graph.inputs) | set(graph.outputs)
    for name, value in list(graph.initializers.items()):
        if value not in keep and not value.uses():
            del graph.initializers[name]


def finish_inlined(model: ir.Model) -> None:
    """After inlining every body into the main graph: constants become shared initializers.

    Inside functions constants must be nodes; in a flat graph the 48 copies of one shape
    constant become a single initializer, as in torch.onnx's own flat model. No common
    subexpression elimination: the flat graph keeps the hierarchical model's topology.
    """
    ir.passes.Sequential(
        ir.passes.common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        ir.passes.common.DeduplicateInitializersPass(),
    )(model)
    remove_unused_initializers(model.graph)

