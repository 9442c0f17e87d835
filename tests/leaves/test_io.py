"""Saves are atomic as a set: a reader sees the old model + data or the new ones, never a part
or a mix, whatever step fails; a killed writer's temporaries go with the next save."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from torch import nn

import onnx_modular as om
from onnx_modular.leaves import _io


class Two(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        with torch.no_grad():
            self.fc.weight.fill_(scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


X = torch.ones(2, 16)


def export(scale: float) -> om.ExportResult:
    return om.export(Two(scale).eval(), (X,))


def run(path: Path) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: X.numpy()})[0]


@pytest.mark.slow
def test_external_data_saves_replace_the_whole_set(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    export(1.0).save(path, external_data_threshold=0)
    first = set(os.listdir(tmp_path))
    export(2.0).save(path, external_data_threshold=0)
    second = set(os.listdir(tmp_path))
    assert len(second) == 2 and "m.onnx" in second and not (first - {"m.onnx"}) & second
    assert run(path)[0, 0] == pytest.approx(2.0 * 16 + float(Two(2.0).fc.bias[0]), abs=1)


@pytest.mark.slow
@pytest.mark.parametrize("step", range(4))
def test_an_interrupted_save_leaves_the_old_set(tmp_path: Path, monkeypatch, step: int) -> None:
    """Every file operation of an external-data save fails in turn (disk full)."""
    path = tmp_path / "m.onnx"
    old = export(1.0)
    old.save(path, external_data_threshold=0)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    expected = run(path)
    calls = {"n": 0}
    real_replace = os.replace

    def failing_replace(src: object, dst: object) -> None:
        if calls["n"] == step:
            calls["n"] += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        calls["n"] += 1
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    new = export(2.0)
    try:
        new.save(path, external_data_threshold=0)
    except om.OnnxModularError as e:
        assert "no space left" in str(e) and "\n" not in str(e)
        after = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
        assert after == before  # exactly the old set, nothing else
        np.testing.assert_array_equal(run(path), expected)
    else:  # the failing step came after the save was complete
        monkeypatch.undo()
        assert len(list(tmp_path.iterdir())) == 2
        assert not np.array_equal(run(path), expected)


def test_a_killed_writers_temporaries_go_with_the_next_save(tmp_path: Path) -> None:
    dead = 2**22 + 12345  # above the default pid_max: no such process
    stale_file = tmp_path / f".m.onnx.om{dead}-abcd1234.tmp"
    stale_file.write_bytes(b"half a model")
    stale_dir = tmp_path / f".m.onnx.om{dead}-beef0000.tmp"
    stale_dir.mkdir()
    (stale_dir / "m.onnx").write_bytes(b"half")
    other = tmp_path / f".other.onnx.om{dead}-abcd1234.tmp"  # another target's: kept
    other.write_bytes(b"x")
    mine = tmp_path / f".m.onnx.om{os.getpid()}-live0000.tmp"  # a live writer's: kept
    mine.write_bytes(b"x")
    export(1.0).save(tmp_path / "m.onnx")
    assert not stale_file.exists() and not stale_dir.exists()
    assert other.exists() and mine.exists()


def test_bad_targets_are_one_line_and_touch_nothing(tmp_path: Path) -> None:
    result = export(1.0)
    folder = tmp_path / "folder"
    folder.mkdir()
    unrelated = tmp_path / "folder.data"
    unrelated.write_bytes(b"keep me")
    with pytest.raises(om.OnnxModularError, match="is a directory"):
        result.save(folder, external_data_threshold=0)
    with pytest.raises(om.OnnxModularError, match="output path is empty"):
        result.save("")
    assert unrelated.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "folder.data"]


def test_disk_full_during_an_inline_save_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    def full(_model: object, file: BinaryIO) -> None:
        file.write(b"\x00" * 100)  # part of the model, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_io, "write_inline", full)
    with pytest.raises(om.OnnxModularError, match="no space left on the device"):
        export(1.0).save(tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama", "convnet", "conv_bn"])
def test_an_inline_save_writes_the_model_ir_save_writes(name: str, tmp_path: Path) -> None:
    """One weight at a time, as a second ``graph`` field that protobuf merges: the file
    reads back as the very model (value_info aside, whose order carries no meaning)."""
    from models import ARCHITECTURES

    model, args = ARCHITECTURES[name]()
    result = om.export(model, args)
    result.save(tmp_path / "m.onnx")
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]
    got, want = onnx.load(str(tmp_path / "m.onnx")), result.model_proto

    def ordered(proto: onnx.ModelProto) -> onnx.ModelProto:
        infos = sorted(proto.graph.value_info, key=lambda v: v.name)
        del proto.graph.value_info[:]
        proto.graph.value_info.extend(infos)
        return proto

    assert ordered(got) == ordered(want)
    feeds = {i.name: a.numpy() for i, a in zip(want.graph.input, args, strict=False)}
    on_disk = ort.InferenceSession(str(tmp_path / "m.onnx"),
                                   providers=["CPUExecutionProvider"]).run(None, feeds)
    in_memory = ort.InferenceSession(want.SerializeToString(),
                                     providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b in zip(on_disk, in_memory, strict=True):
        np.testing.assert_array_equal(a, b)


class ReturnsNone(nn.Module):
    def forward(self, x: torch.Tensor) -> None:
        return None


class ReturnsInt(nn.Module):
    def forward(self, x: torch.Tensor) -> int:
        return x.shape[0]


class ReturnsStr(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, str]:
        return x + 1, "hello"


@pytest.mark.parametrize("model, message", [
    (ReturnsNone(), "returns no tensor"),
    (ReturnsInt(), r"output #0 .* constant Python int \(2\), not a tensor"),
    (ReturnsStr(), r"output #1 .* constant Python str \('hello'\), not a tensor"),
])
def test_outputs_that_are_not_tensors_are_one_clear_error(model: nn.Module,
                                                         message: str) -> None:
    with pytest.raises(om.OnnxModularError, match=message):
        om.export(model, (torch.randn(2, 3),))


def test_inputs_that_do_not_fit_fail_before_anything_is_written(tmp_path: Path) -> None:
    """int64 ids into a Linear: torch.export does not run kernels and lets it through;
    strict ONNX inference stops it, naming the module and the user's line."""
    with pytest.raises(om.OnnxModularError, match=r"invalid in module 'fc', node 'linear'.*"
                       r"\[module 'fc', node 'linear', .*test_io\.py:\d+\]"):
        om.export(Two(1.0).eval(), (torch.randint(0, 5, (2, 16)),))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("threshold", [0, _io.TWO_GB])
