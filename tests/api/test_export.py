"""Hierarchical export: functions per module call, dedupe, numerics, determinism, saving."""

from __future__ import annotations

import ast
import collections
import os
import re
import warnings as warnings_module

import models
import numpy as np
import onnx
import onnx.inliner
import onnx.numpy_helper
import pytest
import torch
from torch import nn

import onnx_modular as om
from onnx_modular.examples import tiny_gpt, tiny_gpt_inputs
from onnx_modular.lower.translate import quiet_torch_onnx


def _flat_torch(model: nn.Module, args: tuple) -> onnx.ModelProto:
    with quiet_torch_onnx():
        return torch.onnx.export(model, args, dynamo=True, optimize=True).model_proto


def _calls(proto: onnx.ModelProto) -> collections.Counter[str]:
    names = {f.name for f in proto.functions}
    nodes = list(proto.graph.node) + [n for f in proto.functions for n in f.node]
    return collections.Counter(n.op_type for n in nodes if n.op_type in names)


def _non_constant(nodes) -> int:
    return sum(1 for n in nodes if n.op_type != "Constant")


@pytest.fixture(scope="module")
def tiny():
    model, args = tiny_gpt(), tiny_gpt_inputs()
    return model, args, om.export(model, args)


@pytest.mark.slow
def test_tiny_gpt_one_function_per_layer_class(tiny, ort_outputs, assert_close) -> None:
    model, args, result = tiny
    proto = result.model_proto
    onnx.checker.check_model(proto, full_check=True)
    calls = _calls(proto)
    assert calls["Block"] == 4 and "Block_1" not in calls  # 4 layers, one prototype
    block = next(f for f in proto.functions if f.name == "Block")
    assert block.domain == "onnx_modular.examples"
    assert block.doc_string == "onnx_modular.examples.Block"
    assert not any(n.op_type == "Constant" and n.attribute[0].t.dims and
                   np.prod(n.attribute[0].t.dims) > 64 for n in block.node)  # no baked weights
    call = next(n for n in proto.graph.node if n.op_type == "Block")
    meta = {p.key: p.value for p in call.metadata_props}
    assert meta["onnx_modular.module_path"] == "blocks.0"
    assert meta["onnx_modular.module_type"] == "onnx_modular.examples.Block"
    assert_close(ort_outputs(proto, args)[0], model(*args), 1e-4)
    summary = {f.name: f for f in result.functions}
    assert summary["Block"].calls == ("blocks.0", "blocks.1", "blocks.2", "blocks.3")
    assert summary["Block"].module_type == "onnx_modular.examples.Block"


@pytest.mark.slow
def test_the_results_graph_module_compiles_as_it_comes(tiny, assert_close) -> None:
    """export reads only the modularized graphs (their code is generated when the result's
    ``graph_module`` is first read): the module a user gets runs as the model and
    torch.compile traces its first call."""
    from torch.fx._lazy_graph_module import _LazyGraphModule

    model, args, result = tiny
    graph_module = result.graph_module
    assert graph_module is not None
    assert not [m for m in graph_module.modules()
                if isinstance(m, _LazyGraphModule) and m._needs_recompile()]
    torch._dynamo.reset()
    compiled = torch.compile(graph_module, backend="eager", fullgraph=True)
    assert_close(compiled(*args), model(*args), 1e-6)


@pytest.mark.slow
def test_equal_bodies_of_other_shapes_share_one_function(tiny) -> None:
    """qkv (32->96), proj (32->32), fc (32->128) and out (128->32) are one MatMul+Add once
    optimized: one Linear function for all 16 calls; the bias-free head stays apart."""
    result = tiny[2]
    summary = {f.name: f for f in result.functions}
    linear = summary["Linear"]
    assert len(linear.calls) == 16
    assert {c.rsplit(".", 1)[1] for c in linear.calls} == {"qkv", "proj", "fc", "out"}
    assert summary["Linear_1"].calls == ("head",)
    assert sorted(summary) == ["Attention_module", "Block", "Embedding", "GELU", "LayerNorm",
                               "Linear", "Linear_1", "MLP"]
    body = next(f for f in result.model_proto.functions if f.name == "Linear")
    assert not body.value_info  # one body for four shapes: no shape of one call is recorded


