"""``save_triton`` writes a repository as one set: re-saves replace the set whole (fewer
stages leave no old model), keep other models and file modes, a save killed at any step
leaves the old set or the new one (never a mix), and every bad argument is one line."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import models
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import onnx_modular as om

pytest.importorskip("tritonclient")
from onnx_modular.leaves._io import folders
from onnx_modular.parts import triton


@pytest.fixture(scope="module")
def net_stages():
    """A small model as 3 and as 2 stages (cheap to save many times)."""
    model, args = models.Net(4).eval(), (torch.randn(2, models.DIM),)
    program = om.capture(model, args)
    return om.split_stages(program, num_stages=3), om.split_stages(program, num_stages=2)


def foreign_models(repo: Path) -> None:
    """Models of someone else's in the repository: one of another name, one whose name
    starts like ours but whose config is not ours."""
    for name in ("other", "m_custom"):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "onnxruntime"\n')


def snapshot(directory: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path under ``directory``: its mode and (for files) its bytes."""
    out = {}
    for path in sorted(directory.rglob("*")):
        mode = stat.S_IMODE(path.lstat().st_mode)
        out[str(path.relative_to(directory))] = (mode, path.read_bytes()
                                                 if path.is_file() else None)
    return out


def consistent(repo: Path, name: str = "m") -> str | None:
    """The set id of the ensemble ``name`` if it is in place and every step it names is the
    version it pins with the same set id (what Triton would load), else None."""
    config = triton.read_config(repo / name)
    if config is None:
        return None
    set_id = triton.config_parameter(config, triton.SET_ID_KEY)
    for step in config.ensemble_scheduling.step:
        part = triton.read_config(repo / step.model_name)
        assert part is not None, f"the ensemble names {step.model_name}, which is gone"
        assert triton.config_parameter(part, triton.SET_ID_KEY) == set_id, "a mix"
        assert (repo / step.model_name / str(step.model_version) / "model.onnx").is_file()
    return set_id


def ours(repo: Path, name: str = "m") -> list[str]:
    return sorted(p.name for p in repo.iterdir() if p.name == name or (
        p.name.startswith(f"{name}_") and p.name != f"{name}_custom"))


@pytest.mark.slow
def test_resaving_fewer_stages_replaces_the_set_and_keeps_the_rest(net_stages, tmp_path
                                                                   ) -> None:
    three, two = net_stages
    repo = tmp_path / "repo"
    repo.mkdir()
    foreign_models(repo)
    first = three.save_triton(repo, name="m")
    assert ours(repo) == ["m", "m_stage_0", "m_stage_1", "m_stage_2"] and first.version == 1
    os.chmod(repo / "m_stage_0" / "1" / "model.onnx", 0o600)
    os.chmod(repo / "m_stage_0" / "config.pbtxt", 0o600)
    os.chmod(repo / "m_stage_0", 0o700)
    foreign = {n: snapshot(repo / n) for n in ("other", "m_custom")}
    for stray in (".m_stage_1.k2j_9x0a", ".m.old-abcd1234"):  # killed saves of old releases
        (repo / stray / "1").mkdir(parents=True)
        (repo / stray / "config.pbtxt").write_text('name: "m_stage_1"\n')
    second = two.save_triton(repo, name="m")
    assert ours(repo) == ["m", "m_stage_0", "m_stage_1"]  # no stale m_stage_2 to load
    assert not [p for p in repo.iterdir() if p.name.startswith(".")]  # Triton fails on those
    assert second.version == 2 and second.set_id != first.set_id
    assert consistent(repo) == second.set_id
    steps = second.configs()["m"].ensemble_scheduling.step
    assert [s.model_version for s in steps] == [2, 2]  # the ensemble pins this save's models
    assert {n: snapshot(repo / n) for n in ("other", "m_custom")} == foreign
    assert stat.S_IMODE((repo / "m_stage_0" / "2" / "model.onnx").stat().st_mode) == 0o600
    assert stat.S_IMODE((repo / "m_stage_0" / "config.pbtxt").stat().st_mode) == 0o600
    assert stat.S_IMODE((repo / "m_stage_0").stat().st_mode) == 0o700
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]  # nothing left beside
    loaded = triton.load_repository(repo, "m")
    assert (loaded.models, loaded.version, loaded.set_id) == (second.models, 2, second.set_id)


