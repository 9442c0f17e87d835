"""Outline ONNX nodes into nested local functions, one call per module call.

Input: a flat ``ir.Model`` whose nodes name their FX node, and for every FX node the chain
of module calls it ran in (``module_call_chains`` of the modularized program). Calls are
outlined innermost first: a call's nodes (and its children's call nodes) move into a
function body, values from outside become function inputs (weights included: functions
hold no initializers), values used outside become outputs, and one call node takes their
place. Bodies with equal structural keys share one ``FunctionProto``.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import onnx
import onnx_ir as ir

from onnx_modular._compat import ort_contrib_operator_names
from onnx_modular._util import class_identifier, common_prefix
from onnx_modular.emit.canonical import graph_key
from onnx_modular.emit.infra import (
    Chains,
    EmitPass,
    calls_of_missing_functions,
    listed,
    unlabelled_calls,
)
from onnx_modular.emit.labels import call_scope, relativize
from onnx_modular.emit.parametrize import merge_scalar_variants
from onnx_modular.emit.sizes import activations_of, derive, is_size
from onnx_modular.metadata import (
    META_CALL,
    META_FX_OUTPUTS,
    META_PATH,
    META_SCOPE,
    META_TYPE,
    CallInfo,
    fx_name,
)

DEFAULT_DOMAIN = "onnx_modular"

Select = Callable[[CallInfo], bool]


@dataclasses.dataclass
class OutlineReport:
    calls: int = 0
    functions: int = 0
    skipped: list[str] = dataclasses.field(default_factory=list)  # calls with no output
    function_of_call: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(eq=False)
class _Scope:
    call: CallInfo | None
    members: list[Any] = dataclasses.field(default_factory=list)  # ir.Node | _Scope
    children: list[_Scope] = dataclasses.field(default_factory=list)


class HoldsOutlineReport(Protocol):
    """Where the outline passes keep their report (the pipeline's ``EmitReport``)."""

    outline: OutlineReport | None


class Selection:
    """Which module calls become functions: classes, class names or module paths.

    Remembers what matched, so that a misspelt name can be reported instead of silently
    leaving the model flat.
    """

    def __init__(self, items: Iterable[Any]) -> None:
        self.wanted: dict[str, str] = {}  # key -> how the user wrote it
        for item in items:
            if isinstance(item, type):
                self.wanted[f"{item.__module__}.{item.__qualname__}"] = item.__qualname__
            else:
                self.wanted[str(item)] = str(item)
        self.matched: set[str] = set()

    def __call__(self, call: CallInfo) -> bool:
        short = call.module_type.rsplit(".", 1)[-1]
        hits = {call.module_path, call.module_type, short} & self.wanted.keys()
        self.matched |= hits
        return bool(hits)

    def unmatched(self) -> list[str]:
        return [shown for key, shown in self.wanted.items() if key not in self.matched]


def selector(functions: Any) -> Select | None:
    """``"all"`` -> None (everything); ``"none"``; or a :class:`Selection` of the items."""
    if functions in (None, "all"):
        return None
    if functions == "none":
        return lambda call: False
    if isinstance(functions, (str, type)):
        functions = [functions]
    return Selection(functions)


def chains_per_node(nodes: list[ir.Node], chains: Mapping[str, tuple[CallInfo, ...]],
                     select: Select | None) -> list[tuple[CallInfo, ...]]:
    """Each node's selected chain; a node of unknown origin takes its surroundings'."""
    result: list[tuple[CallInfo, ...] | None] = []
    for node in nodes:
        name = fx_name(node)
        chain = chains.get(name) if name is not None else None
        if chain is not None and select is not None:
            chain = tuple(c for c in chain if select(c))
        result.append(chain)
    previous: tuple[CallInfo, ...] = ()
    pending: list[int] = []
    for i, chain in enumerate([*result, ()]):
        if chain is None:
            pending.append(i)
            continue
        common = common_prefix(previous, chain)
        for p in pending:
            result[p] = common
        pending.clear()
        previous = chain
    return [c if c is not None else () for c in result]


def _localize_constants(graph: ir.Graph, nodes: list[ir.Node],
                        per_node: list[tuple[CallInfo, ...]]) -> None:
    """torch.onnx reuses one Constant across FX nodes; give each module call its own copy.

    Otherwise the first layer owns the constant and later layers take it as an input, and
    their bodies no longer match.
    """
    chain_of = dict(zip(nodes, per_node))
    inserted: list[tuple[int, ir.Node, tuple[CallInfo, ...]]] = []
    position = {node: i for i, node in enumerate(nodes)}
    dead: set[ir.Node] = set()
    for i, node in enumerate(nodes):
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or node.inputs:
            continue
        own = per_node[i]
        copies: dict[tuple[CallInfo, ...], ir.Value] = {}
        for use in list(node.outputs[0].uses()):
            user_chain = chain_of.get(use.node)
            if user_chain is None or user_chain == own:
                continue
            value = copies.get(user_chain)
            if value is None:
                clone = ir.Node("", "Constant", [], attributes=list(node.attributes.values()),
                                name=f"{node.name}_{len(copies) + 1}",
                                metadata_props=dict(use.node.metadata_props))
                clone.outputs[0].name = f"{node.outputs[0].name}_{len(copies) + 1}"
                clone.outputs[0].type = node.outputs[0].type
                clone.outputs[0].shape = node.outputs[0].shape
                value = copies[user_chain] = clone.outputs[0]
                graph.insert_before(use.node, clone)
                inserted.append((position[use.node], clone, user_chain))
            use.node.replace_input_with(use.idx, value)
        if copies and not node.outputs[0].uses() and node.outputs[0] not in graph.outputs:
            # Every user took a copy: left behind, the original would be a dead node in its
            # call's body, and that body would no longer match its siblings' (Mamba's norms).
            graph.remove(node, safe=True)
            dead.add(node)
    if not inserted:
        return
    # Splice the clones into the node list just before their first user.
    by_position: dict[int, list[tuple[ir.Node, tuple[CallInfo, ...]]]] = {}
    for pos, clone, chain in inserted:
        by_position.setdefault(pos, []).append((clone, chain))
    new_nodes: list[ir.Node] = []
    new_chains: list[tuple[CallInfo, ...]] = []
    for i, (node, chain) in enumerate(zip(nodes, per_node)):
        for clone, clone_chain in by_position.get(i, []):
            new_nodes.append(clone)
            new_chains.append(clone_chain)
        if node not in dead:
            new_nodes.append(node)
            new_chains.append(chain)
    nodes[:] = new_nodes
    per_node[:] = new_chains


def _build_scopes(nodes: list[ir.Node], per_node: list[tuple[CallInfo, ...]]) -> _Scope:
    root = _Scope(None)
    scopes: dict[str, _Scope] = {}
    for node, chain in zip(nodes, per_node):
        parent = root
        for call in chain:
            scope = scopes.get(call.call_id)
            if scope is None:
                scope = scopes[call.call_id] = _Scope(call)
                parent.members.append(scope)
                parent.children.append(scope)
            parent = scope
        parent.members.append(node)
    return root


class _Outliner:
    def __init__(self, model: ir.Model, dedupe: bool, own_sizes: bool = False) -> None:
        self.model = model
        self.graph = model.graph
        self.dedupe = dedupe
        self.own_sizes = own_sizes  # sizes a body reads recomputed in it (emit/sizes.py)
        self.by_key: dict[str, tuple[str, str]] = {}
        self.names: dict[tuple[str, str], int] = {}
        self.report = OutlineReport()
        self.call_nodes: dict[int, ir.Node] = {}  # id(scope) -> its call node
        self.graph_outputs = set(self.graph.outputs)

    def run(self, root: _Scope) -> None:
        for scope in root.children:
            self._visit(scope, ())
        self.graph.sort()

    def _visit(self, scope: _Scope, enclosing: tuple[CallInfo, ...]) -> None:
        assert scope.call is not None
        for child in scope.children:
            self._visit(child, (*enclosing, scope.call))
        members = [m if isinstance(m, ir.Node) else self.call_nodes.get(id(m))
                   for m in scope.members]
        members = [m for m in members if m is not None]
        if members:
            call = self._outline(scope.call, members, enclosing)
            if call is not None:
                self.call_nodes[id(scope)] = call

    def _outline(self, info: CallInfo, members: list[ir.Node],
                 enclosing: tuple[CallInfo, ...]) -> ir.Node | None:
        # the nodes of members' subgraphs (If branches, Loop bodies) move with them: what they
        # read from outside the call becomes a function input too
        subgraphs, nested = _nested(members)
        readers = [n for node in members for n in (node, *nested.get(node, ()))]
        inside = set(readers)
        inputs: dict[ir.Value, ir.Value] = {}  # outer value -> function input
        for node in readers:
            for value in node.inputs:
                if value is not None and value.producer() not in inside \
                        and value.graph not in subgraphs and value not in inputs:
                    inputs[value] = ir.Value(name=value.name, type=value.type,
                                             shape=value.shape)
        outputs = [v for node in members for v in node.outputs
                   if v in self.graph_outputs or any(u.node not in inside for u in v.uses())]
        if not outputs:
            self.report.skipped.append(info.call_id)
            return None
        computed = self._own_sizes(inputs) if self.own_sizes else {}

        call = ir.Node("", "", [v for v in inputs if v not in computed],
                       num_outputs=len(outputs), name=info.call_id,
                       metadata_props={
                           META_PATH: info.module_path, META_TYPE: info.module_type,
                           META_CALL: info.call_id,
                           META_FX_OUTPUTS: json.dumps([_fx_of(v) for v in outputs]),
                           META_SCOPE: json.dumps(
                               [list(f) for f in call_scope(members, info, enclosing)]),
                       })
        for old, new in zip(outputs, call.outputs):
            new.name, new.type, new.shape = old.name, old.type, old.shape
            for use in list(old.uses()):
                if use.node not in inside:
                    use.node.replace_input_with(use.idx, new)
            for i, out in enumerate(self.graph.outputs):
                if out is old:
                    self.graph.outputs[i] = new
                    self.graph_outputs.discard(old)
                    self.graph_outputs.add(new)
        for node in readers:
            for i, value in enumerate(node.inputs):
                if value is not None and value in inputs:
                    node.replace_input_with(i, inputs[value])

        self.graph.insert_before(members[0], call)
        self.graph.remove(members, safe=False)
        sizes = [n for nodes in computed.values() for n in nodes]
        body = ir.Graph([new for old, new in inputs.items() if old not in computed], outputs,
                        nodes=[*sizes, *members], opset_imports=self._opsets(members),
                        name=info.call_id)
        if not _in_order(body):  # a size hoisted out of a child call follows that call
            body.sort()
        domain, name = self._function_for(info, body)
        call.domain, call.op_type = domain, name
        self.report.calls += 1
        self.report.function_of_call[info.call_id] = name
        return call

    def _own_sizes(self, inputs: dict[ir.Value, ir.Value]) -> dict[ir.Value, list[ir.Node]]:
        """Sizes the call reads, recomputed from its own activations' shapes where they can
        be (:mod:`.sizes`): ``inputs[size]`` becomes the body's own value, and the size is
        no input of the function."""
        activations = [(v, inputs[v]) for v in activations_of(inputs)]
        computed: dict[ir.Value, list[ir.Node]] = {}
        for value in list(inputs):
            if activations and is_size(value):
                nodes = derive(value, activations, value.name or f"size_{len(computed)}")
                if nodes is not None:
                    computed[value] = nodes
                    inputs[value] = nodes[-1].outputs[0]
        return computed

    def _function_for(self, info: CallInfo, body: ir.Graph) -> tuple[str, str]:
        key = graph_key(body) if self.dedupe else None
        if key is not None and key in self.by_key:
            return self.by_key[key]
        module, _, short = info.module_type.rpartition(".")
        domain = module or DEFAULT_DOMAIN
        base = function_base(short)
        count = self.names.get((domain, base), 0)
        self.names[(domain, base)] = count + 1
        name = base if count == 0 else f"{base}_{count}"
        function = ir.Function(domain, name, graph=body, attributes=[])
        function.doc_string = info.module_type
        relativize(function, info, set(self.model.functions))
        self.model.functions[function.identifier()] = function
        self.model.opset_imports.setdefault(domain, 1)
        self.report.functions += 1
        if key is not None:
            self.by_key[key] = (domain, name)
        return domain, name

    def _opsets(self, nodes: Iterable[ir.Node]) -> dict[str, int]:
        opsets = {"": self.model.opset_imports.get("", 18)}
        for node in nodes:
            if node.domain not in opsets:
                opsets[node.domain] = self.model.opset_imports.get(node.domain, 1)
        return opsets


def _nested(nodes: list[ir.Node]) -> tuple[set[ir.Graph], dict[ir.Node, list[ir.Node]]]:
    """The subgraphs of ``nodes`` (at any depth) and, per node, the nodes inside them."""
    graphs: set[ir.Graph] = set()
    inner: dict[ir.Node, list[ir.Node]] = {}
    for node in nodes:
        todo = [node]
        while todo:
            current = todo.pop()
            for attr in current.attributes.values():
                if attr.is_ref() or attr.type not in (ir.AttributeType.GRAPH,
                                                      ir.AttributeType.GRAPHS):
                    continue
                for graph in ([attr.value] if attr.type == ir.AttributeType.GRAPH
                              else list(attr.value)):
                    graphs.add(graph)
                    inner.setdefault(node, []).extend(graph)
                    todo.extend(graph)
    return graphs, inner


@functools.cache
def operator_names() -> frozenset[str]:
    """Operators of the default ONNX domain (every version) and of ``com.microsoft``."""
    standard = {s.name for s in onnx.defs.get_all_schemas_with_history()
                if s.domain in ("", "ai.onnx")}
    return frozenset(standard) | ort_contrib_operator_names()


def function_base(type_name: str) -> str:
    """A function's name before numbering: its class name, suffixed where it is an operator
    name (``Softmax`` -> ``Softmax_module``). IREE and TVM ignore a call's domain and would
    run a function named ``Softmax`` as the standard op, silently giving other numbers."""
    base = class_identifier(type_name)
    return f"{base}_module" if base in operator_names() else base


def _in_order(graph: ir.Graph) -> bool:
    """Does every node come after the nodes of this graph that it reads from?"""
    seen: set[ir.Node] = set()
    for node in graph:
        for value in node.inputs:
            producer = value.producer() if value is not None else None
            if producer is not None and producer.graph is graph and producer not in seen:
                return False
        seen.add(node)
    return True


def _fx_of(value: ir.Value) -> str | None:
    """The FX node whose value this is: torch.onnx names values after FX nodes."""
    producer = value.producer()
    if producer is not None and producer.metadata_props.get(META_FX_OUTPUTS):
        names = json.loads(producer.metadata_props[META_FX_OUTPUTS])
        return names[value.index()] if value.index() is not None else None
    if producer is not None and fx_name(producer) == value.name:
        return value.name
    return value.name if producer is not None else None


def outline(model: ir.Model, chains: Mapping[str, tuple[CallInfo, ...]], *,
            select: Select | None = None, dedupe: bool = True,
            own_sizes: bool = False) -> OutlineReport:
    """Outline ``model`` in place; ``select`` keeps some calls as functions (default: all);
    ``own_sizes``: each body computes the sizes it reads from its own activations."""
    nodes = list(model.graph)
    return outline_nodes(model, nodes, chains_per_node(nodes, chains, select), dedupe=dedupe,
                         own_sizes=own_sizes)


def outline_nodes(model: ir.Model, nodes: list[ir.Node], per_node: list[tuple[CallInfo, ...]],
                  *, dedupe: bool = True, own_sizes: bool = False) -> OutlineReport:
    """Outline ``model`` in place, given each main-graph node's calls (``nodes`` in graph
    order, ``per_node`` already narrowed to the calls that become functions)."""
    nodes, per_node = list(nodes), list(per_node)
    _localize_constants(model.graph, nodes, per_node)
    root = _build_scopes(nodes, per_node)
    outliner = _Outliner(model, dedupe, own_sizes)
    outliner.run(root)
    return outliner.report


class Outline(EmitPass):
    """Module calls -> nested local functions (:func:`outline`); the report goes to
    ``report.outline``."""

    def __init__(self, chains: Chains, select: Select | None, dedupe: bool,
                 report: HoldsOutlineReport, own_sizes: bool = False) -> None:
        super().__init__()
        self.chains, self.select, self.dedupe, self.report = chains, select, dedupe, report
        self.own_sizes = own_sizes

    def requires(self, model: ir.Model) -> None:
        if model.functions:  # outlining names every function; it would clash with these
            raise self.precondition_failed(
                "a model without local functions, got "
                + listed([f.name for f in model.functions.values()]))
        # Nodes naming their FX node are not required: a flat export below opset 18 is
        # version-converted by torch.onnx, which drops that metadata; outlined nothing,
        # it is inlined right after.

    def run(self, model: ir.Model) -> None:
        self.report.outline = outline(model, self.chains, select=self.select, dedupe=self.dedupe,
                                      own_sizes=self.own_sizes)

    def ensures(self, model: ir.Model) -> None:
        ensure_calls_resolve(self, model)
        unlabelled = unlabelled_calls(model)
        if unlabelled:
            raise self.postcondition_failed(
                f"every call node labelled with its module call; {listed(unlabelled)}")


def ensure_calls_resolve(step: EmitPass, model: ir.Model) -> None:
    """``step``'s postcondition: every call of a local function calls one the model holds."""
    missing = calls_of_missing_functions(model)
    if missing:
        raise step.postcondition_failed(
            f"every called function in the model; missing: {listed(missing)}")


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
    target, merged = rounds.target, rounds.merged
    if not merged:
        return 0
    counts: dict[tuple[str, str], int] = {}
    for function in model.functions.values():  # creation order, as outlining named them
        base = function_base(function.doc_string or function.name)
        n = counts.get((function.domain, base), 0)
        counts[(function.domain, base)] = n + 1
        function.name = base if n == 0 else f"{base}_{n}"
    renamed = {identifier: function for identifier, function in model.functions.items()}
    model.functions.clear()
    for function in renamed.values():
        model.functions[function.identifier()] = function
    _retarget_calls(model, renamed)
    if report is not None:
        def final(name: str) -> str:
            function = original.get(name)
            while function is not None and id(function) in target:
                function = target[id(function)]
            return function.name if function is not None else name

        report.function_of_call = {call: final(name)
                                   for call, name in report.function_of_call.items()}
        report.functions = len(model.functions)
    return merged


class MergeRound(EmitPass):
    """One round of :func:`merge_equal_functions`: equal keys first; when none, a function
    into its fuller sibling; when none, scalar variants. Reports a change exactly when it
    merged a function away; ``target`` maps each merged function (by id) to the one kept."""

    def __init__(self) -> None:
        super().__init__()
        self.target: dict[int, ir.Function] = {}
        self.merged = 0

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        kept_for = _merge_equal_keys(model, self.target)
        if not kept_for:
            kept_for = _merge_unused_outputs(model, self.target)
        if not kept_for:
            kept_for = _merge_parametrized(model, self.target)
        self.merged += len(kept_for)
        return ir.passes.PassResult(model, modified=bool(kept_for))


def _merge_equal_keys(model: ir.Model, target: dict[int, ir.Function]
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
            _drop_value_types(kept)
    for identifier in kept_for:
        del model.functions[identifier]
    if kept_for:
        _retarget_calls(model, kept_for)
    return kept_for


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


def _merge_parametrized(model: ir.Model, target: dict[int, ir.Function]
                        ) -> dict[ir.OperatorIdentifier, ir.Function]:
    """Bodies of one class that differ only in float scalars: one function with attributes
    (:mod:`.parametrize`)."""
    kept_for: dict[ir.OperatorIdentifier, ir.Function] = {}
    for gone, kept in merge_scalar_variants(model):
        target[id(gone)] = kept
        kept_for[gone.identifier()] = kept
        _drop_value_types(kept)
    return kept_for


def _merge_unused_outputs(model: ir.Model, target: dict[int, ir.Function]
                          ) -> dict[ir.OperatorIdentifier, ir.Function]:
    """A call whose caller ignores some outputs loses them (and what computes only them)
    before outlining, so its body looks like a new prototype (Flux's last single block).
    Such a function is merged into the function of its class it is a part of: the body that,
    with only some of its outputs kept, is the same. Its calls take the fuller function and
    leave the extra outputs unused. One merge per call, then equal keys are compared again.
    """
    by_class: dict[tuple[str, str | None], list[ir.Function]] = {}
    for function in model.functions.values():
        by_class.setdefault((function.domain, function.doc_string), []).append(function)
    for functions in by_class.values():
        for small in functions:
            key = graph_key(small.graph, signature=False)
            for full in functions:
                if full is small or len(full.outputs) <= len(small.outputs) \
                        or len(full.inputs) != len(small.inputs):
                    continue
                kept = _outputs_matching(full, small, key)
                if kept is None:
                    continue
                target[id(small)] = full
                _drop_value_types(full)
                del model.functions[small.identifier()]
                _widen_calls(model, small, full, kept)
                return {small.identifier(): full}
    return {}


def _outputs_matching(full: ir.Function, small: ir.Function,
                      key: str) -> tuple[int, ...] | None:
    """Which outputs of ``full`` (in order), kept alone, make ``small``'s body."""
    for kept in itertools.combinations(range(len(full.outputs)), len(small.outputs)):
        pruned = ir.serde.deserialize_function(ir.serde.serialize_function(full))
        outputs = [pruned.outputs[i] for i in kept]
        pruned.outputs.clear()
        pruned.outputs.extend(outputs)
        _remove_dead_nodes(pruned.graph)
        if graph_key(pruned.graph, signature=False) == key:
            return kept
    return None


def _remove_dead_nodes(graph: ir.Graph) -> None:
    live = set(graph.outputs)
    for node in reversed(list(graph)):
        if any(v in live for v in node.outputs):
            live.update(v for v in node.inputs if v is not None)
        else:
            graph.remove(node, safe=False)


def _widen_calls(model: ir.Model, small: ir.Function, full: ir.Function,
                 kept: tuple[int, ...]) -> None:
    """Every call of ``small`` becomes a call of ``full``; its outputs land at ``kept``."""
    graphs = [model.graph, *(f.graph for f in model.functions.values())]
    for graph in graphs:
        for node in list(graph):
            if node.op_identifier() != small.identifier():
                continue
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
    for node in (*model.graph.all_nodes(),
                 *(n for f in model.functions.values() for n in f.all_nodes())):
        function = target.get(node.op_identifier())
        if function is not None:
            node.domain, node.op_type = function.domain, function.name


def _drop_value_types(function: ir.Function) -> None:
    for value in (*function.inputs, *(out for node in function for out in node.outputs)):
        value.type = None
        value.shape = None
