"""Weights from a checkpoint, bound to a model built on the meta device.

A model too large for memory is built without weights (``with torch.device("meta"): ...``)
and its tensors are taken from a safetensors checkpoint: one ``.safetensors`` file, a
directory of Hugging Face shards (``model.safetensors.index.json``), or a mapping
name -> tensor. safetensors maps its files: a tensor's bytes are read from the page cache
when something touches them (the weight's write into the ONNX external data, a matmul in
torch) and counted as file pages the kernel may drop, never as the process's private
memory. So the whole pipeline runs unchanged on the bound model and writes the same bytes
as it would from the materialized one; weights it never writes are never read.

Every name, shape and dtype is checked before anything is bound, and a mismatch is one
line naming the parameter. The model gets its own tensors back on exit.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from onnx_modular.diagnostics import Location, Rule
from onnx_modular.leaves._compat import has_transformers_init, transformers_init_weights
from onnx_modular.leaves._io import inside_folder
from onnx_modular.leaves.arguments import Model
from onnx_modular.leaves.errors import fail, rules

#: What ``weights=`` takes.
Checkpoint = str | os.PathLike[str] | Mapping[str, torch.Tensor]

INDEX_NAME = "model.safetensors.index.json"


class _Files:
    """The tensors of safetensors files, opened lazily, each mapped from its file."""

    def __init__(self, where: dict[str, Path], label: str) -> None:
        self.where, self.label = where, label  # tensor name -> its file
        self._open: dict[Path, Any] = {}
        self._keys: dict[Path, set[str]] = {}

    def keys(self) -> Any:
        return self.where.keys()

    def __contains__(self, name: object) -> bool:
        return name in self.where

    def __getitem__(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        path = self.where[name]
        handle = self._open.get(path)
        where = f"checkpoint '{self.label}': tensor '{name}' in shard '{path.name}'"
        if handle is None:
            try:
                handle = self._open[path] = safe_open(str(path), framework="pt")
                self._keys[path] = set(handle.keys())
            except Exception as e:
                raise fail(f"{where}: cannot read the shard as safetensors: "
                           f"{type(e).__name__}: {e}", rules.CHECKPOINT) from e
        if name not in self._keys[path]:
            raise fail(f"{where}: the shard does not hold it", rules.CHECKPOINT)
        try:
            return handle.get_tensor(name)
        except Exception as e:  # a shard cut short: its header promises more than it holds
            raise fail(f"{where}: cannot read it: {type(e).__name__}: {e}",
                       rules.CHECKPOINT) from e


def open_checkpoint(checkpoint: Checkpoint) -> Mapping[str, torch.Tensor] | _Files:
    """Name -> tensor of ``checkpoint``, every tensor of a file mapped, not read."""
    if isinstance(checkpoint, Mapping):
        bad = next((k for k, v in checkpoint.items() if not isinstance(v, torch.Tensor)), None)
        if bad is not None:
            raise fail(f"weights[{bad!r}] is a {type(checkpoint[bad]).__name__}, not a "
                       "torch.Tensor", rules.CHECKPOINT)
        return checkpoint
    if not isinstance(checkpoint, str | os.PathLike):
        raise fail("weights= takes a .safetensors file, a directory of safetensors shards "
                   f"with {INDEX_NAME}, or a mapping name -> tensor; got "
                   f"{type(checkpoint).__name__}", rules.CHECKPOINT)
    path = Path(checkpoint)
    if path.is_dir():
        index = path / INDEX_NAME
        if not index.is_file():
            single = sorted(p for p in path.glob("*.safetensors") if not p.is_dir())
            if len(single) != 1:
                raise fail(f"checkpoint directory '{path}' has no {INDEX_NAME} (and "
                           f"{len(single)} .safetensors files)", rules.CHECKPOINT)
            return _files_of([_shard(path, single[0].name, f"checkpoint '{path}'")],
                             str(path))
        return _Files(_index(path, index), str(path))
    if not path.is_file():
        raise fail(f"checkpoint '{path}' does not exist", rules.CHECKPOINT)
    return _files_of([path], str(path))


def _index(folder: Path, index: Path) -> dict[str, Path]:
    """Tensor name -> its shard, from ``model.safetensors.index.json``; every entry a
    shard file inside ``folder`` (:func:`_shard`), or one line naming the entry."""
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError too
        raise fail(f"cannot read '{index}': {type(e).__name__}: {e}",
                   rules.CHECKPOINT) from e
    weight_map = data.get("weight_map") if isinstance(data, dict) else data
    if not isinstance(weight_map, dict):
        got = f"its weight_map is a {type(weight_map).__name__}" if isinstance(data, dict) \
            else f"it holds a {type(data).__name__}"
        raise fail(f"'{index}' has no \"weight_map\" object (tensor name -> shard file): "
                   f"{got}", rules.CHECKPOINT)
    shards: dict[object, Path] = {}
    where: dict[str, Path] = {}
    for name, file in weight_map.items():
        if not isinstance(file, str) or file not in shards:
            shards[file] = _shard(folder, file, f"'{index}': entry '{name}'")
        where[name] = shards[file]
    return where


def _shard(folder: Path, name: object, where: str) -> Path:
    """``folder/name`` if it is a file inside ``folder``: the rule of parts directories
    (:func:`_io.inside_folder`: no ``..``, no absolute path, no symbolic link out), so an
    index cannot pull tensors from elsewhere into the model. The Hugging Face cache keeps
    a snapshot's files as links into its repository's ``blobs``: those are inside too."""
    resolved = folder.resolve()
    blobs = (resolved.parent.parent / "blobs",) if resolved.parent.name == "snapshots" else ()
    file = inside_folder(folder, name, where, links_within=blobs, rule=rules.CHECKPOINT)
    if not file.is_file():
        raise fail(f"{where}: shard '{name}' is "
                   + ("not a file" if file.exists() else "not there"), rules.CHECKPOINT)
    return file


def _files_of(paths: list[Path], label: str) -> _Files:
    from safetensors import safe_open

    where: dict[str, Path] = {}
    for path in paths:
        try:
            with safe_open(str(path), framework="pt") as f:
                where.update(dict.fromkeys(f.keys(), path))
        except Exception as e:
            raise fail(f"cannot read checkpoint '{path}' as safetensors: "
                       f"{type(e).__name__}: {e}", rules.CHECKPOINT) from e
    return _Files(where, label)


def _slots(model: torch.nn.Module) -> dict[int, list[tuple[torch.nn.Module, str, str, bool]]]:
    """Each distinct tensor of the model -> every (module, attribute, full name,
    is-parameter) holding it: a tied weight is held in several places and saved once."""
    slots: dict[int, list[tuple[torch.nn.Module, str, str, bool]]] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        dot = f"{prefix}." if prefix else ""
        for attr, tensor in module.named_parameters(recurse=False):
            slots.setdefault(id(tensor), []).append((module, attr, dot + attr, True))
        for attr, tensor in module.named_buffers(recurse=False):
            slots.setdefault(id(tensor), []).append((module, attr, dot + attr, False))
    return slots


def _describe(tensor: torch.Tensor) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')} {list(tensor.shape)}"


def plan(model: torch.nn.Module, checkpoint: Checkpoint
         ) -> list[tuple[list[tuple[torch.nn.Module, str, str, bool]], torch.Tensor]]:
    """What to bind where: every tensor of the model the checkpoint has (under any of its
    names), checked; one line naming the parameter on the first mismatch, before any
    binding. A meta tensor the checkpoint lacks is an error, but for non-persistent
    buffers (computed, never saved): those :func:`_recompute_buffers` makes."""
    if not isinstance(model, torch.nn.Module):
        raise fail(f"weights= needs the model as an nn.Module, got {type(model).__name__}",
                   rules.CHECKPOINT)
    tensors = open_checkpoint(checkpoint)
    label = getattr(tensors, "label", "the weights mapping")
    saved = set(model.state_dict(keep_vars=True))  # what checkpoints hold: no computed buffers
    bound = []
    for slots in _slots(model).values():
        module, attr, _, _ = slots[0]
        current = getattr(module, attr)
        names = [s[2] for s in slots if s[2] in tensors]
        name = names[0] if names else None
        if name is None:
            if current.device.type == "meta" and any(s[2] in saved for s in slots):
                raise fail(f"'{slots[0][2]}' ({_describe(current)}) is not in checkpoint "
                           f"{label}", rules.CHECKPOINT)
            continue
        value = tensors[name]
        if tuple(value.shape) != tuple(current.shape) or value.dtype != current.dtype:
            hint = f" (build the model in {value.dtype})" \
                if tuple(value.shape) == tuple(current.shape) else ""
            raise fail(f"'{name}' is {_describe(value)} in checkpoint {label}, but the model "
                       f"has {_describe(current)}{hint}", rules.CHECKPOINT)
        for other in names[1:]:  # a tied weight saved under several names: one value
            twin = tensors[other]
            if not _same(value, twin):
                kinds = f" ({_describe(value)} and {_describe(twin)})" \
                    if (value.shape, value.dtype) != (twin.shape, twin.dtype) else ""
                raise fail(f"'{name}' and '{other}' are one tied weight of the model, but "
                           f"checkpoint {label} holds different values under the two "
                           f"names{kinds}", rules.CHECKPOINT)
        bound.append((slots, value))
    return bound


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit the same tensor (NaN included), without a temporary of their size."""
    if a is b or (a.shape, a.dtype) != (b.shape, b.dtype):
        return a is b
    if a.data_ptr() == b.data_ptr() and a.stride() == b.stride():
        return True
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(a.element_size())
    if bits is None or a.dtype == torch.bool:
        return torch.equal(a, b)
    return torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))


