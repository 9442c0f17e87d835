"""What a Triton repository is written with: :class:`TritonOptions`, one frozen record built
by the caller and passed whole, and every check of it (and of the repository's path) that
runs before anything is written, each failing in one line."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from onnx_modular.leaves._io import TWO_GB
from onnx_modular.leaves.errors import fail

#: ``max_batch_size`` written where the parts keep a dynamic batch dimension
DEFAULT_MAX_BATCH_SIZE = 8
MAX_INSTANCES = 1024
_INT32 = 2**31 - 1
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_NAME_MAX = 200  # leaves room for "_run_on_cpu_<n>" and the temporaries' suffixes
KINDS = {"auto": "KIND_AUTO", "gpu": "KIND_GPU", "cpu": "KIND_CPU"}


@dataclasses.dataclass(frozen=True)
class TritonOptions:
    """How :func:`~onnx_modular.parts.triton.save_triton` writes a repository: the
    arguments of ``SplitResult.save_triton`` as given. :func:`checked` checks them and
    gives the record the writer uses (``kind`` normalized, ``gpus`` as lists of ids,
    ``max_batch_size`` an int once batching is decided)."""

    name: str = "model"
    instances: int = 1
    gpus: Sequence[int] | Mapping[str, Sequence[int]] | None = None
    kind: str | None = None
    max_batch_size: int | None = None
    max_queue_delay_us: int = 0
    external_data: bool | None = None
    batch_dim: str | None = None
    #: symbol -> the user's Dim name (``s27`` -> ``batch``), where the program kept them
    dim_names: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def data_threshold(self) -> int:
        """Weights above this many bytes go to a data file beside their model."""
        if self.external_data is None:
            return TWO_GB
        return 0 if self.external_data else 2**62

    def part_gpus(self, part: Any, accs: Sequence[str]) -> list[int] | None:
        """The GPU ids of one part (``accs``: the accelerator parts' names, in order): its
        own where ``gpus`` maps parts, else accelerator parts take the ids in turn."""
        if isinstance(self.gpus, Mapping):
            ids = self.gpus.get(part.name)
            return list(ids) if ids is not None else None
        if self.gpus and part.is_acc:
            return [self.gpus[accs.index(part.name) % len(self.gpus)]]
        return None


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


def _check_numbers(options: TritonOptions) -> None:
    instances, max_batch_size = options.instances, options.max_batch_size
    if not _is_int(instances) or not 1 <= instances <= MAX_INSTANCES:
        raise fail(f"instances={instances!r}: expected an int from 1 to {MAX_INSTANCES}")
    if max_batch_size is not None and (not _is_int(max_batch_size)
                                       or not 0 <= max_batch_size <= _INT32):
        raise fail(f"max_batch_size={max_batch_size!r}: expected None (batch where the parts "
                   "allow) or an int >= 0")
    delay = options.max_queue_delay_us
    if not _is_int(delay) or not 0 <= delay < 2**63:
        raise fail(f"max_queue_delay_us={delay!r}: expected an int >= 0")
    if options.external_data is not None and not isinstance(options.external_data, bool):
        raise fail(f"external_data={options.external_data!r}: expected None, True or False")


def checked(options: TritonOptions, part_names: Sequence[str] = ()) -> TritonOptions:
    """Every field of ``options`` checked before anything is written (``part_names``: the
    parts ``gpus`` may name), or one line saying what is wrong; the record with the kind
    normalized and the GPU ids as lists (``None`` for none)."""
    check_name(options.name)
    _check_numbers(options)
    kind, gpus = check_kind(options.kind), options.gpus
    ids: list[int] | dict[str, list[int]] | None = None
    if isinstance(gpus, Mapping):
        unknown = [k for k in gpus if k not in part_names]
        if unknown:
            raise fail(f"gpus names {unknown[0]!r}, which is no part ({', '.join(part_names)})")
        ids = {k: _gpu_ids(v, f"gpus[{k!r}]") for k, v in gpus.items()}
    elif gpus is not None:
        ids = _gpu_ids(gpus, "gpus") or None
    if ids and kind in ("cpu", "auto"):
        raise fail(f"gpus={gpus!r} with kind={options.kind!r}: GPU ids need kind 'gpu' "
                   "(Triton refuses KIND_AUTO or KIND_CPU instances that name GPUs)")
    batch_dim = options.batch_dim
    if batch_dim is not None and (not isinstance(batch_dim, str) or not batch_dim):
        raise fail(f"batch_dim={batch_dim!r}: expected the name of the batch dimension")
    return dataclasses.replace(options, kind=kind, gpus=ids)


def repository_anchor(out: Path) -> Path:
    """The repository as the staged-folder transaction anchors it: its real path (the set
    is staged beside the real folder, on its file system)."""
    return out.resolve() if out.exists() else out.absolute()


def check_repository_path(repo: Any) -> Path:
    """The repository as a Path, or one line why it cannot be written."""
    if not isinstance(repo, (str, os.PathLike)) or not str(os.fspath(repo)):
        raise fail(f"cannot write a Triton repository to {repo!r}: give a directory")
    out = Path(repo)
    if out.exists() and not out.is_dir():
        raise fail(f"cannot write a Triton repository to '{out}': it is a file")
    parent = repository_anchor(out).parent
    if not parent.is_dir():
        raise fail(f"cannot write a Triton repository to '{out}': directory '{parent}' "
                   "does not exist")
    if not os.access(parent, os.W_OK):
        raise fail(f"cannot write a Triton repository to '{out}': directory '{parent}' is "
                   "not writable (the set is written beside the repository, then moved in)")
    return out
