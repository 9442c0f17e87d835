"""The Split pass vs torch.fx's ``splitter_base`` on the same graph, side by side in one run.

For 12/48/96 identical layers (about 1.5k to 12k FX nodes after decomposition) and a deny list
that makes regions alternate in every layer, prints the planning times side by side
(``plan_split`` vs ``_SplitterBase.put_nodes_into_subgraphs``: support, non-tensor fallback,
fusion groups, grouping), their ratio, the regions each found, and the whole pass (planning
and building the split GraphModule) with its time per node: the spread of time per node shows
the pass stays near-linear. The ``_guards_fn`` call of ``ExportedProgram.module()`` is removed
first (torch's splitter makes it a region of its own). A last table times the planning of a
worst case for fusion groups (each int read again two steps later, so every group's closure
reaches the next) at 1k to 8k nodes.
Usage: python scripts/bench_split.py [--layers 12 48 96] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import operator
import sys
import time
from pathlib import Path

import torch
import torch.fx
from torch.fx.passes import operator_support as fx_support
from torch.fx.passes import splitter_base

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_modularize import Net

from onnx_modular import OperatorSupport
from onnx_modular.diagnostics import DiagnosticContext
from onnx_modular.passes.split import SplitPass, plan_split

DENY = ("aten.sigmoid", "aten.cat")


def best_of(fn, repeat: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def ours_plan(gm: torch.fx.GraphModule) -> int:
    return len(plan_split(gm, OperatorSupport(deny=DENY)).regions)


def ours_pass(gm: torch.fx.GraphModule) -> int:
    result = SplitPass(OperatorSupport(deny=DENY))(gm, DiagnosticContext())
    assert result.plan is not None
    return len(result.plan.regions)


class _Deny(fx_support.OperatorSupportBase):
    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:  # type: ignore[override]
        if node.op != "call_function":
            return False
        name = getattr(node.target, "_schema", None)
        packet = str(name.name).replace("::", ".") if name is not None else ""
        return packet not in DENY


def theirs(gm: torch.fx.GraphModule, x: torch.Tensor) -> int:
    settings = splitter_base._SplitterSettingBase(min_acc_module_size=1)
    splitter = splitter_base._SplitterBase(gm, (x,), _Deny(), settings)
    return len(splitter.put_nodes_into_subgraphs())


def chained_groups(k: int) -> torch.fx.GraphModule:
    """k blocks of size -> mul -> relu; each size is read again two blocks later."""
    g = torch.fx.Graph()
    t = g.placeholder("x")
    t.meta["val"] = torch.empty(4)
    pending: list[torch.fx.Node] = []
    for _ in range(k):
        size = g.call_method("size", (t, 0))
        size.meta["val"] = 4
        u = g.call_function(operator.mul, (t, size))
        u.meta["val"] = torch.empty(4)
        pending.append(size)
        if len(pending) > 2:
            u = g.call_function(operator.mul, (u, pending.pop(0)))
            u.meta["val"] = torch.empty(4)
        t = g.call_function(torch.relu, (u,))
        t.meta["val"] = torch.empty(4)
    g.output(t)
    return torch.fx.GraphModule(torch.nn.Module(), g)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, nargs="+", default=[12, 48, 96])
    parser.add_argument("--repeat", type=int, default=3)
    opts = parser.parse_args()
    x = torch.randn(2, 16)
    print(f"{'layers':>6} {'nodes':>6} {'plan s':>8} {'fx plan s':>9} {'ratio':>6} "
          f"{'regions':>8} {'fx regions':>10} {'pass s':>7} {'us/node':>8}")
    per_node = []
    for n in opts.layers:
        gm = torch.export.export(Net(n).eval(), (x,)).run_decompositions().module()
        for node in [n for n in gm.graph.nodes if n.op == "call_module"]:
            gm.graph.erase_node(node)  # the _guards_fn call
        gm.recompile()
        nodes = len(gm.graph.nodes)
        plan_s, regions = best_of(lambda gm=gm: ours_plan(gm), opts.repeat)
        fx_s, fx_regions = best_of(lambda gm=gm: theirs(gm, x), opts.repeat)
        pass_s, _ = best_of(lambda gm=gm: ours_pass(gm), opts.repeat)
        per_node.append(pass_s / nodes * 1e6)
        print(f"{n:>6} {nodes:>6} {plan_s:>8.3f} {fx_s:>9.3f} {plan_s / fx_s:>5.2f}x "
              f"{regions:>8} {fx_regions:>10} {pass_s:>7.3f} {per_node[-1]:>8.1f}", flush=True)
    if len(per_node) > 1:
        print(f"time per node, max/min: {max(per_node) / min(per_node):.2f}x")
    print(f"\n{'chained int groups':<20} {'nodes':>6} {'plan s':>8} {'us/node':>8}")
    chained = []
    for k in (250, 500, 1000, 2000):
        gm = chained_groups(k)
        nodes = len(gm.graph.nodes)
        plan_s, _ = best_of(lambda gm=gm: len(plan_split(gm, OperatorSupport.everything())
                                              .regions), opts.repeat)
        chained.append(plan_s / nodes * 1e6)
        print(f"{'':<20} {nodes:>6} {plan_s:>8.3f} {chained[-1]:>8.1f}", flush=True)
    print(f"time per node, max/min: {max(chained) / min(chained):.2f}x")


if __name__ == "__main__":
    main()
