"""Split: splitter_base semantics, region models, manifest, single-file form, chained runner."""

from __future__ import annotations

import io
import itertools
import json
import operator

import onnx
import onnxruntime as ort
import pytest
import torch
from models import MultiOut, Stack, bert, gpt2, x8
from torch import nn

import onnx_modular as om
from onnx_modular import DiagnosticContext, OperatorSupport
from onnx_modular.api.split import print_preview
from onnx_modular.emit.regions import region_chains
from onnx_modular.leaves.errors import rules
from onnx_modular.leaves.metadata import fx_name
from onnx_modular.passes.split import SplitLimits, SplitPass, plan_split
from onnx_modular.support.operator_support import node_op_names

# ---- helpers ---------------------------------------------------------------------------------


def flat_graph(model: nn.Module, *args: torch.Tensor) -> torch.fx.GraphModule:
    ep = torch.export.export(model, args, strict=False).run_decompositions({})
    return ep.module()


def regions(plan) -> list[tuple[str, tuple[str, ...]]]:
    return [(r.name, r.node_names) for r in plan.regions]


def check_alternating(result) -> None:
    rs = result.regions
    assert rs, "no region"
    for i, r in enumerate(rs):
        assert r.node_names, f"{r.name} is empty"
        assert r.name == f"_run_on_{'acc' if r.is_acc else 'cpu'}_{i}"
    for a, b in itertools.pairwise(rs):
        assert a.is_acc != b.is_acc


def check_acc_models(result, denied: set[str]) -> int:
    """No ONNX node of an acc model comes from a denied FX op; returns acc ONNX node count."""
    fx = {n.name: n for n in result.program.module().graph.nodes}
    # Region models are optimized: nodes the optimizer makes name no FX node. None of them
    # may be of an ONNX type that only denied FX nodes translate to.
    from onnx_modular.support.onnx_index import fx_to_onnx_nodes

    by_fx = fx_to_onnx_nodes(result.onnx_model)
    denied_types = {n.op_type for name, ns in by_fx.items() if name in fx
                    and denied & set(node_op_names(fx[name])) for n in ns}
    allowed_types = {n.op_type for name, ns in by_fx.items() if name in fx
                     and not denied & set(node_op_names(fx[name])) for n in ns}
    count = 0
    for rg in result.region_graphs():
        assert rg.model.graph.num_nodes() > 0, f"{rg.name} has no ONNX node"
        if not rg.is_acc:
            continue
        # Module functions inside a region: check every node of every body, not the calls.
        bodies = [f.graph for f in rg.model.functions.values()]
        calls = {(f.domain, f.name) for f in rg.model.functions.values()}
        for node in [n for g in [rg.model.graph, *bodies] for n in g]:
            if (node.domain, node.op_type) in calls:
                continue
            origin = fx_name(node)
            if origin is None:
                assert node.op_type not in denied_types - allowed_types, \
                    f"{rg.name} holds an optimizer-made {node.op_type}"
                count += 1
                continue
            assert origin in fx, f"{node.op_type} in {rg.name} has no FX origin"
            assert not denied & set(node_op_names(fx[origin])), \
                f"{rg.name} holds {origin} ({node.op_type})"
            count += 1
    return count


# ---- splitter_base semantics on FX (no translation: fast) ------------------------------------


class Diamond(nn.Module):
    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return torch.sin(a) + torch.cos(a)


