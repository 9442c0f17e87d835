"""Modularize: rebuild the ``nn.Module`` call hierarchy that ``torch.export`` flattens.

Every FX node carries ``nn_module_stack``, the chain of module calls it ran in. This pass
groups the nodes of each module call into a sub-``GraphModule`` and replaces them by one
``call_module`` node, recursively, so that the result reads like the original model.

Both metadata formats are read: torch.export's (``{key: (path, class_name)}`` with an outer
root layer; a second call of one instance gets the key suffix ``@1``) and the FX symbolic
tracer's (``{path: (path, class)}``, no root layer, leaf modules as ``call_module`` nodes).

The result is laid out as ``torch.export.unflatten``'s: the module of a module's first call
sits at the module's path (``sub_net.0``), containers never called are plain modules, a
second call's module sits beside the first (``shared@1``) and takes the weights as inputs;
every parameter, buffer and constant is registered at its FQN with its kind, so
``state_dict()`` has the model's keys and non-persistent buffers stay out of it.

The algorithm is linear in the number of nodes: one scan assigns each node its chain of
calls, a repair step makes interleaved calls contiguous where dependencies allow, and one
more scan builds all graphs with a stack of builders.
"""

from __future__ import annotations

import dataclasses
import keyword
import operator
import re
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.fx

from onnx_modular.diagnostics import DiagnosticContext, Location
from onnx_modular.leaves._compat import (
    codegen_of,
    generate_code,
    is_persistent_buffer,
    lazy_graph_module,
    program_codegen,
    program_guards_fn,
    set_codegen,
    set_member,
    sort_members,
)
from onnx_modular.leaves._util import class_identifier, common_prefix
from onnx_modular.leaves.errors import fail, rules
from onnx_modular.leaves.metadata import FX_CALL, FX_NAME, NO_MODULE, CallInfo
from onnx_modular.passes.infra import PassBase, PassConditionError, PassResult

#: A module call in a node's chain: (call_id, module_path, module_type).
_Frame = tuple[str, str, str]

_DYNAMO_PATH = re.compile(r"^L\['self'\]\.?")

_INDEX = re.compile(r"\[(\d+)\]|\['([^']+)'\]")


# ---- reading nn_module_stack -----------------------------------------------------------------

def _normalize_path(path: str) -> str:
    """``L['self'].h[1].attn`` (dynamo) -> ``h.1.attn``; export paths pass unchanged."""
    if not path.startswith("L["):
        return path
    path = _DYNAMO_PATH.sub("", path)
    return _INDEX.sub(lambda m: "." + (m.group(1) or m.group(2)), path).strip(".")


def _type_name(cls: Any) -> str:
    if isinstance(cls, str):
        return cls
    return f"{cls.__module__}.{cls.__qualname__}"


