"""runtime: ONNX Runtime plumbing (loading, providers, the one session maker, feeds); every
user mistake is a one-line OnnxModularError."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from onnx_modular.diagnostics import OnnxModularError
from onnx_modular.leaves import runtime
from onnx_modular.leaves.runtime import (
    LoadedModel,
    ProviderUnavailableError,
    first_line,
    load_model,
    make_session,
    non_text_field,
    provider_name,
    resolve_providers,
    run_session,
    to_feed,
    unavailable_defaults,
)

CPU = "CPUExecutionProvider"


def _add_one(weight_name: str = "one") -> onnx.ModelProto:
    """``y = x + one`` with ``one`` an initializer of shape [4]."""
    one = numpy_helper.from_array(np.ones(4, np.float32), weight_name)
    node = helper.make_node("Add", ["x", weight_name], ["y"])
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              initializer=[one])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


# ---- providers -------------------------------------------------------------------------------

def test_provider_names_from_what_users_type() -> None:
    assert provider_name("cuda") == provider_name(" GPU ") == "CUDAExecutionProvider"
    assert provider_name("trt") == "TensorrtExecutionProvider"
    assert provider_name("CPUExecutionProvider") == provider_name("CPU") == CPU


def test_resolve_providers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "available_providers", lambda: ["AzureExecutionProvider", CPU])
    assert resolve_providers(None) == [CPU]
    assert resolve_providers("cpu, CPU,") == [CPU]
    with pytest.raises(OnnxModularError, match=r"OM0501 .*'cuda' is not available \(it "
                                               r"needs the onnxruntime-gpu package.*available: "
                                               r"AzureExecutionProvider, CPU"):
        resolve_providers(["cuda"])
    with pytest.raises(OnnxModularError, match=r"no execution provider given"):
        resolve_providers(" , ")


def test_defaults_left_out_are_stated() -> None:
    missing = unavailable_defaults([CPU])
    assert list(missing) == ["CUDAExecutionProvider"] and "onnxruntime-gpu" in missing[
        "CUDAExecutionProvider"]
    assert unavailable_defaults(["CUDAExecutionProvider", CPU]) == {}


# ---- sessions --------------------------------------------------------------------------------

def test_make_session_runs_and_applies_its_options() -> None:
    session, seconds = make_session(_add_one().SerializeToString(), CPU, fuse=False,
                                    prepack=False, spin=False)
    assert seconds >= 0 and session.get_providers() == [CPU]
    options = session.get_session_options()
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert options.get_session_config_entry("session.disable_prepacking") == "1"
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    (y,), _ = run_session(session, {"x": np.arange(4, dtype=np.float32)})
    np.testing.assert_array_equal(y, [1, 2, 3, 4])


def test_a_model_ort_rejects_is_one_line() -> None:
    with pytest.raises(OnnxModularError, match=r"^error: OM0401 validation: ONNX Runtime "
                                               r"cannot load the probe on CPU: ") as caught:
        make_session(b"not a model", CPU, what="the probe")
    assert "\n" not in str(caught.value)


def test_a_provider_ort_silently_drops_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = ort.InferenceSession

    class FellBack(real):  # type: ignore[misc, valid-type]
        def __init__(self, source: Any, options: Any, providers: list[str]) -> None:
            super().__init__(source, options, providers=[CPU])

    monkeypatch.setattr(ort, "InferenceSession", FellBack)
    with pytest.raises(ProviderUnavailableError, match=r"CUDAExecutionProvider could not be "
                                                       r"initialized \(ONNX Runtime fell back "
                                                       r"to CPUExecutionProvider\)"):
        make_session(_add_one().SerializeToString(), "CUDAExecutionProvider")


def test_a_failed_run_is_one_line() -> None:
    session, _ = make_session(_add_one().SerializeToString(), CPU)
    with pytest.raises(OnnxModularError, match=r"OM0401 .*ONNX Runtime failed to run the "
                                               r"model: "):
        run_session(session, {"x": np.zeros(5, np.float32)})


# ---- loading ---------------------------------------------------------------------------------

class _Result:
    def __init__(self, proto: onnx.ModelProto) -> None:
        self.model_proto = proto


def test_load_from_memory_an_export_result_or_a_path(tmp_path: Path) -> None:
    proto = _add_one()
    assert load_model(proto).label == "<ModelProto>"
    assert load_model(_Result(proto)).label == "<_Result>"
    path = tmp_path / "m.onnx"
    onnx.save(proto, path)
    loaded = load_model(path)
    assert loaded.path == path and loaded.session_source() == str(path)
    assert loaded.size_bytes == path.stat().st_size and not loaded.large
    assert load_model(loaded) is loaded


def test_external_data_is_checked_and_found_beside_the_model(tmp_path: Path) -> None:
    proto = _add_one()
    path = tmp_path / "m.onnx"
    onnx.save(proto, path, save_as_external_data=True, location="m.data", size_threshold=0)
    loaded = load_model(path)
    assert loaded.external_files == frozenset({"m.data"}) and loaded.has_external_data
    assert loaded.session_config() == {
        "session.model_external_initializers_file_folder_path": str(tmp_path.resolve())}
    (tmp_path / "m.data").write_bytes(b"")
    with pytest.raises(OnnxModularError, match=r"not a valid ONNX file \(the data file "
                                               r"'m.data' ends at byte 0.*truncated"):
        load_model(path)
    (tmp_path / "m.data").unlink()
    with pytest.raises(OnnxModularError, match=r"'m.data' of weight 'one' is not beside"):
        load_model(path)
    without_data = onnx.load(path, load_external_data=False)
    with pytest.raises(OnnxModularError, match=r"refers to external data \(m.data\) but has "
                                               r"no file"):
        load_model(without_data)


def _written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(("make", "message"), [
    (lambda d: d / "missing.onnx", r"no such file"),
    (lambda d: d, r"it is a directory, not an ONNX file"),
    (lambda d: _written(d / "bad.onnx", b"\xff\x00garbage"), r"not a valid ONNX file"),
    (lambda d: _written(d / "empty.onnx", b""), r"the file holds no ONNX graph"),
], ids=["missing", "directory", "corrupt", "empty"])
def test_an_unreadable_file_is_one_line(tmp_path: Path, make: Any, message: str) -> None:
    with pytest.raises(OnnxModularError, match=r"^error: OM0501 bad-input: cannot read "
                                               r"ONNX model '.*': " + message):
        load_model(make(tmp_path))


def test_names_that_are_not_text_are_found() -> None:
    proto = _add_one()
    assert non_text_field(proto) is None
    proto.graph.node[0].name = "add"
    raw = proto.SerializeToString()
    assert raw.count(b"\x1a\x03add") == 1  # NodeProto.name (field 3), length 3
    raw = raw.replace(b"\x1a\x03add", b"\x1a\x03a\xffd")
    broken = onnx.ModelProto.FromString(raw)
    assert non_text_field(broken) == "NodeProto.name"


def test_anything_else_is_refused() -> None:
    with pytest.raises(OnnxModularError, match=r"must be a path, an onnx.ModelProto or an "
                                               r"export result with .model_proto, got int"):
        load_model(3)


def test_a_large_model_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = LoadedModel(_add_one(), "<ModelProto>")
    assert not loaded.large
    monkeypatch.setattr(runtime, "LARGE_MODEL_BYTES", 10)
    assert loaded.large


# ---- feeds and messages ----------------------------------------------------------------------

def test_to_feed_keeps_dtypes_and_makes_arrays_contiguous() -> None:
    bf16 = to_feed(torch.tensor([1.5, -2.0], dtype=torch.bfloat16))
    assert bf16.dtype == ml_dtypes.bfloat16 and bf16.astype(np.float32).tolist() == [1.5, -2.0]
    transposed = to_feed(np.arange(6).reshape(2, 3).T)
    assert transposed.flags.c_contiguous and transposed.tolist() == [[0, 3], [1, 4], [2, 5]]
    negated = to_feed(torch.tensor([1.0, 2.0])._neg_view())
    assert negated.tolist() == [-1.0, -2.0]


def test_first_line_is_short() -> None:
    assert first_line(ValueError("\n  first\nsecond")) == "first"
    assert first_line(KeyError()) == "KeyError"
    long = first_line(ValueError("x" * 400))
    assert len(long) == 300 and long.endswith("...")
