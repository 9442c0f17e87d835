"""A Triton Inference Server model repository from parts (split regions or pipeline stages).

One model directory per part, run by Triton's ``onnxruntime`` backend, and one ensemble
that wires them as the manifest does::

    repo/
      <name>_stage_0/config.pbtxt        backend "onnxruntime", inputs/outputs, instance_group
      <name>_stage_0/1/model.onnx        (+ model.onnx.<id>.data: the weights, where written apart)
      ...
      <name>/config.pbtxt                platform "ensemble", ensemble_scheduling { step [...] }
      <name>/1/                          (an ensemble has no model file, but needs a version)

Every config is built as Triton's own ``inference.ModelConfig`` message (tritonclient's
protobuf definitions) and written with protobuf's text format, then parsed back: a field
Triton does not know cannot be written. Accelerator parts and stages get ``KIND_GPU``
instances, CPU regions ``KIND_CPU``. Tensors keep their ONNX names, so the ensemble's
tensor names are the values the parts exchange.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from onnx_modular._io import TWO_GB, atomic_write_text, save_model
from onnx_modular.diagnostics import DiagnosticContext, OnnxModularError
from onnx_modular.errors import rules
from onnx_modular.parts.manifest import dtype_name, shape_of

CONFIG = "config.pbtxt"
MODEL_FILE = "model.onnx"
VERSION = "1"

#: numpy's dtype name (as the manifest writes it) -> Triton's DataType name
TRITON_TYPES = {
    "bool": "TYPE_BOOL", "uint8": "TYPE_UINT8", "uint16": "TYPE_UINT16",
    "uint32": "TYPE_UINT32", "uint64": "TYPE_UINT64", "int8": "TYPE_INT8",
    "int16": "TYPE_INT16", "int32": "TYPE_INT32", "int64": "TYPE_INT64",
    "float16": "TYPE_FP16", "float32": "TYPE_FP32", "float64": "TYPE_FP64",
    "bfloat16": "TYPE_BF16", "string": "TYPE_STRING", "object": "TYPE_STRING",
}


def _fail(reason: str) -> OnnxModularError:
    return DiagnosticContext().error(rules.BAD_INPUT, reason=reason)


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
        raise _fail("writing a Triton repository needs tritonclient's protobuf definitions: "
                    "pip install tritonclient") from e
    except RuntimeError:  # "The installation does not include grpc support"
        spec = importlib.util.find_spec("tritonclient")
        assert spec is not None and spec.submodule_search_locations
        path = Path(next(iter(spec.submodule_search_locations))) / "grpc" / \
            "model_config_pb2.py"
        file_spec = importlib.util.spec_from_file_location("_om_triton_model_config_pb2", path)
        if file_spec is None or file_spec.loader is None or not path.is_file():
            raise _fail(f"tritonclient is installed without {path.name}; reinstall "
                        "tritonclient") from None
        module = importlib.util.module_from_spec(file_spec)
        file_spec.loader.exec_module(module)
        return module


def parse_config(text: str) -> Any:
    """Text-format ``config.pbtxt`` -> ``inference.ModelConfig`` (raises on unknown fields)."""
    from google.protobuf import text_format

    return text_format.Parse(text, model_config_pb2().ModelConfig())


@dataclasses.dataclass
class TritonRepository:
    """What :func:`save_triton` wrote: the repository, its ensemble and part models."""

    path: Path
    ensemble: str
    models: list[str]  # part models, in execution order

    def configs(self) -> dict[str, Any]:
        """Model name -> its parsed ``ModelConfig``, read back from disk."""
        return {name: parse_config((self.path / name / CONFIG).read_text())
                for name in [*self.models, self.ensemble]}


def _dims(value: Any, part: str) -> list[int]:
    shape = shape_of(value)
    if shape is None:
        raise _fail(f"Triton needs the rank of every tensor: '{value.name}' of part '{part}' "
                    "has no known shape")
    return [d if isinstance(d, int) and d >= 0 else -1 for d in shape]


def _data_type(value: Any, part: str) -> int:
    pb = model_config_pb2()
    name = dtype_name(value)
    triton = TRITON_TYPES.get(name or "")
    if triton is None:
        raise _fail(f"'{value.name}' of part '{part}' has type {name}, which Triton's "
                    "onnxruntime backend does not take")
    return int(pb.DataType.Value(triton))


def _tensor(message: Any, value: Any, part: str) -> None:
    message.name = value.name
    message.data_type = _data_type(value, part)
    message.dims.extend(_dims(value, part))


def part_config(name: str, part: Any, *, max_batch_size: int = 0, instances: int = 1,
                gpus: Sequence[int] | None = None) -> Any:
    """The ``ModelConfig`` of one part (a ``RegionGraph``) for the onnxruntime backend."""
    pb = model_config_pb2()
    config = pb.ModelConfig(name=name, backend="onnxruntime", max_batch_size=max_batch_size,
                            default_model_filename=MODEL_FILE)
    graph = part.model.graph
    for v in graph.inputs:
        _tensor(config.input.add(), v, part.name)
    for v in graph.outputs:
        _tensor(config.output.add(), v, part.name)
    group = config.instance_group.add(count=instances, kind=(
        pb.ModelInstanceGroup.KIND_GPU if part.is_acc else pb.ModelInstanceGroup.KIND_CPU))
    if part.is_acc and gpus:
        group.gpus.extend(gpus)
    return config


def ensemble_config(name: str, model_graph: Any, steps: Sequence[tuple[str, Any]], *,
                    max_batch_size: int = 0) -> Any:
    """The ensemble: the model's inputs and outputs, one step per part, every tensor wired
    by name (a part's input ``k`` reads the ensemble tensor ``k``)."""
    pb = model_config_pb2()
    config = pb.ModelConfig(name=name, platform="ensemble", max_batch_size=max_batch_size)
    produced: set[str] = set()
    for model_name, part in steps:
        step = config.ensemble_scheduling.step.add(model_name=model_name, model_version=-1)
        for v in part.model.graph.inputs:
            step.input_map[v.name] = v.name
        for v in part.model.graph.outputs:
            step.output_map[v.name] = v.name
            produced.add(v.name)
    inputs = {v.name for v in model_graph.inputs}
    for v in model_graph.inputs:
        _tensor(config.input.add(), v, name)
    for v in model_graph.outputs:
        if v.name not in produced:
            why = "is a model input returned as is" if v.name in inputs else "no part makes it"
            raise _fail(f"model output '{v.name}' {why}: a Triton ensemble can only return "
                        "what a step produces")
        _tensor(config.output.add(), v, name)
    return config


def _write_config(directory: Path, config: Any) -> str:
    from google.protobuf import text_format

    text = text_format.MessageToString(config)
    parse_config(text)  # what Triton reads back must be what was meant
    atomic_write_text(directory / CONFIG, text)
    return text


def _replace_dir(staged: Path, target: Path) -> None:
    """Move a fully written model directory into place (the old one goes only then)."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.replace(target, old / target.name)
    os.replace(staged, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def save_triton(repo: str | os.PathLike[str], model_graph: Any, parts: Sequence[Any], *,
                name: str = "model", max_batch_size: int = 0, instances: int = 1,
                gpus: Sequence[int] | Mapping[str, Sequence[int]] | None = None,
                external_data: bool | None = None) -> TritonRepository:
    """Write a Triton model repository for ``parts`` (``RegionGraph``s, in execution order)
    cut from ``model_graph`` (the whole model's graph: its inputs and outputs).

    ``instances``: instances of each part model (``instance_group.count``); ``gpus``: GPU ids
    the accelerator parts are spread over, one each in turn (``[0, 1, 2, 3]`` puts four
    stages on four GPUs), or part name -> ids; ``external_data``: weights in
    a data file beside each model (``None``: only above 2 GB).
    """
    out = Path(repo)
    if out.exists() and not out.is_dir():
        raise _fail(f"cannot write a Triton repository to '{out}': it is a file")
    if instances < 1:
        raise _fail(f"instances must be at least 1, got {instances}")
    if max_batch_size != 0:
        raise _fail("parts keep the captured shapes (the batch dimension included); "
                    "max_batch_size must be 0")
    threshold = TWO_GB if external_data is None else (0 if external_data else 2**62)
    live = [p for p in parts if p.model.graph.outputs]  # a part nobody reads is skipped
    names = [f"{name}_{p.name.lstrip('_')}" for p in live]
    if name in names or len(set(names)) != len(names):
        raise _fail(f"model names in the repository collide: {name}, {', '.join(names)}")
    steps = list(zip(names, live))
    # the ensemble first: a model Triton could not wire must fail before anything is written
    ensemble = ensemble_config(name, model_graph, steps, max_batch_size=max_batch_size)
    accs = [p.name for p in live if p.is_acc]
    out.mkdir(parents=True, exist_ok=True)
    for model_name, part in steps:
        if isinstance(gpus, Mapping):
            ids: Sequence[int] | None = gpus.get(part.name)
        elif gpus and part.is_acc:
            ids = [list(gpus)[accs.index(part.name) % len(gpus)]]
        else:
            ids = None
        config = part_config(model_name, part, max_batch_size=max_batch_size,
                             instances=instances, gpus=ids)
        _write_model_dir(out, model_name, config, part.model, threshold)
    _write_model_dir(out, name, ensemble, None, threshold)
    return TritonRepository(out, name, names)


def _write_model_dir(out: Path, model_name: str, config: Any, model: Any,
                     threshold: int) -> None:
    """``<model_name>/config.pbtxt`` and ``1/`` (with the model, if any), staged beside and
    moved into place whole."""
    staged = Path(tempfile.mkdtemp(prefix=f".{model_name}.", dir=out))
    try:
        os.chmod(staged, 0o777 & ~_umask())  # mkdtemp makes it private; Triton may not be us
        (staged / VERSION).mkdir()
        if model is not None:
            save_model(model, staged / VERSION / MODEL_FILE, external_data_threshold=threshold)
        _write_config(staged, config)
        _replace_dir(staged, out / model_name)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
