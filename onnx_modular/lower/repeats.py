"""Decompose each distinct module call once.

Decomposition (``run_decompositions``, a full retrace of the program) is most of an export's
time, and a 48-layer model repeats one layer 48 times. Before decomposing, every module call
that is structurally identical to an earlier one (same FX subgraph, same constants, same
input and output metadata, same inner module structure) is replaced by one opaque node,
``onnx_modular::repeated_call``, and its first occurrence, the representative, is marked by an
``onnx_modular::call_anchor`` naming its inputs and outputs. After decomposition each opaque
node is expanded into a copy of the representative's decomposed nodes, with its own module
stack, so the decomposed program is the one a full decomposition gives, node for node, up
to node names.

Only calls whose result cannot depend on anything but their inputs are replaced: static
shapes, ATen operators that update in place only tensors made inside the call, outputs that
are no view of an input nor of each other; anything else is decomposed as usual.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import operator
import threading
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputSpec,
    TensorArgument,
)
from torch.fx.traceback import NodeSource, NodeSourceAction

from onnx_modular.leaves._compat import OpOverload, alias_arguments, returns_alias

_LIBRARY = "onnx_modular"

#: group id -> the output metadata (shape, stride, dtype, device) its opaque node returns
_OUTPUTS: dict[int, list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype, torch.device]]] = {}
_GROUP_IDS = itertools.count()
_LOCK = threading.Lock()

_Frame = tuple[str, Any]  # (nn_module_stack key, (path, type))


@functools.cache
def _ops() -> tuple[OpOverload, OpOverload]:
    """The two custom operators, registered on first use."""

    @torch.library.custom_op(f"{_LIBRARY}::repeated_call", mutates_args=())
    def repeated_call(inputs: list[torch.Tensor], group: int,
                      member: int) -> list[torch.Tensor]:
        raise RuntimeError("onnx_modular::repeated_call is a placeholder; it never runs")

    @repeated_call.register_fake
    def _(inputs: list[torch.Tensor], group: int, member: int) -> list[torch.Tensor]:
        return [torch.empty_strided(shape, stride, dtype=dtype, device=device)
                for shape, stride, dtype, device in _OUTPUTS[group]]

    @torch.library.custom_op(f"{_LIBRARY}::call_anchor", mutates_args=())
    def call_anchor(inputs: list[torch.Tensor], outputs: list[torch.Tensor],
                    group: int) -> None:
        raise RuntimeError("onnx_modular::call_anchor is a placeholder; it never runs")

    @call_anchor.register_fake
    def _(inputs: list[torch.Tensor], outputs: list[torch.Tensor], group: int) -> None:
        return None

    anchor = torch.ops.onnx_modular.call_anchor.default
    torch.fx.node.has_side_effect(anchor)  # no user: keep it through decomposition
    return torch.ops.onnx_modular.repeated_call.default, anchor


# ---- finding repeated calls ------------------------------------------------------------------

@dataclasses.dataclass
class _Call:
    key: str  # the nn_module_stack key of the call
    module_type: str
    depth: int
    nodes: list[torch.fx.Node]
    inputs: list[torch.fx.Node] = dataclasses.field(default_factory=list)
    outputs: list[torch.fx.Node] = dataclasses.field(default_factory=list)
    signature: str | None = None  # None: not replaceable


def _stack(node: torch.fx.Node) -> list[_Frame]:
    return list((node.meta.get("nn_module_stack") or {}).items())


def _tensor_sig(value: Any) -> tuple[Any, ...] | None:
    """Shape, stride, dtype, device of a static tensor; None for anything else."""
    if not isinstance(value, torch.Tensor):
        return None
    shape, stride = tuple(value.shape), tuple(value.stride())
    if not all(type(d) is int for d in (*shape, *stride)):
        return None  # symbolic
    return shape, stride, value.dtype, value.device, value.requires_grad


def _value_sig(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        parts = [_value_sig(v) for v in value]
        return None if any(p is None for p in parts) else tuple(parts)
    return _tensor_sig(value)


#: In-place operators that change which storage a tensor views (``b.set_(x)`` makes ``b``
#: share ``x``'s, which their schemas do not annotate): never replaced.
_RESTORAGE = frozenset({"set_", "resize_", "resize_as_", "as_strided_", "swap_"})


def _allowed(node: torch.fx.Node) -> bool:
    """An ATen-like operator (in place too: :class:`_Storage` decides whether what it writes
    stays inside the call, from the schema's alias annotations) or a getitem."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return True
    return (isinstance(node.target, OpOverload) and node.target.namespace != _LIBRARY
            and node.target.__name__.split(".")[0] not in _RESTORAGE)


def _nodes(value: Any) -> list[torch.fx.Node]:
    found: list[torch.fx.Node] = []
    torch.fx.node.map_arg(value, found.append)
    return found


def _argument(node: torch.fx.Node, position: int, name: str) -> Any:
    return node.args[position] if position < len(node.args) else node.kwargs.get(name)


class _Storage:
    """Which tensors made inside a call each of its values shares storage with (through
    views and in-place updates), so that a call whose in-place updates and returned views
    stay inside it still counts as a function of its inputs (Falcon's ``scores /= scale``,
    T5's ``hidden += ...``, OPT's returned view)."""

    def __init__(self, local: dict[torch.fx.Node, int]) -> None:
        self._local = local
        self._bases: dict[torch.fx.Node, frozenset[torch.fx.Node] | None] = {}

    def bases(self, node: torch.fx.Node) -> frozenset[torch.fx.Node] | None:
        """The fresh tensors of the call ``node`` may share storage with; None when it may
        share with something outside the call (an input, a weight) or that is unknown."""
        if node not in self._local:
            return None
        if node not in self._bases:
            self._bases[node] = None  # a cycle cannot happen; guards the recursion anyway
            shared = self._shared_with(node)
            found: frozenset[torch.fx.Node] | None = frozenset([node]) if shared == [] else None
            if shared:
                found = frozenset()
                for other in shared:
                    more = self.bases(other)
                    if more is None:
                        found = None
                        break
                    found |= more
            self._bases[node] = found
        return self._bases[node]

    def _shared_with(self, node: torch.fx.Node) -> list[torch.fx.Node] | None:
        """The values ``node``'s result may be a view of ([]: a fresh tensor)."""
        producer = node.args[0] if node.target is operator.getitem else node
        assert isinstance(producer, torch.fx.Node)
        if not returns_alias(producer.target):
            return []
        arguments = alias_arguments(producer.target)
        if arguments is None:
            return None
        return _nodes([_argument(producer, i, name) for i, name, _ in arguments])

    def writes_stay_inside(self, node: torch.fx.Node) -> bool:
        """An operator writing in place writes only tensors made inside the call."""
        arguments = alias_arguments(node.target) or []
        written = _nodes([_argument(node, i, name) for i, name, write in arguments if write])
        return all(self.bases(value) is not None for value in written)

    def outputs_own_their_storage(self, outputs: list[torch.fx.Node]) -> bool:
        """No output is a view of an input or shares storage with another output: updates
        made to one after the call reach nothing else."""
        seen: set[torch.fx.Node] = set()
        for out in outputs:
            bases = self.bases(out)
            if bases is None or not seen.isdisjoint(bases):
                return False
            seen |= bases
        return True


def _collect_calls(graph: torch.fx.Graph) -> list[_Call]:
    """Every module call (by its stack key) with its nodes; only contiguous calls count."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    calls: dict[str, _Call] = {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        for depth, (key, value) in enumerate(_stack(node)):
            if not isinstance(value, tuple) or value[0] == "":
                continue
            call = calls.get(key)
            if call is None:
                calls[key] = _Call(key, str(value[1]), depth, [node])
            else:
                call.nodes.append(node)
    found = []
    for call in calls.values():
        first, last = order[call.nodes[0]], order[call.nodes[-1]]
        if last - first + 1 == len(call.nodes):
            found.append(call)
    return found


def _describe(call: _Call) -> None:
    """Fill ``inputs``, ``outputs`` and ``signature`` (None when not replaceable)."""
    local = {n: i for i, n in enumerate(call.nodes)}
    external: dict[torch.fx.Node, int] = {}
    items: list[Any] = []
    base = _stack(call.nodes[0])[: call.depth + 1]
    base_path = str(base[-1][1][0])

    def ref(value: torch.fx.Node) -> tuple[str, int]:
        if value in local:
            return ("l", local[value])
        return ("x", external.setdefault(value, len(external)))

    storage = _Storage(local)
    for node in call.nodes:
        if not _allowed(node) or not storage.writes_stay_inside(node):
            return
        val = _value_sig(node.meta.get("val"))
        if val is None and node.meta.get("val") is not None:
            return  # symbolic or non-tensor
        stack = _stack(node)
        if stack[: call.depth + 1] != base:
            return
        inner = tuple((_relative(str(v[0]), base_path), str(v[1])) for _, v in
                      stack[call.depth + 1:])
        args = torch.fx.node.map_arg((node.args, node.kwargs), ref)
        items.append((str(node.target), repr(args), inner, val))
    inputs = list(external)
    for value in inputs:
        if _tensor_sig(value.meta.get("val")) is None:
            return
    outputs = [n for n in call.nodes if any(u not in local for u in n.users)]
    if not outputs:
        return
    if any(_tensor_sig(out.meta.get("val")) is None for out in outputs):
        return
    if not storage.outputs_own_their_storage(outputs):
        return
    call.inputs, call.outputs = inputs, outputs
    call.signature = repr((call.module_type, items, [local[o] for o in outputs],
                           [_tensor_sig(v.meta["val"]) for v in inputs]))


def _relative(path: str, base: str) -> str:
    if path == base:
        return "."
    if path.startswith(base + "."):
        return path[len(base):]
    return path


# ---- reduce / expand -------------------------------------------------------------------------

@dataclasses.dataclass
class _Repeat:
    group: int
    frames: dict[str, _Frame]  # representative's frame key -> this call's frame
    outer: list[_Frame]  # this call's frames above it
    #: representative's captured node name -> provenance naming this call's captured node
    sources: dict[str, NodeSource]
    #: this call's captured node name -> the representative's
    names: dict[str, str] = dataclasses.field(default_factory=dict)
    #: weights taken out of the opaque node's inputs: (position, placeholder name)
    stripped: list[tuple[int, str]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Repeats:
    """What ``reduce`` replaced: expanded again by ``expand`` after decomposition."""

    representative_keys: dict[int, str] = dataclasses.field(default_factory=dict)
    repeats: list[_Repeat] = dataclasses.field(default_factory=list)  # by member number
    #: the input specs before weights used only by opaque nodes were taken out, and the
    #: placeholders of those weights (put back by ``expand``)
    input_specs: list[InputSpec] = dataclasses.field(default_factory=list)
    weights: dict[str, torch.fx.Node] = dataclasses.field(default_factory=dict)

    def release(self) -> None:
        with _LOCK:
            for group in self.representative_keys:
                _OUTPUTS.pop(group, None)


def _groups(calls: list[_Call]) -> list[list[_Call]]:
    """Groups of identical calls, largest first (so a call comes before the calls inside
    it); a call inside a replaced call is left to its copy."""
    by_signature: dict[str, list[_Call]] = {}
    for call in calls:
        _describe(call)
        if call.signature is not None:
            by_signature.setdefault(call.signature, []).append(call)
    replaced: set[torch.fx.Node] = set()
    representatives: list[_Call] = []
    chosen: list[list[_Call]] = []
    for members in sorted((m for m in by_signature.values() if len(m) > 1),
                          key=lambda m: (-len(m[0].nodes), min(c.depth for c in m))):
        # a call inside a replaced call goes with it; a representative stays, so calls
        # inside it may still repeat each other, but a call around one cannot be replaced
        kept = [c for c in members if replaced.isdisjoint(c.nodes)]
        kept = kept[:1] + [c for c in kept[1:] if not any(_contains(c, r)
                                                          for r in representatives)]
        if len(kept) < 2:
            continue
        chosen.append(kept)
        representatives.append(kept[0])
        for call in kept[1:]:
            replaced.update(call.nodes)
    return chosen


def _contains(outer: _Call, inner: _Call) -> bool:
    return len(outer.nodes) > len(inner.nodes) and inner.nodes[0] in outer.nodes

def reduce(program: torch.export.ExportedProgram
           ) -> tuple[torch.export.ExportedProgram, Repeats] | None:
    """``program`` with every repeated call replaced by an opaque node; None if none repeats.
    ``program`` itself is left as it was."""
    repeated_call, call_anchor = _ops()
    graph = torch.fx.Graph()
    old_to_new: dict[torch.fx.Node, torch.fx.Node] = {}
    value, old_output = graph.graph_copy(program.graph, old_to_new,  # type: ignore[misc]
                                         return_output_node=True)
    graph.output(value).meta.update(old_output.meta)
    for old, new in old_to_new.items():
        if new.name != old.name:  # a builtin's name ("input") is suffixed on copy
            new.name = old.name
    groups = _groups(_collect_calls(graph))
    if not groups:
        return None
    plan = Repeats()
    renamed: dict[str, str] = {}
    now: dict[torch.fx.Node, torch.fx.Node] = {}  # outputs of replaced calls -> getitems

    def current(nodes: list[torch.fx.Node]) -> list[torch.fx.Node]:
        return [now.get(n, n) for n in nodes]

    for members in groups:
        with _LOCK:
            group = next(_GROUP_IDS)
            _OUTPUTS[group] = [_meta(o.meta["val"]) for o in members[0].outputs]
        first = members[0]
        plan.representative_keys[group] = first.key
        with graph.inserting_after(first.nodes[-1]):
            anchor = graph.call_function(call_anchor, (current(first.inputs),
                                                       current(first.outputs), group))
        anchor.meta["nn_module_stack"] = dict(_stack(first.nodes[0])[: first.depth + 1])
        for call in members[1:]:
            with graph.inserting_after(call.nodes[-1]):
                node = graph.call_function(repeated_call,
                                           (current(call.inputs), group,
                                            len(plan.repeats)))
                node.meta["val"] = [o.meta["val"] for o in call.outputs]
                node.meta["nn_module_stack"] = dict(_stack(call.nodes[0])[: call.depth + 1])
                plan.repeats.append(_frame_map(first, call, group))
            previous = node
            for k, out in enumerate(call.outputs):
                with graph.inserting_after(previous):
                    item = graph.call_function(operator.getitem, (node, k))
                item.meta["val"] = out.meta["val"]
                item.meta["nn_module_stack"] = node.meta["nn_module_stack"]
                out.replace_all_uses_with(item)
                now[out] = item
                renamed[out.name] = item.name
                previous = item
            for dead in reversed(call.nodes):
                graph.erase_node(dead)
    plan.input_specs = list(program.graph_signature.input_specs)
    specs = _strip_weights(graph, plan)
    return _with_graph(program, graph, renamed, specs), plan


_WEIGHTS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def _strip_weights(graph: torch.fx.Graph, plan: Repeats) -> list[InputSpec]:
    """Take the weights that only opaque nodes read out of the program: decomposition costs
    time per graph input (torch's signature lookups are quadratic in them), and these are
    put back by ``expand``."""
    repeated_call, _ = _ops()
    # a non-persistent buffer lives among the program's constants and is still registered on
    # the module decomposition retraces, which lifts it again: taking it out would define it
    # twice (GPT-J's rotary table, Swin's relative position index)
    kinds = {spec.arg.name: spec.kind for spec in plan.input_specs
             if isinstance(spec.arg, TensorArgument) and spec.persistent is not False}
    for node in [n for n in graph.nodes if n.op == "placeholder"]:
        if kinds.get(node.name) not in _WEIGHTS or not node.users \
                or any(u.target is not repeated_call for u in node.users):
            continue
        for user in list(node.users):
            inputs = list(user.args[0])  # type: ignore[arg-type]
            repeat = plan.repeats[user.args[2]]  # type: ignore[index]
            while node in inputs:
                position = inputs.index(node)
                repeat.stripped.append((_original_position(repeat, position), node.name))
                del inputs[position]
            user.args = (inputs, *user.args[1:])
        plan.weights[node.name] = node
        graph.erase_node(node)
    return [spec for spec in plan.input_specs
            if not (isinstance(spec.arg, TensorArgument) and spec.arg.name in plan.weights)]


def _original_position(repeat: _Repeat, position: int) -> int:
    """Where input ``position`` of what is left stood before any was taken out."""
    for taken, _ in sorted(repeat.stripped):
        if taken <= position:
            position += 1
    return position


def _meta(value: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...], torch.dtype,
                                        torch.device]:
    return tuple(value.shape), tuple(value.stride()), value.dtype, value.device


def _frame_map(first: _Call, call: _Call, group: int) -> _Repeat:
    frames: dict[str, _Frame] = {}
    outer: list[_Frame] = []
    sources: dict[str, NodeSource] = {}
    for a, b in zip(first.nodes, call.nodes, strict=True):
        sources[a.name] = NodeSource(b, "onnx_modular.repeats", NodeSourceAction.CREATE)
        sa, sb = _stack(a), _stack(b)
        outer = sb[: call.depth]
        for fa, fb in zip(sa[first.depth:], sb[call.depth:], strict=True):
            frames.setdefault(fa[0], fb)
    names = {b.name: a.name for a, b in zip(first.nodes, call.nodes, strict=True)}
    return _Repeat(group, frames, outer, sources, names)


def expand(program: torch.export.ExportedProgram, plan: Repeats
           ) -> torch.export.ExportedProgram:
    """Replace every opaque node of decomposed ``program`` by a copy of its representative's
    decomposed nodes; anchors go."""
    repeated_call, call_anchor = _ops()
    graph = program.graph_module.graph
    anchors = {n.args[2]: n for n in graph.nodes if n.target is call_anchor}
    pending: dict[int, list[torch.fx.Node]] = {}
    for node in graph.nodes:
        if node.target is repeated_call:
            pending.setdefault(node.args[1], []).append(node)  # type: ignore[arg-type]
    renamed: dict[str, str] = {}
    done: set[int] = set()
    specs = _restore_weights(graph, program, plan, pending)

    def expand_group(group: int, active: tuple[int, ...]) -> None:
        if group in done:
            return
        if group in active:
            raise RuntimeError("repeated calls nest in a cycle")
        anchor = anchors[group]
        body = _slice(anchor)
        inner = {n.args[1] for n in body if n.target is repeated_call}
        if inner:  # repeated calls inside the representative come first
            for other in sorted(inner):  # type: ignore[type-var]
                expand_group(other, (*active, group))  # type: ignore[arg-type]
            body = _slice(anchor)
        # read after the inner expansion, which replaces some of them
        inputs: list[torch.fx.Node] = list(anchor.args[0])  # type: ignore[arg-type]
        outputs: list[torch.fx.Node] = list(anchor.args[1])  # type: ignore[arg-type]
        order = {n: i for i, n in enumerate(graph.nodes)}
        body.sort(key=order.__getitem__)
        key = plan.representative_keys[group]
        for dup in pending.get(group, []):
            _copy_into(graph, dup, body, inputs, outputs, key, plan.repeats[dup.args[2]],
                       renamed)
        done.add(group)

    for group in sorted(pending):
        expand_group(group, ())
    for anchor in anchors.values():
        graph.erase_node(anchor)
    return _with_graph(program, graph, renamed, specs)


def _restore_weights(graph: torch.fx.Graph, program: torch.export.ExportedProgram,
                     plan: Repeats, pending: dict[int, list[torch.fx.Node]]
                     ) -> list[InputSpec]:
    """Put back the placeholders ``_strip_weights`` took out, in their places."""
    if not plan.weights:
        return list(program.graph_signature.input_specs)
    placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    first = next(n for n in graph.nodes if n.op != "placeholder")
    kept = iter(program.graph_signature.input_specs)
    specs: list[InputSpec] = []
    for spec in plan.input_specs:
        name = spec.arg.name if isinstance(spec.arg, TensorArgument) else None
        if name in plan.weights:
            with graph.inserting_before(first):
                node = graph.placeholder(name)
            node.name = name  # a builtin's name is suffixed on creation
            node.meta.update(plan.weights[name].meta)
            placeholders[name] = node
            specs.append(spec)
        else:
            specs.append(next(kept))
    for spec in specs:  # graph inputs in the order of the specs
        arg = spec.arg
        node = placeholders.get(getattr(arg, "name", ""))
        if node is not None:
            first.prepend(node)
    for dups in pending.values():
        for dup in dups:
            inputs = list(dup.args[0])  # type: ignore[arg-type]
            for position, name in sorted(plan.repeats[dup.args[2]].stripped):  # type: ignore[index]
                inputs.insert(position, placeholders[name])
            dup.args = (inputs, *dup.args[1:])
    return specs


def _slice(anchor: torch.fx.Node) -> list[torch.fx.Node]:
    """The nodes computing the anchor's outputs from its inputs (weights and constants are
    shared, not part of it)."""
    inputs: list[torch.fx.Node] = list(anchor.args[0])  # type: ignore[arg-type]
    outputs: list[torch.fx.Node] = list(anchor.args[1])  # type: ignore[arg-type]
    stop = set(inputs)
    seen: set[torch.fx.Node] = set()
    todo = [o for o in outputs if o not in stop]
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        if node.op in ("placeholder", "get_attr"):
            continue  # weights and constants the decomposition lifted: shared
        if node.op != "call_function":
            raise RuntimeError(f"unexpected node {node.format_node()} in a repeated call")
        seen.add(node)
        todo.extend(n for n in node.all_input_nodes if n not in stop and n not in seen)
    return list(seen)


def _copy_into(graph: torch.fx.Graph, dup: torch.fx.Node, body: list[torch.fx.Node],
               inputs: list[torch.fx.Node], outputs: list[torch.fx.Node], key: str,
               repeat: _Repeat, renamed: dict[str, str]) -> None:
    env: dict[torch.fx.Node, torch.fx.Node] = dict(zip(inputs, dup.args[0], strict=True))

    def lookup(n: torch.fx.Node) -> torch.fx.Node:
        return env.get(n, n)  # weights and constants outside the call are shared

    with graph.inserting_before(dup):
        for node in body:
            source = _source(node, repeat.sources)
            # a node decomposition kept as it was keeps its name, as in a full decomposition
            kept = source is not None and node.name == repeat.names.get(source.name)
            copy = graph.create_node(
                node.op, node.target, torch.fx.node.map_arg(node.args, lookup),
                torch.fx.node.map_arg(node.kwargs, lookup),
                name=source.name if kept else node.name, type_expr=node.type)
            copy.meta = dict(node.meta)
            copy.meta["nn_module_stack"] = dict(_moved(_stack(node), key, repeat))
            copy.meta["from_node"] = [source] if source is not None else []
            env[node] = copy
    for user in list(dup.users):
        value = outputs[user.args[1]]  # type: ignore[index]
        new = env.get(value, value)
        user.replace_all_uses_with(new)
        renamed[user.name] = new.name
        graph.erase_node(user)
    graph.erase_node(dup)


def _source(node: torch.fx.Node, sources: dict[str, NodeSource]) -> NodeSource | None:
    """The provenance of a copy: the captured node of its call that it was decomposed from
    (``passes/stages.py`` follows it to carry stages)."""
    todo = list(node.meta.get("from_node") or [])
    while todo:
        item = todo.pop(0)
        found = sources.get(getattr(item, "name", None))  # type: ignore[arg-type]
        if found is not None:
            return found
        todo.extend(getattr(item, "from_node", None) or [])
    return None


def _moved(stack: list[_Frame], key: str, repeat: _Repeat) -> Iterator[_Frame]:
    """A representative's node stack as the same node of another call has it."""
    yield from repeat.outer
    keys = [k for k, _ in stack]
    if key not in keys:  # made by decomposition without a stack: the call itself
        yield repeat.frames[key]
        return
    for frame in stack[keys.index(key):]:
        yield repeat.frames.get(frame[0], frame)


def _with_graph(program: torch.export.ExportedProgram, graph: torch.fx.Graph,
                renamed: dict[str, str], input_specs: list[InputSpec] | None = None
                ) -> torch.export.ExportedProgram:
    """A program like ``program`` around ``graph``; outputs follow renamed nodes."""

    def follow(name: str) -> str:
        while name in renamed:
            name = renamed[name]
        return name

    outputs = []
    for spec in program.graph_signature.output_specs:
        arg = spec.arg
        if isinstance(arg, TensorArgument) and arg.name in renamed:
            arg = TensorArgument(name=follow(arg.name))
        outputs.append(OutputSpec(kind=spec.kind, arg=arg, target=spec.target))
    if input_specs is None:
        input_specs = list(program.graph_signature.input_specs)
    signature = ExportGraphSignature(input_specs, outputs)
    return torch.export.ExportedProgram(
        root=program.graph_module, graph=graph, graph_signature=signature,
        state_dict=program.state_dict, range_constraints=program.range_constraints,
        module_call_graph=program.module_call_graph, example_inputs=program.example_inputs,
        constants=program.constants, verifiers=program.verifiers)