def _frames_of(node: torch.fx.Node) -> list[_Frame] | None:
    """The node's module-call chain, outermost first, root layer dropped; None if unknown."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    frames: list[_Frame] = []
    for key, value in stack.items():
        if isinstance(value, tuple):
            path, cls = value
        else:  # very old FX tracer format: {path: class}
            path, cls = key, value
        path = _normalize_path(str(path))
        if path == "" or path == NO_MODULE:  # torch.export's root layer, or no module
            continue
        suffix = key.rsplit("@", 1)[1] if "@" in key else ""
        call_id = f"{path}@{suffix}" if suffix else path
        frames.append((call_id, path, _type_name(cls)))
    if node.op == "call_module" and frames and frames[-1][1] == node.target:
        frames.pop()  # FX tracer: a leaf module's own frame; the node *is* that call
    return frames


# ---- step 1: a chain of calls for every node ------------------------------------------------

def _assign_chains(
    nodes: Sequence[torch.fx.Node], ctx: DiagnosticContext
) -> dict[torch.fx.Node, tuple[_Frame, ...]]:
    """Chains for compute nodes; unannotated ones inherit the context around them."""
    chains: dict[torch.fx.Node, tuple[_Frame, ...]] = {}
    pending: list[torch.fx.Node] = []
    unannotated: list[torch.fx.Node] = []
    previous: tuple[_Frame, ...] = ()

    def settle(following: tuple[_Frame, ...]) -> None:
        common = common_prefix(previous, following)
        for p in pending:
            chains[p] = common
        pending.clear()

    for node in nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        if node.op == "call_module" and node.target == "_guards_fn":
            chains[node] = ()
            continue
        frames = _frames_of(node)
        if frames is None:
            pending.append(node)
            unannotated.append(node)
            continue
        chain = tuple(frames)
        settle(chain)
        chains[node] = chain
        previous = chain
    settle(())
    _hoist_shared_sizes(nodes, chains)
    if unannotated:
        names = ", ".join(n.name for n in unannotated[:8])
        more = f" (+{len(unannotated) - 8} more)" if len(unannotated) > 8 else ""
        ctx.note(rules.MISSING_MODULE_STACK, Location.of_node(unannotated[0]),
                 count=len(unannotated), nodes=names + more)
    return chains


def _is_size(node: torch.fx.Node) -> bool:
    """A symbolic (or plain) scalar computed from shapes: ``sym_size``, ``mul`` of sizes."""
    val = node.meta.get("val")
    return node.op == "call_function" and isinstance(
        val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool))


def _hoist_shared_sizes(nodes: Sequence[torch.fx.Node],
                        chains: dict[torch.fx.Node, tuple[_Frame, ...]]) -> None:
    """Size arithmetic that torch.export computes once in the first of several calls and
    reuses in the others (a dynamic batch times the head count, in block 0) moves up to the
    calls' common parent: every call then takes it as an input, and all keep one signature.

    Only where everything it reads is already visible there (no call gets a new output).
    Reverse order: users are placed before the sizes they read.
    """
    for node in reversed(nodes):
        own = chains.get(node)
        if own is None or not own or not _is_size(node):
            continue
        target = own
        for user in node.users:
            chain = chains.get(user)
            if chain is not None:
                target = common_prefix(target, chain)
        if len(target) == len(own):
            continue
        if all(_visible(a, target, chains) for a in node.all_input_nodes):
            chains[node] = target


def _visible(value: torch.fx.Node, scope: tuple[_Frame, ...],
             chains: dict[torch.fx.Node, tuple[_Frame, ...]]) -> bool:
    """Is ``value`` made in ``scope`` or above it (usable there without a new call output)?"""
    if value.op in ("placeholder", "get_attr"):
        return True
    chain = chains.get(value)
    if chain is None:
        return False
    if _is_size(value):
        return True  # a size is hoisted with its users: it lands in a prefix of ``scope``
    return common_prefix(chain, scope) == chain


# ---- step 2: make every call contiguous, or split it ---------------------------------------

def _make_contiguous(
    order: list[torch.fx.Node],
    chains: dict[torch.fx.Node, tuple[_Frame, ...]],
    ctx: DiagnosticContext,
) -> list[torch.fx.Node]:
    """Reorder interleaved calls into one piece when no dependency forbids it.

    For a call whose nodes are interrupted by foreign nodes, the foreign nodes that depend
    on the call move after it, the others before it. If a node of the call depends on a
    foreign node that must move after it, the call is split into pieces (``id#1`` ...).
    Calls are visited outermost first; each reorder touches only the call's own span.
    """
    compute = [n for n in order if n in chains]
    position = {n: i for i, n in enumerate(compute)}
    members: dict[str, list[torch.fx.Node]] = {}
    depth: dict[str, int] = {}
    for n in compute:
        for d, frame in enumerate(chains[n]):
            members.setdefault(frame[0], []).append(n)
            depth.setdefault(frame[0], d)

    for call_id in sorted(members, key=lambda c: (depth[c], position[members[c][0]])):
        inside = set(members[call_id])
        lo = min(position[n] for n in inside)
        hi = max(position[n] for n in inside)
        if hi - lo + 1 == len(inside):
            continue
        span = compute[lo:hi + 1]
        after: set[torch.fx.Node] = set()
        blocked = False
        for n in span:
            if n in inside:
                if any(a in after for a in n.all_input_nodes):
                    blocked = True
                    break
            elif any(a in inside or a in after for a in n.all_input_nodes):
                after.add(n)
        if blocked:
            _split_call(call_id, span, inside, chains, ctx)
            continue
        before = [n for n in span if n not in inside and n not in after]
        grouped = before + [n for n in span if n in inside] + [n for n in span if n in after]
        compute[lo:hi + 1] = grouped
        for i, n in enumerate(grouped, start=lo):
            position[n] = i

    others = [n for n in order if n not in chains]
    placeholders = [n for n in others if n.op in ("placeholder", "get_attr")]
    outputs = [n for n in others if n.op == "output"]
    return placeholders + compute + outputs


def _split_call(
    call_id: str,
    span: list[torch.fx.Node],
    inside: set[torch.fx.Node],
    chains: dict[torch.fx.Node, tuple[_Frame, ...]],
    ctx: DiagnosticContext,
) -> None:
    """Give each contiguous run of the call its own id, ``call_id#k`` for k >= 1."""
    piece, was_inside = 0, False
    for n in span:
        is_inside = n in inside
        if is_inside and not was_inside:
            piece += 1
        if is_inside and piece > 1:
            chains[n] = tuple(
                (f"{f[0]}#{piece - 1}", f[1], f[2]) if f[0] == call_id else f for f in chains[n]
            )
        was_inside = is_inside
    first = next(n for n in span if n in inside)
    path = next(f[1] for f in chains[first] if f[0] == call_id)
    ctx.warn(rules.MODULE_CALL_SPLIT, Location.of_node(first, path), module=call_id, pieces=piece)


# ---- step 3: build the nested GraphModules --------------------------------------------------

class _Builder:
    """Accumulates one module call's graph while the scan is inside that call.

    ``attr``: the call's attribute in its parent (dotted through containers never called).
    ``location``: where the module sits in the result's tree, the call's module path, for
    the first call of a module inside first calls; None for other calls (a shared module's
    second call, a call split in pieces), whose weights then come in as inputs.
    """

    def __init__(self, frame: _Frame | None, parent: _Builder | None,
                 graph: torch.fx.Graph, attr: str = "", location: str | None = "") -> None:
        self.frame = frame
        self.parent = parent
        self.graph = graph
        self.attr = attr
        self.location = location
        self.env: dict[torch.fx.Node, torch.fx.Node] = {}
        self.inputs: list[torch.fx.Node] = []  # outer nodes, in first-use order
        self.defined: list[torch.fx.Node] = []  # original nodes whose value lives here
        self.attributes: dict[str, Any] = {}
        self.children: set[str] = set()  # attribute names of the calls made here
        self._first_body: torch.fx.Node | None = None

    @property
    def call_id(self) -> str:
        return self.frame[0] if self.frame else ""

    @property
    def prefix(self) -> str:
        return self.frame[1] + "." if self.frame else ""

    def owned(self, fqn: str) -> str | None:
        """``fqn`` relative to this module when the module holds it, else None."""
        if self.location is None:
            return None
        if not self.location:
            return fqn
        return fqn[len(self.location) + 1:] if fqn.startswith(self.location + ".") else None


#: How a state entry is registered: a parameter, a (non-)persistent buffer, or a constant
#: (a plain attribute, outside the state dict).
_PARAMETER, _BUFFER, _NON_PERSISTENT, _CONSTANT = "parameter", "buffer", "non_persistent", \
    "constant"


@dataclasses.dataclass
class _Source:
    """What the modularizer reads: a graph, where its attributes live, how it is called.

    For an ExportedProgram the graph is the *lifted* one: parameter and buffer placeholders
    become attributes and mutated buffers are copied back at the end, which is what
    ``ExportedProgram.module()`` does, without copying and recompiling the whole graph.
    ``state``: every parameter, buffer and constant as (FQN, value, kind), registered at its
    FQN in the result, so that its ``state_dict()`` is the model's.
    """

    graph: torch.fx.Graph
    attributes: dict[str, Any]
    state: list[tuple[str, Any, str]]
    lifted: dict[torch.fx.Node, str]  # placeholder -> attribute FQN
    mutated_outputs: list[str | None] | None  # per flat output: buffer/input it writes
    codegen: Any
    class_name: str
    module_type: str
    meta: dict[str, Any]
    program: torch.export.ExportedProgram | None = None  # for its input guards
    _aliases: dict[str, list[str]] = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        by_id: dict[int, list[str]] = {}
        for name, value, _ in self.state:
            by_id.setdefault(id(value), []).append(name)
        self._aliases = {name: names for names in by_id.values() for name in names}

    def aliases(self, target: str) -> list[str]:
        """``target`` and every other FQN of the same object (a tied weight), in order."""
        return [target, *(n for n in self._aliases.get(target, []) if n != target)]

    @classmethod
    def of_graph_module(cls, gm: torch.fx.GraphModule) -> _Source:
        """The module's own tensors, shared with it (nothing is copied)."""
        state: list[tuple[str, Any, str]] = [
            (name, p, _PARAMETER) for name, p in gm.named_parameters(remove_duplicate=False)]
        for name, buffer in gm.named_buffers(remove_duplicate=False):
            owner, _, field = name.rpartition(".")
            persistent = is_persistent_buffer(gm.get_submodule(owner), field)
            state.append((name, buffer, _BUFFER if persistent else _NON_PERSISTENT))
        attributes = {name: value for name, value, _ in state}
        for node in gm.graph.nodes:
            if node.op in ("get_attr", "call_module"):
                attributes[str(node.target)] = _fetch_attr(gm, str(node.target))
        return cls(gm.graph, attributes, state, {}, None, codegen_of(gm.graph),
                   type(gm).__name__, getattr(gm, "module_type", _type_name(type(gm))),
                   dict(gm.meta))

    @classmethod
    def of_program(cls, ep: torch.export.ExportedProgram) -> _Source:
        from torch.export.graph_signature import InputKind, OutputKind

        placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
        lifted_kinds = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR,
                        InputKind.CUSTOM_OBJ)
        state = _program_state(ep)
        attributes = {name: value for name, value, _ in state}
        lifted: dict[torch.fx.Node, str] = {}
        for node, spec in zip(placeholders, ep.graph_signature.input_specs, strict=True):
            if spec.kind in lifted_kinds and spec.target is not None:
                lifted[node] = spec.target
        for node in ep.graph.nodes:
            if node.op == "get_attr":  # submodules of control flow, rare in exported graphs
                attributes[str(node.target)] = _fetch_attr(ep.graph_module, str(node.target))
        mutated = [spec.target if spec.kind in (OutputKind.BUFFER_MUTATION,
                                                OutputKind.USER_INPUT_MUTATION,
                                                OutputKind.PARAMETER_MUTATION) else None
                   for spec in ep.graph_signature.output_specs]
        codegen = program_codegen(ep)
        root_type = _root_type_of(ep)
        return cls(ep.graph, attributes, state, lifted, mutated, codegen,
                   class_identifier(root_type), root_type, dict(ep.graph_module.meta), ep)