def test_folded_transposed_weights_are_written_in_c_order(threshold: int,
                                                          tmp_path: Path) -> None:
    """``Transpose(weight)`` folds to a strided numpy view, which torch copies into C order as
    it is written: the file holds the very bytes the in-memory proto holds."""
    from onnx_modular.leaves._weights import StridedTensor

    model = nn.Sequential(nn.Linear(48, 80), nn.GELU(), nn.Linear(80, 24)).eval()
    result = om.export(model, (torch.randn(2, 3, 48),))  # 3-D: MatMul, not Gemm
    strided = [v for v in result.model.graph.initializers.values()
               if isinstance(v.const_value, StridedTensor)]
    assert strided and not strided[0].const_value.numpy().flags.c_contiguous
    result.save(tmp_path / "m.onnx", external_data_threshold=threshold)
    got = {t.name: onnx.numpy_helper.to_array(t)
           for t in onnx.load(str(tmp_path / "m.onnx")).graph.initializer}
    want = {t.name: onnx.numpy_helper.to_array(t) for t in result.model_proto.graph.initializer}
    assert got.keys() == want.keys()
    for name, array in want.items():
        np.testing.assert_array_equal(got[name], array)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float8_e4m3fn", "int64",
                                   "bool", ">f4", "complex128"])
