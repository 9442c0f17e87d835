"""The names of the user's ``Dim``\\ s on the file's symbolic dimensions, as torch.onnx
writes them.

torch.export calls every dynamic dimension ``s<N>`` (``s72``, ``s70*s72``) and keeps the
user's names (``Dim("batch")``) only in its shape environment; torch.onnx's export renames
the dimensions of its file after them, and so does this, on every value of the main graph
and of each function body, expressions included (``seq*batch``). ONNX Runtime and the
viewers show these names; sizes are the same, so nothing computes differently.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import onnx_ir as ir

from onnx_modular.emit.walk import all_nodes, graphs


def name_dims(model: ir.Model, names: Mapping[str, str]) -> int:
    """Rename symbolic dimensions by ``names`` (symbol -> the ``Dim``'s name, from
    ``leaves._compat.dim_names``); how many shapes changed."""
    if not names:
        return 0
    symbol = re.compile("|".join(rf"(?<!\w){re.escape(s)}(?!\w)"
                                 for s in sorted(names, key=len, reverse=True)))
    renamed = 0
    for value in _values(model):
        shape = value.shape
        if shape is None or not any(isinstance(d, ir.SymbolicDim) and d.value for d in shape):
            continue
        dims = [symbol.sub(lambda m: names[m.group(0)], d.value)
                if isinstance(d, ir.SymbolicDim) and d.value else d for d in shape]
        if dims != list(shape):
            value.shape = ir.Shape(dims)
            renamed += 1
    return renamed


def _values(model: ir.Model) -> list[ir.Value]:
    """Every value with a shape: graph, function and subgraph inputs and outputs,
    initializers and every node's outputs (If branches and Loop bodies too)."""
    values: list[ir.Value] = [*model.graph.initializers.values()]
    for graph in graphs(model):
        values += [*graph.inputs, *graph.outputs]
    for node in all_nodes(model):
        values += node.outputs
        for attribute in node.attributes.values():  # a Loop body's inputs, If branches'
            bodies = [attribute.value] if attribute.type == ir.AttributeType.GRAPH else \
                attribute.value if attribute.type == ir.AttributeType.GRAPHS else []
            for body in bodies:
                values += [*body.inputs, *body.outputs]
    return values
