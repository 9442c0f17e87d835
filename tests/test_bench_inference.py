"""scripts/bench_inference.py's checking half: it says the outputs match torch only when they
do (a benchmark that times a wrong file must say so), and refuses a provider that fell back."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_inference.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_inference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_inference"] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules["bench_inference"]


def _model(scale: float) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    k = helper.make_tensor("k", TensorProto.FLOAT, [], [scale])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "k"], ["y"])], "g", [x], [y], [k])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _saved(tmp_path: Path, hier_scale: float) -> Path:
    onnx.save(_model(hier_scale), tmp_path / "m_static_hier.onnx")
    onnx.save(_model(2.0), tmp_path / "m_static_flat.onnx")
    for i, batch in enumerate((2, 5)):
        x = np.arange(batch * 4, dtype=np.float32).reshape(batch, 4)
        np.savez(tmp_path / f"m_static_{i}.npz", in0=x, out0=2.0 * x)
    (tmp_path / "cases.json").write_text(json.dumps([{"case": "m_static", "sizes": 2}]))
    return tmp_path


def test_matching_files_pass(bench, tmp_path, capsys) -> None:
    assert bench.load(_saved(tmp_path, 2.0), ["CPUExecutionProvider"], rounds=2, runs=2)
    out = capsys.readouterr().out
    assert "all outputs match torch" in out and "CPUExecutionProvider: median ratio" in out


def test_a_file_off_at_one_size_fails(bench, tmp_path, capsys) -> None:
    assert not bench.load(_saved(tmp_path, 2.001), ["CPUExecutionProvider"], rounds=2, runs=2)
    out = capsys.readouterr().out
    assert "OUTPUTS DIFFER" in out and "SOME OUTPUTS DIFFER FROM TORCH" in out


def test_a_provider_this_onnxruntime_lacks_is_an_error(bench, tmp_path) -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA")
    with pytest.raises(RuntimeError, match="CUDAExecutionProvider did not start"):
        bench.load(_saved(tmp_path, 2.0), ["CUDAExecutionProvider"], rounds=1, runs=1)
