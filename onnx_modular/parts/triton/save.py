"""Saving a Triton repository: the arguments checked, batching decided, every model of the
set written into the staged-folder transaction (:class:`~onnx_modular.leaves._io.folders.
StagedFolders`), which swaps the set in with the old ensemble out first and the new one in
last, so a server polling the repository meanwhile never finds an ensemble over a mix."""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx_ir as ir

from onnx_modular.emit.regions import RegionGraph
from onnx_modular.leaves._io import atomic_write_text, keep_mode, save_model
from onnx_modular.leaves._io.folders import StagedFolders
from onnx_modular.leaves.errors import fail
from onnx_modular.leaves.metadata import PARTS_SET_ID
from onnx_modular.parts.batching import (
    batch_symbol,
    batched_parts,
    plan_batching,
    plan_scalars,
    prove_batching,
)
from onnx_modular.parts.manifest import shape_of
from onnx_modular.parts.triton.config import (
    CONFIG,
    MODEL_FILE,
    SetStamp,
    ensemble_config,
    parse_config,
    part_config,
    part_model_name,
)
from onnx_modular.parts.triton.options import (
    DEFAULT_MAX_BATCH_SIZE,
    TritonOptions,
    check_repository_path,
    checked,
    repository_anchor,
)
from onnx_modular.parts.triton.repository import (
    TritonRepository,
    latest_version,
    old_set,
    recover_repository,
)


class TritonBatchingWarning(UserWarning):
    """A model with a dynamic first dimension saved without batching (or batched on the
    caller's word): ``TritonRepository.note`` says why."""


def save_triton(repo: str | os.PathLike[str], model_graph: ir.Graph, parts: Sequence[RegionGraph],
                options: TritonOptions | None = None) -> TritonRepository:
    """Write a Triton model repository for ``parts`` (``RegionGraph``s, in execution order)
    cut from ``model_graph`` (the whole model's graph: its inputs and outputs).

    ``options`` (:class:`TritonOptions`, default: all defaults): ``kind``: instances of
    accelerator parts, ``auto`` (default: GPUs where the host has them, else CPU), ``gpu``
    (the default where ``gpus`` is given) or ``cpu``; CPU regions are ``KIND_CPU``.
    ``instances``: instances of each part model; ``gpus``: GPU ids the accelerator parts
    are spread over, one each in turn (``[0, 1, 2, 3]`` puts four stages on four GPUs), or
    part name -> ids. ``max_batch_size``: ``None`` batches (up to
    ``DEFAULT_MAX_BATCH_SIZE``, with ``dynamic_batching``) where every tensor of every part
    has the model's dynamic batch dimension first and the graph analysis
    (:mod:`~onnx_modular.parts.batch_axis`) proves the model treats it as a batch (no op
    mixes rows along it), else 0 with ``TritonRepository.note`` (and a
    :class:`TritonBatchingWarning`) saying why; a number above 0 where batching is refused
    is an error. ``batch_dim``: states that axis 0 (the dimension of that name: the
    ``Dim`` the program was exported with, which torch.export renames ``s<N>``, found
    through ``options.dim_names``; where the program kept no names, the first input's
    dynamic first dimension) is the batch; ops
    the analysis cannot follow are then trusted (the note lists them), ops that provably
    mix rows still refuse it. ``max_queue_delay_us``: how long a request may wait for
    others to batch with (Triton's default 0: only those already queued while an instance
    is busy); ``external_data``: weights in a data file beside each model (``None``: only
    above 2 GB). Other models in ``repo`` are left alone; the set this ensemble had before
    is replaced whole.
    """
    live = [p for p in parts if p.model.graph.outputs]  # a part nobody reads is skipped
    options = checked(options or TritonOptions(), [p.name for p in live])
    out = check_repository_path(repo)
    plan, note = _batching(model_graph, live, options)
    if options.max_batch_size is None:
        options = dataclasses.replace(
            options, max_batch_size=DEFAULT_MAX_BATCH_SIZE if plan.symbol else 0)
    if options.max_batch_size == 0:
        plan = plan_scalars(model_graph, live)
    with batched_parts(live, plan):
        saved = _save(out, model_graph, live, options, note)
    if note:
        warnings.warn(f"onnx_modular.save_triton: {note}", TritonBatchingWarning,
                      stacklevel=3)
    return saved


