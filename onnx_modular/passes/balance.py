"""Balanced pipeline stages: where to cut so that stages hold about equal weight bytes.

A stage is a device's share of the weights, so stages are balanced by the parameter bytes
they hold, and cut only where a cut costs nothing in structure: at the call boundaries of
the model's repeated block list (``h.0 .. h.N``, ``layers.*``), or, without one, between
the calls of the top-level modules. The plan becomes ordinary ``split_points`` (the module
where each stage after the first begins), so the cutting itself is :mod:`.stages`'.

A weight read by several stages (tied embedding and output head) is copied into each of
them, so it counts in each: a stage's bytes are those of the distinct weights it reads.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Sequence

import torch
import torch.fx

from onnx_modular.diagnostics import DiagnosticContext, Location
from onnx_modular.leaves._util import format_bytes
from onnx_modular.leaves.errors import fail, rules
from onnx_modular.passes.stages import _compute_nodes, _paths_of

_INDEXED = re.compile(r"^(?P<list>.+)\.(?P<index>\d+)$")
_WEIGHT_KINDS = ("PARAMETER", "BUFFER", "CONSTANT_TENSOR")


@dataclasses.dataclass
class Unit:
    """An indivisible run of nodes: one block call, or what runs before/after the blocks."""

    label: str  # "model.h.3", or the modules of a run outside the blocks
    path: str | None  # the module at whose boundary the unit starts (None for the first)
    where: str  # "beginning" of ``path``, or its "end" (what runs after the last block)
    modules: tuple[str, ...]  # modules whose calls it holds, at the cut level
    weights: dict[str, int]  # weight name -> bytes
    #: weight name -> the module whose node reads it (tied weights go by one name only)
    owners: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class PlannedStage:
    units: list[Unit]
    bytes: int

    @property
    def modules(self) -> str:
        """``model.wte, model.wpe, model.h.0-5`` (consecutive blocks folded)."""
        return _fold([m for u in self.units for m in u.modules])


@dataclasses.dataclass
class StagePlan:
    """Which modules go to which stage, and the weight bytes each stage holds."""

    stages: list[PlannedStage]
    blocks: str | None  # the repeated block list cut at ("model.h"), or None
    how: str  # "num_stages=4", "max_stage_bytes=2.00 GB", ...

    @property
    def cuts(self) -> list[tuple[str, str]]:
        """Where each stage after the first begins, in order: (module path, "beginning" or
        "end"). One path may be cut at both ends (the last block alone in a stage, the
        tail in the next): what ``from_split_points`` is given."""
        return [(s.units[0].path, s.units[0].where) for s in self.stages[1:]
                if s.units[0].path is not None]

    @property
    def split_points(self) -> dict[str, str]:
        """:attr:`cuts` as ``split_points`` (module path -> "beginning" / "end"); a path cut
        at both ends keeps its beginning here, so the plan itself goes by :attr:`cuts`."""
        points: dict[str, str] = {}
        for path, where in self.cuts:
            points.setdefault(path, where)
        return points

    @property
    def stage_bytes(self) -> list[int]:
        return [s.bytes for s in self.stages]

    def lines(self) -> list[str]:
        where = f"the blocks of '{self.blocks}'" if self.blocks else "top-level module calls"
        head = (f"{len(self.stages)} stage(s) by {self.how}, cut between {where}; weight "
                f"bytes max/min {_ratio(self.stage_bytes)}")
        return [head] + [f"stage_{i}: {format_bytes(s.bytes)} ({s.bytes} bytes): {s.modules}"
                         for i, s in enumerate(self.stages)]

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _ratio(values: Sequence[int]) -> str:
    low = min(values) if values else 0
    return f"{max(values) / low:.2f}" if low else "n/a"


def _fold(modules: list[str]) -> str:
    """``[a.h.0, a.h.1, a.h.2]`` -> ``a.h.0-2``."""
    out: list[str] = []
    run: list[tuple[str, int]] = []

    def flush() -> None:
        if not run:
            return
        prefix, first = run[0]
        last = run[-1][1]
        out.append(f"{prefix}.{first}" if first == last else f"{prefix}.{first}-{last}")
        run.clear()

    for m in modules:
        match = _INDEXED.match(m)
        if match and run and run[-1][0] == match["list"] and run[-1][1] + 1 == int(match["index"]):
            run.append((match["list"], int(match["index"])))
            continue
        flush()
        if match:
            run.append((match["list"], int(match["index"])))
        else:
            out.append(m)
    flush()
    return ", ".join(out) or "(top-level ops)"


# ---- units -----------------------------------------------------------------------------------

def _weights_of(ep: torch.export.ExportedProgram) -> dict[str, tuple[str, int]]:
    """Placeholder name -> (weight name, bytes) for parameters, buffers and constants."""
    result = {}
    for spec in ep.graph_signature.input_specs:
        if spec.kind.name not in _WEIGHT_KINDS or spec.target is None:
            continue
        t = ep.state_dict.get(spec.target, ep.constants.get(spec.target))
        if isinstance(t, torch.Tensor):
            result[spec.arg.name] = (spec.target, t.numel() * t.element_size())
    return result


def _stack(node: torch.fx.Node) -> list[str]:
    """The node's module paths, outermost first."""
    stack = node.meta.get("nn_module_stack") or {}
    return [str(v[0]) if isinstance(v, tuple) else str(k) for k, v in stack.items()]


