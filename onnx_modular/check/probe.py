"""The ONNX side of localization: a probe, the model with every module call's outputs exposed.

One ORT session on an inlined copy of the model in which the outputs of every module call
are extra graph outputs. Calls are found in one of two ways:

- hierarchical models (call nodes with ``onnx_modular.*`` metadata): the model is inlined
  by :class:`_TrackingInliner`, which notes for each call node instance, nested ones
  included, the names its outputs keep after inlining (the inliner gives the call site's
  output names to the inlined body's outputs) and the call it was inlined from;
- flat models from ``torch.onnx``: each node's ``pkg.torch.onnx.name_scopes`` gives its
  module chain; a call's outputs are the values its nodes make that others use.

Weights are never decoded or re-encoded (see :mod:`onnx_modular.check.wire`).
"""

from __future__ import annotations

import dataclasses
import functools
import re

import onnx
import onnx_ir as ir

from onnx_modular.check import wire as _wire
from onnx_modular.check.calls import CallRecord
from onnx_modular.emit.inline import RebasingInlinePass
from onnx_modular.leaves._compat import ObservedInlinePass
from onnx_modular.leaves.metadata import (
    CLASS_HIERARCHY,
    META_CALL,
    META_PATH,
    META_TYPE,
    NAME_SCOPES,
    CallInfo,
)

__all__ = ["OnnxCall", "Probe", "build_probe", "graph_id", "node_id"]


@dataclasses.dataclass
class OnnxCall(CallRecord):
    """A module call found in the ONNX model; ``outputs`` are value names after inlining.

    ``call.module_type`` is empty where the model does not name the call's class.
    """

    outputs: list[str]
    parent: int | None = None
    exact: bool = True  # False: metadata of a shared body, resolved against the parent
    inputs: list[str] = dataclasses.field(default_factory=list)
    # What extraction and the overlay need, never filtered: every argument by position
    # (None where absent) and every result, the function a call node calls, the graph and
    # node name a viewer shows the call as, and (flat) the node indices of the call.
    arguments: list[str | None] = dataclasses.field(default_factory=list)
    results: list[str] = dataclasses.field(default_factory=list)
    function: ir.OperatorIdentifier | None = None
    site: tuple[str, str] | None = None
    nodes: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Probe:
    """The inlined model (serialized) with every call output exposed, and its calls."""

    model_bytes: bytes
    calls: list[OnnxCall]
    position: dict[str, int]  # value name -> index of its producer in the inlined graph
    kind: str  # "hierarchical", "flat" or "none"
    note: str = ""  # why kind is "none", when the model has metadata that cannot be used
    # the graph the calls' value names refer to (inlined, without weights, for a
    # hierarchical model; the original's for a flat one): ``OnnxCall.nodes`` index it
    graph: onnx.GraphProto | None = None
    inlined: bool = False  # ``graph`` is an inlined copy: its nodes are not the model's


@dataclasses.dataclass
class _Instance:
    """One call node instance the inliner met: its own metadata, the instance it was
    inlined from, its value names, the function it calls and where a viewer shows it."""

    meta: dict[str, str]
    parent: int | None
    outputs: list[str]
    inputs: list[str]
    arguments: list[str | None]
    function: ir.OperatorIdentifier
    site: tuple[str, str]


def graph_id(function: ir.OperatorIdentifier | None, main: str) -> str:
    """The id Model Explorer's ONNX adapter gives a graph: the main graph's name, or
    ``[function]domain::name`` for a function body."""
    if function is None:
        return main
    domain, name, overload = function
    return f"[function]{domain}::{name}" + (f"::{overload}" if overload else "")


def node_id(node: ir.Node | onnx.NodeProto, index: int) -> str:
    """The id a viewer gives a node: its name, or ``<node_i>`` by position when it has none."""
    return node.name or f"<node_{index}>"