def _recompute_buffers(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, Any]]:
    """Non-persistent buffers left on the meta device (rotary ``inv_freq``: computed from
    the config in ``__init__``, never saved): transformers models recompute them with
    their own weight initialization. Returns what was replaced, to put back."""
    saved = set(model.state_dict(keep_vars=True))
    replaced = []
    for prefix, module in model.named_modules():
        dot = f"{prefix}." if prefix else ""
        meta = [a for a, b in module.named_buffers(recurse=False)
                if b.device.type == "meta" and dot + a not in saved]
        if not meta:
            continue
        owner = _transformers_owner(model, prefix)
        if owner is None:
            raise fail(f"buffer '{dot}{meta[0]}' is on the meta device and not saved in "
                       "checkpoints (non-persistent): build the model with only its "
                       "parameters on meta", rules.CHECKPOINT)
        for attr in meta:
            old = getattr(module, attr)
            replaced.append((module, attr, old))
            setattr(module, attr, torch.empty_like(old, device="cpu"))
        try:
            with torch.no_grad():
                transformers_init_weights(owner, module)
        except Exception as e:
            raise fail(f"cannot compute buffer '{dot}{meta[0]}' (meta, non-persistent) "
                       f"with {type(owner).__name__}'s weight initialization: "
                       f"{type(e).__name__}: {e}", rules.CHECKPOINT) from e
    return replaced