class Chain(nn.Module):
    """relu, sin, relu, sin, ... with sin unsupported: 2n alternating regions."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.n):
            x = torch.sin(torch.relu(x) * 2.0)
        return x


@pytest.mark.slow
def test_diamond_groups_independent_acc_nodes():
    gm = flat_graph(Diamond(), torch.randn(4))
    plan = plan_split(gm, OperatorSupport.allow(["aten.sin", "aten.cos"]))
    assert regions(plan) == [("_run_on_acc_0", ("sin", "cos")), ("_run_on_cpu_1", ("add",))]
    assert plan.regions[0].inputs == ("a",)
    assert plan.regions[0].outputs == ("sin", "cos")
    assert plan.regions[1].input_bytes == 32 and plan.regions[1].output_bytes == 16


@pytest.mark.slow
def test_start_on_cpu_when_a_cpu_node_is_ready():
    gm = flat_graph(Chain(2), torch.randn(4))
    plan = plan_split(gm, OperatorSupport.deny(["aten.relu"]))
    assert [r.kind for r in plan.regions] == ["cpu", "acc", "cpu", "acc"]
    assert plan.regions[0].name == "_run_on_cpu_0"


def test_min_acc_module_size_merges_small_acc_regions_into_cpu():
    gm = flat_graph(Chain(3), torch.randn(4))
    deny_sin = OperatorSupport.deny(["aten.sin"])
    plan = plan_split(gm, deny_sin)
    assert [(r.kind, len(r.node_names)) for r in plan.regions] == \
        [("acc", 2), ("cpu", 1)] * 3
    # acc regions of 2 nodes are below 3: everything folds into one CPU region
    merged = plan_split(gm, deny_sin, limits=SplitLimits(min_acc_module_size=3))
    assert [(r.kind, len(r.node_names)) for r in merged.regions] == [("cpu", 9)]
    assert merged.regions_before_merge == (3, 3)
    assert merged.regions[0].name == "_run_on_cpu_0"
    assert plan_split(gm, deny_sin, limits=SplitLimits(min_acc_module_size=2)).regions == \
        plan.regions


def test_max_acc_splits_counts_regions_like_splitter_base():
    gm = flat_graph(Chain(2), torch.randn(4))
    support = OperatorSupport.deny(["aten.sin"])  # acc, cpu, acc, cpu
    ctx = DiagnosticContext()
    with pytest.raises(om.OnnxModularError, match=r"needs 4 regions \(2 acc, 2 cpu\), more "
                       r"than max_acc_splits=3"):
        SplitPass(support, limits=SplitLimits(max_acc_splits=3))(gm, ctx)
    assert ctx.diagnostics[-1].rule == rules.SPLIT_LIMIT
    for limit in (4, 10, 0, -1):
        result = SplitPass(support, limits=SplitLimits(max_acc_splits=limit))(gm)
        assert len(result.plan.regions) == 4


class TupleOut(nn.Module):
    """``max`` makes a tuple: a non-tensor value the getitems read."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v, i = torch.max(torch.relu(x), dim=-1)
        return torch.tanh(v) + i


def _getitem_on_cpu(node: torch.fx.Node) -> bool:
    return not (node.target is operator.getitem and node.args[1] == 1)


def test_non_tensor_outputs_to_cpu_fall_back_unless_allowed():
    gm = flat_graph(TupleOut(), torch.randn(2, 4))
    support = OperatorSupport.from_callable(_getitem_on_cpu)  # the index getitem is CPU
    plan = plan_split(gm, support, limits=SplitLimits(skip_fusion=True))
    owner = plan.region_of()
    assert owner["max_1"] == owner["getitem_1"] and not plan.regions[
        [r.name for r in plan.regions].index(owner["max_1"])].is_acc
    assert "max_1" in plan.fallback_nodes
    allowed = plan_split(gm, support,
                         limits=SplitLimits(skip_fusion=True, allow_non_tensor=True))
    acc = {n for r in allowed.regions if r.is_acc for n in r.node_names}
    assert "max_1" in acc and "getitem_1" not in acc


def test_fusion_groups_keep_non_tensor_flow_in_one_region():
    gm = flat_graph(TupleOut(), torch.randn(2, 4))
    support = OperatorSupport.from_callable(_getitem_on_cpu)
    fused = plan_split(gm, support, limits=SplitLimits(allow_non_tensor=True))
    owner = fused.region_of()
    assert owner["max_1"] == owner["getitem"] == owner["getitem_1"]
    assert fused.fallback_nodes["max_1"].startswith("fusion group")
    split = plan_split(gm, support,
                       limits=SplitLimits(allow_non_tensor=True, skip_fusion=True))
    assert split.region_of()["max_1"] != split.region_of()["getitem_1"]


