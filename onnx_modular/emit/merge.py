"""Merge the functions the optimizer made equal, to a fixpoint.

:func:`merge_equal_functions` runs :class:`MergeRound` under onnx_ir's ``PassManager`` until a
round merges nothing; :class:`MergeEqualFunctions` is its step in the emit pipeline. Each
round tries, in turn: bodies of one class with equal keys, a function into the fuller
function of its class (its caller ignored some outputs), and bodies that differ only in
float scalars (:mod:`.parametrize`).
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable, Iterator, Mapping

import onnx_ir as ir

from onnx_modular.emit.canonical import graph_key
from onnx_modular.emit.functions import (
    HoldsOutlineReport,
    OutlineReport,
    ensure_calls_resolve,
    function_base,
)
from onnx_modular.emit.infra import EmitPass
from onnx_modular.emit.parametrize import merge_scalar_variants
from onnx_modular.emit.walk import all_nodes, graphs, remove_unread
from onnx_modular.leaves.metadata import META_FX_OUTPUTS


def merge_equal_functions(model: ir.Model, report: OutlineReport | None = None) -> int:
    """After optimization: functions of one class whose bodies came out the same become one,
    to a fixpoint (``Linear`` 32->96 and 32->32: one ``MatMul, Add``; then the two blocks
    that call them, and so on up).

    Bodies are keyed with their input shapes for outlining, since the optimizer specializes a
    body to its shapes; here what it made of each is compared with the shapes left out, and
    equal bodies share the first function. A body's key names the functions it calls, so a
    parent is compared again after its children merged. A kept function's recorded types
    no longer hold for every call and are dropped; names are made dense again (``Linear``,
    ``Linear_1``). When nothing else merges, bodies that differ only in float scalars become
    one function with attributes (:mod:`.parametrize`). Returns how many functions were
    merged away.
    """
    original = {identifier[1]: function for identifier, function in model.functions.items()}
    rounds = MergeRound()
    # each round that changes the model merges a function away: one round more than there
    # are functions always reaches the round that changes nothing, where the manager stops
    ir.passes.PassManager([rounds], steps=len(model.functions) + 1, early_stop=True)(model)
    if not rounds.merged:
        return 0
    _renumber(model)
    if report is not None:
        _follow_merges(report, original, rounds.target)
        report.functions = len(model.functions)
    return rounds.merged


def _renumber(model: ir.Model) -> None:
    """Names dense again, per class in creation order (as outlining named them): ``Linear``,
    ``Linear_1``; the model's functions keyed by their new names, every call following."""
    counts: dict[tuple[str, str], int] = {}
    for function in model.functions.values():
        base = function_base(function.doc_string or function.name)
        n = counts.get((function.domain, base), 0)
        counts[(function.domain, base)] = n + 1
        function.name = base if n == 0 else f"{base}_{n}"
    renamed = {identifier: function for identifier, function in model.functions.items()}
    model.functions.clear()
    for function in renamed.values():
        model.functions[function.identifier()] = function
    _retarget_calls(model, renamed)


def _follow_merges(report: OutlineReport, original: Mapping[str, ir.Function],
                   target: Mapping[int, ir.Function]) -> None:
    """Each call of the report names the function its own was merged into, as renamed."""
    def final(name: str) -> str:
        function = original.get(name)
        while function is not None and id(function) in target:
            function = target[id(function)]
        return function.name if function is not None else name

    report.function_of_call = {call: final(name)
                               for call, name in report.function_of_call.items()}


#: The input types and shapes one call of a function passes (symbolic dimensions by name);
#: None where a type is not known.
Signature = tuple[tuple[str, str], ...] | None


def _signature(function: ir.Function) -> Signature:
    """As outlining keys a body's inputs (``canonical``'s "shape" signature)."""
    if any(value.type is None for value in function.inputs):
        return None
    return tuple((str(value.type), str(value.shape)) for value in function.inputs)


class Signatures:
    """The input signatures each function serves: its own as outlined, then those of the
    functions merged into it. A merged function's recorded types are dropped, so they are
    read once, before the first merge."""

    def __init__(self, model: ir.Model) -> None:
        self._served: dict[int, tuple[ir.Function, set[Signature]]] = {
            id(f): (f, {_signature(f)}) for f in model.functions.values()}

    def of(self, function: ir.Function) -> set[Signature]:
        entry = self._served.get(id(function))
        return entry[1] if entry is not None and entry[0] is function else {None}

    def merge(self, gone: ir.Function, kept: ir.Function,
              widen: Callable[[Signature], Signature] | None = None) -> None:
        """``kept`` serves ``gone``'s signatures too (each through ``widen``: ``gone``'s
        calls pass more inputs to ``kept``)."""
        served = self.of(gone)
        if widen is not None:
            served = {None if sig is None else widen(sig) for sig in served}
        self._served[id(kept)] = (kept, self.of(kept) | served)

    def covers(self, full: ir.Function, small: ir.Function) -> bool:
        """Every call of ``small`` passes what some call of ``full`` passes (all known)."""
        mine, theirs = self.of(small), self.of(full)
        return None not in mine and None not in theirs and mine <= theirs


