"""``save_triton`` takes its options as one record and writes the set through the
staged-folder transaction: a failure while a model is written leaves the old set and
nothing beside the repository."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import models
import pytest
import torch

import onnx_modular as om

pytest.importorskip("tritonclient")
from onnx_modular.parts.triton import save as save_module
from onnx_modular.parts.triton.options import TritonOptions
from onnx_modular.parts.triton.repository import load_repository


@pytest.fixture(scope="module")
def stages() -> om.SplitResult:
    model, args = models.Net(4).eval(), (torch.randn(2, models.DIM),)
    return om.split_stages(om.capture(model, args), num_stages=2)


def files(repo: Path) -> dict[str, bytes]:
    return {str(p.relative_to(repo)): p.read_bytes() for p in sorted(repo.rglob("*"))
            if p.is_file()}


def test_the_options_record_is_passed_whole(stages, tmp_path: Path) -> None:
    options = TritonOptions(name="n", instances=2, kind="cpu")
    saved = save_module.save_triton(tmp_path / "repo", stages.onnx_model.graph,
                                    stages.region_graphs(), options)
    assert saved.models == ["n_stage_0", "n_stage_1"] and saved.ensemble == "n"
    configs = saved.configs()
    assert {c.instance_group[0].count for n, c in configs.items() if n != "n"} == {2}
    assert (tmp_path / "repo" / "n_stage_0" / "1" / "model.onnx").is_file()
    assert sorted(os.listdir(tmp_path)) == ["repo"]
    assert load_repository(tmp_path / "repo").set_id == saved.set_id


def test_a_model_that_cannot_be_written_leaves_the_old_set(stages, tmp_path: Path,
                                                           monkeypatch) -> None:
    repo = tmp_path / "repo"
    first = stages.save_triton(repo, name="m")
    before = files(repo)
    real, calls = save_module.save_model, []

    def full(*args: object, **kwargs: object) -> None:
        calls.append(args)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(*args, **kwargs)

    monkeypatch.setattr(save_module, "save_model", full)
    with pytest.raises(om.OnnxModularError, match="No space left.*nothing in it was changed"):
        stages.save_triton(repo, name="m")
    assert files(repo) == before
    assert os.listdir(tmp_path) == ["repo"]
    assert load_repository(repo).set_id == first.set_id
