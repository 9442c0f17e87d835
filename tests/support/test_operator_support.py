"""OperatorSupport: names, lists, callables, combinations, files, ONNX Runtime kernel registries."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from torch import nn

from onnx_modular import OnnxModularError, OperatorSupport
from onnx_modular.leaves.metadata import fx_name
from onnx_modular.support.onnx_index import SupportContext, fx_to_onnx_nodes
from onnx_modular.support.operator_support import load_support_file, node_op_name, resolve_support
from onnx_modular.support.ort_kernels import ort_kernel_registry


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.nn.functional.gelu(self.fc(x))
        values, _ = torch.max(y, dim=-1)
        return torch.relu(y) + 1.0, values


@pytest.fixture(scope="module")
def graph() -> torch.fx.GraphModule:
    ep = torch.export.export(Small(), (torch.randn(2, 8),), strict=False)
    return ep.run_decompositions({}).module()


def nodes_by_op(gm: torch.fx.GraphModule) -> dict[str, torch.fx.Node]:
    return {node_op_name(n): n for n in gm.graph.nodes if n.op == "call_function"}


@pytest.mark.slow
def test_allow_list_by_overload_and_packet(graph):
    nodes = nodes_by_op(graph)
    by_overload = OperatorSupport.allow(["aten.gelu.default"])
    by_packet = OperatorSupport.allow(["aten.gelu"])
    for support in (by_overload, by_packet):
        assert support.is_node_supported(nodes["aten.gelu.default"])
        assert not support.is_node_supported(nodes["aten.relu.default"])
    # spellings users copy from elsewhere
    assert resolve_support(["torch.ops.aten.relu.default"])(nodes["aten.relu.default"])
    assert resolve_support(["aten::relu"])(nodes["aten.relu.default"])


def test_getitem_follows_its_producer(graph):
    getitem = next(n for n in graph.graph.nodes if node_op_name(n) == "getitem")
    assert OperatorSupport.allow(["aten.max"])(getitem)
    assert not OperatorSupport.allow(["aten.gelu"])(getitem)
    assert not OperatorSupport.deny(["aten.max.dim"])(getitem)
    assert OperatorSupport.deny(["aten.gelu"])(getitem)


def test_deny_list_and_combinations(graph):
    nodes = nodes_by_op(graph)
    gelu, relu, linear = (nodes[k] for k in
                          ("aten.gelu.default", "aten.relu.default", "aten.linear.default"))
    deny = OperatorSupport.deny(["aten.gelu"])
    assert not deny(gelu) and deny(relu)
    assert (~deny)(gelu) and not (~deny)(relu)
    both = OperatorSupport.allow(["aten.gelu", "aten.relu"]) & OperatorSupport.deny(["aten.relu"])
    assert both(gelu) and not both(relu) and not both(linear)
    either = OperatorSupport.allow(["aten.gelu"]) | (lambda n: n.name.startswith("relu"))
    assert either(gelu) and either(relu) and not either(linear)
    mapping = resolve_support({"allow": ["aten.gelu", "aten.relu"], "deny": ["aten.gelu"]})
    assert mapping(relu) and not mapping(gelu)


def test_constructor_and_torch_fx_supports(graph):
    from torch.fx.passes.operator_support import OperatorSupport as FxSupport

    nodes = nodes_by_op(graph)
    gelu, relu = nodes["aten.gelu.default"], nodes["aten.relu.default"]
    both = OperatorSupport(["aten.gelu", "aten.relu"], deny=["aten.relu"])
    assert both(gelu) and not both(relu)
    assert OperatorSupport(deny=["aten.gelu"])(relu) and OperatorSupport()(gelu)
    assert OperatorSupport(lambda n: n is gelu)(gelu)
    # torch.fx's own support objects and support_dicts work as they are
    fx = FxSupport({"torch.ops.aten.gelu.default": None})
    assert resolve_support(fx)(gelu) and not resolve_support(fx)(relu)
    as_dict = resolve_support({"aten.gelu.default": None})
    assert as_dict(gelu) and not as_dict(relu)


def test_callable_and_placeholders(graph):
    support = resolve_support(lambda n: "gelu" in n.name)
    nodes = nodes_by_op(graph)
    assert support(nodes["aten.gelu.default"]) and not support(nodes["aten.relu.default"])
    placeholder = next(n for n in graph.graph.nodes if n.op == "placeholder")
    assert not OperatorSupport.everything()(placeholder)  # only operators run anywhere


def test_bad_specs_are_one_line_errors():
    with pytest.raises(OnnxModularError, match="unknown operator 'aten.gelux'"):
        OperatorSupport.deny(["aten.gelux"])
    with pytest.raises(OnnxModularError, match="has overloads"):
        OperatorSupport.allow(["aten.gelu.nope"])
    with pytest.raises(OnnxModularError, match="not an operator name"):
        OperatorSupport.allow(["gelu"])
    with pytest.raises(OnnxModularError, match="support must be"):
        resolve_support(42)
    with pytest.raises(OnnxModularError, match="unknown operator 'permit'|not an operator"):
        resolve_support({"permit": ["aten.gelu"]})


def test_support_files(tmp_path, graph):
    nodes = nodes_by_op(graph)
    gelu, relu = nodes["aten.gelu.default"], nodes["aten.relu.default"]
    text = tmp_path / "ops.txt"
    text.write_text("# accelerator ops\naten.gelu\naten.relu.default  # comment\n")
    support = load_support_file(text)
    assert support(gelu) and support(relu) and not support(nodes["aten.linear.default"])
    deny = tmp_path / "deny.txt"
    deny.write_text("!aten.gelu\n")
    assert not load_support_file(deny)(gelu) and load_support_file(deny)(relu)
    js = tmp_path / "ops.json"
    js.write_text(json.dumps({"deny": ["aten.relu"]}))
    assert load_support_file(js)(gelu) and not load_support_file(js)(relu)
    js.write_text(json.dumps(["aten.relu"]))
    assert load_support_file(js)(relu) and not load_support_file(js)(gelu)
    js.write_text("[not json")
    with pytest.raises(OnnxModularError, match="invalid JSON"):
        load_support_file(js)
    with pytest.raises(OnnxModularError, match="no such file"):
        load_support_file(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("# nothing\n")
    with pytest.raises(OnnxModularError, match="names no operator"):
        load_support_file(tmp_path / "empty.txt")


def test_ort_kernel_registry_versions_and_types():
    cpu = ort_kernel_registry("cpu")
    assert cpu.provider == "CPUExecutionProvider"
    assert cpu.supports("Gelu", "", 20)
    assert cpu.supports("Add", "ai.onnx", 14, {"T": "tensor(float)"})
    assert not cpu.supports("Add", "", 14, {"T": "tensor(string)"})
    assert not cpu.supports("NoSuchOp", "", 20)
    assert not cpu.supports("Gelu", "", 19)  # Gelu entered the default domain at opset 20
    assert cpu.supports("CastLike", "", 20)  # a function op: ORT expands it
    assert cpu.supports("Gelu", "", 20) and len(cpu._cache) >= 1  # cached per key


def test_ort_provider_without_kernels_is_a_clear_error():
    with pytest.raises(OnnxModularError, match="no kernels for 'NoSuchExecutionProvider'"):
        resolve_support("ort:NoSuch")


@pytest.mark.slow
def test_ort_support_reads_the_translation(graph):
    support = resolve_support("ort:CPUExecutionProvider")
    gelu = nodes_by_op(graph)["aten.gelu.default"]
    with pytest.raises(OnnxModularError, match="ONNX translation"):
        support(gelu)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(Small(), (torch.randn(2, 8),), strict=False)
        onnx_program = torch.onnx.export(ep, dynamo=True, optimize=False, verbose=False)
    model = onnx_program.model
    mapping = fx_to_onnx_nodes(model)
    assert all(fx_name(n) in mapping for n in model.graph)
    context = SupportContext(mapping, dict(model.opset_imports))
    fx = onnx_program.exported_program.graph_module
    nodes = nodes_by_op(fx)
    assert support(nodes["aten.gelu.default"], context)
    # the same FX node is unsupported once one of its ONNX ops has no kernel
    import onnx_ir as ir

    gelu_nodes = [*mapping["gelu"], ir.Node("", "NoSuchOp", [], version=20)]
    fake = SupportContext({**mapping, "gelu": gelu_nodes}, dict(model.opset_imports))
    assert not support(nodes["aten.gelu.default"], fake)
    assert support(nodes["aten.linear.default"], fake)