class _TrackingInliner(RebasingInlinePass):
    """The inliner (labels moved to each actual call), noting every call node instance it
    expands and where it came from."""

    def __init__(self, model: ir.Model) -> None:
        # Only bodies that call functions are expanded: a leaf call (Linear, LayerNorm...)
        # stays a call node whose outputs can be exposed as they are; ONNX Runtime expands
        # it natively, and Python clones a third of the nodes (GPT-2: 72 of 243 calls).
        functions = model.functions
        super().__init__(lambda f: any(n.op_identifier() in functions for n in f))
        self.instances: list[_Instance] = []
        self._origin: dict[ir.Node, int] = {}
        self._site: dict[ir.Node, tuple[str, str]] = {}  # clone -> its body's graph and node
        self._leaves: dict[int, ir.Node] = {}  # instance -> its call node, still in the graph
        self._expanding: list[int] = []
        self._main = model.graph.name or "<main>"
        for i, node in enumerate(model.graph):
            self._site[node] = (self._main, node_id(node, i))

    def _record(self, node: ir.Node) -> int:
        parent = self._origin.get(node)
        meta = dict(node.metadata_props)
        if parent is not None and meta.get(META_CALL) == self.instances[parent].meta.get(
                META_CALL):
            meta = {}  # no metadata of its own: the cloner copied the enclosing call's
        self.instances.append(_Instance(
            meta, parent, [v.name or "" for v in node.outputs],
            [v.name for v in node.inputs if v is not None and v.name],
            [v.name if v is not None else None for v in node.inputs],
            node.op_identifier(), self._site.get(node, (self._main, node.name or ""))))
        return len(self.instances) - 1

    def _is_leaf(self, node: ir.Node) -> bool:
        function = self.function_of(node)
        return function is not None and self.criteria is not None and not self.criteria(function)

    def before_expand(self, call: ir.Node) -> None:
        self._expanding.append(self._record(call))

    def expanded(self, node: ir.Node, function: ir.Function, nodes: list[ir.Node]) -> None:
        super().expanded(node, function, nodes)
        index = self._expanding.pop()
        body = graph_id(function.identifier(), self._main)
        for i, (original, n) in enumerate(zip(function, nodes, strict=True)):
            self._origin[n] = index
            self._site[n] = (body, node_id(original, i))
        for n in nodes:  # leaf calls stay: recorded now, in body order after their parent
            if self._is_leaf(n):
                self._leaves[self._record(n)] = n

    def record_leaves(self, graph: ir.Graph) -> None:
        """Leaf calls of the main graph itself; and the final value names of every leaf
        (a leaf's output that ends its parent's body takes the call site's name later)."""
        for node in graph:
            if node not in self._origin and self._is_leaf(node):
                self._leaves[self._record(node)] = node
        for index, node in self._leaves.items():
            instance = self.instances[index]
            instance.outputs = [v.name or "" for v in node.outputs]
            instance.inputs = [v.name for v in node.inputs if v is not None and v.name]
            instance.arguments = [v.name if v is not None else None for v in node.inputs]


def _drop_unused_functions(model: ir.Model) -> None:
    """Functions no call reaches any more (a body half expanded inside an unused function
    would name domains its opset imports lack, and ORT would refuse the probe)."""
    reached: set[ir.OperatorIdentifier] = set()
    todo = [model.graph]
    while todo:
        for node in todo.pop():
            key = node.op_identifier()
            if key in model.functions and key not in reached:
                reached.add(key)
                todo.append(model.functions[key].graph)
    for key in [k for k in model.functions if k not in reached]:
        del model.functions[key]


def _module_instances(inliner: _TrackingInliner) -> list[OnnxCall]:
    """Call instances that are module calls; non-module functions pass their parent on."""
    calls: list[OnnxCall] = []
    index_of: dict[int, int | None] = {}
    for i, inst in enumerate(inliner.instances):
        parent_call = index_of.get(inst.parent) if inst.parent is not None else None
        call_id = inst.meta.get(META_CALL) or inst.meta.get(META_PATH)
        if not call_id:
            index_of[i] = parent_call
            continue
        info = CallInfo(call_id, inst.meta.get(META_PATH, call_id),
                        inst.meta.get(META_TYPE) or "")
        calls.append(OnnxCall(info, inst.outputs, parent_call,
                              exact=inst.parent is None, inputs=inst.inputs,
                              arguments=list(inst.arguments), results=list(inst.outputs),
                              function=inst.function, site=inst.site))
        index_of[i] = len(calls) - 1
    return calls