@pytest.mark.slow
def test_matches_flat_export_and_inlines_to_its_size(tiny, ort_outputs, assert_close) -> None:
    model, args, result = tiny
    proto = result.model_proto
    flat = _flat_torch(model, args)
    assert_close(ort_outputs(proto, args)[0], ort_outputs(flat, args)[0], 1e-6)
    inlined = onnx.inliner.inline_local_functions(proto)
    assert _non_constant(inlined.graph.node) <= 1.1 * _non_constant(flat.graph.node)
    ours_flat = om.export(model, args, functions="none").model_proto
    assert not ours_flat.functions
    assert_close(ort_outputs(ours_flat, args)[0], ort_outputs(flat, args)[0], 1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_inlined_hierarchical_is_the_flat_model(name: str, ort_outputs, assert_close) -> None:
    """Invariant 2: same multiset of ops, same topology, bit-identical ORT outputs."""
    model, args = models.ARCHITECTURES[name](layers=2)
    hierarchical = om.export(model, args).model_proto
    flat = om.export(model, args, functions="none").model_proto
    onnx.checker.check_model(flat, full_check=True)
    assert not flat.functions
    inlined = onnx.inliner.inline_local_functions(hierarchical)
    # Constants are nodes inside functions and shared initializers in the flat graph.
    histogram = collections.Counter(n.op_type for n in inlined.graph.node
                                    if n.op_type != "Constant")
    assert histogram == collections.Counter(n.op_type for n in flat.graph.node)
    assert not any(n.op_type == "Constant" for n in flat.graph.node)
    report = om.compare(hierarchical, flat, inputs=args)
    assert report.same_structure and report.equivalent
    assert_close(ort_outputs(hierarchical, args)[0], ort_outputs(flat, args)[0], 0)


class _SharedTwice(nn.Module):
    """One instance called twice (shared, shared@1) and two identical layers."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.shared(self.shared(x))
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.slow
def test_flat_nodes_name_their_own_module_call() -> None:
    """Inlining a shared body moves its labels to each call: layer 1's nodes say layers.1."""
    torch.manual_seed(0)
    flat = om.export(_SharedTwice(), (torch.randn(2, 8),), functions="none").model_proto
    labels = [{p.key: p.value for p in n.metadata_props} for n in flat.graph.node]
    by_call = collections.defaultdict(list)
    for i, meta in enumerate(labels):
        by_call[meta.get("onnx_modular.call_id")].append(i)
        scopes = meta.get("pkg.torch.onnx.name_scopes")
        if scopes and "onnx_modular.module_path" in meta:  # torch.onnx's scopes agree
            *calls, _node = ast.literal_eval(scopes)
            path = meta["onnx_modular.module_path"]
            assert calls[0] == "" and calls[-1] == path, scopes
            # here calls nest as their paths do: no other call's ancestors in the chain
            assert all(path.startswith(c + ".") for c in calls[1:-1]), scopes
    assert {"shared.0", "shared.0@1", "layers.0.0", "layers.1.0", "layers.1.1"} <= set(by_call)
    for call_id, members in by_call.items():  # each call's nodes are one contiguous run
        assert members == list(range(members[0], members[-1] + 1)), call_id


@pytest.mark.slow
def test_deterministic_bytes(tiny, tmp_path) -> None:
    result = tiny[2]
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    result.save(a)
    om.export(tiny_gpt(), tiny_gpt_inputs()).save(b)
    assert a.read_bytes() == b.read_bytes()


class GatedBlock(nn.Module):
    def __init__(self, gelu: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.GELU() if gelu else nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.fc(x))


class Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([GatedBlock(False), GatedBlock(False), GatedBlock(True)])
        self.shared = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.shared(torch.tanh(self.shared(x)))


@pytest.mark.slow
def test_really_different_bodies_get_separate_functions_and_shared_calls_share(
        ort_outputs, assert_close) -> None:
    model, args = Mixed().eval(), models.x8()
    proto = om.export(model, args).model_proto
    onnx.checker.check_model(proto, full_check=True)
    calls = _calls(proto)
    assert calls["GatedBlock"] == 2 and calls["GatedBlock_1"] == 1
    shared = [n for n in proto.graph.node
              if any(p.value == "shared" for p in n.metadata_props)]
    assert len(shared) == 2 and shared[0].op_type == shared[1].op_type
    ids = [next(p.value for p in n.metadata_props if p.key == "onnx_modular.call_id")
           for n in shared]
    assert ids[0] != ids[1]
    assert_close(ort_outputs(proto, args)[0], model(*args), 1e-5)
    no_dedupe = om.export(model, args, dedupe=False).model_proto
    assert len(no_dedupe.functions) > len(proto.functions)


@pytest.mark.slow
@pytest.mark.parametrize("functions, expected", [
    (["GatedBlock"], {"GatedBlock", "GatedBlock_1"}),
    ([GatedBlock], {"GatedBlock", "GatedBlock_1"}),
    (["layers.2", "shared"], {"GatedBlock", "Linear"}),
])
def test_function_subsets(functions, expected, ort_outputs, assert_close) -> None:
    model, args = Mixed().eval(), models.x8()
    proto = om.export(model, args, functions=functions).model_proto
    assert {f.name for f in proto.functions} == expected
    assert_close(ort_outputs(proto, args)[0], model(*args), 1e-5)


@pytest.mark.slow
def test_multiple_outputs_kwargs_buffers(ort_outputs, assert_close) -> None:
    model, args = models.MultiOut().eval(), models.x8()
    kwargs = {"bias": torch.randn(8)}
    result = om.export(model, args, kwargs)
    proto = result.model_proto
    onnx.checker.check_model(proto, full_check=True)
    got = ort_outputs(proto, {"x": args[0], "bias": kwargs["bias"]})
    assert_close(got, model(*args, **kwargs), 1e-6)
    assert "TwoOut" in {f.name for f in proto.functions}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", pytest.param("llama", marks=pytest.mark.slow),
                                  "bert"])
