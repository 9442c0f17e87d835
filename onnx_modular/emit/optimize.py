"""Optimization around outlining.

Before: fold what depends on weights and constants only (``Transpose(weight)`` of every
Linear), as the flat optimizer would; inside a function the weight is an input and could no
longer be folded. After: the full optimizer, on each unique function body once, never inlined.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common

from onnx_modular.emit.hold import hold_varying_inputs, release
from onnx_modular.emit.infra import Chains, EmitPass
from onnx_modular.emit.outline import Select, chains_per_node
from onnx_modular.emit.walk import all_nodes, graphs
from onnx_modular.leaves._compat import (
    FOLDING_LOGGER,
    fold_constants_pass,
    optimize_ir_keeping_calls,
    quiet_loggers,
)
from onnx_modular.leaves._weights import StridedTensor
from onnx_modular.leaves.metadata import CallInfo


def _quiet_folding() -> contextlib.AbstractContextManager[None]:
    """The folder warns on stderr about every node its reference evaluator cannot evaluate
    (such a node is simply left as it is), the deduplicator about every constant that is a
    region's output; keep that out of the user's terminal."""
    return quiet_loggers(FOLDING_LOGGER, "onnx_ir.passes.common.initializer_deduplication")


#: Folded values up to this many elements (shapes, axes, scalars) go back into the bodies.
SMALL_CONSTANT = 16
#: Folded values whose elements are all equal (a zero bias torch.onnx makes for a Conv
#: without one) also go back, up to this many elements: as inputs they would make a 32-channel
#: conv a different function from a 16-channel one.
SPLAT_CONSTANT = 1 << 16


def _is_small_or_splat(tensor: ir.TensorProtocol) -> bool:
    if tensor.size <= SMALL_CONSTANT:
        return True
    if tensor.size > SPLAT_CONSTANT:
        return False
    array = tensor.numpy().reshape(-1)
    return bool((array == array[0]).all())


def fold_weights(model: ir.Model, weights: set[str] | frozenset[str] = frozenset(),
                 per_node: Sequence[tuple[CallInfo, ...]] | None = None) -> None:
    """Constant-fold the flat graph (no shape inference: it is only about constant inputs).

    The folder writes every result as an initializer, small ones too: the target shape of
    each Reshape, axes, scalars. Outlined, those would enter every layer function as inputs,
    and a body would no longer say its own shapes; so results of up to ``SMALL_CONSTANT``
    elements, or made of one repeated value, that are neither model ``weights`` (by
    initializer name) nor computed from one become Constant nodes again, which the outliner
    copies into each call using them. A value computed from a weight (``-exp(A_log)`` of a
    Mamba mixer, ``1 + weight`` of an RMSNorm) is a weight too, however small: baked into a
    body, it would make every layer a function of its own. ``per_node``: each node's module
    calls (in graph order), to hold a call's inputs that are constant only in some calls of
    its class (:mod:`.hold`).
    """
    derived = _weight_derived(model.graph, weights)
    holds = [] if per_node is None else hold_varying_inputs(model.graph, list(model.graph),
                                                            per_node)
    try:
        with _quiet_folding():
            _fold_weights(model)
    finally:
        held = release(model.graph, holds)
    _small_initializers_to_constants(model.graph, weights | held, derived)
    _contiguous_when_written(model.graph)


#: Ops whose result says only their input's shape: a weight they read derives nothing.
_SHAPE_ONLY = frozenset({"Shape", "Size"})


def _weight_derived(graph: ir.Graph, weights: set[str] | frozenset[str]) -> set[str]:
    """Names of the values computed from a model weight's values (the folder names a folded
    initializer after the value it replaces). Unoptimized, torch.onnx leaves most values
    untyped (a GroupNorm's ``Unsqueeze(weight)``), so the folded tensor's dtype decides
    later (:func:`_small_initializers_to_constants`)."""
    derived = {v for name, v in graph.initializers.items() if name in weights}
    names: set[str] = set()
    for node in graph:
        if node.op_type in _SHAPE_ONLY and node.domain in ("", "ai.onnx"):
            continue
        # CastLike(c, like) takes only ``like``'s type: a clamp bound cast like an
        # activation stays the body's constant
        read = node.inputs[:1] if node.op_type == "CastLike" else node.inputs
        if any(v in derived for v in read if v is not None):
            derived.update(node.outputs)
            names.update(v.name for v in node.outputs if v.name)
    return names


def _small_initializers_to_constants(graph: ir.Graph, weights: set[str] | frozenset[str],
                                     derived: set[str] | frozenset[str] = frozenset()
                                     ) -> None:
    """Small and splat initializers become Constant nodes, except ``weights`` and the
    floating-point values ``derived`` from one. Integer results (position ids sliced from a
    buffer) are index tables, not weights: they go into the bodies."""
    keep = set(graph.inputs) | set(graph.outputs)
    first = next(iter(graph), None)
    for name, value in list(graph.initializers.items()):
        tensor = value.const_value
        if (name in weights or value in keep or tensor is None or not value.uses()
                or (name in derived and tensor.dtype.is_floating_point())
                or not _is_small_or_splat(tensor)):
            continue

        constant = ir.node("Constant", [], attributes={"value": tensor}, name=f"{name}_const")
        constant.outputs[0].name = name
        constant.outputs[0].type, constant.outputs[0].shape = value.type, value.shape
        for use in list(value.uses()):
            use.node.replace_input_with(use.idx, constant.outputs[0])
        del graph.initializers[name]
        if first is None:
            graph.append(constant)
        else:
            graph.insert_before(first, constant)


def _contiguous_when_written(graph: ir.Graph) -> None:
    """Folded weights are often views (``Transpose(weight)`` of a Linear), which numpy
    writes element by element (~80 MB/s): each becomes a tensor that is written in blocks
    (see ``_weights``)."""
    for value in graph.initializers.values():
        tensor = value.const_value
        if not isinstance(tensor, ir.Tensor) or isinstance(tensor, StridedTensor):
            continue
        array = tensor.raw
        if not isinstance(array, np.ndarray) or array.flags.c_contiguous:
            continue
        value.const_value = StridedTensor(array, dtype=tensor.dtype, name=tensor.name,
                                          doc_string=tensor.doc_string,
                                          metadata_props=dict(tensor.metadata_props))


def _fold_weights(model: ir.Model) -> None:
    fold_constants_pass()(model)
    ir.passes.common.RemoveUnusedNodesPass()(model)


class FoldWeights(EmitPass):
    """Fold what depends on weights and constants only (:func:`fold_weights`), before
    outlining: inside a function a weight is an input and could no longer be folded."""

    def __init__(self, weights: frozenset[str], chains: Chains, select: Select | None) -> None:
        super().__init__()
        self.weights, self.chains, self.select = weights, chains, select

    def run(self, model: ir.Model) -> None:
        nodes = list(model.graph)
        fold_weights(model, self.weights, chains_per_node(nodes, self.chains, self.select))


def optimize(model: ir.Model, avoid: frozenset[str] = frozenset()) -> None:
    """Constant folding, rewrites and dead-code removal on the main graph and every body.

    With ``inline=False`` a body shared by 48 layers is optimized once, which is what makes
    hierarchical export cheaper than the flat optimizer's pass over 48 copies. ``avoid``:
    ONNX op types no rewrite may create (an accelerator region's denied ops: a Min/Max pair
    must not come back as the Clip the user kept off the accelerator).
    """
    with _quiet_folding():
        optimize_ir_keeping_calls(model, avoid)
    if collapse_reshapes(model):
        ir.passes.common.RemoveUnusedNodesPass()(model)
    plain_reshapes(model)
    remove_unused_initializers(model.graph)


class Optimize(EmitPass):
    """onnxscript's optimizer, each unique body once (:func:`optimize`)."""

    def __init__(self, avoid: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.avoid = avoid

    def run(self, model: ir.Model) -> None:
        optimize(model, self.avoid)


def _is_reshape(node: ir.Node | None) -> bool:
    return node is not None and node.op_type == "Reshape" and node.domain in ("", "ai.onnx")


def collapse_reshapes(model: ir.Model) -> int:
    """``Reshape(Reshape(x, a), b)`` -> ``Reshape(x, b)`` where ``b`` is a constant without 0s.

    onnxscript has this rule, but it writes its shape as an initializer, which a function
    body cannot hold, so inside functions it never fires (one extra Reshape per GPT-2 layer).
    A constant ``b`` without 0 entries does not depend on the intermediate shape.
    """
    collapsed = 0
    for graph in graphs(model):
        for node in list(graph):
            if not _is_reshape(node) or len(node.inputs) < 2 or node.inputs[0] is None:
                continue
            inner = node.inputs[0].producer()
            if not _is_reshape(inner) or inner.graph is not node.graph:
                continue
            shape = ir.convenience.get_const_tensor(node.inputs[1]) if node.inputs[1] else None
            if shape is None or (shape.numpy() == 0).any():
                continue
            node.replace_input_with(0, inner.inputs[0])
            collapsed += 1
            if not inner.outputs[0].uses() and inner.outputs[0] not in graph.outputs:
                graph.remove(inner, safe=True)
    return collapsed


def plain_reshapes(model: ir.Model) -> int:
    """``allowzero=1`` -> ``0`` on Reshapes whose shape is a constant without 0 entries.

    torch.onnx writes ``allowzero=1`` on every Reshape; with no 0 in the shape both forms mean
    the same, but ONNX Runtime fuses contiguous Reshapes only with ``allowzero=0``. In a flat
    graph onnxscript collapses such pairs itself; across a call boundary (a module ending in
    a view whose child starts with one: GPT-2's attention and its ``c_proj``) only ORT, after
    inlining, can, which cost one Reshape per layer.
    """
    relaxed = 0
    for node in all_nodes(model, subgraphs=False):
        allowzero = node.attributes.get("allowzero")
        if (not _is_reshape(node) or allowzero is None or allowzero.as_int() == 0
                or len(node.inputs) < 2 or node.inputs[1] is None):
            continue
        shape = ir.convenience.get_const_tensor(node.inputs[1])
        if shape is None or (shape.numpy() == 0).any():
            continue
        node.attributes["allowzero"] = ir.AttrInt64("allowzero", 0)
        relaxed += 1
    return relaxed


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


def _constant_key(node: ir.Node) -> tuple[object, ...] | None:
    """What a Constant node holds, comparable: its attribute's name, dtype, shape and bytes
    (None for anything else, or a Constant whose value is a reference to the function's
    attribute)."""
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or node.inputs \
            or len(node.attributes) != 1:
        return None
    attribute = next(iter(node.attributes.values()))
    if attribute.is_ref():  # the function's attribute: its value differs per call
        return None
    value = attribute.value
    if attribute.type == ir.AttributeType.TENSOR:
        array = value.numpy()
        # an object array's bytes are pointers (strings): compare its items instead
        held = tuple(array.ravel().tolist()) if array.dtype.kind == "O" else array.tobytes()
        # the ONNX type: numpy spells several 1-byte types alike (float8 variants, int4)
        return attribute.name, value.dtype, array.shape, held
    if isinstance(value, (int, float, str)) or (
            isinstance(value, Sequence) and all(isinstance(v, (int, float)) for v in value)):
        return attribute.name, repr(value)
    return None


def share_equal_constants(graph: ir.Graph) -> int:
    """Constant nodes of ``graph`` holding the same value -> the first of them.

    ONNX Runtime turns each Constant of each call into an initializer of its own when it
    inlines a function: a GPT-2 block's body wrote its three ``[-1, 64]`` and three
    ``[1, 16, -1, 16]`` shapes once per Reshape (17 Constants where 12 values), which made
    every layer call cost five initializers more at session creation. Only Constant nodes,
    never other common subexpressions: the body keeps the topology of the flat model.
    """
    first: dict[tuple[object, ...], ir.Value] = {}
    shared = 0
    for node in list(graph):
        key = _constant_key(node)
        if key is None:
            continue
        output = node.outputs[0]
        kept = first.setdefault(key, output)
        if kept is output or output in graph.outputs:
            continue
        output.replace_all_uses_with(kept)
        graph.remove(node, safe=True)
        shared += 1
    return shared


class ShareConstants(EmitPass):
    """In every function body, equal Constant nodes become one (:func:`share_equal_constants`)."""

    def run(self, model: ir.Model) -> None:
        for function in model.functions.values():
            share_equal_constants(function.graph)


_SCALAR_FORMS = frozenset({"value_float", "value_floats", "value_int", "value_ints"})


def tensor_constants(nodes: Iterable[ir.Node]) -> int:
    """``Constant(value_floats=...)`` and its scalar siblings -> ``Constant(value=<tensor>)``,
    the same values in the one form every tool reads: onnxslim rewrote a body's
    ``value_floats`` (diffusers' ``Upsample2D`` Resize scales) as a double tensor ONNX
    Runtime then refused, and ORT's symbolic shape inference reads ``value`` only."""
    changed = 0
    for node in nodes:
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") \
                or len(node.attributes) != 1 or not _SCALAR_FORMS & set(node.attributes):
            continue
        tensor = ir.convenience.get_const_tensor(node.outputs[0])
        if tensor is not None:
            node.attributes.clear()
            node.attributes["value"] = ir.AttrTensor("value", tensor)
            changed += 1
    return changed


class TensorConstants(EmitPass):
    """Every Constant of the model, bodies and branches too, in tensor form
    (:func:`tensor_constants`)."""

    def run(self, model: ir.Model) -> None:
        tensor_constants(list(all_nodes(model)))
