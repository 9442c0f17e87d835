"""The module call of every node of an ONNX model, read back from the model alone.

torch.onnx labels each node it writes with the modules it ran in
(``pkg.torch.onnx.name_scopes`` and ``class_hierarchy``, root first); our inliner leaves the
same labels, absolute per copy. That is the whole hierarchy, except three things a tool run
after export (a quantizer, ORT's transformers optimizer, an fp16 converter, a slimmer) or the
labels themselves leave open:

- **nodes without labels**, added or fused by the tool: one writing a tensor named after an
  FX node takes that FX node's module (tools keep the names of the tensors they rewrite);
  else each takes the module of the labelled nodes that read what it writes (a
  ``DynamicQuantizeLinear`` belongs with the ``MatMul`` it quantizes for), their lowest
  common ancestor when several modules read it (a fusion that spans modules); a node nobody
  labelled reads takes the common ancestor of its producers;
- **calls of one module** (a module run twice, in a loop): the labels name the module, not
  the call. A module's nodes that a path through other modules separates are several calls
  (``path``, ``path@1``, ...), numbered in execution order;
- **a node placed between two nodes of one call** by the rule above (a fusion reading from
  and writing to one module): it moves into that call, since a function cannot be left and
  re-entered. Labelled nodes never move: they are facts, unlabelled ones guesses.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import onnx
import onnx_ir as ir

from onnx_modular.emit.inline import RebasingInlinePass
from onnx_modular.emit.labels import RELATIVE, call_suffix, scope_of, torch_scopes
from onnx_modular.emit.walk import all_nodes
from onnx_modular.leaves._util import common_prefix
from onnx_modular.leaves.metadata import (
    CLASS_HIERARCHY,
    LABELS,
    META_CALL,
    META_PATH,
    META_SCOPE,
    META_TYPE,
    NAME_SCOPES,
    CallInfo,
)

Frame = tuple[str, str]  # (module path, qualified class)


def labelled_frames(node: ir.Node) -> tuple[Frame, ...] | None:
    """The modules torch.onnx's labels put ``node`` in, outermost first (the root module
    and the FX node left out), else those of our call labels; None where it carries none
    (or inconsistent ones)."""
    scopes, classes = torch_scopes(node.metadata_props)
    if len(scopes) >= 2 and len(scopes) == len(classes):
        return tuple(zip(scopes[1:-1], classes[1:-1], strict=True))
    chain = scope_of(node)  # a node our inliner gave its call's labels
    return tuple((p, c) for p, c in chain if p) if chain else None


def weights_next_to_readers(graph: ir.Graph) -> None:
    """Move each node computed from initializers alone (a weight's ``DequantizeLinear``, a
    ``Constant``) to just before its first reader. Tools put such nodes wherever they like
    (quantizers: all at the top); this order makes every layer's body list its nodes, and so
    its inputs, alike, whichever layer it is."""
    nodes = list(graph)
    leaf: set[ir.Node] = set()
    for node in nodes:
        if not _has_subgraph(node) and all(
                v is None or v.is_initializer() or (v.producer() in leaf)
                for v in node.inputs) and not any(v.is_graph_output() for v in node.outputs):
            leaf.add(node)
    if not leaf:
        return
    order: list[ir.Node] = []
    placed: set[ir.Node] = set()

    def place(node: ir.Node) -> None:
        for v in node.inputs:
            producer = v.producer() if v is not None else None
            if producer in leaf and producer not in placed:
                place(producer)
        placed.add(node)
        order.append(node)

    for node in nodes:
        if node not in leaf:
            place(node)
    order.extend(n for n in nodes if n not in placed)  # read by nobody: where they were
    if order == nodes:
        return
    graph.remove(nodes, safe=False)
    graph.extend(order)


def _has_subgraph(node: ir.Node) -> bool:
    return any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
               for a in node.attributes.values() if not a.is_ref())


@dataclasses.dataclass
class ScopeReport:
    """How the chains were found: counts a user can judge the result by."""

    labelled: int = 0  # nodes with torch.onnx's labels
    inferred: int = 0  # nodes placed by their neighbours
    moved: int = 0  # inferred nodes moved into a call they sat inside of
    repeated: list[str] = dataclasses.field(default_factory=list)  # modules called again


def node_chains(nodes: Sequence[ir.Node]) -> tuple[list[tuple[CallInfo, ...]], ScopeReport]:
    """Each node's module calls, outermost first (``nodes`` in topological order)."""
    report = ScopeReport()
    frames: list[tuple[Frame, ...] | None] = [labelled_frames(n) for n in nodes]
    labelled = [f is not None for f in frames]
    report.labelled = sum(labelled)
    _by_tensor_name(nodes, frames)
    index = {node: i for i, node in enumerate(nodes)}
    producers = [[index[p] for v in node.inputs if v is not None
                  and (p := v.producer()) is not None and p in index] for node in nodes]
    consumers: list[list[int]] = [[] for _ in nodes]
    for i, ps in enumerate(producers):
        for p in ps:
            consumers[p].append(i)
    outputs = set(nodes[0].graph.outputs) if nodes and nodes[0].graph is not None else set()
    ends = {i for i, node in enumerate(nodes) if any(v in outputs for v in node.outputs)}
    _infer(frames, producers, consumers, ends)
    report.inferred = len(nodes) - report.labelled
    placed = [f if f is not None else () for f in frames]
    calls = _Calls(placed, labelled, producers, consumers, report)
    return calls.run(), report