def test_split_graph_module_runs_and_previews(capsys, assert_close):
    gm = flat_graph(Chain(3), torch.randn(4))
    ctx = DiagnosticContext()
    split_pass = SplitPass(OperatorSupport.deny(["aten.sin"]))
    result = split_pass(gm, ctx)
    out = result.graph_module
    x = torch.randn(4)
    assert_close(out(x), gm(x), 0)
    names = [n.target for n in out.graph.nodes if n.op == "call_module"]
    assert names[-6:] == [f"_run_on_{k}_{i}" for i, k in enumerate(["acc", "cpu"] * 3)]
    texts = [d.message for d in ctx.diagnostics]
    assert any("3 of 9 node(s) supported" not in t and "6 of 9 node(s) supported" in t
               for t in texts)
    assert any(t.startswith("_run_on_acc_0: 2 node(s), 1 input(s) (16 bytes)") for t in texts)
    from rich.console import Console

    buf = io.StringIO()
    print_preview(result.plan, Console(file=buf, width=120))
    table = buf.getvalue()
    assert "aten.sin.default" in table and "_run_on_cpu_5" in table


@pytest.mark.slow
def test_many_alternating_regions():
    """Hundreds of regions in a long chain: the grouping stays correct at size."""
    gm = torch.fx.symbolic_trace(Chain(400))
    plan = plan_split(gm, OperatorSupport.from_callable(lambda n: n.target is not torch.sin))
    assert len(plan.regions) == 800
    assert all(len(r.node_names) == (2 if r.is_acc else 1) for r in plan.regions)


def test_bad_arguments_are_clear():
    gm = flat_graph(Diamond(), torch.randn(4))
    with pytest.raises(om.OnnxModularError, match="min_acc_module_size must be an int"):
        SplitPass(OperatorSupport.everything(),
                  limits=SplitLimits(min_acc_module_size="2"))(gm)


# ---- end to end: ONNX region models, manifest, runner ----------------------------------------


class Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.nn.functional.gelu(self.fc1(x))
        y = self.norm(self.fc2(h) + x)
        a, b = y.split(4, dim=-1)
        return torch.tanh(a) * b, y.softmax(-1)


@pytest.fixture(scope="module")
def mixed():
    torch.manual_seed(0)
    model = Mixed().eval()
    args = x8()
    result = om.split(model, args, support={"deny": ["aten.gelu", "aten.tanh"]})
    return model, args, result


