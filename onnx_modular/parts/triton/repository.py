"""A Triton repository as onnx_modular left it: the set an ensemble has there (read back
from the configs), which models are that set's, and the recovery of a save killed while
swapping its set in."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from onnx_modular.leaves._io.folders import recover
from onnx_modular.leaves.errors import fail
from onnx_modular.parts.triton.config import (
    BATCHING_KEY,
    CONFIG,
    ENSEMBLE_KEY,
    SET_ID_KEY,
    config_parameter,
    parse_config,
    read_config,
)
from onnx_modular.parts.triton.options import repository_anchor


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


def recover_repository(out: Path) -> None:
    """Undo a save into ``out`` killed during its swap (or finish it, where the new
    ensemble was in), and remove what killed saves left beside it."""
    recover(repository_anchor(out))


def load_repository(repo: str | os.PathLike[str], name: str | None = None
                    ) -> TritonRepository:
    """The set :func:`save_triton` wrote into ``repo`` (the ensemble ``name``, or the only
    ensemble there), read back from its configs."""
    path = Path(repo)
    if not path.is_dir():
        raise fail(f"'{repo}' is not a Triton model repository (no such directory)")
    recover_repository(path)
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


def latest_version(directory: Path) -> int:
    """The highest version folder of a model directory (0 for none)."""
    try:
        return max((int(p.name) for p in directory.iterdir()
                    if p.name.isdigit() and p.is_dir()), default=0)
    except OSError:
        return 0


def old_set(out: Path, name: str) -> list[str]:
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