def _batching(model_graph: ir.Graph, live: Sequence[RegionGraph], options: TritonOptions
              ) -> tuple[Any, str]:
    """The batching plan and the note to keep with the set (why it is not batched, or what
    batching took on trust); one line where what was asked cannot be done."""
    batch_dim, max_batch_size = options.batch_dim, options.max_batch_size
    symbol = None
    if batch_dim is not None:
        try:
            symbol = batch_symbol(model_graph, batch_dim, options.dim_names)
        except ValueError as e:
            raise fail(f"batch_dim={batch_dim!r}: {e}") from None
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


def _save(out: Path, model_graph: ir.Graph, live: Sequence[RegionGraph], options: TritonOptions,
          note: str) -> TritonRepository:
    """The set's configs (the ensemble first: a model Triton could not wire fails before
    anything is written), then the set written and swapped in."""
    name = options.name
    names = [part_model_name(name, p.name) for p in live]
    if name in names or len(set(names)) != len(names):
        raise fail(f"model names in the repository collide: {name}, {', '.join(names)}")
    steps = list(zip(names, live))
    if out.is_dir():
        recover_repository(out)
        _remove_stray_staging(out, name)
    old = old_set(out, name)
    foreign = [m for m in [*names, name] if m not in old and (out / m).exists()]
    if foreign:
        raise fail(f"'{out / foreign[0]}' is a model onnx_modular did not write for the "
                   f"ensemble '{name}'; it is left alone: save under another name")
    stamp = SetStamp(1 + max((latest_version(out / m) for m in old), default=0),
                     secrets.token_hex(8), note)
    ensemble = ensemble_config(model_graph, steps, options, stamp)
    accs = [p.name for p in live if p.is_acc]
    configs = {m: part_config(m, p, options, stamp, options.part_gpus(p, accs))
               for m, p in steps}
    try:
        _write_set(out, steps, configs, ensemble, options, stamp, old)
    except OSError as e:
        raise fail(f"cannot write the Triton repository '{out}': {e.strerror or e}; "
                   "nothing in it was changed") from e
    return TritonRepository(out, name, names, version=stamp.version, set_id=stamp.set_id,
                            max_batch_size=options.max_batch_size or 0, note=note)


def _write_set(out: Path, steps: Sequence[tuple[str, RegionGraph]], configs: dict[str, Any],
               ensemble: Any, options: TritonOptions, stamp: SetStamp,
               old: Sequence[str]) -> None:
    """Every model of the set into the transaction (the ensemble last: it goes in last),
    with the modes the models it replaces had; the old set's other models retire."""
    anchor = repository_anchor(out)
    threshold = options.data_threshold
    with StagedFolders(anchor, anchor, retire=old) as staged:
        for model_name, part in steps:
            part.model.metadata_props[PARTS_SET_ID] = stamp.set_id
            _write_model_dir(staged.folder(model_name), stamp.version, configs[model_name],
                             part.model, threshold)
        _write_model_dir(staged.folder(options.name), stamp.version, ensemble, None,
                         threshold)
        for model_name in staged.staged:
            _keep_modes(out / model_name, staged.staging / model_name, stamp.version)


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


def _keep_modes(old: Path, new: Path, version: int) -> None:
    """Give the new model directory the permissions its predecessor had (a model kept
    private stays private): the directory, its config, version folder and files."""
    if not old.is_dir():
        return
    old_version = old / str(latest_version(old))
    pairs = [(old, new), (old / CONFIG, new / CONFIG), (old_version, new / str(version))]
    old_files = [p for p in old_version.iterdir() if p.is_file()] if old_version.is_dir() \
        else []
    model_mode = next((p for p in old_files if p.name == MODEL_FILE), None)
    if model_mode is not None and (new / str(version)).is_dir():
        pairs += [(model_mode, f) for f in (new / str(version)).iterdir() if f.is_file()]
    for source, target in pairs:
        keep_mode(source, target)
