"""``TritonOptions``: one frozen record of how a repository is written, checked once before
anything is written (each bad field one line), the checked record what the writer uses."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from onnx_modular.leaves._io import TWO_GB
from onnx_modular.leaves.errors import OnnxModularError
from onnx_modular.parts.triton.options import (
    TritonOptions,
    check_repository_path,
    checked,
)


def test_the_record_is_frozen_and_checked_once_into_the_writers_form() -> None:
    given = TritonOptions(name="m", kind="KIND_GPU", gpus=(0, 1), instances=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        given.name = "other"  # type: ignore[misc]
    options = checked(given, ["stage_0", "stage_1"])
    assert (options.kind, options.gpus, options.instances) == ("gpu", [0, 1], 2)
    assert given.kind == "KIND_GPU"  # the caller's record is left as it was
    assert checked(TritonOptions(gpus=[]), []).gpus is None  # no ids is none
    by_part = checked(TritonOptions(kind="gpu", gpus={"stage_1": (3,)}), ["stage_1"])
    assert by_part.gpus == {"stage_1": [3]}


@pytest.mark.parametrize(("fields", "message"), [
    ({"name": "a/b"}, "not a Triton model name"),
    ({"instances": 0}, "from 1 to 1024"),
    ({"max_batch_size": -1}, "max_batch_size=-1"),
    ({"max_queue_delay_us": 1.5}, "max_queue_delay_us=1.5"),
    ({"external_data": 1}, "external_data=1"),
    ({"kind": "tpu"}, "kind='tpu'"),
    ({"gpus": [0], "kind": "cpu"}, "GPU ids need kind 'gpu'"),
    ({"gpus": {"stage_9": [0]}}, "'stage_9', which is no part"),
    ({"batch_dim": ""}, "batch_dim=''"),
])
def test_each_bad_field_is_one_line(fields: dict, message: str) -> None:
    with pytest.raises(OnnxModularError, match=message) as error:
        checked(TritonOptions(**fields), ["stage_0"])
    assert "\n" not in str(error.value)


def test_where_the_weights_go_and_which_gpus_a_part_gets() -> None:
    assert TritonOptions().data_threshold == TWO_GB
    assert TritonOptions(external_data=True).data_threshold == 0
    assert TritonOptions(external_data=False).data_threshold > 2**60
    acc = [SimpleNamespace(name=f"stage_{i}", is_acc=True) for i in range(3)]
    cpu = SimpleNamespace(name="cpu_0", is_acc=False)
    accs = [p.name for p in acc]
    spread = TritonOptions(kind="gpu", gpus=[4, 5])
    assert [spread.part_gpus(p, accs) for p in acc] == [[4], [5], [4]]  # in turn
    assert spread.part_gpus(cpu, accs) is None
    mapped = TritonOptions(kind="gpu", gpus={"stage_1": [2, 3]})
    assert [mapped.part_gpus(p, accs) for p in acc] == [None, [2, 3], None]


def test_a_repository_path_that_cannot_be_written_is_one_line(tmp_path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(OnnxModularError, match="it is a file"):
        check_repository_path(tmp_path / "file")
    with pytest.raises(OnnxModularError, match="does not exist"):
        check_repository_path(tmp_path / "no" / "repo")
    with pytest.raises(OnnxModularError, match="give a directory"):
        check_repository_path("")
    assert check_repository_path(tmp_path / "repo") == tmp_path / "repo"