@pytest.mark.slow
def test_hand_model_end_to_end(mixed, tmp_path, assert_close):
    model, args, result = mixed
    check_alternating(result)
    assert [r.is_acc for r in result.regions] == [True, False, True, False, True]
    check_acc_models(result, {"aten.gelu.default", "aten.tanh.default"})
    expected = model(*args)
    assert_close(result.graph_module(*args), expected, 0)

    out = result.save(tmp_path / "parts")
    manifest = json.loads((out / "manifest.json").read_text())
    assert [r["name"] for r in manifest["regions"]] == [r.name for r in result.regions]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["manifest.json"] + [f"{r.name}.onnx" for r in result.regions])
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp files left
    first, second = manifest["regions"][0], manifest["regions"][1]
    assert first["kind"] == "acc" and first["file"] == "_run_on_acc_0.onnx"
    assert first["inputs"] == [{"name": "x", "dtype": "float32", "shape": [2, 8],
                                "from": "input"}]
    assert second["inputs"][0]["from"] == "_run_on_acc_0"
    assert "_run_on_cpu_1" in first["outputs"][0]["to"]
    assert [o["name"] for o in manifest["outputs"]] == \
        [o.name for o in result.onnx_model.graph.outputs]
    # each region model stands alone: checker and ORT accept it
    for region in manifest["regions"]:
        proto = onnx.load(str(out / region["file"]))
        onnx.checker.check_model(proto)
        sess = ort.InferenceSession(proto.SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        assert [i.name for i in sess.get_inputs()] == [i["name"] for i in region["inputs"]]

    runner = om.SplitRunner(out)
    assert_close(runner.run(*args), expected)
    assert isinstance(runner.run(*args), tuple)
    assert_close(runner.run(args[0].numpy()), expected)


@pytest.mark.slow
def test_single_file_form(mixed, tmp_path, ort_outputs, assert_close):
    model, args, result = mixed
    path = result.save_single(tmp_path / "split.onnx")
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto)
    region_names = [r.name for r in result.regions]
    assert [f.name for f in proto.functions if f.name.startswith("_run_on_")] == region_names
    assert [n.op_type for n in proto.graph.node] == region_names
    # module functions nest inside the regions (the model's Linear layers)
    module_functions = {f.name for f in proto.functions} - set(region_names)
    assert "Linear" in module_functions
    called = {n.op_type for f in proto.functions for n in f.node}
    assert module_functions <= called
    assert proto.graph.initializer  # weights once, in the main graph, passed to functions
    assert_close(ort_outputs(proto, {"x": args[0]}), model(*args))


@pytest.mark.slow
def test_kwargs_buffers_constants_and_structure(tmp_path, assert_close):
    model, x, bias = MultiOut().eval(), x8()[0], torch.randn(8)
    result = om.split(model, (x,), kwargs={"bias": bias}, support=["aten.linear", "aten.mul"])
    check_alternating(result)
    expected = model(x, bias=bias)
    assert_close(result.graph_module(x, bias=bias), expected, 0)
    result.save(tmp_path)
    assert_close(om.SplitRunner(tmp_path).run(x, bias=bias), expected)
    with pytest.raises(om.OnnxModularError, match="takes 2 tensor input"):
        om.SplitRunner(tmp_path).run(x)