def test_transformers(name: str, ort_outputs, assert_close) -> None:
    model, args = models.ARCHITECTURES[name](layers=3)
    layer = models.ARCHITECTURES[name].layer
    proto = om.export(model, args).model_proto
    onnx.checker.check_model(proto, full_check=True)
    calls = _calls(proto)
    assert calls[layer] == 3 and f"{layer}_1" not in calls
    got = ort_outputs(proto, args)[0]
    assert_close(got, model(*args), 1e-4)
    flat = _flat_torch(model, args)
    assert_close(got, ort_outputs(flat, args)[0], 1e-6)
    inlined = onnx.inliner.inline_local_functions(proto)
    assert _non_constant(inlined.graph.node) <= 1.1 * _non_constant(flat.graph.node)
    # Shapes, axes and scalars stay inside the bodies: an initializer a call is given is a
    # weight of the model or a folded tensor (a mask, rotary tables), never a Reshape target.
    weights = {name for name, _ in model.named_parameters()} | {
        name for name, _ in model.named_buffers()}
    sizes = {i.name: int(np.prod(i.dims)) for i in proto.graph.initializer}
    nodes = list(proto.graph.node) + [n for f in proto.functions for n in f.node]
    fed = {name for n in nodes if n.op_type in calls for name in n.input} & sizes.keys()
    assert fed & weights
    assert not {n: sizes[n] for n in fed - weights if sizes[n] <= 16}


@pytest.mark.slow
def test_dynamic_batch_and_opset(ort_outputs, assert_close) -> None:
    model, args = models.Stack(2).eval(), models.x8(2)
    batch = torch.export.Dim("batch", min=1, max=64)
    proto = om.export(model, args, dynamic_shapes=({0: batch},), opset=19).model_proto
    assert {o.domain: o.version for o in proto.opset_import}[""] == 19
    x5 = torch.randn(5, 8)
    assert_close(ort_outputs(proto, (x5,))[0], model(x5), 1e-5)


