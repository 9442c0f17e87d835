"""Localization: which module call is the first whose ONNX outputs leave torch's.

Torch side: one eager run with forward hooks records every module call (its path, call
index, parent and the tensors it returned). No re-export is needed, so localizing costs
little more than the plain validation run. An ``ExportedProgram`` runs through its
modularized ``GraphModule``, whose sub-modules stand for the module calls.

ONNX side: one ORT session on an inlined copy of the model in which the outputs of every
module call are extra graph outputs. Calls are found in one of two ways:

- hierarchical models (call nodes with ``onnx_modular.*`` metadata): the model is inlined
  by :class:`_TrackingInliner`, which notes for each call node instance, nested ones
  included, the names its outputs keep after inlining (the inliner gives the call site's
  output names to the inlined body's outputs) and the call it was inlined from;
- flat models from ``torch.onnx``: each node's ``pkg.torch.onnx.name_scopes`` gives its
  module chain; a call's outputs are the values its nodes make that others use.

ONNX call outputs pair with the torch call's returned tensors by shape and dtype; where
several have the same shape the closest one counts, so a reordering never reads as a
mismatch. The first mismatch is the diverging call whose earliest diverging value comes
first in the inlined graph; on a tie the deeper call wins.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import torch

from onnx_modular._compat import ObservedInlinePass, tensor_version, tree_leaves
from onnx_modular.check import wire as _wire
from onnx_modular.check.call_stats import (
    HIST_EDGES,
    CallError,
    Stack,
    abs_error_histogram,
    find_stack,
)
from onnx_modular.check.numerics import Diff, check_value, dtype_name, json_float, to_numpy
from onnx_modular.emit.inline import RebasingInlinePass
from onnx_modular.metadata import CLASS_HIERARCHY, META_CALL, META_PATH, META_TYPE, NAME_SCOPES

_CALL_SUFFIX = re.compile(r"@(\d+)$")


# ---- torch side ------------------------------------------------------------------------------

@dataclasses.dataclass
class TorchCall:
    """One module call seen in eager mode; ``outputs`` are its returned tensors.

    They are kept, not copied; ``versions`` (their ``_version`` counters when returned)
    tells when later code changed one in place, and such a value is not compared.
    """

    call_id: str
    module_path: str
    module_type: str
    depth: int
    parent: int | None
    outputs: list[torch.Tensor]
    versions: list[int] = dataclasses.field(default_factory=list)
    inputs: list[torch.Tensor] = dataclasses.field(default_factory=list)
    input_versions: list[int] = dataclasses.field(default_factory=list)

    def intact_outputs(self) -> list[torch.Tensor]:
        return [t for t, v in zip(self.outputs, self.versions, strict=True)
                if tensor_version(t) == v]

    def intact_inputs(self) -> list[torch.Tensor]:
        return [t for t, v in zip(self.inputs, self.input_versions, strict=True)
                if tensor_version(t) == v]


def _type_name(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _tensor_leaves(value: Any) -> list[torch.Tensor]:
    leaves = tree_leaves(value)
    return [t.detach() for t in leaves if isinstance(t, torch.Tensor)]


def record_calls(
    model: torch.nn.Module, run: Callable[[], Any], *, modularized: bool = False
) -> tuple[Any, list[TorchCall]]:
    """Run ``run()`` with hooks on every submodule; the output and the calls, in call order.

    ``modularized``: submodules are generated sub-GraphModules carrying ``call_id``,
    ``module_path`` and ``module_type`` (from :func:`onnx_modular.modularize`).
    """
    calls: list[TorchCall] = []
    stack: list[int] = []
    counts: dict[int, int] = {}
    handles = []

    running: list[torch.nn.Module] = []

    def pre_hook(name: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            if running and running[-1] is module:
                # the module calling itself again, as a lazily compiled GraphModule does on
                # its first call: one module call, not a nested second one
                running.append(module)
                stack.append(-1)
                return
            running.append(module)
            if modularized:
                call_id = str(module.call_id)
                path, type_name = str(module.module_path), str(module.module_type)
            else:
                k = counts.get(id(module), 0)
                counts[id(module)] = k + 1
                call_id = name if k == 0 else f"{name}@{k}"
                path, type_name = name, _type_name(module)
            inputs = _tensor_leaves((args, kwargs))
            open_calls = [i for i in stack if i >= 0]
            calls.append(TorchCall(call_id, path, type_name, len(open_calls),
                                   open_calls[-1] if open_calls else None, [], [], inputs,
                                   [tensor_version(t) for t in inputs]))
            stack.append(len(calls) - 1)
        return hook

    def post_hook(module: torch.nn.Module, _args: Any, output: Any) -> None:
        running.pop()
        index = stack.pop()
        if index < 0:
            return
        call = calls[index]
        call.outputs = _tensor_leaves(output)
        call.versions = [tensor_version(t) for t in call.outputs]

    try:
        for name, module in model.named_modules():
            if not name or (modularized and not hasattr(module, "call_id")):
                continue
            handles.append(module.register_forward_pre_hook(pre_hook(name), with_kwargs=True))
            handles.append(module.register_forward_hook(post_hook))
        result = run()
    finally:
        for h in handles:
            h.remove()
    return result, calls


# ---- ONNX side -------------------------------------------------------------------------------

@dataclasses.dataclass
class OnnxCall:
    """A module call found in the ONNX model; ``outputs`` are value names after inlining."""

    call_id: str
    module_path: str
    module_type: str | None
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
        calls.append(OnnxCall(call_id, inst.meta.get(META_PATH, call_id),
                              inst.meta.get(META_TYPE), inst.outputs, parent_call,
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
                call_id, path, types.get(path), outputs, inputs=inputs,
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


# ---- pairing and judging ---------------------------------------------------------------------

def _components(path: str) -> list[str]:
    return [p for p in _CALL_SUFFIX.sub("", path).split(".") if p]


def _suffix_score(a: str, b: str) -> int:
    score = 0
    for x, y in zip(reversed(_components(a)), reversed(_components(b)), strict=False):
        if x != y:
            break
        score += 1
    return score


def resolve(onnx_calls: list[OnnxCall], torch_calls: list[TorchCall]) -> dict[int, int]:
    """ONNX call index -> torch call index.

    Calls of the main graph name their call exactly. A call inlined from a shared function
    body carries the metadata of the call the body was made from (``h.0.attn`` inside the
    body that ``h.1`` also calls); it resolves to the descendant of its parent's torch call
    with the same class whose path shares the longest tail with it.
    """
    by_id = {c.call_id: i for i, c in enumerate(torch_calls)}
    children: dict[int | None, list[int]] = {}
    for i, c in enumerate(torch_calls):
        children.setdefault(c.parent, []).append(i)

    below: dict[int | None, list[int]] = {}  # each root's descendants, in execution order

    def descendants(root: int | None) -> list[int]:
        if root not in below:
            out, todo = [], list(reversed(children.get(root, [])))
            while todo:  # pre-order, without recursion (a module tree may be deep)
                i = todo.pop()
                out.append(i)
                todo += reversed(children.get(i, []))
            below[root] = out
        return below[root]

    inside: dict[int | None, set[int]] = {}

    def is_descendant(i: int, root: int | None) -> bool:
        if root not in inside:
            inside[root] = set(descendants(root))
        return i in inside[root]

    mapping: dict[int, int] = {}
    used: set[int] = set()
    for k, call in enumerate(onnx_calls):
        if "#" in call.call_id:  # a piece of a split call: its outputs are intermediates
            continue
        parent = mapping.get(call.parent) if call.parent is not None else None
        if call.parent is not None and parent is None:
            continue  # the parent could not be placed, so neither can this call
        exact = by_id.get(call.call_id)
        if exact is not None and (call.exact or parent is None or is_descendant(exact, parent)):
            if exact not in used:
                mapping[k] = exact
                used.add(exact)
            continue
        if call.exact:
            continue
        best, best_score = None, 0
        for j in descendants(parent):
            if j in used:
                continue
            t = torch_calls[j]
            if call.module_type and t.module_type != call.module_type:
                continue
            score = _suffix_score(call.call_id, t.call_id)
            if score > best_score:
                best, best_score = j, score
        if best is not None:
            mapping[k] = best
            used.add(best)
    return mapping


@dataclasses.dataclass
class ModuleDivergence:
    """A module call whose ONNX outputs leave torch's, and by how much."""

    module_path: str
    call_id: str
    module_type: str
    depth: int
    output: str  # the ONNX value name of the worst output
    max_abs: float
    max_rel: float
    mismatched: int
    position: int = 0
    inherited: bool = False  # an input of the call diverged already

    def to_dict(self) -> dict[str, Any]:
        return {"module_path": self.module_path, "call_id": self.call_id,
                "module_type": self.module_type, "depth": self.depth, "output": self.output,
                "inherited": self.inherited,
                "max_abs_err": json_float(self.max_abs),
                "max_rel_err": json_float(self.max_rel), "mismatched": self.mismatched}