def _program_state(ep: torch.export.ExportedProgram) -> list[tuple[str, Any, str]]:
    """The program's parameters (shared), buffers (copied: every result runs on state of its
    own, as ``torch.export.unflatten``'s do; aliases stay aliases) and constants (shared)."""
    non_persistent = set(ep.graph_signature.non_persistent_buffers)
    copies: dict[int, torch.Tensor] = {}

    def own(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in copies:
            copies[id(tensor)] = tensor.clone()
        return copies[id(tensor)]

    state: list[tuple[str, Any, str]] = []
    for name, value in ep.state_dict.items():
        if isinstance(value, torch.nn.Parameter):
            state.append((name, value, _PARAMETER))
        else:
            state.append((name, own(value), _BUFFER))
    for name, value in ep.constants.items():
        if name in non_persistent and isinstance(value, torch.Tensor):
            state.append((name, own(value), _NON_PERSISTENT))
        else:
            state.append((name, value, _CONSTANT))
    return state


class _Modularizer:
    def __init__(self, source: _Source, ctx: DiagnosticContext, eager_code: bool = True
                 ) -> None:
        self.source = source
        self.ctx = ctx
        self.eager_code = eager_code
        self.chains: dict[torch.fx.Node, tuple[_Frame, ...]] = {}
        self.located: set[str] = set()  # module paths whose place a call's module took

    def run(self) -> torch.fx.GraphModule:
        nodes = list(self.source.graph.nodes)
        self.chains = _assign_chains(nodes, self.ctx)
        ordered = _make_contiguous(nodes, self.chains, self.ctx)

        root_graph = torch.fx.Graph()
        set_codegen(root_graph, self.source.codegen)  # keeps the pytree calling convention
        root = _Builder(None, None, root_graph)
        stack = [root]
        for node in ordered:
            if node.op in ("placeholder", "get_attr"):
                if node.op == "placeholder" and node not in self.source.lifted:
                    root.env[node] = root_graph.node_copy(node)
                    root.defined.append(node)
                continue
            chain = self.chains.get(node, ())
            common = 0
            while (common < len(chain) and common + 1 < len(stack)
                   and stack[common + 1].frame == chain[common]):
                common += 1
            while len(stack) > common + 1:
                self._close(stack.pop())
            for frame in chain[common:]:
                stack.append(self._open(stack[-1], frame))
            if node.op == "output" and self.source.mutated_outputs is not None:
                self._program_output(root, node)
            else:
                self._copy(stack[-1], node)
        while len(stack) > 1:
            self._close(stack.pop())
        return self._finish_root(root)

    def _program_output(self, root: _Builder, node: torch.fx.Node) -> None:
        """Mutated buffers and inputs are written back with ``copy_``; user outputs returned."""
        assert self.source.mutated_outputs is not None
        by_name = {n.name: n for n in self.source.graph.nodes if n.op == "placeholder"}
        by_target = {t: n for n, t in self.source.lifted.items()}
        user_outputs = []
        for value, target in zip(node.args[0], self.source.mutated_outputs, strict=True):
            mapped = self._lookup(root, value) if isinstance(value, torch.fx.Node) else value
            if target is None:
                user_outputs.append(mapped)
                continue
            written = self._lookup(root, by_target.get(target) or by_name[target])
            root.graph.call_function(torch.ops.aten.copy_.default, (written, mapped))
        root.graph.output(tuple(user_outputs))

    # -- values -------------------------------------------------------------------------------

    def _lookup(self, builder: _Builder, value: torch.fx.Node) -> torch.fx.Node:
        """The node standing for ``value`` in ``builder``'s graph (placeholder if outer)."""
        found = builder.env.get(value)
        if found is not None:
            return found
        if value.op == "get_attr" or value in self.source.lifted:
            return self._attribute(builder, value)
        return self._input(builder, value)

    def _input(self, builder: _Builder, value: torch.fx.Node) -> torch.fx.Node:
        """A new input of ``builder``'s call, passed by its parent."""
        graph = builder.graph
        if builder._first_body is None:
            placeholder = graph.placeholder(value.name)
        else:
            with graph.inserting_before(builder._first_body):
                placeholder = graph.placeholder(value.name)
        placeholder.meta = dict(value.meta)
        builder.env[value] = placeholder
        builder.inputs.append(value)
        return placeholder

    def _attribute(self, builder: _Builder, value: torch.fx.Node) -> torch.fx.Node:
        """Parameters, buffers and constants are read where they live, at their FQN: the
        module holding one reads it as an attribute; other calls take it as an input from
        their parent, as ``torch.export.unflatten`` does (a tied weight, a shared module's
        second call). Objects that cannot be inputs (control-flow graphs) are attributes
        of the module using them."""
        target = self.source.lifted.get(value) or str(value.target)
        obj = self.source.attributes[target]
        local = next((name for name in map(builder.owned, self.source.aliases(target))
                      if name is not None), None)
        if local is None:
            if isinstance(obj, torch.Tensor):
                return self._input(builder, value)
            local = target.replace(".", "_")
        builder.attributes[local] = obj
        graph = builder.graph
        if builder._first_body is None:
            node = graph.get_attr(local)
        else:
            with graph.inserting_before(builder._first_body):
                node = graph.get_attr(local)
        node.meta = dict(value.meta)
        node.meta[FX_NAME] = value.name
        builder.env[value] = node
        return node

    def _copy(self, builder: _Builder, node: torch.fx.Node) -> None:
        new = builder.graph.node_copy(node, lambda v: self._lookup(builder, v))
        new.meta[FX_NAME] = node.name
        if builder._first_body is None:
            builder._first_body = new
        if node.op == "call_module":  # FX tracer leaf module, or _guards_fn
            target = str(node.target)
            local = builder.owned(target)
            local = target.replace(".", "_") if local is None else local
            new.target = local
            builder.attributes[local] = self.source.attributes[target]
        builder.env[node] = new
        builder.defined.append(node)

    # -- closing a call -----------------------------------------------------------------------

    def _open(self, parent: _Builder, frame: _Frame) -> _Builder:
        """The builder of a call made inside ``parent``'s: its attribute and place."""
        call_id, path, _ = frame
        local = path[len(parent.prefix):] if path.startswith(parent.prefix) else path
        # ``@1`` for a second call, ``#1`` for a piece; inside a call that has no place in
        # the tree (nothing else lives in its module) its calls keep their plain names
        attr = local + call_id[len(path):] if parent.location is not None else local
        located = (attr == local and parent.owned(path) == local and path not in self.located)
        if located:
            self.located.add(path)
        base, k = attr, 0
        while attr in parent.children or (
                not located and parent.location is not None and attr == local):
            k += 1  # the module's place is another call's: ``shared@1`` as unflatten names it
            attr = f"{base}@{k}"
        parent.children.add(attr)
        return _Builder(frame, parent, torch.fx.Graph(), attr, path if located else None)

    def _close(self, builder: _Builder) -> None:
        parent = builder.parent
        assert parent is not None and builder.frame is not None
        call_id, path, type_name = builder.frame
        inside = set(builder.defined)
        outputs = [n for n in builder.defined if any(u not in inside for u in n.users)]
        mapped = [builder.env[n] for n in outputs]
        builder.graph.output(mapped[0] if len(mapped) == 1 else tuple(mapped))
        sub = lazy_graph_module(builder.attributes, builder.graph, class_identifier(type_name))
        sub.module_path = path
        sub.module_type = type_name
        sub.call_id = call_id

        attr = builder.attr
        parent.attributes[attr] = sub
        args = tuple(self._lookup(parent, v) for v in builder.inputs)
        call = parent.graph.create_node("call_module", attr, args, name=_node_name(attr))
        call.meta[FX_CALL] = CallInfo(call_id, path, type_name)
        if parent._first_body is None:
            parent._first_body = call
        if len(outputs) == 1:
            parent.env[outputs[0]] = call
            call.meta["val"] = outputs[0].meta.get("val")
        else:
            call.meta["val"] = tuple(out.meta.get("val") for out in outputs)
            for i, out in enumerate(outputs):
                item = parent.graph.call_function(operator.getitem, (call, i))
                item.meta["val"] = out.meta.get("val")
                parent.env[out] = item
        # Inner nodes join the parent's membership (their users are inside it too); only
        # the outputs get values in the parent's graph.
        parent.defined.extend(builder.defined)

    def _finish_root(self, root: _Builder) -> torch.fx.GraphModule:
        gm = lazy_graph_module(root.attributes, root.graph, self.source.class_name)
        _install_state(gm, self.source.state)
        _order_as(gm, [name for name, _, _ in self.source.state])
        gm.module_path = ""
        gm.module_type = self.source.module_type
        gm.call_id = ""
        gm.meta.update(self.source.meta)
        if self.source.program is not None:
            _add_guards(gm, self.source.program)
        # Code generated now, not on first call: torch.compile cannot trace a lazy module's
        # first call (it generates its code then), and a result is compiled as it comes.
        if self.eager_code:
            generate_code(gm)
        return gm


def _install_state(root: torch.nn.Module, state: list[tuple[str, Any, str]]) -> None:
    """Register every entry at its FQN, of its kind (a ``GraphModule`` built from a dict
    makes every plain tensor a persistent buffer); containers no call stands for (a
    ``ModuleList``, a module never called) become plain ``nn.Module``\\ s."""
    for fqn, value, kind in state:
        *parents, field = fqn.split(".")
        module = root
        for part in parents:
            child = getattr(module, part, None)
            if not isinstance(child, torch.nn.Module):
                child = torch.nn.Module()
                module.add_module(part, child)
            module = child
        parameter = kind == _PARAMETER and isinstance(value, torch.nn.Parameter)
        set_member(module, field, value, parameter=parameter,
                   buffer=kind in (_PARAMETER, _BUFFER, _NON_PERSISTENT),
                   persistent=kind != _NON_PERSISTENT)


def _order_as(root: torch.nn.Module, names: list[str]) -> None:
    """Children, parameters and buffers in the order their FQNs first come in ``names``
    (the model's), so that ``state_dict()`` lists its keys as the model does; the modules
    of other calls and the guards come last."""
    rank: dict[str, int] = {}
    for name in names:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            rank.setdefault(".".join(parts[:i]), len(rank))
    last = len(rank)
    for path, module in root.named_modules(remove_duplicate=False):
        prefix = path + "." if path else ""
        sort_members(module, lambda name, prefix=prefix: rank.get(prefix + name, last))


def _add_guards(gm: torch.fx.GraphModule, program: torch.export.ExportedProgram) -> None:
    """Check the inputs as ``program.module()`` does (its ``_guards_fn``), first thing.

    A function call, not a submodule call: every ``call_module`` node of the result is a
    module of the model with a graph and ``meta["val"]``, as in ``torch.export.unflatten``'s
    (torch's own tests walk them so)."""
    generate_code(gm, recursive=False)  # the signature the guards bind inputs to
    guards = program_guards_fn(program, gm)
    if guards is None:
        return

    def check_inputs(*inputs: Any) -> None:
        guards(*inputs)

    placeholders = gm.graph.find_nodes(op="placeholder")
    with gm.graph.inserting_after(placeholders[-1]):
        node = gm.graph.call_function(check_inputs, tuple(placeholders))
    node.meta["val"] = None
    gm.recompile()


def _node_name(attr: str) -> str:
    """Generated code binds node names as locals: readable identifiers (``m_0`` for a
    digit-led attribute, ``shared_1`` for ``shared@1``), never ``self`` or a keyword."""
    name = re.sub(r"\W", "_", attr) or "module"
    if name[0].isdigit():
        name = f"m_{name}"
    return f"{name}_" if name == "self" or keyword.iskeyword(name) else name


def _fetch_attr(gm: torch.nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


# ---- the pass and the public entry point ----------------------------------------------------

class Modularize(PassBase):
    """Nested ``GraphModule`` per module call; outputs stay exactly equal.

    ``Modularize()(gm)`` reads a GraphModule whose nodes carry ``nn_module_stack``; for an
    ExportedProgram, :meth:`for_program` gives the pass (configured with the program's
    lifted weights and calling convention) and the module to call it on.
    """

    def __init__(self, source: _Source | None = None, *, eager_code: bool = True) -> None:
        self.source = source
        self.eager_code = eager_code

    @classmethod
    def for_program(cls, program: torch.export.ExportedProgram, *, eager_code: bool = True
                    ) -> tuple[Modularize, torch.fx.GraphModule]:
        from torch.export.graph_signature import InputKind

        if any(spec.kind == InputKind.TOKEN for spec in program.graph_signature.input_specs):
            # effect tokens: let torch unlift
            return cls(eager_code=eager_code), program.module()
        return cls(_Source.of_program(program), eager_code=eager_code), program.graph_module

    def requires(self, graph_module: torch.fx.GraphModule) -> None:
        if not isinstance(graph_module, torch.fx.GraphModule):
            raise PassConditionError(
                f"a torch.fx.GraphModule, got {type(graph_module).__name__}")
        if self.source is not None and graph_module.graph is not self.source.graph:
            raise PassConditionError("the graph module of the program the pass was made for")

    def ensures(self, graph_module: torch.fx.GraphModule) -> None:
        for node, sub in iter_module_calls(graph_module):
            if not (hasattr(sub, "module_path") and hasattr(sub, "module_type")):
                raise PassConditionError(f"call '{node.name}' lost its module_path/module_type")

    def call(self, graph_module: torch.fx.GraphModule, ctx: DiagnosticContext) -> PassResult:
        source = self.source or _Source.of_graph_module(graph_module)
        return PassResult(_Modularizer(source, ctx, self.eager_code).run(), modified=True)


def modularize(program: Any, ctx: DiagnosticContext | None = None, *,
               eager_code: bool = True) -> torch.fx.GraphModule:
    """Rebuild the module hierarchy of ``program`` as nested ``GraphModule``\\ s.

    ``program`` is an ``ExportedProgram`` (before or after ``run_decompositions``) or a
    ``GraphModule`` whose nodes carry ``nn_module_stack``. The result is called like
    ``program.module()``, checks its inputs as that does (the program's guards) and returns
    exactly the same values; ``state_dict()`` keys are the model's, so
    ``load_state_dict(model.state_dict(), strict=True)`` works.

    State of an ExportedProgram: buffers are copied, as ``torch.export.unflatten`` copies
    them, so running the result (a BatchNorm in training, a cache) changes neither the
    program nor another result made from it; parameters and constants are shared, not
    copied (``load_state_dict`` on the result writes into the program's parameters). A
    GraphModule's tensors are all shared with it.

    ``eager_code=False``: each GraphModule generates its Python code on its first call, not
    now (``om.export`` reads only the graphs: 2% of its time on small models, and its
    result generates the code when ``graph_module`` is first read); torch.compile cannot
    trace a lazy module's first call.
    """
    ctx = ctx if ctx is not None else DiagnosticContext()
    if isinstance(program, torch.export.ExportedProgram):
        modularize_pass, graph_module = Modularize.for_program(program, eager_code=eager_code)
    elif isinstance(program, torch.fx.GraphModule):
        modularize_pass, graph_module = Modularize(eager_code=eager_code), program
    else:
        raise fail(rule=rules.UNSUPPORTED_INPUT, reason=(
            "modularize() takes a torch.export.ExportedProgram or a torch.fx.GraphModule "
            f"carrying nn_module_stack meta, got {type(program).__name__}"))
    return modularize_pass(graph_module, ctx).graph_module


def _root_type_of(program: torch.export.ExportedProgram) -> str:
    for node in program.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            first = next(iter(stack.values()))
            if isinstance(first, tuple) and first[0] == "":
                return _type_name(first[1])
    return "torch.nn.Module"


def module_call_chains(gm: torch.fx.GraphModule) -> dict[str, tuple[CallInfo, ...]]:
    """FX node name -> the module calls containing it, outermost first (root excluded)."""
    result: dict[str, tuple[CallInfo, ...]] = {}

    def walk(module: torch.fx.GraphModule, chain: tuple[CallInfo, ...]) -> None:
        for node in module.graph.nodes:
            info = node.meta.get(FX_CALL)
            if node.op == "call_module" and info is not None:
                walk(module.get_submodule(str(node.target)), (*chain, info))
            elif node.op in ("call_function", "call_method", "call_module", "get_attr"):
                name = node.meta.get(FX_NAME)
                if name is not None and (node.op != "get_attr" or name not in result):
                    result[name] = chain

    walk(gm, ())
    return result


def iter_module_calls(
    gm: torch.fx.GraphModule,
) -> Iterator[tuple[torch.fx.Node, torch.fx.GraphModule]]:
    """Every (call_module node, sub-GraphModule) pair, depth first in execution order."""
    for node in gm.graph.nodes:
        if node.op == "call_module" and node.meta.get(FX_CALL) is not None:
            sub = gm.get_submodule(str(node.target))
            yield node, sub
            yield from iter_module_calls(sub)
