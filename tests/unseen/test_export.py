"""Models and inputs the other tests do not use: more architectures, and what broke on them.

Transformers models come from the registry (models.py): tiny configs, random weights.
"""

from __future__ import annotations

import collections
from pathlib import Path

import models
import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch
from torch import nn

import onnx_modular as om
from onnx_modular.emit.canonical import graph_key
from onnx_modular.passes.modularize import iter_module_calls

pytestmark = pytest.mark.slow  # whole models: the full suite, not the inner loop

# Architectures no other export test runs; each has one layer function, called per layer.
UNSEEN = ["opt", "gpt_neox", "falcon", "bloom", "t5_encoder", "deberta_v2", "clip_vision",
          "whisper_encoder",
          # Mamba's two blocks used to become two functions each (MambaBlock, MambaBlock_1...):
          # a shared constant shifted the node numbering of the structural key.
          "mamba"]

def _sites(proto: onnx.ModelProto) -> collections.Counter[str]:
    names = {f.name for f in proto.functions}
    return collections.Counter(n.op_type for g in [proto.graph, *proto.functions]
                               for n in g.node if n.op_type in names)


@pytest.mark.parametrize("name", UNSEEN)
def test_unseen_architecture(name: str, ort_outputs, assert_close) -> None:
    model, args = models.ARCHITECTURES[name]()
    layer = models.ARCHITECTURES[name].layer
    ep = torch.export.export(model, args)
    gm = om.modularize(ep)
    assert torch.equal(gm(*args), ep.module()(*args))
    assert all(sub.module_path and sub.module_type for _, sub in iter_module_calls(gm))

    proto = om.export(model, args).model_proto
    onnx.checker.check_model(proto, full_check=True)
    with torch.no_grad():
        expected = model(*args)
    assert_close(ort_outputs(proto, args)[0], expected, 1e-4)
    layers = {f.name: f for f in proto.functions if f.doc_string.endswith("." + layer)}
    assert list(layers) == [layer], f"one function for {layer}, got {list(layers)}"
    assert _sites(proto)[layer] == 2  # one call per layer


@pytest.mark.slow
@pytest.mark.parametrize("name", ["opt"])
def test_unseen_flat_equals_hierarchical_and_bytes_are_stable(name: str, ort_outputs,
                                                               assert_close) -> None:
    model, args = models.ARCHITECTURES[name]()
    first = om.export(model, args).model_proto
    flat = om.export(model, args, functions="none").model_proto
    assert not flat.functions
    assert_close(ort_outputs(first, args)[0], ort_outputs(flat, args)[0], 1e-6)
    assert om.export(model, args).model_proto.SerializeToString() == first.SerializeToString()
    # through the hook too: unchanged torch.onnx.export calls give the same bytes each time
    with om.hook():
        hooked = [torch.onnx.export(model, args, dynamo=True).model_proto.SerializeToString()
                  for _ in range(2)]
    assert hooked[0] == hooked[1]


def test_key_ignores_where_a_constant_sits() -> None:
    """torch.onnx shares one Constant between calls; the first call keeps the original, at a
    different place than the copies the others get. The bodies are still interchangeable."""
    def body(constant_first: bool) -> ir.Graph:
        x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
        const = ir.node("Constant", [], attributes={"value": ir.tensor(np.array([2.0], "f"))})
        relu = ir.node("Relu", [x])
        mul = ir.node("Mul", [relu.outputs[0], x])
        add = ir.node("Add", [mul.outputs[0], const.outputs[0]])
        order = [const, relu, mul, add] if constant_first else [relu, mul, const, add]
        return ir.Graph([x], add.outputs, nodes=order, opset_imports={"": 18})

    assert graph_key(body(True)) == graph_key(body(False))


class _Inner(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.om_unseen.mystery(x) + 1


class _Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * 3


def test_untranslatable_op_error_names_op_node_and_module() -> None:
    lib = torch.library.Library("om_unseen", "FRAGMENT")
    lib.define("mystery(Tensor x) -> Tensor")
    lib.impl("mystery", lambda x: x * 2, "CompositeExplicitAutograd")
    lib.impl("mystery", lambda x: torch.empty_like(x), "Meta")
    with pytest.raises(om.OnnxModularError) as info:
        om.export(_Outer(), (torch.randn(3),))
    message = str(info.value)
    assert "\n" not in message and "Refer to the full stack trace" not in message
    assert "om_unseen.mystery" in message and "node 'mystery'" in message
    assert "module 'inner'" in message and Path(__file__).name in message


def test_unreachable_opset_is_a_clear_error_not_an_invalid_model() -> None:
    model, args = nn.Sequential(nn.Linear(4, 4), nn.GELU()), (torch.randn(2, 4),)
    with pytest.raises(om.OnnxModularError, match="OM0202.*opset 99") as info:
        om.export(model, args, opset=99)
    assert "\n" not in str(info.value)


def test_functions_of_a_wrong_type_is_a_clear_error() -> None:
    with pytest.raises(om.OnnxModularError, match="OM0104.*functions= takes.*got 42"):
        om.export(nn.Linear(4, 4), (torch.randn(2, 4),), functions=42)


class _Branches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda x: self.a(x), lambda x: self.b(x).relu(), (x,))


def test_torch_cond_exports_and_bytes_are_stable(ort_outputs, assert_close) -> None:
    """Branch code is generated (``<eval_with_key>.N``, N counting up in the process): the
    source locations must not carry N, or a second export differs."""
    model, args = _Branches().eval(), (torch.randn(2, 4),)
    ep = torch.export.export(model, args)
    assert torch.equal(om.modularize(ep)(*args), ep.module()(*args))
    first = om.export(model, args).model_proto
    onnx.checker.check_model(first, full_check=True)
    assert_close(ort_outputs(first, args)[0], model(*args), 1e-5)
    assert om.export(model, args).model_proto.SerializeToString() == first.SerializeToString()