@dataclasses.dataclass(eq=False)
class Evidence:
    """What the judging saw, kept (not copied) for extraction and the viewer overlay:
    the probe, every value it exposed, torch's calls and which ONNX call is which."""

    probe: Probe
    values: dict[str, np.ndarray]
    torch_calls: list[TorchCall]
    mapping: dict[int, int]  # ONNX call index -> torch call index
    rtol: float | None
    atol: float | None

    def onnx_call_of(self, torch_index: int) -> int | None:
        """The ONNX call paired with torch call ``torch_index``, if any."""
        for k, j in self.mapping.items():
            if j == torch_index:
                return k
        return None


@dataclasses.dataclass
class Localization:
    """Every diverging module call in execution order, and the first (deepest) one.

    ``errors`` holds every paired call's error in execution order (diverging or not), so
    a report can show where the error starts growing.
    """

    kind: str
    calls_checked: int
    divergences: list[ModuleDivergence]
    first: ModuleDivergence | None
    note: str = ""
    errors: list[CallError] = dataclasses.field(default_factory=list)
    evidence: Evidence | None = dataclasses.field(default=None, repr=False, compare=False)

    def stack(self) -> Stack | None:
        """The repeated blocks whose errors tell where the error starts to grow."""
        return find_stack(self.errors, self.first.call_id if self.first else None)

    def to_dict(self) -> dict[str, Any]:
        stack = self.stack()
        return {"kind": self.kind, "calls_checked": self.calls_checked,
                "first_mismatch": self.first.module_path if self.first else None,
                "divergences": [d.to_dict() for d in self.divergences], "note": self.note,
                "abs_err_hist_edges": list(HIST_EDGES),
                "calls": [e.to_dict() for e in self.errors],
                "stack": stack.to_dict() if stack is not None else None}


