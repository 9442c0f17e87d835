"""A hand-built hierarchical ONNX model with the call-node metadata CONTRACTS.md specifies.

It stands in for the hierarchical exporter in the validate/compare tests: a ``Net`` of three
``Layer`` calls that share one ``Layer`` function, whose body calls a shared ``Lin`` function.
The nested call node inside the shared body carries the metadata of the call the body was
made from (``layers.0.fc``), as a deduplicated body must.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

DIM = 8
DOMAIN = "hand_hier"


class Lin(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(DIM, DIM) / DIM**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = Lin()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.fc(x))


class Net(nn.Module):
    def __init__(self, n: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def net() -> tuple[Net, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Net().eval(), (torch.randn(2, DIM),)


def _type(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _meta(node: onnx.NodeProto, path: str, cls: type, fx_outputs: list[str]) -> None:
    for key, value in (("onnx_modular.module_path", path), ("onnx_modular.call_id", path),
                       ("onnx_modular.module_type", _type(cls)),
                       ("onnx_modular.fx_outputs", json.dumps(fx_outputs))):
        node.metadata_props.add(key=key, value=value)


def _lin_function(name: str = "Lin", scale: float | None = None) -> onnx.FunctionProto:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["matmul"])]
    if scale is not None:  # a planted error: the body scales its result
        nodes.append(helper.make_node("Constant", [], ["s"],
                                      value=numpy_helper.from_array(np.float32(scale), "s")))
        nodes[0].output[0] = "mm"
        nodes.append(helper.make_node("Mul", ["mm", "s"], ["matmul"]))
    return helper.make_function(DOMAIN, name, ["x", "w"], ["matmul"], nodes,
                                [helper.make_opsetid("", 18)])


def _layer_function(name: str = "Layer", lin: str = "Lin",
                    residual: str = "Add") -> onnx.FunctionProto:
    call = helper.make_node(lin, ["x", "w"], ["matmul"], domain=DOMAIN)
    _meta(call, "layers.0.fc", Lin, ["matmul"])
    nodes = [call, helper.make_node("Relu", ["matmul"], ["relu"]),
             helper.make_node(residual, ["x", "relu"], ["add"])]
    return helper.make_function(DOMAIN, name, ["x", "w"], ["add"], nodes,
                                [helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])


def hierarchical(model: Net, *, layer_ops: dict[int, str] | None = None,
                 weight_scale: dict[int, float] | None = None,
                 lin_scale: dict[int, float] | None = None) -> onnx.ModelProto:
    """The ONNX twin of ``model``; the keyword arguments plant errors in one call each.

    ``layer_ops``: layer index -> residual op (``"Sub"``) in a copy of the Layer body that
    only that call uses. ``weight_scale``: layer index -> factor on that layer's weight
    initializer. ``lin_scale``: layer index -> factor applied inside a copy of the Lin body
    that only that layer's (copied) Layer body calls.
    """
    layer_ops, weight_scale, lin_scale = layer_ops or {}, weight_scale or {}, lin_scale or {}
    functions = {"Lin": _lin_function(), "Layer": _layer_function()}
    nodes, inits = [], []
    previous = "x"
    for i, layer in enumerate(model.layers):
        w = layer.fc.weight.detach().numpy() * weight_scale.get(i, 1.0)
        inits.append(numpy_helper.from_array(w.astype(np.float32), f"layers.{i}.fc.weight"))
        op = "Layer"
        if i in layer_ops or i in lin_scale:
            op, lin = f"Layer_{i}", "Lin"
            if i in lin_scale:
                lin = f"Lin_{i}"
                functions[lin] = _lin_function(lin, lin_scale[i])
            functions[op] = _layer_function(op, lin, layer_ops.get(i, "Add"))
        out = "output" if i == len(model.layers) - 1 else f"add_{i}"
        call = helper.make_node(op, [previous, f"layers.{i}.fc.weight"], [out], domain=DOMAIN,
                                name=f"layers.{i}")
        _meta(call, f"layers.{i}", Layer, [out])
        nodes.append(call)
        previous = out
    graph = helper.make_graph(
        nodes, "Net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, DIM])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [2, DIM])], inits)
    proto = helper.make_model(
        graph, functions=list(functions.values()),
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    proto.ir_version = 10
    onnx.checker.check_model(proto, full_check=True)
    return proto


def isolate_call(proto: onnx.ModelProto, call_id: str,
                 within: onnx.FunctionProto | None = None) -> onnx.FunctionProto:
    """Give the call node ``call_id`` (in the main graph or in ``within``) a private copy of
    its function, so that a change planted in the copy affects that one call only.

    Inside a function body call ids are relative to its module (``c_fc`` for
    ``model.h.0.mlp.c_fc``): a nested call matches by the tail of ``call_id``."""
    nodes = within.node if within is not None else proto.graph.node
    for node in nodes:
        meta = {p.key: p.value for p in node.metadata_props}
        own = meta.get("onnx_modular.call_id")
        if own is None or not (own == call_id or (
                within is not None and call_id.endswith("." + own))):
            continue
        original = next(f for f in proto.functions
                        if f.name == node.op_type and f.domain == node.domain)
        copy = proto.functions.add()
        copy.CopyFrom(original)
        copy.name = f"{original.name}_planted_{len(proto.functions)}"
        node.op_type = copy.name
        return copy
    raise AssertionError(f"no call node {call_id}")
