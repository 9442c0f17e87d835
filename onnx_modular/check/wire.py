"""Protobuf wire-format splicing, so the localization probe never re-serializes the weights.

Concatenated protobuf messages merge: repeated fields append, embedded messages merge. So
"a model's bytes + a ``ModelProto`` holding only extra graph outputs" is the model with
those outputs, and "a weightless inlined model + the original's initializer fields, cut
from its bytes without decoding them" is the inlined model with its weights. Only field
boundaries are read here (a few thousand varints), never a tensor.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx

from onnx_modular.leaves._io import encode_varint

_MODEL_GRAPH = 7  # ModelProto.graph
_GRAPH_INITIALIZER = 5  # GraphProto.initializer
_GRAPH_SPARSE_INITIALIZER = 15  # GraphProto.sparse_initializer


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, start of the field, start of its payload, end) for each field."""
    pos = start
    while pos < end:
        field_start = pos
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _varint(buf, pos)
            payload = pos
        elif wire == 1:
            payload, pos = pos, pos + 8
        elif wire == 5:
            payload, pos = pos, pos + 4
        elif wire == 2:
            size, payload = _varint(buf, pos)
            pos = payload + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, field_start, payload, pos


def _length_delimited(number: int, payload: bytes) -> bytes:
    return encode_varint(number << 3 | 2) + encode_varint(len(payload)) + payload


def initializer_patch(model_bytes: bytes) -> bytes:
    """A serialized ``ModelProto`` holding only the graph initializers of ``model_bytes``."""
    pieces = []
    for number, _, payload, end in _fields(model_bytes, 0, len(model_bytes)):
        if number != _MODEL_GRAPH:
            continue
        for inner, field_start, _, field_end in _fields(model_bytes, payload, end):
            if inner in (_GRAPH_INITIALIZER, _GRAPH_SPARSE_INITIALIZER):
                pieces.append(model_bytes[field_start:field_end])
    return _length_delimited(_MODEL_GRAPH, b"".join(pieces))


def outputs_patch(names: list[str]) -> bytes:
    """A serialized ``ModelProto`` whose graph declares only the outputs ``names``."""
    patch = onnx.ModelProto()
    for name in names:
        patch.graph.output.add(name=name)
    return patch.SerializeToString()


def without_initializers(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` whose initializers are shells: name, type and shape, no data."""
    light = onnx.ModelProto()
    graph = proto.graph
    light.CopyFrom(onnx.ModelProto(
        ir_version=proto.ir_version, producer_name=proto.producer_name,
        producer_version=proto.producer_version, domain=proto.domain,
        model_version=proto.model_version, doc_string=proto.doc_string))
    light.opset_import.extend(proto.opset_import)
    light.functions.extend(proto.functions)
    light.metadata_props.extend(proto.metadata_props)
    lg = light.graph
    lg.name = graph.name
    lg.node.extend(graph.node)
    lg.input.extend(graph.input)
    lg.output.extend(graph.output)
    lg.value_info.extend(graph.value_info)
    for init in graph.initializer:
        lg.initializer.add(name=init.name, data_type=init.data_type, dims=init.dims)
    return light