def _closest(actual: np.ndarray, candidates: list[torch.Tensor], rtol: float | None,
             atol: float | None) -> tuple[Diff, torch.Tensor] | None:
    """The diff to the nearest same-shape torch tensor, and that tensor; None when none
    has the shape."""
    best: tuple[Diff, torch.Tensor] | None = None
    for t in candidates:
        if tuple(t.shape) != actual.shape:
            continue
        d = check_value(actual, t, rtol, atol, same_dtype=False).diff
        if best is None or (d.ok, -d.max_abs) > (best[0].ok, -best[0].max_abs):
            best = d, t
    return best


def _inputs_diverge(call: OnnxCall, tcall: TorchCall, values: dict[str, np.ndarray],
                    rtol: float | None, atol: float | None) -> bool:
    """Whether a torch input of the call has no agreeing ONNX input (so it was fed wrong).

    ONNX inputs also hold weights and constants; a torch input pairs with the closest
    ONNX input of its shape, and inputs the probe cannot see are not held against it.
    """
    arrays = [values[n] for n in call.inputs if n in values]
    for t in tcall.intact_inputs():
        best: Diff | None = None
        for actual in arrays:
            found = _closest(actual, [t], rtol, atol)
            d = found[0] if found is not None else None
            if d is not None and (best is None or (d.ok, -d.max_abs) > (best.ok, -best.max_abs)):
                best = d
        if best is not None and not best.ok:
            return True
    return False