def _by_tensor_name(nodes: Sequence[ir.Node], frames: list[tuple[Frame, ...] | None]) -> None:
    """An unlabelled node writing a tensor named after an FX node that labelled nodes came
    from takes their module: tools keep the names of the tensors they rewrite the nodes of
    (quantize_dynamic's ``DequantizeLinear`` after a quantized ``Gather`` writes the
    ``Gather``'s old output)."""
    by_fx: dict[str, tuple[Frame, ...]] = {}
    for node, chain in zip(nodes, frames):
        if chain is not None:
            scopes = torch_scopes(node.metadata_props)[0]
            if scopes:
                by_fx.setdefault(scopes[-1], chain)
    if not by_fx:
        return
    for i, node in enumerate(nodes):
        if frames[i] is None:
            found = next((by_fx[v.name] for v in node.outputs if v.name in by_fx), None)
            if found is not None:
                frames[i] = found


def _infer(frames: list[tuple[Frame, ...] | None], producers: list[list[int]],
           consumers: list[list[int]], ends: set[int]) -> None:
    """Unlabelled nodes, last to first: the common module of their readers, once every
    reader is placed (a chain of new nodes follows the labelled node at its end); then,
    first to last, the common module of their producers and placed readers. ``ends``:
    nodes writing a model output (whose reader is outside any module)."""
    def common(chains: list[tuple[Frame, ...]]) -> tuple[Frame, ...]:
        result = chains[0]
        for chain in chains[1:]:
            result = common_prefix(result, chain)
        return result

    for i in reversed(range(len(frames))):
        if frames[i] is None and consumers[i] and i not in ends:
            known = [frames[c] for c in consumers[i]]
            if all(f is not None for f in known):
                frames[i] = common(known)  # type: ignore[arg-type]
    for i in range(len(frames)):
        if frames[i] is None:
            known = [frames[n] for n in (*producers[i], *consumers[i]) if frames[n] is not None]
            frames[i] = common(known) if known else ()  # type: ignore[arg-type]


