"""Split vs torch.fx's splitter_base, run as an oracle on the same FX graphs."""

from __future__ import annotations

import contextlib
import io
import operator

import pytest
import torch
import torch.fx
from models import gpt2
from torch import nn
from torch.export import Dim
from torch.fx.passes import operator_support as fx_support
from torch.fx.passes import splitter_base
from torch.fx.passes.shape_prop import ShapeProp

import onnx_modular as om
from onnx_modular import DiagnosticContext, OperatorSupport
from onnx_modular.passes.split import SplitLimits, SplitPass, plan_split

Regions = list[tuple[bool, frozenset[str]]]


def exported(model: nn.Module, args: tuple, dynamic_shapes=None) -> torch.fx.GraphModule:
    ep = torch.export.export(model, args, dynamic_shapes=dynamic_shapes, strict=False)
    gm = ep.run_decompositions().module()
    for node in [n for n in gm.graph.nodes if n.op == "call_module"]:
        gm.graph.erase_node(node)  # the _guards_fn call: torch's splitter cannot tag it
    gm.recompile()
    return gm


class _Adapter(fx_support.OperatorSupportBase):
    def __init__(self, support: OperatorSupport) -> None:
        self.support = support

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:  # type: ignore[override]
        return self.support.is_node_supported(node)


def theirs(gm: torch.fx.GraphModule, args: tuple, support: OperatorSupport, **kw) -> Regions:
    for node in gm.graph.nodes:
        if hasattr(node, "tag"):
            del node.tag
    settings = splitter_base._SplitterSettingBase(**kw)
    with contextlib.redirect_stdout(io.StringIO()):
        splitter = splitter_base._SplitterBase(gm, args, _Adapter(support), settings)
        subgraphs = splitter.remove_small_acc_subgraphs(splitter.put_nodes_into_subgraphs())
    return [(s.is_acc, frozenset(n.name for n in s.nodes)) for s in subgraphs]


def ours(gm: torch.fx.GraphModule, support: OperatorSupport, **kw) -> Regions:
    return [(r.is_acc, frozenset(r.node_names)) for r in plan_split(
        gm, support, limits=SplitLimits(**kw)).regions]


# ---- models ----------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.n = nn.Linear(8, 16), nn.Linear(16, 8), nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.n(self.b(torch.relu(self.a(x))).sigmoid() + x)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.o = nn.Linear(16, 48), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).split(16, dim=-1)
        a = torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1)
        return self.o(a @ v) + x.mean(dim=-1, keepdim=True)


class Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c, self.bn, self.c2 = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.max_pool2d(torch.relu(self.bn(self.c(x))), 2)
        return self.c2(y).flatten(1).sum(-1)