def _dtypes(pairs: list[tuple[np.ndarray, torch.Tensor]]) -> str:
    names = []
    for actual, expected in pairs:
        want, got = dtype_name(expected), dtype_name(actual)
        name = want if want == got else f"{want} -> {got}"
        if name not in names:
            names.append(name)
    return ", ".join(names)


def judge(
    probe: Probe,
    onnx_values: dict[str, np.ndarray],
    torch_calls: list[TorchCall],
    rtol: float | None,
    atol: float | None,
) -> Localization:
    """Compare every paired call's outputs (and, for diverging calls, inputs).

    A call whose outputs diverge while its inputs agree with torch is where the error
    arises; ``first`` is the earliest such call (the deepest on a tie), or the earliest
    diverging call when every one of them was fed diverging inputs. Every compared call's
    error goes to ``errors``, in torch's execution order.
    """
    mapping = resolve(probe.calls, torch_calls)
    divergences: list[ModuleDivergence] = []
    errors: list[CallError] = []
    for k, j in mapping.items():
        call, tcall = probe.calls[k], torch_calls[j]
        bad: list[tuple[int, str, Diff]] = []
        pairs: list[tuple[np.ndarray, torch.Tensor, Diff]] = []
        outputs = tcall.intact_outputs()
        for name in call.outputs:
            actual = onnx_values.get(name)
            found = _closest(actual, outputs, rtol, atol) if actual is not None else None
            if found is None:
                continue
            best, expected = found
            pairs.append((actual, expected, best))
            if not best.ok:
                bad.append((probe.position.get(name, 0), name, best))
        if not pairs:
            continue
        inherited = None
        if bad:
            position, name, _ = min(bad, key=lambda b: b[0])
            inherited = _inputs_diverge(call, tcall, onnx_values, rtol, atol)
            divergences.append(ModuleDivergence(
                tcall.module_path, tcall.call_id, tcall.module_type, tcall.depth, name,
                max(b[2].max_abs for b in bad), max(b[2].max_rel for b in bad),
                sum(b[2].mismatched for b in bad), position, inherited))
        histogram = [0] * (len(HIST_EDGES) + 1)
        for actual, expected, _ in pairs:
            counts = abs_error_histogram(actual, to_numpy(expected))
            histogram = [a + b for a, b in zip(histogram, counts, strict=True)]
        errors.append(CallError(
            j, tcall.call_id, tcall.module_path, tcall.module_type, tcall.depth, tcall.parent,
            max(d.max_abs for _, _, d in pairs), max(d.max_rel for _, _, d in pairs),
            sum(d.mismatched for _, _, d in pairs), sum(int(a.size) for a, _, _ in pairs),
            _dtypes([(a, e) for a, e, _ in pairs]), histogram, not bad, inherited))
    divergences.sort(key=lambda d: (d.position, -d.depth))
    errors.sort(key=lambda e: e.order)
    origins = [d for d in divergences if not d.inherited]
    first = origins[0] if origins else (divergences[0] if divergences else None)
    note = "" if errors else "no module call of the ONNX model could be paired with torch"
    evidence = Evidence(probe, onnx_values, torch_calls, mapping, rtol, atol)
    return Localization(probe.kind, len(errors), divergences, first, note, errors, evidence)
