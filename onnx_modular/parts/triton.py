"""A Triton Inference Server model repository from parts (split regions or pipeline stages).

One model directory per part, run by Triton's ``onnxruntime`` backend, and one ensemble
that wires them as the manifest does::

    repo/
      <name>_stage_0/config.pbtxt        backend "onnxruntime", inputs/outputs, instance_group
      <name>_stage_0/<v>/model.onnx      (+ model.onnx.<id>.data: the weights, where written apart)
      ...
      <name>/config.pbtxt                platform "ensemble", ensemble_scheduling { step [...] }
      <name>/<v>/                        (an ensemble has no model file, but needs a version)

Every config is built as Triton's own ``inference.ModelConfig`` message (tritonclient's
protobuf definitions) and written with protobuf's text format, then parsed back: a field
Triton does not know cannot be written. Accelerator parts and stages get ``KIND_AUTO``
instances by default (GPUs where the host has them, CPU otherwise), CPU regions ``KIND_CPU``.
Tensors keep their ONNX names, so the ensemble's tensor names are the values the parts
exchange.

The models of one save are a set: they share a version number ``<v>`` (one above any the
set had before), which the ensemble's steps name, and a set id in every config's
``parameters`` and every part's ONNX metadata. The set is written beside the repository,
then swapped in with the ensemble out of the repository meanwhile (see
:func:`_swap_in_set`); a save killed on the way is undone by the next one.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import json
import os
import re
import secrets
import shutil
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from onnx_modular._io import (
    TWO_GB,
    atomic_write_text,
    clean_stale_temporaries,
    keep_mode,
    pid_alive,
    save_model,
    temp_name,
)
from onnx_modular.errors import fail
from onnx_modular.metadata import PARTS_SET_ID
from onnx_modular.parts.batching import (
    batch_symbol,
    batched_parts,
    plan_batching,
    plan_scalars,
    prove_batching,
)
from onnx_modular.parts.manifest import dtype_name, shape_of

CONFIG = "config.pbtxt"
MODEL_FILE = "model.onnx"
#: config ``parameters`` keys: the save a model belongs to, and the ensemble of that save
SET_ID_KEY = "onnx_modular_set_id"
ENSEMBLE_KEY = "onnx_modular_ensemble"
#: ensemble config ``parameters`` key: why the set is not batched, or what batching assumed
BATCHING_KEY = "onnx_modular_batching"
#: ``max_batch_size`` written where the parts keep a dynamic batch dimension
DEFAULT_MAX_BATCH_SIZE = 8
MAX_INSTANCES = 1024
_INT32 = 2**31 - 1
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_NAME_MAX = 200  # leaves room for "_run_on_cpu_<n>" and the temporaries' suffixes
KINDS = {"auto": "KIND_AUTO", "gpu": "KIND_GPU", "cpu": "KIND_CPU"}

#: numpy's dtype name (as the manifest writes it) -> Triton's DataType name
TRITON_TYPES = {
    "bool": "TYPE_BOOL", "uint8": "TYPE_UINT8", "uint16": "TYPE_UINT16",
    "uint32": "TYPE_UINT32", "uint64": "TYPE_UINT64", "int8": "TYPE_INT8",
    "int16": "TYPE_INT16", "int32": "TYPE_INT32", "int64": "TYPE_INT64",
    "float16": "TYPE_FP16", "float32": "TYPE_FP32", "float64": "TYPE_FP64",
    "bfloat16": "TYPE_BF16", "string": "TYPE_STRING", "object": "TYPE_STRING",
}


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


@dataclasses.dataclass
class TritonRepository:
    """What :func:`save_triton` wrote: the repository, its ensemble and part models."""

    path: Path
    ensemble: str
    models: list[str]  # part models, in execution order
    version: int = 1  # the version folder of every model of the set
    set_id: str | None = None
    max_batch_size: int = 0
    note: str = ""  # why the set is not batched, or what batching took on trust

    def configs(self) -> dict[str, Any]:
        """Model name -> its parsed ``ModelConfig``, read back from disk."""
        return {name: parse_config((self.path / name / CONFIG).read_text())
                for name in [*self.models, self.ensemble]}


class TritonBatchingWarning(UserWarning):
    """A model with a dynamic first dimension saved without batching (or batched on the
    caller's word): ``TritonRepository.note`` says why."""


def load_repository(repo: str | os.PathLike[str], name: str | None = None
                    ) -> TritonRepository:
    """The set :func:`save_triton` wrote into ``repo`` (the ensemble ``name``, or the only
    ensemble there), read back from its configs."""
    path = Path(repo)
    if not path.is_dir():
        raise fail(f"'{repo}' is not a Triton model repository (no such directory)")
    _recover(path)
    ensembles = {}
    for entry in sorted(path.iterdir()):
        config = read_config(entry) if entry.is_dir() else None
        if config is not None and config.platform == "ensemble" and \
                config_parameter(config, SET_ID_KEY) is not None:
            ensembles[entry.name] = config
    if name is None and len(ensembles) != 1:
        raise fail(f"'{repo}' holds {len(ensembles)} ensembles written by onnx_modular "
                   f"({', '.join(ensembles) or 'none'}); name one")
    name = name if name is not None else next(iter(ensembles))
    if name not in ensembles:
        raise fail(f"'{repo}' holds no ensemble '{name}' written by onnx_modular")
    config = ensembles[name]
    steps = [s.model_name for s in config.ensemble_scheduling.step]
    versions = {s.model_version for s in config.ensemble_scheduling.step}
    return TritonRepository(path, name, steps, version=max(versions, default=1),
                            set_id=config_parameter(config, SET_ID_KEY),
                            max_batch_size=config.max_batch_size,
                            note=config_parameter(config, BATCHING_KEY) or "")


# --- configs -------------------------------------------------------------------------------

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


def _tensor(message: Any, value: Any, part: str, batched: bool) -> None:
    message.name = value.name
    message.data_type = _data_type(value, part)
    dims = _dims(value, part, batched)
    if dims:
        message.dims.extend(dims)
    else:  # a scalar (or [batch]): Triton wants dims, so [1], reshaped to [] for the model
        message.dims.append(1)
        message.reshape.SetInParent()


def _set_parameters(config: Any, set_id: str | None, ensemble: str | None) -> None:
    if set_id is not None:
        config.parameters[SET_ID_KEY].string_value = set_id
    if ensemble is not None:
        config.parameters[ENSEMBLE_KEY].string_value = ensemble


def part_config(name: str, part: Any, *, max_batch_size: int = 0, instances: int = 1,
                gpus: Sequence[int] | None = None, kind: str | None = None,
                max_queue_delay_us: int = 0, set_id: str | None = None,
                ensemble: str | None = None) -> Any:
    """The ``ModelConfig`` of one part (a ``RegionGraph``) for the onnxruntime backend.

    ``kind``: ``auto``/``gpu``/``cpu`` for an accelerator part (default ``auto``, or ``gpu``
    where ``gpus`` name devices: Triton refuses ``KIND_AUTO`` with GPUs on a host without
    them); a CPU region is always ``KIND_CPU``.
    """
    pb = model_config_pb2()
    batched = max_batch_size > 0
    config = pb.ModelConfig(name=name, backend="onnxruntime", max_batch_size=max_batch_size,
                            default_model_filename=MODEL_FILE)
    graph = part.model.graph
    for v in graph.inputs:
        _tensor(config.input.add(), v, part.name, batched)
    for v in graph.outputs:
        _tensor(config.output.add(), v, part.name, batched)
    chosen = "cpu" if not part.is_acc else (kind or ("gpu" if gpus else "auto"))
    group = config.instance_group.add(
        count=instances, kind=pb.ModelInstanceGroup.Kind.Value(KINDS[chosen]))
    if chosen == "gpu" and gpus:
        group.gpus.extend(gpus)
    if batched:
        config.dynamic_batching.SetInParent()  # "dynamic_batching { }": the defaults
        config.dynamic_batching.max_queue_delay_microseconds = max_queue_delay_us
    _set_parameters(config, set_id, ensemble)
    return config


def ensemble_config(name: str, model_graph: Any, steps: Sequence[tuple[str, Any]], *,
                    max_batch_size: int = 0, version: int = -1,
                    set_id: str | None = None, note: str = "") -> Any:
    """The ensemble: the model's inputs and outputs, one step per part, every tensor wired
    by name (a part's input ``k`` reads the ensemble tensor ``k``). ``version``: the
    version of every step's model (-1: the latest)."""
    pb = model_config_pb2()
    batched = max_batch_size > 0
    config = pb.ModelConfig(name=name, platform="ensemble", max_batch_size=max_batch_size)
    produced: set[str] = set()
    for model_name, part in steps:
        step = config.ensemble_scheduling.step.add(model_name=model_name,
                                                   model_version=version)
        for v in part.model.graph.inputs:
            step.input_map[v.name] = v.name
        for v in part.model.graph.outputs:
            step.output_map[v.name] = v.name
            produced.add(v.name)
    inputs = {v.name for v in model_graph.inputs}
    for v in model_graph.inputs:
        _tensor(config.input.add(), v, name, batched)
    for v in model_graph.outputs:
        if v.name not in produced:
            why = "is a model input returned as is" if v.name in inputs else "no part makes it"
            raise fail(f"model output '{v.name}' {why}: a Triton ensemble can only return "
                       "what a step produces")
        _tensor(config.output.add(), v, name, batched)
    _set_parameters(config, set_id, None)
    if note:
        config.parameters[BATCHING_KEY].string_value = note
    return config


# --- arguments -----------------------------------------------------------------------------

def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_name(name: Any) -> str:
    """A model name Triton and every file system take: one plain path component."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > _NAME_MAX:
        raise fail(f"name={name!r} is not a Triton model name: letters, digits, '_', '-' "
                   f"and '.' (not first), at most {_NAME_MAX} characters")
    return name


def check_kind(kind: Any) -> str | None:
    if kind is None:
        return None
    text = kind.lower().removeprefix("kind_") if isinstance(kind, str) else None
    if text not in KINDS:
        raise fail(f"kind={kind!r}: expected one of auto, gpu, cpu (KIND_AUTO, KIND_GPU, "
                   "KIND_CPU)")
    return text


def _gpu_ids(value: Any, where: str) -> list[int]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise fail(f"{where} must be a list of GPU ids (ints >= 0), got {value!r}")
    for gpu in value:
        if not _is_int(gpu) or not 0 <= gpu <= _INT32:
            raise fail(f"{where}: GPU id {gpu!r} is not an int >= 0")
    return list(value)


def check_arguments(*, name: Any, instances: Any, gpus: Any, kind: Any, max_batch_size: Any,
                    external_data: Any, max_queue_delay_us: Any = 0,
                    part_names: Sequence[str] = ()
                    ) -> tuple[str | None, list[int] | dict[str, list[int]] | None]:
    """Every argument of :func:`save_triton`, checked before anything is written: the kind
    (normalized) and the GPU ids, or one line saying what is wrong."""
    check_name(name)
    if not _is_int(instances) or not 1 <= instances <= MAX_INSTANCES:
        raise fail(f"instances={instances!r}: expected an int from 1 to {MAX_INSTANCES}")
    if max_batch_size is not None and (not _is_int(max_batch_size)
                                       or not 0 <= max_batch_size <= _INT32):
        raise fail(f"max_batch_size={max_batch_size!r}: expected None (batch where the parts "
                   "allow) or an int >= 0")
    if not _is_int(max_queue_delay_us) or not 0 <= max_queue_delay_us < 2**63:
        raise fail(f"max_queue_delay_us={max_queue_delay_us!r}: expected an int >= 0")
    if external_data is not None and not isinstance(external_data, bool):
        raise fail(f"external_data={external_data!r}: expected None, True or False")
    chosen = check_kind(kind)
    ids: list[int] | dict[str, list[int]] | None = None
    if isinstance(gpus, Mapping):
        unknown = [k for k in gpus if k not in part_names]
        if unknown:
            raise fail(f"gpus names {unknown[0]!r}, which is no part ({', '.join(part_names)})")
        ids = {k: _gpu_ids(v, f"gpus[{k!r}]") for k, v in gpus.items()}
    elif gpus is not None:
        ids = _gpu_ids(gpus, "gpus") or None
    if ids and chosen in ("cpu", "auto"):
        raise fail(f"gpus={gpus!r} with kind={kind!r}: GPU ids need kind 'gpu' (Triton "
                   "refuses KIND_AUTO or KIND_CPU instances that name GPUs)")
    return chosen, ids


def check_repository_path(repo: Any) -> Path:
    """The repository as a Path, or one line why it cannot be written."""
    if not isinstance(repo, (str, os.PathLike)) or not str(os.fspath(repo)):
        raise fail(f"cannot write a Triton repository to {repo!r}: give a directory")
    out = Path(repo)
    if out.exists() and not out.is_dir():
        raise fail(f"cannot write a Triton repository to '{out}': it is a file")
    parent = _parent(out)
    if not parent.is_dir():
        raise fail(f"cannot write a Triton repository to '{out}': directory '{parent}' "
                   "does not exist")
    if not os.access(parent, os.W_OK):
        raise fail(f"cannot write a Triton repository to '{out}': directory '{parent}' is "
                   "not writable (the set is written beside the repository, then moved in)")
    return out


def _parent(out: Path) -> Path:
    real = out.resolve() if out.exists() else out.absolute()
    return real.parent


# --- saving --------------------------------------------------------------------------------

def save_triton(repo: str | os.PathLike[str], model_graph: Any, parts: Sequence[Any], *,
                name: str = "model", max_batch_size: int | None = None, instances: int = 1,
                gpus: Sequence[int] | Mapping[str, Sequence[int]] | None = None,
                kind: str | None = None, max_queue_delay_us: int = 0,
                external_data: bool | None = None, batch_dim: str | None = None
                ) -> TritonRepository:
    """Write a Triton model repository for ``parts`` (``RegionGraph``s, in execution order)
    cut from ``model_graph`` (the whole model's graph: its inputs and outputs).

    ``kind``: instances of accelerator parts, ``auto`` (default: GPUs where the host has
    them, else CPU), ``gpu`` (the default where ``gpus`` is given) or ``cpu``; CPU regions
    are ``KIND_CPU``. ``instances``: instances of each part model; ``gpus``: GPU ids the
    accelerator parts are spread over, one each in turn (``[0, 1, 2, 3]`` puts four stages
    on four GPUs), or part name -> ids. ``max_batch_size``: ``None`` batches (up to
    ``DEFAULT_MAX_BATCH_SIZE``, with ``dynamic_batching``) where every tensor of every part
    has the model's dynamic batch dimension first and the graph analysis
    (:mod:`~onnx_modular.parts.batch_axis`) proves the model treats it as a batch (no op
    mixes rows along it), else 0 with ``TritonRepository.note`` (and a
    :class:`TritonBatchingWarning`) saying why; a number above 0 where batching is refused
    is an error. ``batch_dim``: states that axis 0 (the dimension of that name, or the
    first input's dynamic first one: torch.export names them ``s<N>``) is the batch; ops
    the analysis cannot follow are then trusted (the note lists them), ops that provably
    mix rows still refuse it. ``max_queue_delay_us``: how long
    a request may wait for others to batch with (Triton's default 0: only those already
    queued while an instance is busy); ``external_data``: weights in a
    data file beside each model (``None``: only above 2 GB). Other models in ``repo`` are
    left alone; the set this ensemble had before is replaced whole.
    """
    live = [p for p in parts if p.model.graph.outputs]  # a part nobody reads is skipped
    chosen, ids = check_arguments(name=name, instances=instances, gpus=gpus, kind=kind,
                                  max_batch_size=max_batch_size, external_data=external_data,
                                  max_queue_delay_us=max_queue_delay_us,
                                  part_names=[p.name for p in live])
    if batch_dim is not None and (not isinstance(batch_dim, str) or not batch_dim):
        raise fail(f"batch_dim={batch_dim!r}: expected the name of the batch dimension")
    out = check_repository_path(repo)
    plan, note = _batching(model_graph, live, max_batch_size, batch_dim)
    if max_batch_size is None:
        max_batch_size = DEFAULT_MAX_BATCH_SIZE if plan.symbol else 0
    if max_batch_size == 0:
        plan = plan_scalars(model_graph, live)
    with batched_parts(live, plan):
        saved = _save(out, model_graph, live, name=name, max_batch_size=max_batch_size,
                      instances=instances, ids=ids, kind=chosen,
                      max_queue_delay_us=max_queue_delay_us, external_data=external_data,
                      note=note)
    if note:
        warnings.warn(f"onnx_modular.save_triton: {note}", TritonBatchingWarning,
                      stacklevel=3)
    return saved


def _batching(model_graph: Any, live: Sequence[Any], max_batch_size: int | None,
              batch_dim: str | None) -> tuple[Any, str]:
    """The batching plan and the note to keep with the set (why it is not batched, or what
    batching took on trust); one line where what was asked cannot be done."""
    symbol = None
    if batch_dim is not None:
        symbol = batch_symbol(model_graph, batch_dim)
        if symbol is None:
            raise fail(f"batch_dim={batch_dim!r}: the model has no dynamic dimension of that "
                       "name and its first input no dynamic first dimension (export with "
                       "dynamic_shapes to batch)")
    first = plan_batching(model_graph, live, symbol)
    plan = prove_batching(model_graph, live, first, stated=batch_dim is not None)
    asked = batch_dim is not None or (max_batch_size or 0) > 0
    if plan.symbol is None and asked and max_batch_size != 0:
        what = f"batch_dim={batch_dim!r}" if batch_dim is not None else \
            f"max_batch_size={max_batch_size}"
        raise fail(f"{what}: Triton batches along every tensor's first dimension, but "
                   f"{plan.reason}")
    if plan.symbol is None:
        inputs = list(model_graph.inputs)
        dynamic = bool(inputs) and isinstance((shape_of(inputs[0]) or [None])[0], str)
        note = f"not batched (max_batch_size 0): {plan.reason}" if dynamic else ""
        return plan, note
    return plan, plan.note


def _save(out: Path, model_graph: Any, live: Sequence[Any], *, name: str,
          max_batch_size: int, instances: int, ids: list[int] | dict[str, list[int]] | None,
          kind: str | None, max_queue_delay_us: int, external_data: bool | None,
          note: str = "") -> TritonRepository:
    threshold = TWO_GB if external_data is None else (0 if external_data else 2**62)
    names = [part_model_name(name, p.name) for p in live]
    if name in names or len(set(names)) != len(names):
        raise fail(f"model names in the repository collide: {name}, {', '.join(names)}")
    steps = list(zip(names, live))
    if out.is_dir():
        _recover(out)
        _remove_stray_staging(out, name)
    old = _old_set(out, name)
    foreign = [m for m in [*names, name] if m not in old and (out / m).exists()]
    if foreign:
        raise fail(f"'{out / foreign[0]}' is a model onnx_modular did not write for the "
                   f"ensemble '{name}'; it is left alone: save under another name")
    version = 1 + max((_versions(out / m) for m in old), default=0)
    set_id = secrets.token_hex(8)
    # the ensemble first: a model Triton could not wire must fail before anything is written
    ensemble = ensemble_config(name, model_graph, steps, max_batch_size=max_batch_size,
                               version=version, set_id=set_id, note=note)
    accs = [p.name for p in live if p.is_acc]
    configs = []
    for model_name, part in steps:
        if isinstance(ids, dict):
            part_ids: list[int] | None = ids.get(part.name)
        elif ids and part.is_acc:
            part_ids = [ids[accs.index(part.name) % len(ids)]]
        else:
            part_ids = None
        configs.append(part_config(model_name, part, max_batch_size=max_batch_size,
                                   instances=instances, gpus=part_ids, kind=kind,
                                   max_queue_delay_us=max_queue_delay_us, set_id=set_id,
                                   ensemble=name))
    parent = _parent(out)
    staging = parent / temp_name(out)
    try:
        staging.mkdir()
        for (model_name, part), config in zip(steps, configs):
            part.model.metadata_props[PARTS_SET_ID] = set_id
            _write_model_dir(staging / model_name, version, config, part.model, threshold)
            _step("staged", model_name)
        _write_model_dir(staging / name, version, ensemble, None, threshold)
        for model_name in [*names, name]:
            _keep_modes(out / model_name, staging / model_name, version)
        out.mkdir(exist_ok=True)
        _swap_in_set(out, staging, name, names, old, set_id)
    except OSError as e:
        raise fail(f"cannot write the Triton repository '{out}': {e.strerror or e}; "
                   "nothing in it was changed") from e
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return TritonRepository(out, name, names, version=version, set_id=set_id,
                            max_batch_size=max_batch_size, note=note)


def _write_model_dir(directory: Path, version: int, config: Any, model: Any,
                     threshold: int) -> None:
    """``config.pbtxt`` and ``<version>/`` (with the model, if any)."""
    from google.protobuf import text_format

    (directory / str(version)).mkdir(parents=True)
    if model is not None:
        save_model(model, directory / str(version) / MODEL_FILE,
                   external_data_threshold=threshold)
    text = text_format.MessageToString(config)
    parse_config(text)  # what Triton reads back must be what was meant
    atomic_write_text(directory / CONFIG, text)


def _remove_stray_staging(out: Path, name: str) -> None:
    """Hidden model directories of this set that saves before sets were staged beside the
    repository left inside it when killed (``.<model>.<8 chars>``, ``.<model>.old-<8>``):
    Triton refuses to start over them."""
    pattern = re.compile(rf"^\.{re.escape(name)}(_[A-Za-z0-9_.-]+)?\.(old-)?[a-z0-9_]{{8}}$")
    for entry in out.iterdir():
        if pattern.match(entry.name) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)


def _versions(directory: Path) -> int:
    """The highest version folder of a model directory (0 for none)."""
    try:
        return max((int(p.name) for p in directory.iterdir()
                    if p.name.isdigit() and p.is_dir()), default=0)
    except OSError:
        return 0


def _old_set(out: Path, name: str) -> list[str]:
    """The models the ensemble ``name`` had: its directory, the parts its steps name and
    every part directory whose config says it belongs to it (a model of another ensemble or
    of nobody's is left)."""
    if not out.is_dir():
        return []
    found = []
    for entry in sorted(out.iterdir()):
        if not entry.is_dir() or not (entry.name == name or entry.name.startswith(f"{name}_")):
            continue
        config = read_config(entry)
        if config is None:
            continue
        steps = [s.model_name for s in config.ensemble_scheduling.step]
        if entry.name == name and config.platform == "ensemble" and steps and all(
                m.startswith(f"{name}_") for m in steps):
            found.append(entry.name)  # (an ensemble saved before sets had ids, too)
            found.extend(m for m in steps if (out / m).is_dir())
        elif config_parameter(config, ENSEMBLE_KEY) == name:
            found.append(entry.name)
    return sorted(set(found))


def _keep_modes(old: Path, new: Path, version: int) -> None:
    """Give the new model directory the permissions its predecessor had (a model kept
    private stays private): the directory, its config, version folder and files."""
    if not old.is_dir():
        return
    old_version = old / str(_versions(old))
    pairs = [(old, new), (old / CONFIG, new / CONFIG), (old_version, new / str(version))]
    old_files = [p for p in old_version.iterdir() if p.is_file()] if old_version.is_dir() \
        else []
    model_mode = next((p for p in old_files if p.name == MODEL_FILE), None)
    if model_mode is not None and (new / str(version)).is_dir():
        pairs += [(model_mode, f) for f in (new / str(version)).iterdir() if f.is_file()]
    for source, target in pairs:
        keep_mode(source, target)


# The swap. ``.<repo>.om<pid>-<hex>.tmp`` (beside the repository) holds the new set while it
# is written; ``.<repo>.om<pid>-old<hex>.tmp`` the old set's directories while they are
# replaced, with ``swap.json`` naming the new set. Triton never sees either: it reads only
# the repository, and a hidden directory inside it would be a model it fails to load.
_JOURNAL = "swap.json"


def _swap_in_set(out: Path, staging: Path, name: str, parts: Sequence[str],
                 old: Sequence[str], set_id: str) -> None:
    """Move the new set in: the old ensemble out first (a server polling the repository
    meanwhile has no ensemble to call, never one over a mix), the old set's directories
    aside, the new parts in, the new ensemble last. The old directories are removed once
    the new ensemble is in; until then :func:`_recover` can put them back."""
    backup = staging.parent / f".{out.name}.om{os.getpid()}-old{secrets.token_hex(3)}.tmp"
    backup.mkdir()
    atomic_write_text(backup / _JOURNAL, json.dumps(
        {"set_id": set_id, "ensemble": name, "models": [*parts, name]}))
    ordered = [m for m in old if m == name] + [m for m in old if m != name]
    try:
        for model in ordered:
            _step("move-old", model)
            os.rename(out / model, backup / model)
        for model in [*parts, name]:
            _step("move-new", model)
            os.rename(staging / model, out / model)
    except BaseException:
        _roll_back(out, backup)  # an error or Ctrl-C here: the old set goes back now
        shutil.rmtree(backup, ignore_errors=True)
        raise
    _step("clean", name)
    shutil.rmtree(backup, ignore_errors=True)


def _step(what: str, model: str) -> None:
    """A filesystem step of the swap (tests inject faults here)."""


def _recover(out: Path) -> None:
    """Undo a save into ``out`` that was killed during its swap, and remove what killed
    saves left beside it: the repository is the old set again."""
    parent = _parent(out)
    backup = re.compile(rf"^\.{re.escape(out.name)}\.om(\d+)-old[0-9a-f]+\.tmp$")
    try:
        entries = sorted(parent.iterdir())
    except OSError:
        return
    for entry in entries:
        match = backup.match(entry.name)
        if match is not None and entry.is_dir() and not pid_alive(int(match[1])):
            _roll_back(out, entry)
    clean_stale_temporaries(parent, out.name)  # backups rolled back, and staging sets


def _roll_back(out: Path, backup: Path) -> None:
    try:
        journal = json.loads((backup / _JOURNAL).read_text(encoding="utf-8"))
        set_id, ensemble = journal["set_id"], journal["ensemble"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # killed before the journal was in place: nothing was moved yet
    config = read_config(out / ensemble)
    if config is not None and config_parameter(config, SET_ID_KEY) == set_id:
        return  # the new ensemble was in: the save was done but for removing the old set
    for model in journal.get("models", []):  # the new set's models already moved in
        config = read_config(out / model)
        if config is not None and config_parameter(config, SET_ID_KEY) == set_id:
            shutil.rmtree(out / model)
    kept = (p for p in backup.iterdir() if p.is_dir())
    for directory in sorted(kept, key=lambda p: (p.name == ensemble, p.name)):  # ensemble last
        if not (out / directory.name).exists():
            os.rename(directory, out / directory.name)
