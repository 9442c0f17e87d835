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
then swapped in with the ensemble out of the repository meanwhile (the staged-folder
transaction, :mod:`onnx_modular.leaves._io.folders`); a save killed on the way is undone by the
next one.

One job per module: ``options`` (:class:`TritonOptions`, the one record of how a repository
is written, and every check that runs before writing), ``config`` (the ModelConfig
messages), ``repository`` (what is on disk: the set an ensemble has, loading it back,
recovery), ``save`` (:func:`save_triton`: batching decided, the set written through the
transaction).
"""

from onnx_modular.parts.triton.config import (
    BATCHING_KEY,
    CONFIG,
    ENSEMBLE_KEY,
    MODEL_FILE,
    SET_ID_KEY,
    TRITON_TYPES,
    SetStamp,
    config_parameter,
    ensemble_config,
    model_config_pb2,
    parse_config,
    part_config,
    part_model_name,
    read_config,
)
from onnx_modular.parts.triton.options import (
    DEFAULT_MAX_BATCH_SIZE,
    KINDS,
    MAX_INSTANCES,
    TritonOptions,
    check_kind,
    check_name,
    check_repository_path,
    checked,
)
from onnx_modular.parts.triton.repository import (
    TritonRepository,
    load_repository,
    recover_repository,
)
from onnx_modular.parts.triton.save import TritonBatchingWarning, save_triton

__all__ = [
    "BATCHING_KEY", "CONFIG", "DEFAULT_MAX_BATCH_SIZE", "ENSEMBLE_KEY", "KINDS",
    "MAX_INSTANCES", "MODEL_FILE", "SET_ID_KEY", "TRITON_TYPES", "SetStamp",
    "TritonBatchingWarning", "TritonOptions", "TritonRepository", "check_kind",
    "check_name", "check_repository_path", "checked", "config_parameter",
    "ensemble_config", "load_repository", "model_config_pb2", "parse_config",
    "part_config", "part_model_name", "read_config", "recover_repository", "save_triton",
]