class _Calls:
    """Module paths -> calls, depth by depth: each module's nodes are checked to form one
    call (no path leaves and re-enters them); where one does, an unlabelled node on it moves
    in, or, where labelled nodes separate them, they are several calls."""

    def __init__(self, frames: list[tuple[Frame, ...]], labelled: list[bool],
                 producers: list[list[int]], consumers: list[list[int]],
                 report: ScopeReport) -> None:
        self.frames, self.labelled = frames, labelled
        self.producers, self.consumers = producers, consumers
        self.report = report
        self.ids: list[list[str]] = [[] for _ in frames]  # call id per depth

    def run(self) -> list[tuple[CallInfo, ...]]:
        depth = 0
        while True:
            groups: dict[str, list[int]] = {}
            for i, chain in enumerate(self.frames):
                if len(chain) > depth:
                    suffix = call_suffix(self.ids[i][depth - 1]) if depth else ""
                    groups.setdefault(chain[depth][0] + suffix, []).append(i)
            if not groups:
                break
            for key, members in groups.items():
                self._place(key, members, depth)
            depth += 1
        return [tuple(CallInfo(call_id, path, cls) for call_id, (path, cls)
                      in zip(self.ids[i], chain, strict=True))
                for i, chain in enumerate(self.frames)]

    def _place(self, key: str, members: list[int], depth: int) -> None:
        members = [i for i in members if len(self.ids[i]) == depth]  # not moved meanwhile
        if not members:
            return
        inside = set(members)
        between = self._between(inside, members[0], members[-1])
        # an unlabelled node not placed at this depth yet (one another call at this depth
        # took in already stays there: moving it again would leave that call non-convex)
        movable = [i for i in between if not self.labelled[i] and len(self.ids[i]) <= depth]
        if between and len(movable) == len(between):
            chain, ids = self.frames[members[0]][:depth + 1], self.ids[members[0]][:depth]
            for i in movable:
                self.frames[i], self.ids[i] = chain, list(ids)
            self.report.moved += len(movable)
            members = sorted(inside | set(movable))
            between = []
        segment = self._segments(set(members), members[0], members[-1]) if between else {}
        if any(segment.values()):
            self.report.repeated.append(key)
        for i in members:
            n = segment.get(i, 0)
            self.ids[i][depth:] = [key + (f"@{n}" if n else "")]

    def _between(self, inside: set[int], first: int, last: int) -> list[int]:
        """Nodes outside ``inside`` on a path from one of its nodes to another."""
        after: set[int] = set()  # reached from inside, going forward
        for i in range(first, last + 1):
            if i not in inside and any(p in inside or p in after for p in self.producers[i]):
                after.add(i)
        if not after:
            return []
        before: set[int] = set()  # reaching inside, going backward
        for i in range(last, first - 1, -1):
            if i in after and any(c in inside or c in before for c in self.consumers[i]
                                  if c <= last):
                before.add(i)
        return sorted(before)

    def _segments(self, inside: set[int], first: int, last: int) -> dict[int, int]:
        """Each member's call number: one more than the highest call any path from a
        member through other nodes reaches it from."""
        segment: dict[int, int] = {}
        reached: dict[int, int] = {}  # outside nodes: the highest call that reaches them
        for i in range(first, last + 1):
            own = [segment[p] for p in self.producers[i] if p in segment]
            through = [reached[p] for p in self.producers[i] if p in reached]
            if i in inside:
                segment[i] = max([*own, *(t + 1 for t in through), 0])
            elif own or through:
                reached[i] = max([*own, *through])
        return segment


def labels_by_tensor_name(nodes: Sequence[ir.Node], reference: onnx.ModelProto) -> int | None:
    """Give each unlabelled node the labels of the ``reference`` node that wrote a tensor
    of the same name (tools rewrite nodes but keep their tensors' names: the version
    converter, onnxsim and ORT's optimized-model file drop every label but keep them).
    Returns how many nodes got labels; None when the reference carries none."""
    labels: dict[str, dict[str, str]] = {}
    for node in reference.graph.node:
        meta = {p.key: p.value for p in node.metadata_props
                if p.key in (NAME_SCOPES, CLASS_HIERARCHY)}
        if len(meta) == 2:
            for name in node.output:
                labels.setdefault(name, meta)
    if not labels:
        return None
    carried = 0
    for node in nodes:
        if NAME_SCOPES in node.metadata_props:
            continue
        meta = next((labels[v.name] for v in node.outputs if v.name in labels), None)
        if meta is not None:
            node.metadata_props.update(meta)
            carried += 1
    return carried


def inline_labelled(model: ir.Model) -> None:
    """Inline the functions a model already holds, every copy labelled with its call. A
    tool that stripped the labels (onnxslim: of call nodes and functions alike) usually kept
    a call node's name, the call id outlining gave it, and a function's doc string, its
    class: the labels are taken back from them."""
    for node in all_nodes(model):  # in a body a call's name is relative
        function = model.functions.get(node.op_identifier())
        if function is None or META_PATH in node.metadata_props or not node.name:
            continue
        if function.metadata_props.get(LABELS) is None and "." in (function.doc_string or ""):
            function.metadata_props[LABELS] = RELATIVE  # ours (a class in its doc), stripped
        if function.metadata_props.get(LABELS) is not None:
            meta = node.metadata_props
            meta[META_CALL] = node.name
            meta[META_PATH] = node.name.split("@", 1)[0]
            meta[META_TYPE] = function.doc_string or function.name
            frame = [meta[META_PATH], meta[META_TYPE]]  # in a body: relative, as ours are
            meta[META_SCOPE] = json.dumps([["", ""], frame] if node.graph is model.graph
                                          else [frame])
    RebasingInlinePass()(model)
    model.functions.clear()