@pytest.mark.slow
def test_exported_program_input_and_external_data(tmp_path, ort_outputs, assert_close) -> None:
    model, args = models.Stack(3, dim=16).eval(), (torch.randn(2, 16),)
    ep = torch.export.export(model, args)
    result = om.export(ep)
    path = tmp_path / "m.onnx"
    result.save(path, external_data_threshold=100)  # lowered from 2 GB
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 2 and names[0] == "m.onnx"
    assert re.fullmatch(r"m\.onnx\.[0-9a-f]{8}\.data", names[1])  # a name of its own per save
    assert (tmp_path / names[1]).stat().st_size > 0
    umask = os.umask(0)
    os.umask(umask)
    for name in names:  # as readable as any file the user writes
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~umask
    loaded = onnx.load(str(path))
    assert_close(ort_outputs(loaded, args)[0], model(*args), 1e-5)
    # The in-memory model still holds its weights: it saves again, inline this time.
    result.save(tmp_path / "again.onnx")
    again = onnx.load(str(tmp_path / "again.onnx"))
    assert_close(ort_outputs(again, args)[0], ort_outputs(loaded, args)[0], 0)


@pytest.mark.slow
def test_save_to_unwritable_place_leaves_nothing(tmp_path) -> None:
    result = om.export(models.Stack(1).eval(), models.x8())
    with pytest.raises(om.OnnxModularError, match="does not exist"):
        result.save(tmp_path / "missing" / "m.onnx")
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, 0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user who can write anywhere")
        with pytest.raises(om.OnnxModularError, match="not writable"):
            result.save(locked / "m.onnx")
        assert list(locked.iterdir()) == []
    finally:
        os.chmod(locked, 0o700)


@pytest.mark.slow  # over the inner loop's CPU budget per test (tests/conftest.py)
def test_untranslatable_op_is_a_clear_error() -> None:
    lib = torch.library.Library("om_test_export", "FRAGMENT")
    lib.define("mystery(Tensor x) -> Tensor")
    lib.impl("mystery", lambda x: x * 2, "CompositeExplicitAutograd")
    lib.impl("mystery", lambda x: torch.empty_like(x), "Meta")

    class Weird(nn.Module):
        def forward(self, x):
            return torch.ops.om_test_export.mystery(x) + 1

    with pytest.raises(om.OnnxModularError, match="OM0202.*torch.onnx could not translate"):
        om.export(Weird(), (torch.randn(3),))


def test_not_a_module_is_a_clear_error() -> None:
    with pytest.raises(om.OnnxModularError, match="nn.Module or an ExportedProgram"):
        om.export(lambda x: x, (torch.randn(2),))


def test_export_failure_is_one_line_naming_the_model() -> None:
    class Branchy(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x - 1  # data-dependent: torch.export refuses

    with pytest.raises(om.OnnxModularError) as info:
        om.export(Branchy(), (torch.randn(3),))
    message = str(info.value)
    assert "OM0201" in message and "Branchy" in message and "\n" not in message
    program = om.capture(models.Stack(1).eval(), models.x8())
    assert om.capture(program, ()) is program  # an ExportedProgram passes through


@pytest.mark.slow
def test_opset_below_18_is_refused_for_functions_but_flat_converts(ort_outputs,
                                                                    assert_close) -> None:
    model, args = models.Stack(1).eval(), models.x8()
    with pytest.raises(om.OnnxModularError, match="opset 17 is below 18"):
        om.export(model, args, opset=17)
    with quiet_torch_onnx():
        proto = om.export(model, args, opset=17, functions="none").model_proto
    assert {o.domain: o.version for o in proto.opset_import}[""] == 17 and not proto.functions
    assert_close(ort_outputs(proto, args)[0], model(*args), 1e-5)


@pytest.mark.slow
def test_deterministic_across_processes(tmp_path) -> None:
    """Set and dict orders vary with the hash seed between processes; the bytes must not."""
    import subprocess
    import sys

    script = (
        "import sys; sys.path.insert(0, sys.argv[2]); import models, onnx_modular as om; "
        "om.export(*models.gpt2(2)).save(sys.argv[1])"
    )
    tests_dir = os.path.dirname(os.path.dirname(__file__))  # where models.py is
    outputs = []
    for seed in ("1", "2"):
        out = tmp_path / f"m{seed}.onnx"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run([sys.executable, "-c", script, str(out), tests_dir], check=True, env=env,
                       capture_output=True)
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]


