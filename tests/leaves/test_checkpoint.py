"""_checkpoint: a checkpoint index names shards inside its folder only (the rule of parts
directories), a malformed index or shard is one line naming the file and the entry, and a
tied weight saved under two names with different values is refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from onnx_modular.diagnostics import OnnxModularError
from onnx_modular.leaves._checkpoint import INDEX_NAME, open_checkpoint, plan


class Two(torch.nn.Module):
    def __init__(self, tied: bool = False) -> None:
        super().__init__()
        self.a = torch.nn.Linear(2, 2, bias=False)
        self.b = torch.nn.Linear(2, 2, bias=False)
        if tied:
            self.b.weight = self.a.weight


def on_meta(tied: bool = False) -> Two:
    with torch.device("meta"):
        return Two(tied)


def full(value: float) -> torch.Tensor:
    return torch.full((2, 2), value)


def shards(folder: Path, weight_map: object, files: dict[str, dict[str, torch.Tensor]],
           index: str | None = None) -> Path:
    """``folder`` with safetensors ``files`` and an index of ``weight_map`` (or ``index``)."""
    folder.mkdir()
    for name, tensors in files.items():
        save_file(tensors, str(folder / name))
    (folder / INDEX_NAME).write_text(index if index is not None
                                     else json.dumps({"weight_map": weight_map}))
    return folder


def refused(checkpoint: object, *words: str, tied: bool = False) -> str:
    with pytest.raises(OnnxModularError) as caught:
        plan(on_meta(tied), checkpoint)  # type: ignore[arg-type]
    text = str(caught.value)
    assert caught.value.diagnostic.rule.id == "OM0502" and "\n" not in text, text
    assert all(w in text for w in words), text
    return text


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A safetensors file beside the checkpoint folder, not in it."""
    path = tmp_path / "outside.safetensors"
    save_file({"b.weight": full(666.0)}, str(path))
    return path


@pytest.mark.parametrize("entry", ["../outside.safetensors", "ABSOLUTE", "sub/s.safetensors"])
def test_an_index_entry_out_of_the_folder_is_refused(tmp_path: Path, outside: Path,
                                                     entry: str) -> None:
    entry = str(outside) if entry == "ABSOLUTE" else entry
    folder = shards(tmp_path / "ck", {"a.weight": "s.safetensors", "b.weight": entry},
                    {"s.safetensors": {"a.weight": full(1.0)}})
    refused(folder, INDEX_NAME, "entry 'b.weight'", repr(entry), "not a plain file name")


def test_a_shard_linked_out_of_the_folder_is_refused(tmp_path: Path, outside: Path) -> None:
    folder = shards(tmp_path / "ck", {"a.weight": "s.safetensors", "b.weight": "l.safetensors"},
                    {"s.safetensors": {"a.weight": full(1.0)}})
    os.symlink(outside, folder / "l.safetensors")
    refused(folder, "entry 'b.weight'", "'l.safetensors' is a symbolic link out of the "
            "directory")


def test_a_single_file_linked_out_of_an_index_free_folder_is_refused(
        tmp_path: Path, outside: Path) -> None:
    (tmp_path / "ck").mkdir()
    os.symlink(outside, tmp_path / "ck" / "model.safetensors")
    refused(tmp_path / "ck", "symbolic link out of the directory")


def test_a_shard_linked_inside_the_folder_is_read(tmp_path: Path) -> None:
    folder = shards(tmp_path / "ck", {"a.weight": "s.safetensors", "b.weight": "l.safetensors"},
                    {"s.safetensors": {"a.weight": full(1.0)},
                     "real.safetensors": {"b.weight": full(2.0)}})
    os.symlink("real.safetensors", folder / "l.safetensors")
    assert [value[0, 0].item() for _, value in plan(on_meta(), folder)] == [1.0, 2.0]


def test_a_hugging_face_cache_snapshot_linking_into_its_blobs_is_read(tmp_path: Path) -> None:
    """``snapshots/<rev>/file -> ../../blobs/<sha>``: how huggingface_hub stores every file."""
    repo = tmp_path / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    save_file({"a.weight": full(1.0), "b.weight": full(2.0)}, str(repo / "blobs" / "0abc"))
    snapshot = repo / "snapshots" / "rev"
    snapshot.mkdir(parents=True)
    os.symlink("../../blobs/0abc", snapshot / "model.safetensors")
    assert [value[0, 0].item() for _, value in plan(on_meta(), snapshot)] == [1.0, 2.0]


