"""The module call as a standalone ONNX model.

Hierarchical models give the call's function body (nested calls stay functions); flat ones
the call's nodes (found by their ``name_scopes``). Inputs and outputs keep the body's
relative names (``input_0``, ``ln_1.weight``, ``output_0``); weights are the call's own
arguments in the original model (external data is read from the model's directory) and
become initializers.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from onnx_modular.check.probe import OnnxCall
from onnx_modular.check.recorder import TorchCall
from onnx_modular.leaves import runtime
from onnx_modular.leaves.errors import fail, rules


@dataclasses.dataclass
class Built:
    """The module as a graph: its nodes and functions, which of its inputs are weights
    (with the original initializer), constants to embed, and the other inputs/outputs
    (with the value names they carry in the probe)."""

    nodes: list[onnx.NodeProto]
    functions: list[onnx.FunctionProto]
    weights: list[tuple[str, str]]
    constants: list[onnx.NodeProto]
    inputs: list[tuple[str, str]]
    outputs: list[tuple[str, str]]
    value_info: list[onnx.ValueInfoProto]


def _reachable(nodes: list[onnx.NodeProto], functions: dict[tuple[str, str, str], Any]
               ) -> list[onnx.FunctionProto]:
    """The functions ``nodes`` call, directly or not, in the model's order."""
    seen: set[tuple[str, str, str]] = set()
    todo = list(nodes)
    while todo:
        node = todo.pop()
        key = (node.domain, node.op_type, node.overload)
        if key in functions and key not in seen:
            seen.add(key)
            todo.extend(functions[key].node)
    return [f for k, f in functions.items() if k in seen]


def _constant(name: str, producer: onnx.NodeProto) -> onnx.NodeProto:
    node = onnx.NodeProto()
    node.CopyFrom(producer)
    del node.output[:]
    node.output.append(name)
    return node


def _rename(nodes: list[onnx.NodeProto], names: dict[str, str]) -> list[onnx.NodeProto]:
    out = []
    for original in nodes:
        node = onnx.NodeProto()
        node.CopyFrom(original)
        for field in (node.input, node.output):
            for i, name in enumerate(field):
                if name in names:
                    field[i] = names[name]
        out.append(node)
    return out


def from_function(proto: onnx.ModelProto, call: OnnxCall, weights: set[str],
                   producers: dict[str, onnx.NodeProto]) -> Built:
    """A hierarchical call: its function's body, arguments sorted into kinds."""
    functions = {(f.domain, f.name, f.overload): f for f in proto.functions}
    assert call.function is not None
    body = functions.get(tuple(call.function))  # type: ignore[arg-type]
    if body is None:
        raise fail(f"the function of call '{call.call_id}' is not in the model",
                   rules.VALIDATION)
    site = producers.get(call.results[0]) if call.results else None  # a leaf call stays
    if site is None or site.op_type != body.name:  # expanded: the main graph's call node
        site = next((n for n in proto.graph.node if list(n.output) == list(call.results)),
                    site)
    bound = _attribute_values(body, site)
    if bound is None:
        raise fail(f"function {body.name} of call '{call.call_id}' takes attributes its call "
                   "sets from an enclosing function's; extracting it is not supported",
                   rules.VALIDATION)
    built = Built([], [], [], [], [], [], list(body.value_info))
    absent = set()
    for i, formal in enumerate(body.input):
        actual = call.arguments[i] if i < len(call.arguments) else None
        if not actual:
            absent.add(formal)
        elif actual in weights:
            built.weights.append((formal, actual))
        elif actual in producers and _is_constant(producers[actual]):
            built.constants.append(_constant(formal, producers[actual]))
        else:
            built.inputs.append((formal, actual))
    built.nodes = _rename(list(body.node), dict.fromkeys(absent, ""))
    _bind(built.nodes, bound)
    built.outputs = list(zip(body.output, call.results, strict=False))
    built.functions = _reachable(built.nodes, functions)
    return built


def _attribute_values(body: onnx.FunctionProto, call: onnx.NodeProto | None
                      ) -> dict[str, onnx.AttributeProto] | None:
    """What a parametrized body's attributes are at this call (its defaults, then the call
    node's values); None when the call node is not found or passes references on."""
    names = [*body.attribute, *(a.name for a in body.attribute_proto)]
    if not names:
        return {}
    if call is None or (call.domain, call.op_type) != (body.domain, body.name) \
            or any(a.ref_attr_name for a in call.attribute):
        return None
    values = {a.name: a for a in body.attribute_proto}
    values.update({a.name: a for a in call.attribute})
    return values if set(names) <= values.keys() else None