@pytest.mark.slow  # over the inner loop's session budget
def test_misspelt_function_selection_is_reported() -> None:
    """In the diagnostics, and as a Python warning where the caller gave no context (a
    dynamic size torch fixed was a diagnostic alone: nothing told the user)."""
    model, args = Mixed().eval(), models.x8()
    with pytest.warns(om.OnnxModularWarning, match=r"\['GatedBlok'\] matched no module"):
        result = om.export(model, args, functions=["GatedBlock", "GatedBlok"])
    assert {f.name for f in result.functions} == {"GatedBlock", "GatedBlock_1"}
    warnings = [d for d in result.diagnostics if d.level == om.Level.WARNING]
    assert len(warnings) == 1 and "['GatedBlok'] matched no module call" in warnings[0].message
    with warnings_module.catch_warnings():
        warnings_module.simplefilter("error", om.OnnxModularWarning)  # the caller's context
        om.export(model, args, functions=["GatedBlok"], ctx=om.DiagnosticContext())


@pytest.mark.slow
def test_layer_functions_inline_to_torch_onnx_flat_size(ort_outputs, assert_close) -> None:
    """Inside a body the optimizer cannot fold Reshape(Reshape(x)) (its rule writes an
    initializer); ours does, so a layer body is as small as the flat graph's layer."""
    model, args = models.gpt2(2)
    proto = om.export(model, args, functions=["GPT2Block"]).model_proto
    inlined = onnx.inliner.inline_local_functions(proto)
    flat = _flat_torch(model, args)
    assert _non_constant(inlined.graph.node) <= _non_constant(flat.graph.node)
    assert_close(ort_outputs(proto, args)[0], ort_outputs(flat, args)[0], 1e-6)
    # ORT makes each Constant of each call an initializer: the body holds each value once
    body = next(f for f in proto.functions if f.name == "GPT2Block")
    arrays = [onnx.numpy_helper.to_array(n.attribute[0].t) for n in body.node
              if n.op_type == "Constant"]
    held = [(a.dtype.str, a.shape, a.tobytes()) for a in arrays]
    assert len(held) > 1 and len(set(held)) == len(held)


class _CompiledRegionBlock(torch.nn.Module):
    """A block whose forward is a ``torch.compiler.nested_compile_region`` (torch's own way
    to mark a repeated layer: ``invoke_subgraph``)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.fc = torch.nn.LayerNorm(8), torch.nn.Linear(8, 8)

    @torch.compiler.nested_compile_region
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.fc(self.norm(x)))


@pytest.mark.slow
def test_blocks_under_nested_compile_region_export_hierarchically() -> None:
    """torch.onnx makes no function of them; the module hierarchy makes one per class."""
    model = torch.nn.Sequential(*[_CompiledRegionBlock() for _ in range(3)]).eval()
    args = (torch.randn(2, 8),)
    result = om.export(model, args)
    (block,) = [f for f in result.functions if f.name == "_CompiledRegionBlock"]
    assert block.calls == ("0", "1", "2")
    assert om.validate(model, args, result, providers=["cpu"]).ok


@pytest.mark.slow
def test_a_name_only_called_inside_a_compiled_region_says_why_and_what_to_select() -> None:
    """torch.export records no module call inside a nested_compile_region: "matched no
    module call" alone read as a misspelling of a class the model holds."""
    model = torch.nn.Sequential(*[_CompiledRegionBlock() for _ in range(3)]).eval()
    with pytest.warns(om.OnnxModularWarning) as caught:
        result = om.export(model, (torch.randn(2, 8),), functions=["LayerNorm", "Linaer"])
    (message,) = [str(w.message) for w in caught if "matched no module call" in str(w.message)]
    assert "['LayerNorm', 'Linaer'] matched no module call" in message
    assert ("the model holds LayerNorm ('0.norm', '1.norm' and 1 more) but torch.export "
            "recorded no call of it" in message)
    assert "select the enclosing _CompiledRegionBlock ('0')" in message
    assert "Linaer (" not in message  # a misspelling the model does not hold gets no hint
    assert not result.functions