class Reshapes(nn.Module):
    """With dynamic shapes: sym_size ints feed views before and after the acc ops."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.n = nn.Linear(8, 8), nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        y = self.a(x).view(b * t, c).relu()
        return self.n(torch.sigmoid(y).view(b, t, c) + x).reshape(b, -1)


FLAGS = [{}, {"allow_non_tensor": True}, {"skip_fusion": True}, {"min_acc_module_size": 3},
         {"allow_non_tensor": True, "skip_fusion": True}]


@pytest.mark.slow
@pytest.mark.parametrize("build, deny_lists", [
    (lambda: (MLP().eval(), (torch.randn(2, 8),)),
     [["aten.relu"], ["aten.native_layer_norm", "aten.add"], ["aten.addmm"], ["getitem"]]),
    (lambda: (Attention().eval(), (torch.randn(2, 4, 16),)),
     [["aten._softmax"], ["aten.split_with_sizes"], ["aten.bmm", "aten.mean"], ["aten.view"]]),
    (lambda: (Conv().eval(), (torch.randn(1, 3, 8, 8),)),
     [["aten.max_pool2d_with_indices"], ["aten.relu", "aten.sum"], ["aten.convolution"]]),
    pytest.param(lambda: gpt2(2),
                 [["aten._softmax"], ["aten.native_layer_norm"], ["aten.where", "aten.tanh"],
                  ["aten.arange", "aten.embedding", "aten.pow"], ["aten.split_with_sizes"]],
                 marks=pytest.mark.slow),
], ids=["mlp", "attention", "conv", "gpt2"])
def test_regions_match_splitter_base(build, deny_lists):
    model, args = build()
    gm = exported(model, args)
    for deny in deny_lists:
        support = OperatorSupport(deny=deny)
        for kw in FLAGS:
            if "getitem" in deny and kw == {"allow_non_tensor": True}:
                continue  # the deliberate difference below
            assert ours(gm, support, **kw) == theirs(gm, args, support, **kw), (deny, kw)


@pytest.mark.slow
def test_tuple_producer_keeps_its_getitems_deliberately():
    """Documented difference: with allow_non_tensor, splitter_base lets an acc
    native_layer_norm hand its tuple to a CPU getitem (ShapeProp gives tuples a tensor_meta, so
    no fusion group); we keep producer and getitems together."""
    args = (torch.randn(2, 8),)
    gm = exported(MLP().eval(), args)
    support = OperatorSupport(deny=["getitem"])
    torch_acc = {n for a, ns in theirs(gm, args, support, allow_non_tensor=True) if a for n in ns}
    our_acc = {n for a, ns in ours(gm, support, allow_non_tensor=True) if a for n in ns}
    assert torch_acc - our_acc == {"native_layer_norm"}
    assert ours(gm, support, allow_non_tensor=True, skip_fusion=True) == \
        theirs(gm, args, support, allow_non_tensor=True, skip_fusion=True)


@pytest.mark.slow
def test_cpu_only_non_tensor_component_keeps_acc_nodes_between_its_members():
    """Defect: CPU sym_size ints feeding views everywhere formed a fusion group whose closure
    dragged every acc node between the first and last view to CPU."""
    x = torch.randn(2, 3, 8)
    gm = exported(Reshapes().eval(), (x,), ({0: Dim("b", min=2), 1: Dim("t", min=2)},))
    for deny in (["aten.sym_size"], ["aten.sigmoid"], ["aten.view", "aten.sym_size"]):
        support = OperatorSupport(deny=deny)
        for kw in FLAGS:
            assert ours(gm, support, **kw) == theirs(gm, (x,), support, **kw), (deny, kw)
    acc = [r for r in plan_split(gm, OperatorSupport(deny=["aten.sym_size"])).regions if r.is_acc]
    assert {"relu", "sigmoid", "native_layer_norm"} <= {n for r in acc for n in r.node_names}


class SizeView(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(torch.relu(x).view(x.size(0), -1)) + 1


def test_shape_prop_int_results_are_non_tensor():
    """Defect: after ShapeProp an int result has a ``type`` but no ``tensor_meta``; it was read
    as a tensor, so an acc ``size`` fed CPU nodes and no fusion group formed."""
    x = torch.randn(2, 3, 4)
    gm = torch.fx.symbolic_trace(SizeView())
    ShapeProp(gm).propagate(x)
    for deny in ("relu", "size", "view"):
        support = OperatorSupport.from_callable(lambda n, d=deny: d not in n.name)
        for kw in ({}, {"allow_non_tensor": True}):
            assert ours(gm, support, **kw) == theirs(gm, (x,), support, **kw), (deny, kw)
    support = OperatorSupport.from_callable(lambda n: n.name != "relu")
    assert ours(gm, support) == [(False, frozenset({"relu"})),
                                 (True, frozenset({"size", "view", "sigmoid", "add"}))]


def _mutual_groups() -> torch.fx.GraphModule:
    """Two fusion groups (an int and the views reading it), each feeding the other."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(4, 4)
    t1, t2 = g.call_method("size", (x, 0)), g.call_method("size", (x, 1))
    t1.meta["val"] = t2.meta["val"] = 4
    a1, a2 = g.call_method("view", (x, t1, -1)), g.call_method("view", (x, t2, -1))
    b1, b2 = g.call_method("view", (a2, t1, -1)), g.call_method("view", (a1, t2, -1))
    out = g.call_function(operator.add, (b1, b2))
    for n in (a1, a2, b1, b2, out):
        n.meta["val"] = torch.empty(4, 4)
    g.output(out)
    return torch.fx.GraphModule(nn.Module(), g)


def test_fusion_groups_feeding_each_other_merge_instead_of_vanishing(assert_close):
    """Defect: a cycle between two fusion units left Kahn's algorithm with nothing ready, and
    the plan silently had no region at all (splitter_base raises "Subgraph can't be empty")."""
    gm = _mutual_groups()
    plan = plan_split(gm, OperatorSupport.everything())
    assert [(r.is_acc, len(r.node_names)) for r in plan.regions] == [(True, 7)]
    x = torch.randn(4, 4)
    out = SplitPass(OperatorSupport.everything())(gm, DiagnosticContext()).graph_module
    assert_close(out(x), gm(x), 0)


class ThreeRegions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.lin(x)) + self.lin.weight.sum()


@pytest.mark.slow
@pytest.mark.parametrize("limit", [1, 2, 3, 0, -1])
def test_max_acc_splits_counts_every_region_as_splitter_base(limit):
    """splitter_base compares the number of all submodules (acc and CPU) with the limit."""
    x = torch.randn(2, 3)
    gm = exported(ThreeRegions(), (x,))
    support = OperatorSupport(deny=["aten.sin"])
    settings = splitter_base._SplitterSettingBase(max_acc_splits=limit)
    with contextlib.redirect_stdout(io.StringIO()):
        splitter = splitter_base._SplitterBase(gm, (x,), _Adapter(support), settings)
        try:
            splitter.generate_split_results()
            torch_fails = False
        except ValueError as e:
            assert "max_acc_splits" in str(e)
            torch_fails = True
    for node in gm.graph.nodes:
        if hasattr(node, "tag"):
            del node.tag
    try:
        SplitPass(support, limits=SplitLimits(max_acc_splits=limit))(gm,
                                                                    DiagnosticContext())
        ours_fails = False
    except om.OnnxModularError as e:
        assert "3 regions (2 acc, 1 cpu), more than max_acc_splits" in str(e)
        ours_fails = True
    assert ours_fails == torch_fails == (0 < limit < 3)