def test_strided_arrays_are_made_contiguous_bytes_and_all(dtype: str) -> None:
    """torch copies the bytes as integers of the element's size (bfloat16 and float8 of
    ml_dtypes, a big-endian array); what it cannot take, numpy copies."""
    import ml_dtypes

    from onnx_modular.leaves._weights import contiguous_array

    kind = getattr(ml_dtypes, dtype, None) or np.dtype(dtype)
    base = np.arange(12, dtype=np.float32).reshape(3, 4).astype(kind)
    for view in (base.T, base[::-1, ::2]):  # transposed; flipped (negative strides)
        out = contiguous_array(view)
        assert out.flags.c_contiguous and out.dtype == view.dtype
        assert out.tobytes() == np.ascontiguousarray(view).tobytes()


def test_a_strided_int4_weight_is_written_packed(tmp_path: Path) -> None:
    """Two int4 values to a byte, as onnx_ir packs them: the bytes written are nbytes."""
    from onnx_modular.leaves._weights import StridedTensor

    values = np.arange(-4, 4, dtype=np.int8).reshape(2, 4).T
    tensor = StridedTensor(values, dtype=ir.DataType.INT4)
    with open(tmp_path / "w.bin", "wb") as file:
        tensor.tofile(file)
    assert (tmp_path / "w.bin").read_bytes() == ir.Tensor(
        np.ascontiguousarray(values), dtype=ir.DataType.INT4).tobytes()
    assert (tmp_path / "w.bin").stat().st_size == tensor.nbytes == 4


def test_large_external_weights_lie_at_offsets_onnx_runtime_can_map(tmp_path: Path) -> None:
    """ORT maps an external weight instead of reading it into its own memory when its
    offset is a multiple of the page size (64 KiB on Windows)."""
    model = nn.Sequential(nn.Linear(700, 600), nn.Linear(600, 5)).eval()
    om.export(model, (torch.randn(2, 700),)).save(tmp_path / "m.onnx", external_data_threshold=0)
    proto = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    entries = [{e.key: e.value for e in t.external_data} for t in proto.graph.initializer
               if t.data_location == onnx.TensorProto.EXTERNAL]
    large = [int(e.get("offset", 0)) for e in entries if int(e["length"]) >= 2**20]
    assert len(large) == 1 and all(offset % 65536 == 0 for offset in large)
    assert len(entries) >= 3  # both weights and the first bias


def test_an_onnx_ir_without_writer_threads_still_saves_external_data(tmp_path: Path,
                                                                    monkeypatch) -> None:
    """onnx_ir before 1.1 has no ``max_workers``/``alignment``: ir.save is called plainly."""
    from onnx_modular.leaves import _compat

    monkeypatch.setattr(_compat, "_ir_save_parameters", lambda: frozenset({"external_data"}))
    path = tmp_path / "m.onnx"
    export(3.0).save(path, external_data_threshold=0)
    assert len(list(tmp_path.iterdir())) == 2
    assert run(path)[0, 0] == pytest.approx(3.0 * 16 + float(Two(3.0).fc.bias[0]), abs=1)


def test_a_file_system_that_takes_no_file_names_the_users_path(tmp_path, monkeypatch) -> None:
    """/proc, /sys, a read-only mount: the temporary cannot be made; the error names the
    path asked for (not the hidden temporary) and nothing is left behind."""
    real_open = os.open

    def refuse(path: str | os.PathLike[str], *args: object, **kwargs: object) -> int:
        if ".om" in os.fspath(path):  # a PermissionError, as /sys gives
            raise OSError(errno.EACCES, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(_io.os, "open", refuse)
    target = tmp_path / "model.onnx"
    with pytest.raises(om.OnnxModularError) as caught, _io.atomic_path(target):
        pass
    assert f"cannot write '{target}': Permission denied" in str(caught.value)
    assert ".tmp" not in str(caught.value) and list(tmp_path.iterdir()) == []


def test_a_parent_that_is_a_file_is_named_as_one(tmp_path) -> None:
    (tmp_path / "good.onnx").write_bytes(b"x")
    with pytest.raises(om.OnnxModularError, match="'.*good.onnx' is a file, not a directory"):
        _io.check_writable(tmp_path / "good.onnx" / "x.onnx")