class _Gated(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.a(x) * torch.sigmoid(self.b(y))


class _GatedStack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([_Gated() for _ in range(3)])

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.layers[0](x, y)
        h = self.layers[1](h, h)  # one tensor for both parameters
        return self.layers[2](h, y)


@pytest.mark.slow
def test_a_layer_given_one_tensor_for_two_parameters_calls_the_layer_function() -> None:
    model, args = _GatedStack().eval(), (torch.randn(2, 8), torch.randn(2, 8))
    result = om.export(model, args, functions=["_Gated"])
    (gated,) = result.functions
    assert gated.calls == ("layers.0", "layers.1", "layers.2")
    call = [n for n in result.model_proto.graph.node if n.op_type == "_Gated"][1]
    assert call.input[0] == call.input[3]
    assert om.validate(model, args, result, providers=["cpu"]).ok


class _Mixing(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(8, 8) for _ in range(3))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.q(q) * torch.sigmoid(self.k(k)) + torch.tanh(self.v(v))


class _MixingStack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([_Mixing() for _ in range(4)])

    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        h = self.layers[0](x, y, z)
        h = self.layers[1](h, h, h)  # one tensor for all three parameters
        h = self.layers[2](h, y, y)
        return self.layers[3](x, h, x)


@pytest.mark.slow
def test_a_layer_given_one_tensor_for_three_parameters_calls_the_layer_function() -> None:
    model, args = _MixingStack().eval(), tuple(torch.randn(2, 8) for _ in range(3))
    result = om.export(model, args, functions=["_Mixing"])
    (mixing,) = result.functions
    assert mixing.calls == tuple(f"layers.{i}" for i in range(4))
    first, second, third, _ = [n for n in result.model_proto.graph.node
                               if n.op_type == "_Mixing"]
    assert collections.Counter(second.input)[first.output[0]] == 3
    assert collections.Counter(third.input)["y"] == 2
    assert om.validate(model, args, result, providers=["cpu"]).ok


@pytest.mark.slow
def test_dynamic_shapes_torch_guards_against_are_captured_as_torch_onnx_captures() -> None:
    """MobileBERT under a dynamic sequence: torch.export's guard ``seq - 1 != 1`` failed
    the export (torch.onnx, capturing without size specialization, succeeds); now it is
    captured again that way, and the file matches torch at other sizes."""
    from transformers import MobileBertConfig, MobileBertModel

    torch.manual_seed(0)
    config = MobileBertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                              num_attention_heads=4, intermediate_size=64, embedding_size=16,
                              intra_bottleneck_size=16, true_hidden_size=16,
                              num_feedforward_networks=2)
    model = MobileBertModel(config).eval()
    ids = torch.randint(0, 99, (2, 8))
    dims = {0: torch.export.Dim("batch", max=16), 1: torch.export.Dim("seq", max=60)}
    result = om.export(model, (ids,), dynamic_shapes=(dims,))
    import onnxruntime as ort

    session = ort.InferenceSession(result.model_proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    assert any("without size specialization" in d.message for d in result.diagnostics)
    for shape in ((2, 8), (1, 5), (3, 11), (2, 2)):  # seq 2: the guard's own edge
        sample = torch.randint(0, 99, shape)
        with torch.no_grad():
            want = model(sample).last_hidden_state.numpy()
        got = session.run(None, {session.get_inputs()[0].name: sample.numpy()})[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


class EightOnly(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.shape[1] == 8 else x


def test_a_dimension_the_model_fixes_is_exported_static_with_a_warning() -> None:
    """``x.shape[1] == 8`` fixes the dimension marked dynamic: torch.export refuses, torch.onnx
    exports with torch's suggested fix (``seq = 8``) silently; here a warning says so."""
    dims = {1: torch.export.Dim("seq", max=60)}
    result = om.export(EightOnly(), (torch.randn(2, 8),), dynamic_shapes=(dims,))
    (warning,) = [d for d in result.diagnostics if d.level == om.Level.WARNING
                  and "dynamic_shapes" in d.message]
    assert "seq = 8" in warning.message
    assert [d.dim_value for d in result.model_proto.graph.input[0].type.tensor_type.shape.dim] \
        == [2, 8]


def test_a_violated_constraint_keeps_torchs_reason_and_fix() -> None:
    """The one line kept only "Constraints violated (seq)!"."""
    from onnx_modular.lower.capture import _telling_line

    dims = {1: torch.export.Dim("seq", max=60)}
    with pytest.raises(Exception) as e:
        torch.export.export(EightOnly(), (torch.randn(2, 8),), dynamic_shapes=(dims,),
                            strict=False)
    line = _telling_line(e.value)
    assert line.startswith("Constraints violated (seq)!")
    assert "specialized it to be a constant (8)" in line and "Suggested fixes: seq = 8" in line
    assert "\n" not in line