def test_save_errors_are_clear(mixed, tmp_path):
    _, _, result = mixed
    file = tmp_path / "a_file"
    file.write_text("x")
    with pytest.raises(om.OnnxModularError, match="not a directory"):
        result.save(file)
    with pytest.raises(om.OnnxModularError, match="holds no manifest.json"):
        om.SplitRunner(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("build, deny", [
    (gpt2, {"aten.softmax.int", "aten.tanh.default"}),
    (bert, {"aten.gelu.default", "aten.softmax.int"}),
])
def test_transformers_with_deny_lists(build, deny, tmp_path, assert_close):
    model, args = build(2)
    result = om.split(model, args, support=OperatorSupport.deny(sorted(deny)))
    check_alternating(result)
    assert sum(r.is_acc for r in result.regions) >= 3
    assert check_acc_models(result, deny) > 0
    expected = model(*args)
    assert_close(result.graph_module(*args), expected, 0)
    result.save(tmp_path)
    assert_close(om.SplitRunner(tmp_path, acc_providers=["cpu"]).run(*args), expected)


@pytest.mark.slow
def test_ort_cpu_provider_covers_gpt2_in_one_acc_region(tmp_path, assert_close):
    model, args = gpt2(1)
    result = om.split(model, args, support="ort:CPUExecutionProvider")
    assert [(r.name, r.is_acc) for r in result.regions] == [("_run_on_acc_0", True)]
    assert len(result.regions[0].node_names) == sum(
        1 for n in result.program.module().graph.nodes
        if n.op == "call_function")
    result.save(tmp_path)
    assert_close(om.SplitRunner(tmp_path).run(*args), model(*args))


@pytest.mark.slow
def test_region_chains_keep_only_calls_inside_one_region():
    model, x = Stack(2).eval(), x8()[0]
    result = om.split(model, (x,), support={"deny": ["aten.relu"]})
    chains = om.module_call_chains(om.modularize(result.program))
    index = {n: i for i, r in enumerate(result.regions) for n in r.node_names}
    per_region = region_chains(chains, index, len(result.regions))
    first = per_region[0]  # layers.0 straddles acc_0 / cpu_1: only its norm and fc stay
    calls = {c.call_id for chain in first.values() for c in chain}
    assert calls == {"layers.0.norm", "layers.0.fc"}
    for r, mapping in enumerate(per_region):
        assert set(mapping) == {n for n in result.regions[r].node_names if n in chains}


class FlattenedTokens(nn.Module):
    """Two Linears with a dynamic ``reshape(B * T, D)`` between them and a scale after:
    each part's translation numbers its own constants (``val_8``), differently."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        return self.b(self.a(x).reshape(batch * tokens, width)) * 7.0


@pytest.mark.slow
@pytest.mark.parametrize("how", ["stages", "regions"])
def test_the_single_file_keeps_each_parts_own_constants(how: str, tmp_path) -> None:
    """Initializers were pooled by name: the later part got the earlier part's ``val_8``
    (``[-1, 8]`` where it had ``7.0``), and the single file did not load; had the types
    agreed, it would have computed other numbers."""
    torch.manual_seed(0)
    model, x = FlattenedTokens().eval(), torch.randn(2, 5, 8)
    dims = ({0: torch.export.Dim("B", max=8), 1: torch.export.Dim("T", max=32)},)
    program = torch.export.export(model, (x,), dynamic_shapes=dims)
    result = (om.split_stages(program, (x,), split_points={"b": "beginning"}) if how == "stages"
              else om.split(program, (x,), support={"deny": ["aten.linear"]}))
    result.save_single(tmp_path / "single.onnx")
    session = ort.InferenceSession(str(tmp_path / "single.onnx"),
                                   providers=["CPUExecutionProvider"])
    for sample in (x, torch.randn(3, 7, 8)):
        (got,) = session.run(None, {"x": sample.numpy()})
        assert abs(got - model(sample).detach().numpy()).max() < 1e-5


@pytest.mark.parametrize("how", ["stages", "regions"])
def test_the_parts_axes_carry_the_dims_names_as_om_export_writes_them(how: str,
                                                                      tmp_path) -> None:
    """Parts said ``s77``/``s27`` where om.export's file says ``B``/``T``: the same model's
    files disagreed, and a batch_dim given as the symbol still finds its axis."""
    model, x = FlattenedTokens().eval(), torch.randn(2, 5, 8)
    dims = ({0: torch.export.Dim("B", max=8), 1: torch.export.Dim("T", max=32)},)
    program = torch.export.export(model, (x,), dynamic_shapes=dims)
    symbol = str(program.graph_module.graph.find_nodes(op="placeholder")[-1]
                 .meta["val"].shape[0])
    result = (om.split_stages(program, split_points={"b": "beginning"}) if how == "stages"
              else om.split(program, support={"deny": ["aten.linear"]}))
    assert len(result.region_graphs()) >= 2
    manifest = json.loads((result.save(tmp_path / "parts") / "manifest.json").read_text())
    assert manifest["inputs"][0]["shape"] == ["B", "T", 8]
    crossing = {str(d) for part in result.region_graphs()
                for v in [*part.model.graph.inputs, *part.model.graph.outputs]
                for d in v.shape if not isinstance(d, int)}
    assert crossing <= {"B", "T", "B*T", "T*B"} and "B" in crossing, crossing
    runner = om.SplitRunner(tmp_path / "parts", acc_providers="cpu")
    sample = torch.randn(3, 7, 8)
    torch.testing.assert_close(runner.run(sample), model(sample).detach(), rtol=0, atol=1e-5)
    with pytest.raises(om.OnnxModularError, match=f"batch_dim='{symbol}': .* without the "
                       "batch dimension 'B' first"):  # the symbol found its Dim's axis
        result.save_triton(tmp_path / "repo", batch_dim=symbol)