_QUOTED = re.compile(r"'((?:[^'\\]|\\.)*)'")


def _scopes(node: onnx.NodeProto) -> tuple[list[str], list[str]] | None:
    """(module paths, class names) of a torch.onnx node, root and the node itself dropped."""
    meta = {p.key: p.value for p in node.metadata_props}
    scopes = meta.get(NAME_SCOPES)
    if scopes is None:
        return None
    return list(_quoted(scopes)[1:-1]), list(_quoted(meta.get(CLASS_HIERARCHY, ""))[1:])


@functools.lru_cache(maxsize=4096)
def _quoted(text: str) -> tuple[str, ...]:
    """The quoted items of a scope list; one parse per distinct list (the nodes of one
    module call share theirs)."""
    return tuple(_QUOTED.findall(text))


def _sandwiched(chains: list[list[str] | None]) -> list[list[str] | None]:
    """Metadata-less nodes (an optimizer's ``Split``) join the calls open on both sides:
    left out, a call would take its own intermediates as inputs, and an extracted call
    would be fed ONNX's values of them instead of computing them from torch's inputs."""
    out = list(chains)
    before: list[str] | None = None
    pending: list[int] = []
    for i, chain in enumerate(chains):
        if chain is None:
            pending.append(i)
            continue
        if pending and before is not None:
            n = 0
            while n < min(len(before), len(chain)) and before[n] == chain[n]:
                n += 1
            for j in pending:  # in no call: stays None, closing no run
                out[j] = before[:n] or None
        pending, before = [], chain
    return out


def _flat_calls(graph: onnx.GraphProto) -> list[OnnxCall]:
    """Calls from ``name_scopes``: maximal runs of nodes in one module (metadata-less nodes
    join the calls around them)."""
    nodes = list(graph.node)
    chains: list[list[str] | None] = []
    types: dict[str, str] = {}
    for node in nodes:
        found = _scopes(node)
        if found is None:
            chains.append(None)
            continue
        paths, classes = found
        for path, cls in zip(paths, classes, strict=False):
            types.setdefault(path, cls)
        chains.append(paths)
    chains = _sandwiched(chains)

    # membership runs per module path, in graph order
    runs: dict[str, list[list[int]]] = {}
    open_run: dict[str, list[int]] = {}
    for i, chain in enumerate(chains):
        if chain is None:
            continue
        current = set(chain)
        for path in [p for p in open_run if p not in current]:
            runs.setdefault(path, []).append(open_run.pop(path))
        for path in chain:
            open_run.setdefault(path, []).append(i)
    for path, run in open_run.items():
        runs.setdefault(path, []).append(run)

    consumers: dict[str, set[int]] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            consumers.setdefault(name, set()).add(i)
    graph_outputs = {o.name for o in graph.output}
    found_calls: list[tuple[int, OnnxCall]] = []
    for path, path_runs in runs.items():
        for k, run in enumerate(path_runs):
            members = set(run)
            outputs = [name for i in run for name in nodes[i].output if name and (
                name in graph_outputs or not consumers.get(name, set()) <= members)]
            made = {name for i in run for name in nodes[i].output}
            inputs = list(dict.fromkeys(name for i in run for name in nodes[i].input
                                        if name and name not in made))
            call_id = path if k == 0 else f"{path}@{k}"
            found_calls.append((run[0], OnnxCall(
                CallInfo(call_id, path, types.get(path, "")), outputs, inputs=inputs,
                arguments=list(inputs), results=list(outputs), nodes=list(run))))
    found_calls.sort(key=lambda item: (item[0], item[1].module_path.count(".")))
    return [call for _, call in found_calls]


