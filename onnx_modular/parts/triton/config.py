"""Triton's model configs: every config is built as Triton's own ``inference.ModelConfig``
message (tritonclient's protobuf definitions), written with protobuf's text format and
parsed back, so a field Triton does not know cannot be written. A part's model runs on the
``onnxruntime`` backend; the ensemble wires the parts by tensor name."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx_ir as ir

from onnx_modular.emit.regions import RegionGraph
from onnx_modular.leaves.errors import fail
from onnx_modular.parts.manifest import dtype_name, shape_of
from onnx_modular.parts.triton.options import KINDS, TritonOptions

CONFIG = "config.pbtxt"
MODEL_FILE = "model.onnx"
#: config ``parameters`` keys: the save a model belongs to, and the ensemble of that save
SET_ID_KEY = "onnx_modular_set_id"
ENSEMBLE_KEY = "onnx_modular_ensemble"
#: ensemble config ``parameters`` key: why the set is not batched, or what batching assumed
BATCHING_KEY = "onnx_modular_batching"

#: numpy's dtype name (as the manifest writes it) -> Triton's DataType name
TRITON_TYPES = {
    "bool": "TYPE_BOOL", "uint8": "TYPE_UINT8", "uint16": "TYPE_UINT16",
    "uint32": "TYPE_UINT32", "uint64": "TYPE_UINT64", "int8": "TYPE_INT8",
    "int16": "TYPE_INT16", "int32": "TYPE_INT32", "int64": "TYPE_INT64",
    "float16": "TYPE_FP16", "float32": "TYPE_FP32", "float64": "TYPE_FP64",
    "bfloat16": "TYPE_BF16", "string": "TYPE_STRING", "object": "TYPE_STRING",
}


@dataclasses.dataclass(frozen=True)
class SetStamp:
    """What marks the models of one save as a set: the version folder each of them uses
    (the ensemble's steps pin it), the set id in every config, and the batching note the
    ensemble keeps (why the set is not batched, or what batching took on trust)."""

    version: int
    set_id: str
    note: str = ""


@functools.cache
def model_config_pb2() -> Any:
    """tritonclient's ``model_config_pb2`` (Triton's ModelConfig protobuf), imported lazily.

    ``tritonclient.grpc`` refuses to import without grpcio, which only its client needs;
    the message definitions alone are then read from the same file.
    """
    try:
        return importlib.import_module("tritonclient.grpc.model_config_pb2")
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith("tritonclient"):
            raise
        raise fail("writing a Triton repository needs tritonclient's protobuf definitions: "
                   "pip install tritonclient") from e
    except RuntimeError:  # "The installation does not include grpc support"
        spec = importlib.util.find_spec("tritonclient")
        assert spec is not None and spec.submodule_search_locations
        path = Path(next(iter(spec.submodule_search_locations))) / "grpc" / \
            "model_config_pb2.py"
        file_spec = importlib.util.spec_from_file_location("_om_triton_model_config_pb2", path)
        if file_spec is None or file_spec.loader is None or not path.is_file():
            raise fail(f"tritonclient is installed without {path.name}; reinstall "
                       "tritonclient") from None
        module = importlib.util.module_from_spec(file_spec)
        file_spec.loader.exec_module(module)
        return module


def parse_config(text: str) -> Any:
    """Text-format ``config.pbtxt`` -> ``inference.ModelConfig`` (raises on unknown fields)."""
    from google.protobuf import text_format

    return text_format.Parse(text, model_config_pb2().ModelConfig())


def read_config(directory: Path) -> Any | None:
    """The parsed ``config.pbtxt`` of a model directory, or None where there is none or it
    does not parse (a model of someone else's)."""
    try:
        return parse_config((directory / CONFIG).read_text(encoding="utf-8"))
    except Exception:
        return None


def part_model_name(ensemble: str, part: str) -> str:
    """The Triton model of one part of ``ensemble`` (``model`` + ``_run_on_acc_0`` ->
    ``model_run_on_acc_0``)."""
    return f"{ensemble}_{part.lstrip('_')}"


def config_parameter(config: Any, key: str) -> str | None:
    return config.parameters[key].string_value if key in config.parameters else None


def _dims(value: Any, part: str, batched: bool) -> list[int]:
    shape = shape_of(value)
    if shape is None:
        raise fail(f"Triton needs the rank of every tensor: '{value.name}' of part '{part}' "
                   "has no known shape")
    dims = [d if isinstance(d, int) and d >= 0 else -1 for d in shape]
    return dims[1:] if batched else dims


def _data_type(value: Any, part: str) -> int:
    pb = model_config_pb2()
    name = dtype_name(value)
    triton = TRITON_TYPES.get(name or "")
    if triton is None:
        raise fail(f"'{value.name}' of part '{part}' has type {name}, which Triton's "
                   "onnxruntime backend does not take")
    return int(pb.DataType.Value(triton))


def _tensor(message: Any, value: Any, part: str, batched: bool, reshape: bool = True) -> None:
    """``reshape`` False (the ensemble's tensors): a ``[batch]`` tensor is ``[batch, 1]``
    to its clients (an unbatched set has no 0-d model tensor: ``plan_scalars`` refuses it).
    Triton checks an ensemble tensor's shape after its reshape against the step's before
    it (``[-1]`` against ``[-1, 1]``: the ensemble did not load)."""
    message.name = value.name
    message.data_type = _data_type(value, part)
    dims = _dims(value, part, batched)
    if dims:
        message.dims.extend(dims)
    else:  # a scalar (or [batch]): Triton wants dims, so [1], reshaped to [] for the model
        message.dims.append(1)
        if reshape:
            message.reshape.SetInParent()


def _set_parameters(config: Any, set_id: str | None, ensemble: str | None) -> None:
    if set_id is not None:
        config.parameters[SET_ID_KEY].string_value = set_id
    if ensemble is not None:
        config.parameters[ENSEMBLE_KEY].string_value = ensemble


def part_config(name: str, part: Any, options: TritonOptions, stamp: SetStamp,
                gpus: Sequence[int] | None = None) -> Any:
    """The ``ModelConfig`` of one part (a ``RegionGraph``) for the onnxruntime backend,
    written with ``options`` (checked: ``max_batch_size`` an int) as a model of the set
    ``stamp`` of the ensemble ``options.name``.

    ``options.kind``: ``auto``/``gpu``/``cpu`` for an accelerator part (default ``auto``,
    or ``gpu`` where ``gpus`` name devices: Triton refuses ``KIND_AUTO`` with GPUs on a
    host without them); a CPU region is always ``KIND_CPU``.
    """
    pb = model_config_pb2()
    max_batch_size = options.max_batch_size or 0
    batched = max_batch_size > 0
    config = pb.ModelConfig(name=name, backend="onnxruntime", max_batch_size=max_batch_size,
                            default_model_filename=MODEL_FILE)
    graph = part.model.graph
    for v in graph.inputs:
        _tensor(config.input.add(), v, part.name, batched)
    for v in graph.outputs:
        _tensor(config.output.add(), v, part.name, batched)
    chosen = "cpu" if not part.is_acc else (options.kind or ("gpu" if gpus else "auto"))
    group = config.instance_group.add(
        count=options.instances, kind=pb.ModelInstanceGroup.Kind.Value(KINDS[chosen]))
    if chosen == "gpu" and gpus:
        group.gpus.extend(gpus)
    if batched:
        config.dynamic_batching.SetInParent()  # "dynamic_batching { }": the defaults
        config.dynamic_batching.max_queue_delay_microseconds = options.max_queue_delay_us
    _set_parameters(config, stamp.set_id, options.name)
    return config


def ensemble_config(model_graph: ir.Graph, steps: Sequence[tuple[str, RegionGraph]],
                    options: TritonOptions, stamp: SetStamp) -> Any:
    """The ensemble ``options.name``: the model's inputs and outputs, one step per part,
    every tensor wired by name (a part's input ``k`` reads the ensemble tensor ``k``);
    every step names its model at the set's version."""
    pb = model_config_pb2()
    name, max_batch_size = options.name, options.max_batch_size or 0
    batched = max_batch_size > 0
    config = pb.ModelConfig(name=name, platform="ensemble", max_batch_size=max_batch_size)
    produced: set[str] = set()
    for model_name, part in steps:
        step = config.ensemble_scheduling.step.add(model_name=model_name,
                                                   model_version=stamp.version)
        for v in part.model.graph.inputs:
            step.input_map[v.name] = v.name
        for v in part.model.graph.outputs:
            step.output_map[v.name] = v.name
            produced.add(v.name)
    inputs = {v.name for v in model_graph.inputs}
    for v in model_graph.inputs:
        _tensor(config.input.add(), v, name, batched, reshape=False)
    for v in model_graph.outputs:
        if v.name not in produced:
            why = "is a model input returned as is" if v.name in inputs else "no part makes it"
            raise fail(f"model output '{v.name}' {why}: a Triton ensemble can only return "
                       "what a step produces")
        _tensor(config.output.add(), v, name, batched, reshape=False)
    _set_parameters(config, stamp.set_id, None)
    if stamp.note:
        config.parameters[BATCHING_KEY].string_value = stamp.note
    return config
