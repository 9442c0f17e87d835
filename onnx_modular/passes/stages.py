"""Pipeline stages: where the graph is cut, as a partition id for every FX node.

Three ways to say it, as in PiPPy and ``split_module``:

- ``pipe_split()`` markers inside ``forward`` (a registered no-op that ``torch.export`` keeps),
- ``split_points={"h.4": "beginning", "h.9": "end"}`` at module boundaries,
- a ``node -> int`` callback.

The result is a :class:`StageAssignment` on the captured (not yet decomposed) program;
:func:`decomposed_assignment` carries it to the decomposed nodes through their ``from_node``
provenance, :class:`PlanStages` makes it the plan of the decomposed program's module, and
the split's :class:`~onnx_modular.passes.split.CutRegions` cuts it (``StagesPass``: both).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.fx

from onnx_modular.diagnostics import DiagnosticContext, Location
from onnx_modular.leaves.errors import fail, rules
from onnx_modular.lower.markers import is_marker
from onnx_modular.passes.infra import PassConditionError
from onnx_modular.passes.split import (
    Partition,
    PlanPass,
    Region,
    SplitPlan,
    describe_regions,
    is_guard,
    note_region,
    recorded_plan,
)
from onnx_modular.support.operator_support import CALLABLE_OPS

STAGE_PREFIX = "stage_"

@dataclasses.dataclass
class StageAssignment:
    """FX node name -> stage index (0-based, in execution order) for every compute node."""

    stage_of: dict[str, int]
    count: int
    how: str  # "markers", "split_points" or "callback", for reports

    def nodes_of(self, stage: int) -> list[str]:
        return [n for n, s in self.stage_of.items() if s == stage]


def _compute_nodes(graph: torch.fx.Graph, markers: bool = False) -> list[torch.fx.Node]:
    return [n for n in graph.nodes if n.op in ("call_function", "call_method", "call_module")
            and (markers or not is_marker(n))]


def has_operators(ep: torch.export.ExportedProgram) -> bool:
    """Does the program compute anything (a marker is no operator)? Nothing to cut else."""
    return bool(_compute_nodes(ep.graph))


def _paths_of(node: torch.fx.Node) -> set[str]:
    stack = node.meta.get("nn_module_stack") or {}
    return {str(v[0]) if isinstance(v, tuple) else str(k) for k, v in stack.items()}


def from_markers(ep: torch.export.ExportedProgram) -> StageAssignment:
    """Stage k holds the nodes after the k-th ``pipe_split()`` marker."""
    stage, result = 0, {}
    for node in _compute_nodes(ep.graph, markers=True):
        if is_marker(node):
            stage += 1
            continue
        result[node.name] = stage
    return _renumbered(result, "markers")


_WHERE = ("beginning", "end")


def from_split_points(ep: torch.export.ExportedProgram,
                      split_points: Mapping[str, object] | Sequence[tuple[str, object]],
                      module_names: set[str] | None = None) -> StageAssignment:
    """Cut before a module's first node ("beginning") or after its last node ("end").

    ``split_points``: a mapping, or (path, where) pairs, which may cut one path at both ends.

    ``module_names`` (the model's ``named_modules()``) tells a typo from a module that never
    runs; without it, the modules seen in the graph are all that is known.
    """
    nodes = _compute_nodes(ep.graph)
    known = module_names if module_names is not None else {
        p for n in nodes for p in _paths_of(n)}
    cuts: list[int] = []
    pairs = split_points.items() if isinstance(split_points, Mapping) else split_points
    for path, where in pairs:
        where = str(getattr(where, "name", where)).lower()  # PiPPy-like enums too
        if where not in _WHERE:
            raise fail(rule=rules.SPLIT_POINT, location=Location(module_path=path), reason=(
                f"split point '{path}': '{where}' is not one of {', '.join(_WHERE)}"))
        positions = [i for i, n in enumerate(nodes) if path in _paths_of(n)]
        if not positions:
            if path not in known:
                raise fail(rule=rules.SPLIT_POINT, location=Location(module_path=path), reason=(
                    f"split point '{path}' names no module of the model{_hint(path, known)}"))
            raise fail(rule=rules.SPLIT_POINT, location=Location(module_path=path), reason=(
                f"split point '{path}': the module never runs on these inputs"))
        cuts.append(positions[0] if where == "beginning" else positions[-1] + 1)
    cut_set = sorted({c for c in cuts if 0 < c < len(nodes)})
    stage, result, k = 0, {}, 0
    for i, node in enumerate(nodes):
        while k < len(cut_set) and cut_set[k] == i:
            stage, k = stage + 1, k + 1
        result[node.name] = stage
    return _renumbered(result, "split_points")


def _hint(path: str, known: set[str]) -> str:
    """The module the user probably meant: a wrapper's prefix missing, or a typo."""
    near = sorted((k for k in known if k.endswith("." + path)), key=len)
    near = near or difflib.get_close_matches(path, sorted(k for k in known if k), n=1)
    return f" (did you mean '{near[0]}'?)" if near else ""


def from_callback(ep: torch.export.ExportedProgram, callback: Callable[[torch.fx.Node], int]
                  ) -> StageAssignment:
    """``split_module`` semantics: any ids, stages ordered so data only flows forward."""
    raw: dict[torch.fx.Node, int] = {}
    for node in _compute_nodes(ep.graph):
        try:
            raw[node] = int(callback(node))
        except Exception as e:
            raise fail(rule=rules.SPLIT_POINT, location=Location.of_node(node), reason=(
                f"the split callback failed on node '{node.name}': {type(e).__name__}: {e}")
            ) from e
    order = _partition_order(raw)
    rank = {pid: i for i, pid in enumerate(order)}
    return StageAssignment({n.name: rank[p] for n, p in raw.items()}, len(order), "callback")


def _partition_order(raw: dict[torch.fx.Node, int]) -> list[int]:
    """Partitions in dependency order, first appearance breaking ties; a cycle is an error."""
    first_seen: dict[int, int] = {}
    deps: dict[int, set[int]] = {}
    for i, (node, pid) in enumerate(raw.items()):
        first_seen.setdefault(pid, i)
        deps.setdefault(pid, set())
        for arg in node.all_input_nodes:
            src = raw.get(arg)
            if src is not None and src != pid:
                deps[pid].add(src)
    order: list[int] = []
    state: dict[int, int] = {}  # 1 visiting, 2 done

    def visit(pid: int, trail: list[int]) -> None:
        if state.get(pid) == 2:
            return
        if state.get(pid) == 1:
            cycle = " -> ".join(str(p) for p in [*trail[trail.index(pid):], pid])
            raise fail(rule=rules.SPLIT_POINT, reason=(
                f"the split callback's partitions depend on each other in a cycle: {cycle}"))
        state[pid] = 1
        for dep in sorted(deps[pid], key=first_seen.__getitem__):
            visit(dep, [*trail, pid])
        state[pid] = 2
        order.append(pid)

    for pid in sorted(deps, key=first_seen.__getitem__):
        visit(pid, [])
    return order


def _renumbered(stage_of: dict[str, int], how: str) -> StageAssignment:
    """Drop empty stages (two markers in a row, a cut at the very start)."""
    used = sorted(set(stage_of.values()))
    rank = {s: i for i, s in enumerate(used)}
    return StageAssignment({n: rank[s] for n, s in stage_of.items()}, len(used), how)


def combined(first: StageAssignment, second: StageAssignment) -> StageAssignment:
    """Cut where either of two in-order assignments cuts (markers and split points together)."""
    stage_of = {n: s + second.stage_of.get(n, 0) for n, s in first.stage_of.items()}
    return _renumbered(stage_of, f"{first.how}+{second.how}")


def decomposed_assignment(assignment: StageAssignment,
                          decomposed: torch.export.ExportedProgram) -> StageAssignment:
    """Carry stages to the decomposed program's nodes through ``from_node`` provenance."""
    result: dict[str, int] = {}
    last = 0
    for node in _compute_nodes(decomposed.graph):
        # provenance first: a decomposed node may reuse the name of an unrelated captured one
        stage = None
        for source in node.meta.get("from_node") or []:
            stage = _stage_of_source(source, assignment.stage_of)
            if stage is not None:
                break
        if stage is None:
            stage = assignment.stage_of.get(node.name)
        if stage is None:  # created by a pass with no provenance: stays with its producer
            stage = max((result.get(a.name, 0) for a in node.all_input_nodes), default=last)
        result[node.name] = last = stage
    return StageAssignment(_no_earlier_user(decomposed.graph, result), assignment.count,
                           assignment.how)


def _no_earlier_user(graph: torch.fx.Graph, stage_of: dict[str, int]) -> dict[str, int]:
    """Each node moved to the earliest stage that reads it, where that is before its own:
    decomposition shares one node among calls of several stages (XLM-RoBERTa's
    ``scalar_tensor`` of a mask, provenance in layer 3, read from layer 0), which a stage
    cannot take from a later one. Walked backwards, so what such a node reads moves too."""
    for node in reversed(_compute_nodes(graph)):
        readers = [stage_of[u.name] for u in node.users if u.name in stage_of]
        if readers and min(readers) < stage_of[node.name]:
            stage_of[node.name] = min(readers)
    return stage_of


def _stage_of_source(source: object, stage_of: dict[str, int]) -> int | None:
    name = getattr(source, "name", None)
    if name in stage_of:
        return stage_of[name]
    for parent in getattr(source, "from_node", None) or []:
        found = _stage_of_source(parent, stage_of)
        if found is not None:
            return found
    return None


# ---- the pass ---------------------------------------------------------------------------------

@dataclasses.dataclass
class Stage(Region):
    """One pipeline stage; runs on the accelerator providers like an acc region."""

    @property
    def kind(self) -> str:
        return "stage"


class PlanStages(PlanPass):
    """The stages of ``assignment`` (carried to the module's nodes) as a plan for
    :class:`CutRegions`; a stage left empty by decomposition is dropped, the rest are
    ``stage_0``, ``stage_1``, ... in order, one preview note each."""

    def __init__(self, assignment: StageAssignment) -> None:
        self.assignment = assignment

    @property
    def name(self) -> str:
        return f"split ({self.assignment.how})"

    def ensures(self, graph_module: torch.fx.GraphModule) -> None:
        super().ensures(graph_module)
        plan = recorded_plan(graph_module)
        names = [r.name for r in plan.regions] if plan else []
        if names != [f"{STAGE_PREFIX}{i}" for i in range(len(names))]:
            raise PassConditionError(f"stages named in order (got {names})")

    def plan(self, graph_module: torch.fx.GraphModule, ctx: DiagnosticContext) -> SplitPlan:
        stage_of = _stage_of_module_nodes(graph_module, self.assignment.stage_of)
        index = {n: i for i, n in enumerate(graph_module.graph.nodes)}
        members: list[list[torch.fx.Node]] = [[] for _ in range(self.assignment.count)]
        for node, stage in stage_of.items():
            members[stage].append(node)
        # a stage may vanish in decomposition (it held only nodes that fold away)
        described = describe_regions([(True, ns) for ns in members if ns], index)
        stages: list[Region] = [
            Stage(**{**dataclasses.asdict(r), "name": f"{STAGE_PREFIX}{i}"})
            for i, r in enumerate(described)]
        for stage in stages:
            note_region(stage, ctx)
        return SplitPlan(stages, regions_before_merge=(len(stages), 0))


class StagesPass(Partition):
    """Cut a flat module (``program.module()`` of the decomposed program) into the stages
    of ``assignment``: :class:`PlanStages`, then :class:`CutRegions`, as ``SplitPass``
    cuts acc/CPU regions."""

    def __init__(self, assignment: StageAssignment) -> None:
        super().__init__(PlanStages(assignment))


def _stage_of_module_nodes(graph_module: torch.fx.GraphModule,
                           stage_of: Mapping[str, int]) -> dict[torch.fx.Node, int]:
    """Stage of every compute node of the module; nodes it adds join their inputs."""
    result: dict[torch.fx.Node, int] = {}
    for node in graph_module.graph.nodes:
        if node.op not in CALLABLE_OPS or is_guard(node):
            continue
        stage = stage_of.get(node.name)
        if stage is None:
            stage = max((result.get(a, 0) for a in node.all_input_nodes), default=0)
        result[node] = stage
    return result