@pytest.mark.slow
def test_a_save_killed_at_each_step_leaves_the_old_set_or_the_new_one(net_stages, tmp_path
                                                                      ) -> None:
    """A child process saves over the old set and dies (``os._exit``: no cleanup runs) at
    the k-th filesystem step. What a server would load then is never a mix; after the next
    save's recovery the repository is exactly the old one, or the new set whole."""
    three, two = net_stages
    template = tmp_path / "template"
    template.mkdir()
    foreign_models(template)
    three.save_triton(template, name="m")
    old = snapshot(template)
    outcomes = []
    for k in range(40):
        work = tmp_path / f"k{k}"
        work.mkdir()
        repo = work / "repo"
        shutil.copytree(template, repo)
        pid = os.fork()
        if pid == 0:  # the child: save, dying at step k
            try:
                steps = iter(range(k))

                def die_at_k(*_: object, steps=steps) -> None:
                    if next(steps, None) is None:
                        os._exit(9)

                folders._step = die_at_k
                two.save_triton(repo, name="m")
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        killed = os.waitstatus_to_exitcode(status) == 9
        before = consistent(repo)  # no mix whatever the server reads now
        triton.recover_repository(repo)  # what the next save (or load_repository) runs first
        after = consistent(repo)
        leftovers = sorted(p.name for p in work.iterdir())
        assert leftovers == ["repo"], (k, leftovers)
        if snapshot(repo) == old:
            outcomes.append("old")
        else:
            assert after is not None and after == before, k
            assert ours(repo) == ["m", "m_stage_0", "m_stage_1"], (k, ours(repo))
            outcomes.append("new")
        shutil.rmtree(work)
        if not killed:
            break
    # every step was a kill point once, and the last run finished the save
    assert outcomes[-1] == "new" and "old" in outcomes and len(outcomes) > 8, outcomes


@pytest.mark.slow
def test_an_error_during_the_swap_puts_the_old_set_back(net_stages, tmp_path, monkeypatch
                                                        ) -> None:
    three, two = net_stages
    repo = tmp_path / "repo"
    three.save_triton(repo, name="m")
    old = snapshot(repo)
    calls = []

    def fail_on_third(what: str, model: str) -> None:
        calls.append(what)
        if len(calls) == 5:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(folders, "_step", fail_on_third)
    with pytest.raises(om.OnnxModularError, match="No space left.*nothing in it was changed"):
        two.save_triton(repo, name="m")
    assert snapshot(repo) == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"name": ""}, "not a Triton model name"),
    ({"name": "."}, "not a Triton model name"),
    ({"name": ".."}, "not a Triton model name"),
    ({"name": "a/b"}, "not a Triton model name"),
    ({"name": "x" * 300}, "at most 200"),
    ({"gpus": ["a"]}, "GPU id 'a' is not an int"),
    ({"gpus": [-1]}, "GPU id -1 is not an int >= 0"),
    ({"gpus": "0"}, "must be a list of GPU ids"),
    ({"gpus": {"stage_9": [0]}}, "'stage_9', which is no part"),
    ({"gpus": [0], "kind": "auto"}, "GPU ids need kind 'gpu'"),
    ({"instances": 1.5}, "instances=1.5"),
    ({"instances": 10**12}, "from 1 to 1024"),
    ({"instances": True}, "instances=True"),
    ({"kind": "tpu"}, "kind='tpu'"),
    ({"max_batch_size": -1}, "max_batch_size=-1"),
    ({"max_batch_size": 4}, "no dynamic first dimension"),
    ({"external_data": "yes"}, "external_data='yes'"),
])
def test_bad_arguments_are_one_line_and_write_nothing(net_stages, tmp_path, kwargs, message
                                                      ) -> None:
    three, _ = net_stages
    repo = tmp_path / "repo"
    repo.mkdir()
    foreign_models(repo)
    before = snapshot(tmp_path)
    with pytest.raises(om.OnnxModularError, match=message) as error:
        three.save_triton(repo, **kwargs)
    assert "\n" not in str(error.value)
    assert snapshot(tmp_path) == before


def test_a_repository_that_is_a_file_or_has_no_parent_is_one_line(net_stages, tmp_path
                                                                   ) -> None:
    three, _ = net_stages
    foreign_models(tmp_path / "repo")
    before = snapshot(tmp_path)
    with pytest.raises(om.OnnxModularError, match="did not write .* left alone"):
        three.save_triton(tmp_path / "repo", name="other")  # someone else's ensemble name
    with pytest.raises(om.OnnxModularError, match="m_custom' is a model onnx_modular did not"):
        three.save_triton(tmp_path / "repo", name="m_custom")
    assert snapshot(tmp_path) == before
    (tmp_path / "f").write_text("x")
    with pytest.raises(om.OnnxModularError, match="it is a file"):
        three.save_triton(tmp_path / "f")
    with pytest.raises(om.OnnxModularError, match="does not exist"):
        three.save_triton(tmp_path / "no" / "repo")
    with pytest.raises(om.OnnxModularError, match="give a directory"):
        three.save_triton("")