def _block_list(nodes: list[torch.fx.Node], node_bytes: list[int]) -> str | None:
    """The repeated block list to cut at: of the paths ``<list>.<i>`` seen with at least two
    indices, the one whose blocks hold the most weight bytes (the outer list of nested
    ones), then the one with the most blocks."""
    members: dict[str, set[int]] = {}
    weight: dict[str, int] = {}
    for node, nbytes in zip(nodes, node_bytes):
        for path in set(_paths_of(node)):
            match = _INDEXED.match(path)
            if match:
                members.setdefault(match["list"], set()).add(int(match["index"]))
                weight[match["list"]] = weight.get(match["list"], 0) + nbytes
    lists = [name for name, idx in members.items() if len(idx) >= 2]
    if not lists:
        return None
    return max(lists, key=lambda n: (weight[n], len(members[n]), -len(n), n))


def _children(nodes: list[torch.fx.Node]) -> tuple[str | None, list[str]]:
    """Without a block list: the top-level modules below any single wrapper, in call order."""
    depth = 0
    while True:
        seen: list[str] = []
        for node in nodes:
            stack = _stack(node)
            if len(stack) > depth and stack[depth] not in seen:
                seen.append(stack[depth])
        if len(seen) != 1:
            return None, seen
        depth += 1


def plan_units(ep: torch.export.ExportedProgram) -> tuple[str | None, list[Unit]]:
    """The block list (or ``None``) and the indivisible units in execution order."""
    nodes = _compute_nodes(ep.graph)
    weights = _weights_of(ep)
    reads = [{weights[a.name] for a in n.all_input_nodes if a.name in weights} for n in nodes]
    blocks = _block_list(nodes, [sum(b for _, b in r) for r in reads])
    if blocks is not None:
        starts: dict[str, int] = {}
        last = 0
        pattern = re.compile(rf"^{re.escape(blocks)}\.\d+$")
        for i, node in enumerate(nodes):
            for path in _paths_of(node):
                if pattern.match(path):
                    starts.setdefault(path, i)
                    last = i
        cuts = sorted((pos, path, "beginning") for path, pos in starts.items())
        end_path = max(starts, key=starts.__getitem__)
        if last + 1 < len(nodes):
            cuts.append((last + 1, end_path, "end"))
        depth = blocks.count(".") + 1
    else:
        _, children = _children(nodes)
        starts = {}
        for i, node in enumerate(nodes):
            for path in _paths_of(node):
                if path in children:
                    starts.setdefault(path, i)
        cuts = sorted((pos, path, "beginning") for path, pos in starts.items())
        depth = (children[0].count(".") + 1) if children else 1
    if not cuts or cuts[0][0] > 0:
        cuts.insert(0, (0, "", "beginning"))
    units: list[Unit] = []
    for k, (pos, path, where) in enumerate(cuts):
        end = cuts[k + 1][0] if k + 1 < len(cuts) else len(nodes)
        if end <= pos:
            continue
        modules: list[str] = []
        used: dict[str, int] = {}
        owners: dict[str, str] = {}
        for i in range(pos, end):
            stack = _stack(nodes[i])
            for name, nbytes in reads[i]:
                used[name] = nbytes
                owners.setdefault(name, stack[-1] if stack else "")
            # the outermost module that is not the block list's parent: model.wte, embed
            outer = next((p for p in stack if p and not _contains(p, blocks)), None)
            if outer is not None and (blocks is not None or p_depth(outer) == depth) \
                    and outer not in modules:
                modules.append(outer)
        is_block = where == "beginning" and blocks is not None and bool(
            re.fullmatch(rf"{re.escape(blocks)}\.\d+", path))
        if is_block:
            modules = [path]
        label = path if is_block else (", ".join(modules) or "(top-level ops)")
        units.append(Unit(label, path or None, where, tuple(modules), used, owners))
    return blocks, units


def _contains(path: str, blocks: str | None) -> bool:
    """Is ``path`` the block list, inside it, or one of its ancestors?"""
    if blocks is None:
        return False
    return (path == blocks or path.startswith(blocks + ".") or blocks.startswith(path + "."))


def p_depth(path: str) -> int:
    return path.count(".") + 1


# ---- the plan --------------------------------------------------------------------------------

def _costs(units: list[Unit]) -> list[list[int]]:
    """cost[i][j]: bytes of the distinct weights units i..j-1 read (a shared weight once)."""
    n = len(units)
    cost = [[0] * (n + 1) for _ in range(n + 1)]
    for i in range(n):
        seen: dict[str, int] = {}
        for j in range(i, n):
            seen.update(units[j].weights)
            cost[i][j + 1] = sum(seen.values())
    return cost