class MergeRound(EmitPass):
    """One round of :func:`merge_equal_functions`: equal keys first; when none, a function
    into its fuller sibling; when none, scalar variants. Reports a change exactly when it
    merged a function away; ``target`` maps each merged function (by id) to the one kept."""

    def __init__(self) -> None:
        super().__init__()
        self.target: dict[int, ir.Function] = {}
        self.merged = 0
        self.signatures: Signatures | None = None

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if self.signatures is None:
            self.signatures = Signatures(model)
        kept_for = _merge_equal_keys(model, self.target, self.signatures)
        if not kept_for:
            kept_for = _merge_unused_outputs(model, self.target, self.signatures)
        if not kept_for:
            kept_for = _merge_shared_inputs(model, self.target, self.signatures)
        if not kept_for:
            kept_for = _merge_parametrized(model, self.target, self.signatures)
        self.merged += len(kept_for)
        return ir.passes.PassResult(model, modified=bool(kept_for))


class ParametrizeBeforeOptimizing(EmitPass):
    """Before the optimizer: bodies of one class and one input signature that differ only
    in float scalars become one function with attributes (:mod:`.parametrize`). After it,
    a layer whose scale is 1.0 has lost its ``Mul`` (the optimizer drops ``x * 1``) and no
    longer looks like its siblings scaled by 2.0; merged first, the scale is an attribute
    the optimizer leaves alone."""

    def __init__(self, report: HoldsOutlineReport) -> None:
        super().__init__()
        self.report = report

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        original = {identifier[1]: f for identifier, f in model.functions.items()}
        target: dict[int, ir.Function] = {}
        merged = merge_scalar_variants(model, one_signature=True)
        while merged:
            kept_for = {gone.identifier(): kept for gone, kept in merged}
            target.update({id(gone): kept for gone, kept in merged})
            _retarget_calls(model, kept_for)
            merged = merge_scalar_variants(model, one_signature=True)  # their parents
        if not target:
            return ir.passes.PassResult(model, modified=False)
        _renumber(model)
        outline = self.report.outline
        if outline is not None:
            _follow_merges(outline, original, target)
            outline.functions = len(model.functions)
        return ir.passes.PassResult(model, modified=True)

    def ensures(self, model: ir.Model) -> None:
        ensure_calls_resolve(self, model)


class MergeEqualFunctions(EmitPass):
    """After optimization: equal bodies of one class become one function, to a fixpoint
    (:func:`merge_equal_functions`), keeping ``report.outline`` up to date."""

    def __init__(self, report: HoldsOutlineReport) -> None:
        super().__init__()
        self.report = report

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        merged = merge_equal_functions(model, self.report.outline)
        return ir.passes.PassResult(model, modified=bool(merged))

    def ensures(self, model: ir.Model) -> None:
        ensure_calls_resolve(self, model)


def _merge_equal_keys(model: ir.Model, target: dict[int, ir.Function], signatures: Signatures
                      ) -> dict[ir.OperatorIdentifier, ir.Function]:
    """Functions of one class whose bodies (shapes left out) are equal: the first is kept."""
    first: dict[tuple[str, str | None, str], ir.Function] = {}
    kept_for: dict[ir.OperatorIdentifier, ir.Function] = {}
    for identifier, function in model.functions.items():
        key = (function.domain, function.doc_string,
               graph_key(function.graph, signature=False))
        kept = first.setdefault(key, function)
        if kept is not function:
            kept_for[identifier] = kept
            target[id(function)] = kept
            signatures.merge(function, kept)
            _drop_value_types(kept)
    for identifier in kept_for:
        del model.functions[identifier]
    if kept_for:
        _retarget_calls(model, kept_for)
    return kept_for


def _merge_parametrized(model: ir.Model, target: dict[int, ir.Function],
                        signatures: Signatures) -> dict[ir.OperatorIdentifier, ir.Function]:
    """Bodies of one class that differ only in float scalars: one function with attributes
    (:mod:`.parametrize`)."""
    kept_for: dict[ir.OperatorIdentifier, ir.Function] = {}
    for gone, kept in merge_scalar_variants(model):
        target[id(gone)] = kept
        kept_for[gone.identifier()] = kept
        signatures.merge(gone, kept)
        _drop_value_types(kept)
    return kept_for