def _bind(nodes: list[onnx.NodeProto], values: dict[str, onnx.AttributeProto]) -> None:
    """Replace attribute references (``ref_attr_name``) by the values, subgraphs included."""
    for node in nodes:
        for attr in node.attribute:
            if attr.ref_attr_name:
                name = attr.name
                attr.CopyFrom(values[attr.ref_attr_name])
                attr.name = name
            elif attr.type == onnx.AttributeProto.GRAPH:
                _bind(list(attr.g.node), values)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for graph in attr.graphs:
                    _bind(list(graph.node), values)


def _is_constant(node: onnx.NodeProto) -> bool:
    return node.op_type == "Constant" and node.domain in ("", "ai.onnx") and not node.input


def from_nodes(proto: onnx.ModelProto, graph: onnx.GraphProto, call: OnnxCall,
                weights: set[str], producers: dict[str, onnx.NodeProto]) -> Built:
    """A flat call: its nodes, renamed relative to the module like a function body."""
    prefix = f"{call.module_path}." if call.module_path else ""
    names: dict[str, str] = {}
    taken: set[str] = set()
    built = Built([], [], [], [], [], [], [])

    def unique(name: str) -> str:
        while name in taken:
            name += "_"
        taken.add(name)
        return name

    for name in call.arguments:
        if not name or name in names:
            continue
        if name in weights:
            local = unique(name[len(prefix):] if prefix and name.startswith(prefix) else name)
            built.weights.append((local, name))
        elif name in producers and _is_constant(producers[name]):
            local = unique(name)
            built.constants.append(_constant(local, producers[name]))
        else:
            local = unique(f"input_{len(built.inputs)}")
            built.inputs.append((local, name))
        names[name] = local
    for i, name in enumerate(call.results):
        names[name] = unique(f"output_{i}")
        built.outputs.append((names[name], name))
    built.nodes = _rename([graph.node[i] for i in call.nodes], names)
    functions = {(f.domain, f.name, f.overload): f for f in proto.functions}
    built.functions = _reachable(built.nodes, functions)
    return built


def weight(init: onnx.TensorProto, name: str, base: Path | None) -> onnx.TensorProto:
    """A copy of initializer ``init`` named ``name``, its data read in when external."""
    tensor = onnx.TensorProto()
    tensor.CopyFrom(init)
    tensor.name = name
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        if base is None:
            raise fail(f"weight '{init.name}' is stored as external data and the model was "
                       "given without a path: validate the .onnx file to extract from it",
                       rules.VALIDATION)
        from onnx.external_data_helper import load_external_data_for_tensor

        try:
            load_external_data_for_tensor(tensor, str(base))
        except Exception as exc:  # OSError, or onnx's ValidationError for a missing file
            raise fail(f"cannot read the external data of weight '{init.name}' beside the "
                       f"model in '{base}': {runtime.first_line(exc)}", rules.VALIDATION
                       ) from exc
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]
    return tensor


def _value_info(name: str, array: np.ndarray) -> onnx.ValueInfoProto:
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(array.dtype))
    return onnx.helper.make_tensor_value_info(name, elem, list(array.shape))


def standalone_model(proto: onnx.ModelProto, built: Built, weights: list[onnx.TensorProto],
           inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray | None],
           call: TorchCall, label: str) -> onnx.ModelProto:
    graph = onnx.helper.make_graph(
        [*built.constants, *built.nodes], f"{call.call_id} ({call.module_type})",
        [_value_info(n, a) for n, a in inputs.items()],
        [_value_info(n, a) if a is not None else onnx.ValueInfoProto(name=n)
         for n, a in outputs.items()], weights, value_info=built.value_info)
    model = onnx.helper.make_model(graph, opset_imports=list(proto.opset_import),
                                   functions=built.functions)
    model.ir_version = proto.ir_version
    model.producer_name = "onnx_modular extract"
    for key, value in (("onnx_modular.extracted_call", call.call_id),
                       ("onnx_modular.extracted_type", call.module_type),
                       ("onnx_modular.extracted_from", label)):
        model.metadata_props.add(key=key, value=value)
    return model



def nbytes(tensor: onnx.TensorProto) -> int:
    """The bytes of a weight's data."""
    if tensor.raw_data:
        return len(tensor.raw_data)
    return tensor.ByteSize()


def cut(proto: onnx.ModelProto, graph: onnx.GraphProto, call: OnnxCall, call_id: str
        ) -> tuple[Built, str]:
    """The call ``call`` of ``graph`` (the probe's graph, or the model's) as a graph of its
    own, and how it was cut: ``hierarchical`` (its function's body) or ``flat`` (its
    nodes); one line, naming the call ``call_id``, where it cannot be cut out."""
    initializers = {i.name for i in proto.graph.initializer}
    producers = {o: n for n in graph.node for o in n.output if o}
    if call.function is not None:
        return from_function(proto, call, initializers, producers), "hierarchical"
    if call.nodes:
        return from_nodes(proto, graph, call, initializers, producers), "flat"
    raise fail(f"module call '{call_id}' cannot be cut out of the ONNX model",
               rules.VALIDATION)
