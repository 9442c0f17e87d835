"""Split: partition a flat FX graph into alternating accelerator and CPU regions.

Behaviour follows torch.fx's ``splitter_base`` (acc nodes that exchange non-tensor values with
CPU nodes fall back to CPU unless ``allow_non_tensor``; nodes linked by non-tensor values form
fusion groups that stay in one region unless ``skip_fusion``; regions grow greedily in
dependency order, alternating kinds; acc regions below ``min_acc_module_size`` nodes merge into
CPU; ``max_acc_splits`` caps the number of regions, acc and CPU alike, as splitter_base counts
them). Deliberate differences: a node making several tensors (``native_layer_norm``, ``max.dim``,
``split``) counts as non-tensor for fusion too, so with ``allow_non_tensor`` an acc producer still
keeps its getitems (splitter_base reads ``tensor_meta`` there, which ShapeProp sets for tuples);
fusion groups that feed each other merge where splitter_base fails; the limit error names the
counts. The algorithms are written for size:
one worklist for the non-tensor fallback, union-find for fusion groups and Tarjan's strongly
connected components for their closure, Kahn's algorithm with a heap per kind for the grouping,
so the pass is O(n log n) in nodes and edges.

Two passes, run by a :class:`PassManager`: :class:`PlanRegions` decides the plan
(:class:`SplitPlan`) and records it on the flat module; :class:`CutRegions` (shared with the
stages' planner) builds a GraphModule whose top graph calls one sub-GraphModule per region
(``_run_on_acc_0``, ``_run_on_cpu_1``, ...). :class:`SplitPass` runs the two as one call.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import heapq
import itertools
import operator
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import optimization_hint

from onnx_modular.diagnostics import DiagnosticContext, Location
from onnx_modular.leaves._compat import codegen_of, lazy_graph_module, returns_nothing, set_codegen
from onnx_modular.leaves.errors import fail, rules
from onnx_modular.leaves.metadata import FX_SPLIT_PLAN
from onnx_modular.passes.infra import PassBase, PassConditionError, PassManager, PassResult
from onnx_modular.support.matching import entry_findings
from onnx_modular.support.operator_support import (
    CALLABLE_OPS,
    OperatorSupport,
    SupportContext,
    SupportSpec,
    node_op_name,
    resolve_support,
)

ACC_PREFIX = "_run_on_acc_"
CPU_PREFIX = "_run_on_cpu_"


@dataclasses.dataclass
class Region:
    """One region: its FX nodes (graph order) and the values crossing its border."""

    name: str
    is_acc: bool
    node_names: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    input_bytes: int = 0
    output_bytes: int = 0

    @property
    def kind(self) -> str:
        return "acc" if self.is_acc else "cpu"


@dataclasses.dataclass
class SplitPlan:
    """What the pass decided, and the numbers the previews show."""

    regions: list[Region]
    supported_ops: dict[str, int] = dataclasses.field(default_factory=dict)
    unsupported_ops: dict[str, int] = dataclasses.field(default_factory=dict)
    #: supported node -> why it still runs on CPU
    fallback_nodes: dict[str, str] = dataclasses.field(default_factory=dict)
    #: (acc, cpu) regions before small acc regions merged
    regions_before_merge: tuple[int, int] = (0, 0)
    #: (op, supported) -> why, as the support said it (the most frequent reason)
    reasons: dict[tuple[str, bool], str] = dataclasses.field(default_factory=dict)
    #: nodes the support refused (fallback nodes are supported, so not here)
    unsupported_nodes: tuple[str, ...] = ()

    def region_of(self) -> dict[str, str]:
        """FX node name -> region name."""
        return {n: r.name for r in self.regions for n in r.node_names}


def is_tensor_node(node: torch.fx.Node) -> bool:
    """Does the node make one tensor? Read from ``val`` (export), else ``type`` / ``tensor_meta``
    (ShapeProp: an int result has a ``type`` but no ``tensor_meta``, so ``type`` decides, as
    splitter_base's ``is_node_output_tensor`` does), else the op schema (an op that returns
    nothing, like ``_assert_tensor_metadata``, has no ``val``); a node with none of these (a
    hand-traced graph) counts as a tensor."""
    if "val" in node.meta:
        return isinstance(node.meta["val"], torch.Tensor)
    kind = node.meta.get("type")
    if isinstance(kind, type):
        return issubclass(kind, torch.Tensor)
    if "tensor_meta" in node.meta:
        meta = node.meta["tensor_meta"]
        return meta is not None and not isinstance(meta, (list, tuple, dict))
    if returns_nothing(node.target):
        return False
    return node.op != "output"


def value_bytes(node: torch.fx.Node) -> int:
    """Bytes of the node's value from its fake tensor(s); 0 when unknown.

    A symbolic size counts at its example value, read as a hint: ``int()`` of it would add a
    guard to the program's ShapeEnv (shared with the caller's ExportedProgram), pinning the
    dynamic dim to the example size in every later export of that program.
    """
    def size(v: Any) -> int:
        if isinstance(v, torch.Tensor):
            try:
                return optimization_hint(v.numel(), fallback=0) * v.element_size()
            except Exception:  # a size with no hint
                return 0
        if isinstance(v, (list, tuple)):
            return sum(size(x) for x in v)
        return 0

    return size(node.meta.get("val"))


def is_guard(node: torch.fx.Node) -> bool:
    """``ep.module()`` adds a ``_guards_fn`` call that checks inputs; it stays at top level."""
    return node.op == "call_module" and str(node.target).startswith("_guards_fn")


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[torch.fx.Node, torch.fx.Node] = {}

    def find(self, x: torch.fx.Node) -> torch.fx.Node:
        root = x
        while self.parent.get(root, root) is not root:
            root = self.parent[root]
        while x is not root:
            self.parent[x], x = root, self.parent.get(x, x)
        return root

    def union(self, a: torch.fx.Node, b: torch.fx.Node) -> torch.fx.Node:
        ra, rb = self.find(a), self.find(b)
        if ra is not rb:
            self.parent[rb] = ra
        return ra


# ---- planning --------------------------------------------------------------------------------

def _non_tensor_fallback(callables: list[torch.fx.Node], acc: set[torch.fx.Node],
                         fallback: dict[str, str]) -> None:
    """Move to CPU every acc node that would pass a non-tensor value to or from a CPU node."""
    work: collections.deque[torch.fx.Node] = collections.deque()
    for n in callables:
        if n not in acc:
            work.append(n)
        elif not is_tensor_node(n) and any(u.op == "output" for u in n.users):
            acc.discard(n)
            fallback[n.name] = "non-tensor output of the graph"
            work.append(n)
    while work:
        n = work.popleft()
        if not is_tensor_node(n):
            for u in n.users:
                if u in acc:
                    acc.discard(u)
                    fallback[u.name] = f"non-tensor input from CPU node '{n.name}'"
                    work.append(u)
        for a in n.all_input_nodes:
            if a in acc and not is_tensor_node(a):
                acc.discard(a)
                fallback[a.name] = f"non-tensor output to CPU node '{n.name}'"
                work.append(a)


def _strong_components(adjacency: list[list[int]]) -> list[list[int]]:
    """Tarjan's algorithm without recursion (graphs of many thousand nodes exceed its limit)."""
    order = [-1] * len(adjacency)
    low = [0] * len(adjacency)
    on_stack = [False] * len(adjacency)
    stack: list[int] = []
    result: list[list[int]] = []
    counter = 0
    for start in range(len(adjacency)):
        if order[start] != -1:
            continue
        order[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack[start] = True
        work = [(start, 0)]
        while work:
            v, i = work[-1]
            if i < len(adjacency[v]):
                work[-1] = (v, i + 1)
                w = adjacency[v][i]
                if order[w] == -1:
                    order[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack[w] = True
                    work.append((w, 0))
                elif on_stack[w]:
                    low[v] = min(low[v], order[w])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == order[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    component.append(w)
                    if w == v:
                        break
                result.append(component)
    return result


def _non_tensor_links(callables: list[torch.fx.Node], position: dict[torch.fx.Node, int]
                      ) -> tuple[_UnionFind, set[torch.fx.Node]]:
    """Each node that makes a non-tensor value joined with its users among ``callables``,
    and the nodes so joined."""
    uf = _UnionFind()
    grouped: set[torch.fx.Node] = set()
    for n in callables:
        if not is_tensor_node(n):
            for u in n.users:
                if u in position:
                    uf.union(n, u)
                    grouped.update((n, u))
    return uf, grouped


def _fusion_groups(callables: list[torch.fx.Node], index: dict[torch.fx.Node, int],
                   acc: set[torch.fx.Node]) -> list[list[torch.fx.Node]]:
    """Groups of nodes linked by non-tensor values, closed under paths between members.

    As in splitter_base, a group grows only from an acc node that makes a non-tensor value; a
    component of non-tensor links with no such node (e.g. CPU ``sym_size`` feeding views all
    over the graph) is no group, so its closure never drags acc nodes to CPU. The closure is
    the strongly connected component of the group once contracted to one vertex (the nodes on a
    path from the group back into it), found for all groups at once in linear time; a component
    it crosses joins whole, then the closure is taken again. Two groups that feed each other
    also end up in one strongly connected component and merge (splitter_base deadlocks there:
    "Subgraph can't be empty")."""
    position = {n: i for i, n in enumerate(callables)}
    uf, grouped = _non_tensor_links(callables, position)
    members: dict[torch.fx.Node, set[torch.fx.Node]] = {}
    for n in grouped:
        members.setdefault(uf.find(n), set()).add(n)
    seeded = {uf.find(n) for n in grouped if n in acc and not is_tensor_node(n)}

    size = len(callables)
    users = [[position[u] for u in n.users if u in position] for n in callables]
    while True:
        roots = sorted(seeded, key=lambda r: min(index[m] for m in members[r]))
        adjacency = [list(out) for out in users] + [[] for _ in roots]
        for hub, root in enumerate(roots, start=size):
            for m in members[root]:
                adjacency[position[m]].append(hub)
                adjacency[hub].append(position[m])
        grew = False
        for component in _strong_components(adjacency):
            hubs = [roots[v - size] for v in component if v >= size]
            if not hubs or (len(hubs) == 1 and len(component) == 1 + len(members[hubs[0]])):
                continue  # no group, or one group that is closed already
            merged: set[torch.fx.Node] = set()
            for root in hubs:
                merged |= members.pop(root)
                seeded.discard(root)
            for v in component:
                node = callables[v] if v < size else None
                if node is None or node in merged:
                    continue
                if node in grouped and uf.find(node) in members:  # an unseeded component
                    merged |= members.pop(uf.find(node))
                    grew = True
                merged.add(node)
            first = next(iter(merged))
            for n in merged:
                uf.union(first, n)
            grouped |= merged
            root = uf.find(first)
            members[root] = merged
            seeded.add(root)
        if not grew:
            break
    groups = [sorted(members[r], key=index.__getitem__) for r in seeded]
    return sorted(groups, key=lambda g: index[g[0]])


def _group_regions(callables: list[torch.fx.Node], acc: set[torch.fx.Node],
                   unit_of: dict[torch.fx.Node, int], units: list[list[torch.fx.Node]]
                   ) -> list[tuple[bool, list[torch.fx.Node]]]:
    """Kahn's algorithm over units, taking ready units of the current kind until none is left."""
    callable_set = set(callables)
    n_units = len(units)
    indegree = [0] * n_units
    successors: list[set[int]] = [set() for _ in range(n_units)]
    for u_id, unit in enumerate(units):
        for n in unit:
            for user in n.users:
                if user in callable_set:
                    v_id = unit_of[user]
                    if v_id != u_id and v_id not in successors[u_id]:
                        successors[u_id].add(v_id)
                        indegree[v_id] += 1
    is_acc = [units[i][0] in acc for i in range(n_units)]
    ready: dict[bool, list[int]] = {True: [], False: []}
    for i in range(n_units):  # unit ids follow graph order, so ids are the heap keys
        if indegree[i] == 0:
            heapq.heappush(ready[is_acc[i]], i)
    kind = not ready[False]  # start on CPU when a CPU node is ready, as splitter_base does
    regions: list[tuple[bool, list[torch.fx.Node]]] = []
    current: list[torch.fx.Node] = []
    while ready[True] or ready[False]:
        if not ready[kind]:
            if current:
                regions.append((kind, current))
                current = []
            kind = not kind
            continue
        u_id = heapq.heappop(ready[kind])
        current.extend(units[u_id])
        for v_id in successors[u_id]:
            indegree[v_id] -= 1
            if indegree[v_id] == 0:
                heapq.heappush(ready[is_acc[v_id]], v_id)
    if current:
        regions.append((kind, current))
    left = [units[i][0].name for i in range(n_units) if indegree[i] > 0]
    if left:  # a cycle among units would drop these nodes from every region
        raise PassConditionError(f"every operator in a region ({len(left)} left over, "
                                 f"first '{left[0]}': fusion groups depend on each other)")
    return regions


def _merge_small_acc(regions: list[tuple[bool, list[torch.fx.Node]]], min_size: int
                     ) -> list[tuple[bool, list[torch.fx.Node]]]:
    """Acc regions under ``min_size`` nodes join the CPU region before them (or become CPU)."""
    result: list[tuple[bool, list[torch.fx.Node]]] = []
    for is_acc, nodes in regions:
        if is_acc and len(nodes) < min_size:
            is_acc = False
        if result and result[-1][0] == is_acc:
            result[-1][1].extend(nodes)
        else:
            result.append((is_acc, list(nodes)))
    return result


@dataclasses.dataclass(frozen=True)
class SplitLimits:
    """How the acc/CPU split may cut, as ``om.split`` was asked (splitter_base's options):
    acc regions of fewer than ``min_acc_module_size`` nodes go to the CPU, more than
    ``max_acc_splits`` regions (acc and CPU; -1: no cap) is an error, non-tensor values
    may cross a region boundary only with ``allow_non_tensor``, and ``skip_fusion`` keeps
    the fusion groups from pulling nodes into one region."""

    min_acc_module_size: int = 1
    max_acc_splits: int = -1
    allow_non_tensor: bool = False
    skip_fusion: bool = False

    @classmethod
    def checked(cls, min_acc_module_size: int = 1, max_acc_splits: int = -1,
                allow_non_tensor: bool = False, skip_fusion: bool = False) -> SplitLimits:
        """The limits, once :func:`check_limits` has accepted them (one line, before any
        work)."""
        check_limits(min_acc_module_size, max_acc_splits)
        return cls(min_acc_module_size, max_acc_splits, allow_non_tensor, skip_fusion)


def plan_split(graph_module: torch.fx.GraphModule, support: OperatorSupport, *,
               context: SupportContext | None = None,
               limits: SplitLimits = SplitLimits()) -> SplitPlan:
    """Decide the regions of ``graph_module`` (no graph is changed)."""
    min_acc_module_size = limits.min_acc_module_size
    allow_non_tensor, skip_fusion = limits.allow_non_tensor, limits.skip_fusion
    nodes = list(graph_module.graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    callables = [n for n in nodes if n.op in CALLABLE_OPS and not is_guard(n)]
    supported_ops: collections.Counter[str] = collections.Counter()
    unsupported_ops: collections.Counter[str] = collections.Counter()
    why: dict[tuple[str, bool], collections.Counter[str]] = {}
    acc: set[torch.fx.Node] = set()
    for n in callables:
        ok, reason = support.explain(n, context)
        op = node_op_name(n)
        why.setdefault((op, ok), collections.Counter())[reason] += 1
        if ok:
            acc.add(n)
            supported_ops[op] += 1
        else:
            unsupported_ops[op] += 1
    reasons = {key: counts.most_common(1)[0][0] for key, counts in why.items()}
    unsupported = tuple(n.name for n in callables if n not in acc)
    fallback: dict[str, str] = {}
    if not allow_non_tensor:
        _non_tensor_fallback(callables, acc, fallback)

    groups = [] if skip_fusion else _fusion_groups(callables, index, acc)
    unit_of: dict[torch.fx.Node, int] = {}
    grouped: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for g in groups:
        culprit = next((m for m in g if m not in acc), None)
        if culprit is not None:
            # splitter_base drops such a group: all its nodes go to CPU, each on its own.
            for m in g:
                if m in acc:
                    acc.discard(m)
                    fallback[m.name] = f"fusion group with CPU node '{culprit.name}'"
            continue
        for m in g:
            grouped[m] = g
    units: list[list[torch.fx.Node]] = []
    for n in callables:
        if n in unit_of:
            continue
        members = grouped.get(n, [n])
        for m in members:
            unit_of[m] = len(units)
        units.append(members)

    raw = _group_regions(callables, acc, unit_of, units)
    before = (sum(1 for a, _ in raw if a), sum(1 for a, _ in raw if not a))
    merged = _merge_small_acc(raw, min_acc_module_size)
    regions = describe_regions(merged, index)
    return SplitPlan(regions, dict(supported_ops), dict(unsupported_ops), fallback, before,
                     reasons, unsupported)


def describe_regions(merged: list[tuple[bool, list[torch.fx.Node]]],
                      index: dict[torch.fx.Node, int]) -> list[Region]:
    region_of: dict[torch.fx.Node, int] = {}
    for r, (_, ns) in enumerate(merged):
        for n in ns:
            region_of[n] = r
    plans = []
    for r, (is_acc, ns) in enumerate(merged):
        ns = sorted(ns, key=index.__getitem__)
        inputs: dict[torch.fx.Node, None] = {}
        outputs: list[torch.fx.Node] = []
        for n in ns:
            for a in n.all_input_nodes:
                if region_of.get(a) != r and a.op != "get_attr":
                    inputs.setdefault(a, None)
            if any(region_of.get(u) != r for u in n.users):
                outputs.append(n)
        name = f"{ACC_PREFIX if is_acc else CPU_PREFIX}{r}"
        plans.append(Region(
            name, is_acc, tuple(n.name for n in ns), tuple(a.name for a in inputs),
            tuple(o.name for o in outputs), sum(value_bytes(a) for a in inputs),
            sum(value_bytes(o) for o in outputs)))
    return plans


# ---- building the split module ---------------------------------------------------------------

def _fetch_attr(module: torch.nn.Module, target: str) -> Any:
    obj: Any = module
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def build_split_module(graph_module: torch.fx.GraphModule, plan: SplitPlan
                       ) -> torch.fx.GraphModule:
    """A top graph calling one sub-GraphModule per region; parameters live where used."""
    by_name = {n.name: n for n in graph_module.graph.nodes}
    top = torch.fx.Graph()
    set_codegen(top, codegen_of(graph_module.graph))  # same pytree calling convention
    root: dict[str, Any] = {}
    env: dict[torch.fx.Node, torch.fx.Node] = {}

    def top_arg(a: torch.fx.Node) -> torch.fx.Node:
        if a not in env and a.op == "get_attr":
            env[a] = top.node_copy(a)
            root[str(a.target)] = _fetch_attr(graph_module, str(a.target))
        return env[a]

    for n in graph_module.graph.nodes:
        if n.op == "placeholder":
            env[n] = top.node_copy(n)
        elif is_guard(n):
            env[n] = top.node_copy(n, top_arg)
            root[str(n.target)] = _fetch_attr(graph_module, str(n.target))

    for region in plan.regions:
        sub = torch.fx.Graph()
        sub_root: dict[str, Any] = {}
        sub_env: dict[torch.fx.Node, torch.fx.Node] = {}
        for name in region.inputs:
            src = by_name[name]
            ph = sub.placeholder(name)
            ph.meta = dict(src.meta)
            sub_env[src] = ph

        def sub_arg(a: torch.fx.Node, sub_env: dict = sub_env, sub: torch.fx.Graph = sub,
                    sub_root: dict = sub_root) -> torch.fx.Node:
            if a not in sub_env and a.op == "get_attr":
                sub_env[a] = sub.node_copy(a)
                sub_root[str(a.target)] = _fetch_attr(graph_module, str(a.target))
            return sub_env[a]

        for name in region.node_names:
            node = by_name[name]
            sub_env[node] = sub.node_copy(node, sub_arg)
        sub.output(tuple(sub_env[by_name[o]] for o in region.outputs))
        root[region.name] = lazy_graph_module(sub_root, sub, region.name)
        call = top.call_module(region.name, tuple(top_arg(by_name[i]) for i in region.inputs))
        for k, o in enumerate(region.outputs):
            item = top.create_node("call_function", operator.getitem, (call, k), name=o)
            item.meta = dict(by_name[o].meta)
            env[by_name[o]] = item

    for n in graph_module.graph.nodes:
        if n.op == "output":
            top.node_copy(n, top_arg)
    return lazy_graph_module(root, top, "SplitModule")


# ---- the passes: a planner, then CutRegions -------------------------------------------------

@dataclasses.dataclass
class SplitPassResult(PassResult):
    plan: SplitPlan | None = None


def check_limits(min_acc_module_size: object, max_acc_splits: object) -> None:
    """One line before any work for limits that would otherwise pass silently: a negative
    minimum size means no minimum, and ``max_acc_splits`` below 1 other than -1 (no
    limit) would disable the cap the caller asked for."""
    for name, value in (("min_acc_module_size", min_acc_module_size),
                        ("max_acc_splits", max_acc_splits)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail(f"{name} must be an int, got {type(value).__name__} {value!r:.40}")
    if min_acc_module_size < 0:
        raise fail(f"min_acc_module_size must be >= 0 (acc regions of fewer nodes go to the "
                   f"CPU), got {min_acc_module_size}")
    if max_acc_splits != -1 and max_acc_splits < 1:
        raise fail(f"max_acc_splits must be -1 (no limit) or a count >= 1, "
                   f"got {max_acc_splits}")


def recorded_plan(graph_module: torch.fx.GraphModule) -> SplitPlan | None:
    """The plan a planner recorded on ``graph_module`` (or that a cut module was cut by)."""
    plan = graph_module.meta.get(FX_SPLIT_PLAN)
    return plan if isinstance(plan, SplitPlan) else None


def _operators(graph_module: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The nodes a plan places: every callable node but the input guards."""
    return [n for n in graph_module.graph.nodes if n.op in CALLABLE_OPS and not is_guard(n)]


def _uncovered(graph_module: torch.fx.GraphModule, plan: SplitPlan) -> str | None:
    """Why ``plan`` does not put each operator of the module in exactly one region, if so."""
    region_of: dict[str, str] = {}
    for region in plan.regions:
        for name in region.node_names:
            if name in region_of:
                return f"'{name}' is in {region_of[name]} and {region.name}"
            region_of[name] = region.name
    operators = [n.name for n in _operators(graph_module)]
    missing = [name for name in operators if name not in region_of]
    if missing:
        return f"'{missing[0]}' is in no region ({len(missing)} operator(s) left out)"
    unknown = sorted(set(region_of) - set(operators))
    if unknown:
        return f"'{unknown[0]}' of {region_of[unknown[0]]} is no operator of the module"
    return None


class PlanPass(PassBase):
    """A planner: an analysis of a flat module that decides its regions and records the
    :class:`SplitPlan` on it (``graph_module.meta[FX_SPLIT_PLAN]``) for :class:`CutRegions`;
    the graph is not changed. Subclasses implement :meth:`plan`."""

    #: what the flat-graph precondition adds to say how to get one
    flat_hint = ""

    def requires(self, graph_module: torch.fx.GraphModule) -> None:
        operators = _operators(graph_module)
        if not operators:  # e.g. every operator folded away in decomposition
            raise PassConditionError("a graph with at least one operator (nothing to split)")
        if any(n.op == "call_module" for n in operators):
            raise PassConditionError(f"a flat graph (no call_module nodes){self.flat_hint}")

    def ensures(self, graph_module: torch.fx.GraphModule) -> None:
        plan = recorded_plan(graph_module)
        if plan is None:
            raise PassConditionError("a plan recorded on the module")
        why = _uncovered(graph_module, plan)
        if why:
            raise PassConditionError(f"every operator in exactly one region ({why})")

    @abc.abstractmethod
    def plan(self, graph_module: torch.fx.GraphModule, ctx: DiagnosticContext) -> SplitPlan:
        """Decide the regions; report the findings to ``ctx``."""

    def call(self, graph_module: torch.fx.GraphModule, ctx: DiagnosticContext) -> PassResult:
        plan = self.plan(graph_module, ctx)
        graph_module.meta[FX_SPLIT_PLAN] = plan
        return SplitPassResult(graph_module, False, plan)


class PlanRegions(PlanPass):
    """Plan alternating acc/CPU regions with ``support`` (:func:`plan_split`): the previews
    as notes, allow/deny entries that match nothing as warnings, ``max_acc_splits`` held."""

    flat_hint = "; split the program before modularizing it"

    def __init__(self, support: SupportSpec, *, context: SupportContext | None = None,
                 limits: SplitLimits = SplitLimits()) -> None:
        self.support = resolve_support(support)
        self.context = context
        self.limits = limits

    @property
    def name(self) -> str:
        """The step's name in diagnostics and SARIF, as before the cut was a pass of its own."""
        return "SplitPass"

    def requires(self, graph_module: torch.fx.GraphModule) -> None:
        for name, value in (("min_acc_module_size", self.limits.min_acc_module_size),
                            ("max_acc_splits", self.limits.max_acc_splits)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise PassConditionError(f"{name} must be an int, got {value!r}")
        super().requires(graph_module)

    def plan(self, graph_module: torch.fx.GraphModule, ctx: DiagnosticContext) -> SplitPlan:
        plan = plan_split(graph_module, self.support, context=self.context, limits=self.limits)
        report_plan(plan, ctx, graph_module)
        self._check_entries(graph_module, plan, ctx)
        n_acc = sum(r.is_acc for r in plan.regions)
        max_acc_splits = self.limits.max_acc_splits
        if 0 < max_acc_splits < len(plan.regions):
            raise fail(rule=rules.SPLIT_LIMIT, reason=(
                f"the split needs {len(plan.regions)} regions ({n_acc} acc, "
                f"{len(plan.regions) - n_acc} cpu), more than max_acc_splits="
                f"{max_acc_splits}; allow more splits, support more ops, or raise "
                "min_acc_module_size to merge small acc regions into CPU"))
        return plan

    def _check_entries(self, graph_module: torch.fx.GraphModule, plan: SplitPlan,
                       ctx: DiagnosticContext) -> None:
        """Allow/deny entries that match nothing (or miss where the op hides): warnings."""
        nodes = _operators(graph_module)
        acc_names = {name for r in plan.regions if r.is_acc for name in r.node_names}
        on_acc = {n for n in nodes if n.name in acc_names}
        for finding in entry_findings(self.support, nodes, self.context, on_acc):
            log = ctx.warn if finding.warning else ctx.note
            log(rules.SUPPORT_UNMATCHED, reason=finding.message)


class CutRegions(PassBase):
    """Cut a flat module along the plan a planner recorded on it (:func:`build_split_module`);
    one cut for acc/CPU regions and stages alike. The cut module carries the plan too."""

    def requires(self, graph_module: torch.fx.GraphModule) -> None:
        plan = recorded_plan(graph_module)
        if plan is None:
            raise PassConditionError("a plan recorded on the module (run a planner first: "
                                     "PlanRegions or PlanStages)")
        if any(n.op == "call_module" for n in _operators(graph_module)):
            raise PassConditionError("a flat graph (no call_module nodes)")
        why = _uncovered(graph_module, plan)
        if why:
            raise PassConditionError(f"a plan of the module's operators ({why})")

    def ensures(self, graph_module: torch.fx.GraphModule) -> None:
        plan = recorded_plan(graph_module)
        if plan is None:
            raise PassConditionError("the plan recorded on the cut module")
        calls = [str(n.target) for n in graph_module.graph.nodes
                 if n.op == "call_module" and not is_guard(n)]
        if calls != [r.name for r in plan.regions]:
            raise PassConditionError(f"regions called once each, in order (got {calls})")
        for a, b in itertools.pairwise(plan.regions):
            if a.kind == b.kind and a.kind != "stage":
                raise PassConditionError(f"alternating regions ({a.name} and {b.name} "
                                         "are of one kind)")
        for name in calls:
            sub = getattr(graph_module, name)
            if not any(m.op in CALLABLE_OPS for m in sub.graph.nodes):
                raise PassConditionError(f"no empty region ({name} is empty)")

    def call(self, graph_module: torch.fx.GraphModule, ctx: DiagnosticContext) -> PassResult:
        plan = recorded_plan(graph_module)
        assert plan is not None  # required
        cut = build_split_module(graph_module, plan)
        cut.meta[FX_SPLIT_PLAN] = plan
        return SplitPassResult(cut, True, plan)


class Partition:
    """A planner, then :class:`CutRegions`, run by a :class:`PassManager` (each in its scope,
    checked after), called as one pass: ``(module, ctx) -> SplitPassResult``."""

    def __init__(self, planner: PlanPass) -> None:
        self.planner = planner

    def __call__(self, graph_module: torch.fx.GraphModule,
                 ctx: DiagnosticContext | None = None) -> SplitPassResult:
        steps = PassManager([self.planner, CutRegions()], ctx)(graph_module)
        return steps.of(SplitPassResult)


class SplitPass(Partition):
    """Acc/CPU regions: :class:`PlanRegions` (same arguments), then :class:`CutRegions`."""

    def __init__(self, support: SupportSpec, *, context: SupportContext | None = None,
                 limits: SplitLimits = SplitLimits()) -> None:
        super().__init__(PlanRegions(support, context=context, limits=limits))


def report_plan(plan: SplitPlan, ctx: DiagnosticContext,
                graph_module: torch.fx.GraphModule | None = None) -> None:
    """The support and split previews, as notes."""
    def top(counter: dict[str, int]) -> str:
        items = sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))
        return ", ".join(f"{k} x{v}" for k, v in items) or "none"

    n_sup, n_uns = sum(plan.supported_ops.values()), sum(plan.unsupported_ops.values())
    ctx.note(rules.SUPPORT_PREVIEW, reason=(
        f"{n_sup} of {n_sup + n_uns} node(s) supported; supported: {top(plan.supported_ops)}; "
        f"unsupported: {top(plan.unsupported_ops)}"))
    if plan.fallback_nodes:
        by_name = {n.name: n for n in graph_module.graph.nodes} if graph_module else {}
        for name, why in plan.fallback_nodes.items():
            node = by_name.get(name)
            ctx.note(rules.SUPPORT_PREVIEW, Location.of_node(node) if node is not None
                     else Location(fx_node=name), reason=f"supported node runs on CPU: {why}")
    acc_before, cpu_before = plan.regions_before_merge
    n_acc = sum(r.is_acc for r in plan.regions)
    ctx.note(rules.SPLIT_PREVIEW, reason=(
        f"{acc_before + cpu_before} region(s) ({acc_before} acc, {cpu_before} cpu) before "
        f"merging small acc regions, {len(plan.regions)} ({n_acc} acc, "
        f"{len(plan.regions) - n_acc} cpu) after"))
    for r in plan.regions:
        note_region(r, ctx)


def note_region(region: Region, ctx: DiagnosticContext) -> None:
    """One region's (or stage's) preview line: nodes, and the bytes crossing its border."""
    ctx.note(rules.SPLIT_PREVIEW, reason=(
        f"{region.name}: {len(region.node_names)} node(s), {len(region.inputs)} input(s) "
        f"({region.input_bytes} bytes), {len(region.outputs)} output(s) "
        f"({region.output_bytes} bytes)"))