def _partition(cost: list[list[int]], n: int, k: int, cap: int | None) -> list[int] | None:
    """Start index of each of ``k`` contiguous stages over ``n`` units that minimizes the
    largest stage, then (among those) the sum of squares; ``None`` if ``cap`` cannot hold."""
    inf = float("inf")
    # pass 1: the smallest possible largest stage
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0
    for s in range(1, k + 1):
        for j in range(s, n + 1):
            best[s][j] = min((max(best[s - 1][i], cost[i][j]) for i in range(s - 1, j)),
                             default=inf)
    limit = best[k][n]
    if limit == inf or (cap is not None and limit > cap):
        return None
    # pass 2: every stage within that limit, as even as possible
    sq = [[inf] * (n + 1) for _ in range(k + 1)]
    back = [[0] * (n + 1) for _ in range(k + 1)]
    sq[0][0] = 0
    for s in range(1, k + 1):
        for j in range(s, n + 1):
            for i in range(s - 1, j):
                if cost[i][j] <= limit and sq[s - 1][i] + cost[i][j] ** 2 < sq[s][j]:
                    sq[s][j] = sq[s - 1][i] + cost[i][j] ** 2
                    back[s][j] = i
    starts, j = [], n
    for s in range(k, 0, -1):
        j = back[s][j]
        starts.append(j)
    return starts[::-1]


def _largest_unit(units: list[Unit], blocks: str | None) -> str:
    """The largest indivisible part, named by its module: an error can say what to shrink."""
    unit = max(units, key=lambda u: sum(u.weights.values()))
    nbytes = sum(unit.weights.values())
    if blocks is not None and unit.path and unit.label == unit.path:
        return f"module '{unit.path}' ({format_bytes(nbytes)})"
    by_module: dict[str, int] = {}
    for name, b in unit.weights.items():
        owner = unit.owners.get(name) or name
        by_module[owner] = by_module.get(owner, 0) + b
    top = max(by_module, key=by_module.__getitem__) if by_module else unit.label
    return (f"module '{top}' ({format_bytes(by_module.get(top, 0))}), with the rest of "
            f"[{unit.label}] ({format_bytes(nbytes)} in all)")


def balanced_plan(ep: torch.export.ExportedProgram, num_stages: int | None = None,
                  max_stage_bytes: int | None = None,
                  ctx: DiagnosticContext | None = None) -> StagePlan:
    """Stages at block boundaries: ``num_stages`` as even as possible, and/or as few as keep
    every stage within ``max_stage_bytes``."""
    ctx = ctx if ctx is not None else DiagnosticContext()
    for name, value in (("num_stages", num_stages), ("max_stage_bytes", max_stage_bytes)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise fail(rule=rules.SPLIT_POINT, reason=(
                f"{name} must be a positive int, got {value!r}"))
    if num_stages is None and max_stage_bytes is None:
        raise fail(rule=rules.SPLIT_POINT, reason="give num_stages or max_stage_bytes")
    blocks, units = plan_units(ep)
    cost = _costs(units)
    n = len(units)
    where = (f"between the blocks of '{blocks}'" if blocks else "between top-level modules")
    if num_stages is not None and num_stages > n:
        raise fail(rule=rules.SPLIT_POINT, location=Location(module_path=blocks), reason=(
            f"num_stages={num_stages}: the model can be cut {where} into at most {n} "
            f"stage(s) ({', '.join(u.label for u in units)})"))
    if max_stage_bytes is not None:
        too_big = [u for u in units if sum(u.weights.values()) > max_stage_bytes]
        if too_big:
            raise fail(rule=rules.SPLIT_POINT, location=Location(module_path=blocks), reason=(
                f"max_stage_bytes={format_bytes(max_stage_bytes)} cannot be met: the "
                f"largest indivisible part, {_largest_unit(units, blocks)}, is larger "
                f"(stages are cut only {where})"))
    if num_stages is None:
        assert max_stage_bytes is not None
        count, start = 1, 0  # greedy: the fewest stages that keep the budget
        for j in range(1, n + 1):
            if cost[start][j] > max_stage_bytes:
                count, start = count + 1, j - 1
        k, how = count, f"max_stage_bytes={format_bytes(max_stage_bytes)}"
    else:
        k, how = num_stages, f"num_stages={num_stages}"
        if max_stage_bytes is not None:
            how += f", max_stage_bytes={format_bytes(max_stage_bytes)}"
    starts = _partition(cost, n, k, max_stage_bytes)
    if starts is None:
        best = _partition(cost, n, k, None)
        assert best is not None
        bounds = [*best, n]
        largest = max(cost[a][b] for a, b in itertools.pairwise(bounds))
        raise fail(rule=rules.SPLIT_POINT, location=Location(module_path=blocks), reason=(
            f"num_stages={k} cannot keep every stage within max_stage_bytes="
            f"{format_bytes(max_stage_bytes or 0)}: the most even cut {where} has a stage of "
            f"{format_bytes(largest)}; allow more stages"))
    bounds = [*starts, n]
    stages = [PlannedStage(units[a:b], cost[a][b]) for a, b in itertools.pairwise(bounds)]
    plan = StagePlan(stages, blocks, how)
    for line in plan.lines():
        ctx.note(rules.STAGE_PLAN, reason=line)
    return plan