@pytest.mark.parametrize(("index", "words"), [
    ("{nope", ["cannot read", "JSONDecodeError"]),
    ('{"weight_map": [["a.weight", "s.safetensors"]]}', ["no \"weight_map\" object",
                                                         "its weight_map is a list"]),
    ("[1]", ["no \"weight_map\" object", "it holds a list"]),
    ('{"weight_map": {"a.weight": "s.safetensors", "b.weight": null}}',
     ["entry 'b.weight'", "file None is not a plain file name"]),
    ('{"weight_map": {"a.weight": "s.safetensors", "b.weight": ["x"]}}',
     ["entry 'b.weight'", "['x'] is not a plain file name"]),
    ('{"weight_map": {"a.weight": "s.safetensors", "b.weight": "gone.safetensors"}}',
     ["entry 'b.weight'", "shard 'gone.safetensors' is not there"]),
])
def test_a_malformed_index_is_one_line_naming_file_and_entry(
        tmp_path: Path, index: str, words: list[str]) -> None:
    folder = shards(tmp_path / "ck", None, {"s.safetensors": {"a.weight": full(1.0)}}, index)
    refused(folder, str(folder / INDEX_NAME), *words)


def test_a_shard_that_is_no_safetensors_file_is_one_line(tmp_path: Path) -> None:
    folder = shards(tmp_path / "ck", {"a.weight": "s.safetensors", "b.weight": "j.safetensors"},
                    {"s.safetensors": {"a.weight": full(1.0)}})
    (folder / "j.safetensors").write_bytes(b"not safetensors")
    refused(folder, "tensor 'b.weight' in shard 'j.safetensors'", "as safetensors")


def test_a_shard_without_the_tensor_its_entry_names_is_one_line(tmp_path: Path) -> None:
    folder = shards(tmp_path / "ck", {"a.weight": "s.safetensors", "b.weight": "t.safetensors"},
                    {"s.safetensors": {"a.weight": full(1.0)},
                     "t.safetensors": {"c": full(3.0)}})
    refused(folder, "tensor 'b.weight' in shard 't.safetensors'", "does not hold it")


def test_a_directory_named_like_a_shard_is_not_a_shard(tmp_path: Path) -> None:
    folder = shards(tmp_path / "ck", {"a.weight": "s.safetensors", "b.weight": "d.safetensors"},
                    {"s.safetensors": {"a.weight": full(1.0)}})
    (folder / "d.safetensors").mkdir()
    refused(folder, "entry 'b.weight'", "shard 'd.safetensors' is not a file")
    plain = tmp_path / "plain"
    plain.mkdir()
    save_file({"a.weight": full(1.0), "b.weight": full(2.0)}, str(plain / "m.safetensors"))
    (plain / "x.safetensors").mkdir()  # no index: the one file is the checkpoint
    assert sorted(open_checkpoint(plain).keys()) == ["a.weight", "b.weight"]


def test_a_tied_weight_saved_twice_with_different_values_is_refused(tmp_path: Path) -> None:
    save_file({"a.weight": full(1.0), "b.weight": full(2.0)}, str(tmp_path / "m.safetensors"))
    refused(tmp_path / "m.safetensors", "'a.weight' and 'b.weight'", "tied",
            "different values", tied=True)
    refused({"a.weight": full(1.0), "b.weight": full(2.0)}, "'a.weight' and 'b.weight'",
            tied=True)


def test_a_tied_weight_saved_twice_alike_is_one_weight(tmp_path: Path) -> None:
    nan = torch.tensor([[float("nan"), 1.0], [2.0, 3.0]])
    save_file({"a.weight": nan, "b.weight": nan.clone()}, str(tmp_path / "m.safetensors"))
    ((slots, value),) = plan(on_meta(tied=True), tmp_path / "m.safetensors")
    assert [s[2] for s in slots] == ["a.weight", "b.weight"] and value[0, 1] == 1.0
    assert len(plan(on_meta(tied=True), {"a.weight": full(1.0), "b.weight": full(1.0)})) == 1