def _merge_unused_outputs(model: ir.Model, target: dict[int, ir.Function],
                          signatures: Signatures) -> dict[ir.OperatorIdentifier, ir.Function]:
    """A call whose caller ignores some outputs loses them (and what computes only them)
    before outlining, so its body looks like a new prototype (Flux's last single block).
    Such a function is merged into the function of its class it is a part of: the body that,
    with only some of its outputs kept, is the same. Its calls take the fuller function and
    leave the extra outputs unused. One merge per call, then equal keys are compared again.

    Only where the fuller function was built for the same input shapes: its extra outputs'
    nodes still run (ONNX Runtime does not skip them), and a body made for other shapes
    may hold sizes of its own (a Reshape to ``[0, 0, 4, 8]`` of a 32-wide input) that fail
    on this call's input.
    """
    for functions in _by_class(model):
        for small in functions:
            key = graph_key(small.graph, signature=False)
            for full in functions:
                if full is small or len(full.outputs) <= len(small.outputs) \
                        or len(full.inputs) != len(small.inputs) \
                        or not signatures.covers(full, small):
                    continue
                kept = _outputs_matching(full, small, key)
                if kept is None:
                    continue
                target[id(small)] = full
                signatures.merge(small, full)
                _drop_value_types(full)
                del model.functions[small.identifier()]
                _widen_calls(model, small, full, kept)
                return {small.identifier(): full}
    return {}


def _by_class(model: ir.Model) -> list[list[ir.Function]]:
    by_class: dict[tuple[str, str | None], list[ir.Function]] = {}
    for function in model.functions.values():
        by_class.setdefault((function.domain, function.doc_string), []).append(function)
    return list(by_class.values())


#: At most this many parameters of one call may repeat a tensor another one takes
#: (``layer(h, h, h)``: 2).
MOST_SHARED = 3


def _merge_shared_inputs(model: ir.Model, target: dict[int, ir.Function],
                         signatures: Signatures) -> dict[ir.OperatorIdentifier, ir.Function]:
    """A call passing one tensor for several parameters (``layer(h, h)``, ``attn(x, x, x)``)
    reads one value where its siblings read two or three, so its body was outlined with
    inputs fewer and looked like a new prototype. Such a function is merged into the
    function of its class that, with some of its inputs taken as others, is the same; its
    calls pass the tensor again at those places. Only where the fuller function serves
    those input shapes (bodies are specialized to them). One merge per round."""
    for functions in _by_class(model):
        for small in functions:
            key = graph_key(small.graph, signature=False)
            for full in functions:
                extra = len(full.inputs) - len(small.inputs)
                if full is small or not 0 < extra <= MOST_SHARED \
                        or len(full.outputs) != len(small.outputs):
                    continue
                source = _inputs_sharing(full, small, key, signatures)
                if source is None:
                    continue
                target[id(small)] = full
                signatures.merge(small, full, functools.partial(_spread, source=source))
                _drop_value_types(full)
                del model.functions[small.identifier()]
                _share_calls(model, small, full, source)
                return {small.identifier(): full}
    return {}


#: How many ways of reading a fuller function's inputs as a smaller one's are tried against
#: its body, per pair of functions (each try copies the body).
MOST_TRIES = 16
#: How many candidate readings the signatures may offer per pair of functions (layers of
#: many weights of one shape offer many) before the pair is given up.
MOST_CANDIDATES = 4096


def _inputs_sharing(full: ir.Function, small: ir.Function, key: str,
                    signatures: Signatures) -> tuple[int, ...] | None:
    """``source``: which of ``small``'s inputs each input of ``full`` reads, such that
    ``full`` with its surplus inputs read as the ones they repeat is ``small``'s body, and
    every input signature ``small`` serves, spread so, is one ``full`` serves. Candidates
    come from the signatures (``small``'s inputs in order among ``full``'s, each surplus
    input like the one it repeats), so a layer of many weights is no search."""
    served, theirs = signatures.of(small), signatures.of(full)
    if None in served or None in theirs:
        return None
    mine = next(iter(served))
    candidates = (source for theirs_one in theirs for source in _spreads(mine, theirs_one))
    tries = 0
    for source in itertools.islice(candidates, MOST_CANDIDATES):
        if any(_spread(sig, source) not in theirs for sig in served):
            continue
        tries += 1
        if tries > MOST_TRIES:
            return None
        if _reads_as(full, source) == key:
            return source
    return None