def _stale_call_metadata(graph: onnx.GraphProto) -> str | None:
    """The call id that labels two separate calls of a flat graph, if any.

    A flat model made by inlining a hierarchical one whose calls share a function body
    (``om.export(..., functions="none")`` with ``dedupe``) keeps, on the nodes of every
    call but the one the body was built from, that call's ``call_id`` and
    ``name_scopes`` (``layers.0.fc1`` on layer 1's nodes too). The nodes of one call are
    contiguous, with only its descendants' nodes among them; a call id whose nodes are
    parted by nodes of another, unrelated call therefore labels two calls, and localizing
    by these labels would name the wrong module.
    """
    last: dict[str, int] = {}
    ids: list[str | None] = []
    for node in graph.node:
        meta = {p.key: p.value for p in node.metadata_props}
        ids.append(meta.get(META_CALL))
    for i, call_id in enumerate(ids):
        if call_id is None:
            continue
        prev = last.get(call_id)
        if prev is not None and prev < i - 1:
            between = [c for c in ids[prev + 1:i] if c is not None]
            if any(c != call_id and not c.startswith(call_id + ".") for c in between):
                return call_id
        last[call_id] = i
    return None


def _has_module_calls(proto: onnx.ModelProto) -> bool:
    for node in proto.graph.node:
        for p in node.metadata_props:
            if p.key in (META_CALL, META_PATH):
                return True
    return any(p.key in (META_CALL, META_PATH) for f in proto.functions for n in f.node
               for p in n.metadata_props)


def build_probe(proto: onnx.ModelProto, model_bytes: bytes | None = None) -> Probe:
    """The model's bytes with every module call's outputs exposed as graph outputs.

    A hierarchical model is inlined without its weights (shells stand in for the
    initializers) and gets them back as fields cut from ``model_bytes``, the serialized
    original; a flat one is ``model_bytes`` plus the extra outputs. Either way the weights
    are never decoded or re-encoded (see :mod:`onnx_modular.check.wire`).
    """
    if model_bytes is None:
        model_bytes = proto.SerializeToString()
    if proto.functions:
        light = _wire.without_initializers(proto)
        model = ir.serde.deserialize_model(light)
        if _has_module_calls(proto):
            inliner = _TrackingInliner(model)
            inliner(model)
            inliner.record_leaves(model.graph)
            _drop_unused_functions(model)
            calls = _module_instances(inliner)
            kind = "hierarchical"
        else:
            ObservedInlinePass()(model)
            calls, kind = [], "flat"
        model.graph.initializers.clear()
        graph_proto = ir.serde.serialize_model(model)
        base = graph_proto.SerializeToString() + _wire.initializer_patch(model_bytes)
        graph = graph_proto.graph
        if kind == "flat":
            calls = _flat_calls(graph)
    else:
        graph, base = proto.graph, model_bytes
        stale = _stale_call_metadata(graph)
        if stale is not None:
            return Probe(base, [], {}, "none", (
                f"the flat model's module metadata is ambiguous: '{stale}' labels more than "
                "one module call (metadata copied from a shared function body); validate "
                "the hierarchical export, or export flat with dedupe=False, to localize"))
        calls = _flat_calls(graph)
        kind = "flat"
    if not calls:
        kind = "none"

    position: dict[str, int] = {}
    for value in graph.input:
        position[value.name] = -1
    for i, node in enumerate(graph.node):
        for name in node.output:
            if name:
                position[name] = i
    present = {o.name for o in graph.output}
    extra: list[str] = []
    for call in calls:
        call.outputs = [name for name in call.outputs if position.get(name, -1) >= 0]
        call.inputs = [name for name in call.inputs if name in position]
        for name in call.outputs + [n for n in call.inputs if position[n] >= 0]:
            if name not in present:
                extra.append(name)
                present.add(name)
    return Probe(base + _wire.outputs_patch(extra), calls, position, kind, graph=graph,
                 inlined=bool(proto.functions))


