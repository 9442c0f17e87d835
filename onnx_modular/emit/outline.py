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
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

import onnx_ir as ir

from onnx_modular.emit.canonical import graph_key
from onnx_modular.emit.functions import (
    HoldsOutlineReport,
    OutlineReport,
    ensure_calls_resolve,
    function_base,
)
from onnx_modular.emit.infra import Chains, EmitPass, listed, unlabelled_calls
from onnx_modular.emit.labels import call_scope, relativize
from onnx_modular.emit.sizes import (
    activations_of,
    derive,
    is_size,
    remove_dead_size_nodes,
    retarget_shape,
)
from onnx_modular.emit.walk import graphs, is_read, remove_unread
from onnx_modular.leaves._util import common_prefix
from onnx_modular.leaves.arguments import FunctionSelection
from onnx_modular.leaves.metadata import (
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


@dataclasses.dataclass(eq=False)
class _Scope:
    call: CallInfo | None
    members: list[ir.Node | _Scope] = dataclasses.field(default_factory=list)
    children: list[_Scope] = dataclasses.field(default_factory=list)


class Selection:
    """Which module calls become functions: classes, class names or module paths.

    Remembers what matched, so that a misspelt name can be reported instead of silently
    leaving the model flat.
    """

    def __init__(self, items: Iterable[type | str]) -> None:
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

    def uncalled(self, modules: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
        """Unmatched names -> the paths of ``modules`` ((path, qualified type) of the
        model) they name: modules the model holds but torch.export recorded no call of."""
        found: dict[str, list[str]] = {}
        for key, shown in self.wanted.items():
            if key in self.matched:
                continue
            paths = [path for path, kind in modules
                     if key in (path, kind, kind.rsplit(".", 1)[-1])]
            if paths:
                found[shown] = paths
        return found


def selector(functions: FunctionSelection | None) -> Select | None:
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


_CALLER_SUFFIX = re.compile(r"(_caller\d+)+$")


@dataclasses.dataclass(frozen=True)
class OutlineRules:
    """How module calls become functions. ``dedupe``: equal bodies share one function;
    ``own_sizes``: each body computes the sizes it reads from its own activations
    (emit/sizes.py); ``shared_to_caller``: what another exporter's optimizer shared
    between calls goes to their caller (:meth:`_Outliner._shared_to_caller`)."""

    dedupe: bool = True
    own_sizes: bool = False
    shared_to_caller: bool = False


class _Outliner:
    def __init__(self, model: ir.Model, rules: OutlineRules) -> None:
        self.model = model
        self.graph = model.graph
        self.dedupe = rules.dedupe
        self.own_sizes = rules.own_sizes
        self.shared_to_caller = rules.shared_to_caller
        self.by_key: dict[str, tuple[str, str]] = {}
        self.names: dict[tuple[str, str], int] = {}
        self.report = OutlineReport()
        self.call_nodes: dict[int, ir.Node] = {}  # id(scope) -> its call node
        self.graph_outputs = set(self.graph.outputs)
        self.derived = 0  # sizes computed in a caller instead (:meth:`_sizes_to_caller`)

    def run(self, root: _Scope) -> None:
        unread = {node for node in self.graph if not is_read(node)}  # the model's own
        for scope in root.children:
            self._visit(scope, (), root)
        # a size a caller computed for a later call that then computed it in its own body
        # (:meth:`_sizes_to_caller`, own sizes) is read by nobody: no dead code is left
        for graph in graphs(self.model):
            remove_unread(graph, keep=unread)
        self.graph.sort()

    def _visit(self, scope: _Scope, enclosing: tuple[CallInfo, ...], parent: _Scope) -> None:
        assert scope.call is not None
        for child in scope.children:
            self._visit(child, (*enclosing, scope.call), scope)
        members = [m if isinstance(m, ir.Node) else self.call_nodes.get(id(m))
                   for m in scope.members]
        members = [m for m in members if m is not None]
        if members and self.shared_to_caller:
            members = self._shared_to_caller(members, parent)
        if members and self.own_sizes:
            self._shapes_to_caller(members, parent)
            members = self._sizes_to_caller(members, parent)
        if members:
            call = self._outline(scope.call, members, enclosing)
            if call is not None:
                self.call_nodes[id(scope)] = call

    def _shared_to_caller(self, members: list[ir.Node], parent: _Scope) -> list[ir.Node]:
        """What a call's nodes compute from what its caller holds alone, read both in the
        call and after it, was shared by the file's optimizer: torch.onnx's CSE keeps one
        ``Unsqueeze(cos)`` of Qwen2's rotary embedding, in layer 0's attention, which
        every later layer reads from there. It is the caller's: it leaves the call, which
        then reads it as the others do, instead of returning it (a file of another
        exporter's; ``om.outline``)."""
        _, nested = _nested(members)
        inside = {n for node in members for n in (node, *nested.get(node, ()))}
        outer_only: list[ir.Node] = []
        for node in members:  # in graph order: a node's producers come first
            if node.outputs and all(
                    v is None or v.producer() not in inside or v.producer() in outer_only
                    for v in node.inputs) and not any(
                    isinstance(a.value, ir.Graph) for a in node.attributes.values()):
                outer_only.append(node)
        shared: set[ir.Node] = set()
        for node in reversed(outer_only):
            uses = [u.node for v in node.outputs for u in v.uses()]
            if any(u in shared for u in uses) or (
                    any(u not in inside for u in uses) and any(u in inside for u in uses)):
                shared.add(node)
        if not shared:
            return members
        parent.members.extend(node for node in members if node in shared)
        return [node for node in members if node not in shared]

    def _shapes_to_caller(self, members: list[ir.Node], parent: _Scope) -> None:
        """A caller's ``Shape`` of a tensor the call computes and returns for nothing else
        (torch.export reads a height where it first saw it: in diffusers' UNet, inside a
        ResnetBlock2D's shortcut conv) reads the same dimensions of a tensor the call
        reads or returns anyway, so the call does not return a tensor for its shape."""
        _, nested = _nested(members)
        inside = {n for node in members for n in (node, *nested.get(node, ()))}
        here = {m for m in parent.members if isinstance(m, ir.Node)}

        def shapes_only(value: ir.Value) -> list[ir.Node] | None:
            readers = [u.node for u in value.uses() if u.node not in inside]
            if not readers or value in self.graph_outputs or not all(
                    n.op_type == "Shape" and n.domain in ("", "ai.onnx") and n in here
                    for n in readers):
                return None
            return readers

        outputs = [v for node in members for v in node.outputs]
        read = {v: shapes_only(v) for v in outputs}
        candidates = activations_of(dict.fromkeys(
            [v for node in members for v in node.inputs
             if v is not None and v.producer() not in inside]
            + [v for v in outputs if read[v] is None and (
                v in self.graph_outputs or any(u.node not in inside for u in v.uses()))]))
        for readers in read.values():
            for shape in readers or ():
                retarget_shape(shape, candidates)

    def _sizes_to_caller(self, members: list[ir.Node], parent: _Scope) -> list[ir.Node]:
        """A size a call computes and its caller reads (the height a VAE's GroupNorm reads
        and a later Attention reshapes with) is computed in the caller instead, from the
        shapes of what the call reads or returns, so no function returns a size; the
        nodes that computed only it leave the call. A size no such shape gives stays an
        output."""
        _, nested = _nested(members)
        inside = {n for node in members for n in (node, *nested.get(node, ()))}
        outer = [v for node in members for v in node.inputs
                 if v is not None and v.producer() not in inside]
        returned = [v for node in members for v in node.outputs
                    if any(u.node not in inside for u in v.uses()) and not is_size(v)]
        activations = [(v, v) for v in activations_of(dict.fromkeys([*outer, *returned]))]
        moved = False
        for node in members:
            for value in node.outputs:
                outside = [u for u in value.uses() if u.node not in inside]
                if not activations or not outside or not is_size(value) \
                        or value in self.graph_outputs:
                    continue
                base = _CALLER_SUFFIX.sub("", value.name or "size")
                nodes = derive(value, activations, f"{base}_caller{self.derived + 1}")
                if nodes is None:
                    continue
                self.derived += 1
                self.graph.insert_after(members[-1], nodes)
                parent.members.extend(nodes)
                for use in outside:
                    use.node.replace_input_with(use.idx, nodes[-1].outputs[0])
                moved = True
        if not moved:
            return members
        gone = remove_dead_size_nodes(self.graph, members)  # what computed only those sizes
        return [node for node in members if node not in gone]

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
    return outline_nodes(model, nodes, chains_per_node(nodes, chains, select),
                         OutlineRules(dedupe=dedupe, own_sizes=own_sizes))


def outline_nodes(model: ir.Model, nodes: list[ir.Node], per_node: list[tuple[CallInfo, ...]],
                  rules: OutlineRules = OutlineRules()) -> OutlineReport:
    """Outline ``model`` in place, given each main-graph node's calls (``nodes`` in graph
    order, ``per_node`` already narrowed to the calls that become functions)."""
    nodes, per_node = list(nodes), list(per_node)
    _localize_constants(model.graph, nodes, per_node)
    root = _build_scopes(nodes, per_node)
    outliner = _Outliner(model, rules)
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
