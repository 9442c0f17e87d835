"""What is on disk: the set an ensemble has (its models, found by their configs, never a
model of someone else's), the set read back, and a killed save's swap recovered first,
through a symbolic link to the repository too."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from onnx_modular.leaves.errors import OnnxModularError

pytest.importorskip("tritonclient")
from onnx_modular.parts.triton.repository import latest_version, load_repository, old_set

DEAD = 2**22 + 4321  # no such process


def model(repo: Path, name: str, config: str, versions: tuple[int, ...] = (1,)) -> None:
    for v in versions:
        (repo / name / str(v)).mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}')


def ours(set_id: str, ensemble: str = "m") -> str:
    return (f'parameters {{ key: "onnx_modular_set_id" value {{ string_value: "{set_id}" }} }}\n'
            f'parameters {{ key: "onnx_modular_ensemble" value {{ string_value: "{ensemble}" '
            '} }\n')


ENSEMBLE = ('platform: "ensemble"\n'
            'ensemble_scheduling { step { model_name: "m_stage_0" model_version: 2 } }\n'
            'parameters { key: "onnx_modular_set_id" value { string_value: "s1" } }\n')


def written(repo: Path) -> None:
    """The set of ``m`` (version 2), a model of another ensemble, one of nobody's."""
    model(repo, "m_stage_0", 'backend: "onnxruntime"\n' + ours("s1"), (1, 2))
    model(repo, "m", ENSEMBLE, (2,))
    model(repo, "m_custom", 'backend: "onnxruntime"\n')
    model(repo, "mx_stage_0", 'backend: "onnxruntime"\n' + ours("s2", "mx"))


def test_the_set_of_an_ensemble_is_its_models_only(tmp_path: Path) -> None:
    written(tmp_path)
    (tmp_path / "m_stray").mkdir()  # no config: not a model of the set
    assert old_set(tmp_path, "m") == ["m", "m_stage_0"]
    assert old_set(tmp_path, "mx") == ["mx_stage_0"]
    assert old_set(tmp_path / "none", "m") == []
    assert latest_version(tmp_path / "m_stage_0") == 2 and latest_version(tmp_path) == 0


def test_a_set_is_read_back_from_its_configs(tmp_path: Path) -> None:
    written(tmp_path)
    loaded = load_repository(tmp_path)
    assert (loaded.ensemble, loaded.models, loaded.version, loaded.set_id) == (
        "m", ["m_stage_0"], 2, "s1")
    with pytest.raises(OnnxModularError, match="no ensemble 'mx'"):
        load_repository(tmp_path, "mx")
    with pytest.raises(OnnxModularError, match="no such directory"):
        load_repository(tmp_path / "none")
    model(tmp_path, "n", ENSEMBLE.replace('"s1"', '"s3"'))
    with pytest.raises(OnnxModularError, match="holds 2 ensembles .*name one"):
        load_repository(tmp_path)


def test_loading_through_a_link_recovers_a_save_killed_beside_the_real_folder(tmp_path: Path
                                                                              ) -> None:
    real = tmp_path / "real"
    written(real)
    (tmp_path / "link").symlink_to(real)
    backup = tmp_path / f".real.om{DEAD}-old0a1b2c3d.tmp"  # the ensemble was moved out
    staging = tmp_path / f".real.om{DEAD}-0a1b2c3d.tmp"
    (staging / "m").mkdir(parents=True)  # ... and the new one never came in
    backup.mkdir()
    (backup / "swap.json").write_text(json.dumps({
        "format": "onnx_modular.folders", "staging": staging.name, "home": "real",
        "old": ["m"], "new": ["m"]}))
    os.rename(real / "m", backup / "m")
    loaded = load_repository(tmp_path / "link")
    assert loaded.ensemble == "m" and loaded.set_id == "s1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]