def _transformers_owner(model: torch.nn.Module, path: str) -> Any:
    """The innermost transformers ``PreTrainedModel`` above ``path``, if any."""
    owner = None
    node: torch.nn.Module = model
    parts = path.split(".") if path else []
    for k in range(len(parts) + 1):
        if has_transformers_init(node):
            owner = node
        if k < len(parts):
            node = getattr(node, parts[k])
    return owner


def meta_tensor(model: torch.nn.Module) -> str | None:
    """The name of the model's first tensor on the meta device, if any."""
    for name, tensor in (*model.named_parameters(), *model.named_buffers()):
        if tensor.device.type == "meta":
            return name
    return None


def check_checkpoint(model: Model, checkpoint: Checkpoint) -> None:
    """Fail now, in one line, if ``checkpoint`` cannot be bound to ``model``."""
    plan(model, checkpoint)


def require_data(model: Any, rule: Rule, location: Location | None = None) -> None:
    """Fail now, in one line, if the model has a tensor on the meta device (no data to run
    or export) and no checkpoint is given."""
    if isinstance(model, torch.nn.Module) and (on_meta := meta_tensor(model)) is not None:
        raise fail(f"'{on_meta}' of {type(model).__name__} is on the meta device (no data): "
                   "pass its checkpoint as weights= (--weights on the command line)",
                   rule, location)


@contextlib.contextmanager
def bound_weights(model: Any, checkpoint: Checkpoint | None) -> Iterator[Any]:
    """``model`` holding the checkpoint's mapped tensors while the block runs (nothing
    when ``checkpoint`` is None); its own tensors are put back after."""
    if checkpoint is None:
        yield model
        return
    bound = plan(model, checkpoint)
    saved: list[tuple[torch.nn.Module, str, Any]] = []
    replaced: list[tuple[torch.nn.Module, str, Any]] = []
    try:
        for slots, value in bound:
            module, attr, _, is_param = slots[0]
            old = getattr(module, attr)
            # one object for every slot: a tied weight stays one weight
            new = torch.nn.Parameter(value, requires_grad=old.requires_grad) \
                if is_param else value
            for module, attr, _, _ in slots:
                saved.append((module, attr, getattr(module, attr)))
                setattr(module, attr, new)  # a buffer stays (non-)persistent
        replaced = _recompute_buffers(model)
        yield model
    finally:
        for module, attr, old in (*reversed(replaced), *reversed(saved)):
            setattr(module, attr, old)
