"""Small onnx_ir models built by hand, with the metadata the emit functions read.

A translated node names its FX node (``pkg.torch.onnx.fx_node``) and its output is named
after it, as torch.onnx does; ``chains`` maps FX node names to the module calls they ran in
(outermost first), as ``module_call_chains`` of a modularized program does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnx_modular.leaves.metadata import FX_NODE, CallInfo

FLOAT = ir.TensorType(ir.DataType.FLOAT)
OPSET = 18


def value(name: str, shape: Sequence[int] = (2, 4), dtype: ir.DataType = ir.DataType.FLOAT
          ) -> ir.Value:
    return ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(shape))


def weight(name: str, shape: Sequence[int] = (4, 4), seed: int = 0) -> ir.Value:
    """An initializer holding random float32 values."""
    array = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return ir.Value(name=name, type=FLOAT, shape=ir.Shape(shape),
                    const_value=ir.tensor(array, name=name))


def fx(op_type: str, inputs: Sequence[ir.Value | None], name: str,
       shape: Sequence[int] | None = (2, 4), **attributes: object) -> ir.Node:
    """A node translated from FX node ``name``: its output is ``name``, typed float."""
    node = ir.node(op_type, list(inputs), attributes=attributes or None, name=f"n_{name}",
                   metadata_props={FX_NODE: f"%{name} : [num_users=1] = call_function"})
    out = node.outputs[0]
    out.name, out.type = name, FLOAT
    out.shape = ir.Shape(shape) if shape is not None else None
    return node


def model(inputs: Sequence[ir.Value], outputs: Sequence[ir.Value], nodes: Sequence[ir.Node],
          initializers: Sequence[ir.Value] = (), functions: Sequence[ir.Function] = (),
          opsets: dict[str, int] | None = None) -> ir.Model:
    graph = ir.Graph(list(inputs), list(outputs), nodes=list(nodes),
                     initializers=list(initializers), opset_imports=opsets or {"": OPSET},
                     name="main")
    return ir.Model(graph, ir_version=10, functions=list(functions))


def call(path: str, type_name: str = "pkg.Block", call_id: str | None = None) -> CallInfo:
    return CallInfo(call_id or path, path, type_name)


def two_blocks(second_shape: tuple[int, int] = (4, 4)
               ) -> tuple[ir.Model, dict[str, tuple[CallInfo, ...]]]:
    """``neg(relu(relu(x @ w0) @ w1))``: ``layers.0`` and ``layers.1`` are calls of one
    class (MatMul, Relu), the Neg is the root's; ``second_shape`` is ``w1``'s shape."""
    x = value("x")
    w0, w1 = weight("layers.0.weight"), weight("layers.1.weight", second_shape, seed=1)
    mm0 = fx("MatMul", [x, w0], "mm0")
    r0 = fx("Relu", [mm0.outputs[0]], "r0")
    out_shape = (2, second_shape[1])
    mm1 = fx("MatMul", [r0.outputs[0], w1], "mm1", out_shape)
    r1 = fx("Relu", [mm1.outputs[0]], "r1", out_shape)
    neg = fx("Neg", [r1.outputs[0]], "neg", out_shape)
    m = model([x], neg.outputs, [mm0, r0, mm1, r1, neg], [w0, w1])
    first, second = call("layers.0"), call("layers.1")
    chains = {"mm0": (first,), "r0": (first,), "mm1": (second,), "r1": (second,), "neg": ()}
    return m, chains


def nested_blocks() -> tuple[ir.Model, dict[str, tuple[CallInfo, ...]]]:
    """Two ``pkg.Block`` calls, each an ``act`` (``pkg.Act``: a Relu) after a MatMul."""
    x = value("x")
    w0, w1 = weight("layers.0.weight"), weight("layers.1.weight", seed=1)
    nodes = [fx("MatMul", [x, w0], "mm0")]
    nodes.append(fx("Relu", [nodes[-1].outputs[0]], "r0"))
    nodes.append(fx("MatMul", [nodes[-1].outputs[0], w1], "mm1"))
    nodes.append(fx("Relu", [nodes[-1].outputs[0]], "r1"))
    m = model([x], nodes[-1].outputs, nodes, [w0, w1])
    b0, b1 = call("layers.0"), call("layers.1")
    a0, a1 = call("layers.0.act", "pkg.Act"), call("layers.1.act", "pkg.Act")
    chains = {"mm0": (b0,), "r0": (b0, a0), "mm1": (b1,), "r1": (b1, a1)}
    return m, chains


def function(name: str, ops: Sequence[str], doc: str = "pkg.Block", domain: str = "pkg",
             shape: Sequence[int] = (2, 4)) -> ir.Function:
    """A function of class ``doc`` applying unary ``ops`` in turn to its one input."""
    x = value("x", shape)
    nodes: list[ir.Node] = []
    for op in ops:
        nodes.append(ir.node(op, [nodes[-1].outputs[0] if nodes else x]))
    graph = ir.Graph([x], nodes[-1].outputs, nodes=nodes, opset_imports={"": OPSET},
                     name=name)
    f = ir.Function(domain, name, graph=graph, attributes=[])
    f.doc_string = doc
    return f


def calling(functions: Sequence[ir.Function], shape: Sequence[int] = (2, 4)) -> ir.Model:
    """A model calling each function once, in turn, on its input."""
    x = value("x", shape)
    nodes: list[ir.Node] = []
    for i, f in enumerate(functions):
        nodes.append(ir.node(f.name, [nodes[-1].outputs[0] if nodes else x], domain=f.domain,
                             name=f"call_{i}"))
    y = nodes[-1].outputs[0]
    y.name, y.type, y.shape = "y", FLOAT, ir.Shape(shape)
    domains = {f.domain: 1 for f in functions}
    return model([x], nodes[-1].outputs, nodes, functions=functions,
                 opsets={"": OPSET, **domains})


def run(m: ir.Model, **feeds: np.ndarray) -> list[np.ndarray]:
    """ORT CPU outputs of ``m``."""
    import onnxruntime as ort

    proto = ir.serde.serialize_model(m)
    session = ort.InferenceSession(proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)