ARGUMENT_VALUES = {
    "name": st.one_of(st.sampled_from(["", ".", "..", "a/b", "m", "M-1.x", "_m", "-m", "m\0",
                                       "m ", "é"]), st.text(max_size=12)),
    "instances": st.one_of(st.integers(-3, 2**40), st.floats(allow_nan=True), st.none(),
                           st.booleans(), st.just("2")),
    "gpus": st.one_of(st.none(), st.lists(st.one_of(st.integers(-2, 3), st.text(max_size=2),
                                                    st.floats()), max_size=3),
                      st.dictionaries(st.sampled_from(["stage_0", "stage_7"]),
                                      st.lists(st.integers(-1, 3), max_size=2)),
                      st.just("0")),
    "kind": st.one_of(st.none(), st.sampled_from(["auto", "GPU", "KIND_CPU", "kind_auto",
                                                  "tpu", ""]), st.integers()),
    "max_batch_size": st.one_of(st.none(), st.integers(-2, 2**40), st.floats()),
    "max_queue_delay_us": st.one_of(st.integers(-2, 2**70), st.floats()),
    "external_data": st.one_of(st.none(), st.booleans(), st.integers(0, 2)),
}


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.fixed_dictionaries({}, optional=ARGUMENT_VALUES))
def test_any_arguments_give_a_loadable_set_or_one_line_and_no_change(net_stages, tmp_path,
                                                                     kwargs) -> None:
    three, _ = net_stages
    root = tmp_path / "h"
    shutil.rmtree(root, ignore_errors=True)
    repo = root / "repo"
    repo.mkdir(parents=True)
    foreign_models(repo)
    before = snapshot(root)
    try:
        saved = three.save_triton(repo, **kwargs)
    except om.OnnxModularError as e:
        assert "\n" not in str(e) and "Traceback" not in str(e)
        assert snapshot(root) == before
        return
    assert consistent(repo, saved.ensemble) == saved.set_id
    assert sorted(p.name for p in root.iterdir()) == ["repo"]
    configs = saved.configs()
    for name in saved.models:
        (group,) = configs[name].instance_group
        assert group.count == kwargs.get("instances", 1)
        assert all(g >= 0 for g in group.gpus)
    assert snapshot(repo / "other") == {k.removeprefix("repo/other/"): v
                                        for k, v in before.items()
                                        if k.startswith("repo/other/")}


def test_a_set_saved_before_sets_had_ids_is_replaced_whole(net_stages, tmp_path) -> None:
    """Configs without parameters (as saved before this release): the ensemble's steps
    say which models were its, so they are replaced and none is left behind."""
    three, two = net_stages
    repo = tmp_path / "repo"
    three.save_triton(repo, name="m")
    for config_file in repo.glob("m*/config.pbtxt"):
        config = triton.parse_config(config_file.read_text())
        config.ClearField("parameters")
        config_file.write_text(str(config))
    two.save_triton(repo, name="m")
    assert ours(repo) == ["m", "m_stage_0", "m_stage_1"]
    assert consistent(repo) is not None


def test_triton_runner_says_in_one_line_what_is_missing(net_stages, tmp_path) -> None:
    pytest.importorskip("geventhttpclient")  # tritonclient[http]
    three, _ = net_stages
    repo = tmp_path / "repo"
    three.save_triton(repo, name="m")
    with pytest.raises(om.OnnxModularError, match="no endpoint for model 'm_stage_2'"):
        om.TritonRunner(repo, {"stage_0": "127.0.0.1:1", "m_stage_1": "127.0.0.1:1"})
    with pytest.raises(om.OnnxModularError, match="protocol='tcp'"):
        om.TritonRunner(repo, "127.0.0.1:1", protocol="tcp")
    runner = om.TritonRunner(repo, {"*": "http://127.0.0.1:1"}, timeout=5)
    assert [s[0] for s in runner.steps] == ["m_stage_0", "m_stage_1", "m_stage_2"]
    with pytest.raises(om.OnnxModularError, match="takes 1 input"):
        runner.run()
    with pytest.raises(om.OnnxModularError, match="no Triton server answers at 127.0.0.1:1"):
        runner.run(torch.randn(2, models.DIM))