def _spreads(small: Signature, full: Signature) -> Iterator[tuple[int, ...]]:
    """Each ``source`` with ``full[k] == small[source[k]]`` for every ``k``, in which
    ``small``'s inputs come in their order and a surplus input repeats one placed before it
    (the call passes a tensor again: its first place is the one the smaller body reads)."""
    assert small is not None and full is not None

    def place(k: int, placed: int, source: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
        if k == len(full):
            if placed == len(small):
                yield source
            return
        if placed < len(small) and full[k] == small[placed]:
            yield from place(k + 1, placed + 1, (*source, placed))
        if len(full) - k > len(small) - placed:  # a surplus place is left
            for own in range(placed):
                if small[own] == full[k]:
                    yield from place(k + 1, placed, (*source, own))

    return place(0, 0, ())


def _reads_as(full: ir.Function, source: tuple[int, ...]) -> str:
    """The key of ``full``'s body with each surplus input read as the first input that
    takes the same tensor (``source``: the smaller function's input each one takes)."""
    joined = ir.serde.deserialize_function(ir.serde.serialize_function(full))
    first: dict[int, int] = {}
    for k, own in enumerate(source):
        first.setdefault(own, k)
    for k in reversed(range(len(source))):
        if first[source[k]] != k:
            joined.inputs[k].replace_all_uses_with(joined.inputs[first[source[k]]])
            joined.inputs.pop(k)
    return graph_key(joined.graph, signature=False)


def _spread(signature: Signature, source: tuple[int, ...]) -> Signature:
    """``signature`` of a call of the smaller function as the fuller one takes it: entry
    ``source[k]`` at each ``k`` (a tensor passed again where the call shares it)."""
    assert signature is not None
    return tuple(signature[i] for i in source)


def _share_calls(model: ir.Model, small: ir.Function, full: ir.Function,
                 source: tuple[int, ...]) -> None:
    """Every call of ``small`` becomes a call of ``full``, input ``k`` its ``source[k]``."""
    for node in all_nodes(model):
        if node.op_identifier() != small.identifier():
            continue
        inputs = [node.inputs[i] for i in source]
        node.resize_inputs(len(inputs))
        for k, value in enumerate(inputs):
            node.replace_input_with(k, value)
        node.domain, node.op_type = full.domain, full.name


def _outputs_matching(full: ir.Function, small: ir.Function,
                      key: str) -> tuple[int, ...] | None:
    """Which outputs of ``full`` (in order), kept alone, make ``small``'s body."""
    for kept in itertools.combinations(range(len(full.outputs)), len(small.outputs)):
        pruned = ir.serde.deserialize_function(ir.serde.serialize_function(full))
        outputs = [pruned.outputs[i] for i in kept]
        pruned.outputs.clear()
        pruned.outputs.extend(outputs)
        remove_unread(pruned.graph)
        if graph_key(pruned.graph, signature=False) == key:
            return kept
    return None


def _widen_calls(model: ir.Model, small: ir.Function, full: ir.Function,
                 kept: tuple[int, ...]) -> None:
    """Every call of ``small`` becomes a call of ``full``; its outputs land at ``kept``."""
    for graph in graphs(model):
        for node in list(graph):
            if node.op_identifier() == small.identifier():
                _widen_call(graph, node, full, kept)


def _widen_call(graph: ir.Graph | ir.Function, node: ir.Node, full: ir.Function,
                kept: tuple[int, ...]) -> None:
    """``node`` (in ``graph``) becomes a call of ``full``; its outputs land at ``kept``, the
    others are unused."""
    wider = ir.Node(full.domain, full.name, list(node.inputs),
                    attributes=list(node.attributes.values()),  # a call's parameters
                    num_outputs=len(full.outputs), name=node.name,
                    metadata_props=dict(node.metadata_props))
    for i, old in zip(kept, node.outputs, strict=True):
        new = wider.outputs[i]
        new.name, new.type, new.shape = old.name, old.type, old.shape
        old.name = None
        for k, out in enumerate(graph.outputs):
            if out is old:
                graph.outputs[k] = new
        old.replace_all_uses_with(new)
    for i, out in enumerate(wider.outputs):
        if out.name is None:
            out.name = f"{node.name}_unused_{i}"
    fx_outputs = node.metadata_props.get(META_FX_OUTPUTS)
    if fx_outputs is not None:
        widened: list[str | None] = [None] * len(full.outputs)
        for i, fx in zip(kept, json.loads(fx_outputs), strict=True):
            widened[i] = fx
        wider.metadata_props[META_FX_OUTPUTS] = json.dumps(widened)
    graph.insert_before(node, wider)
    graph.remove(node, safe=False)


def _retarget_calls(model: ir.Model,
                    target: Mapping[ir.OperatorIdentifier, ir.Function]) -> None:
    """Point every call node (main graph, bodies, subgraphs) at its new function."""
    for node in all_nodes(model):
        function = target.get(node.op_identifier())
        if function is not None:
            node.domain, node.op_type = function.domain, function.name


def _drop_value_types(function: ir.Function) -> None:
    for value in (*function.inputs, *(out for node in function for out in node.outputs)):
        value.type = None
        value.shape = None
