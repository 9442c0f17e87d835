"""The three runners on tiny models: torch eager, one ORT session, chained parts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from onnx_modular.check.runners import (
    Inputs,
    PartsRunner,
    Runner,
    SessionRunner,
    TorchRunner,
)
from onnx_modular.diagnostics import OnnxModularError
from onnx_modular.leaves import runtime
from onnx_modular.parts.runner import SplitRunner


def _model(op: str, x: str, y: str) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node(op, [x], [y])], op,
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


class InPlace(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.act = torch.nn.ReLU()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x.neg_()
        return self.act(x), x * 2


def test_torch_runs_on_a_copy_and_records_calls() -> None:
    x = torch.tensor([1.0, -2.0])
    runner = TorchRunner(InPlace())
    inputs = Inputs((x,))
    out = runner.run(inputs)
    again, calls = runner.run_recording(inputs)
    assert torch.equal(x, torch.tensor([1.0, -2.0]))  # the caller's tensor is untouched
    for result in (out, again):
        assert [v.tolist() for v in result.values] == [[0.0, 2.0], [-2.0, 4.0]]
        assert result.seconds >= 0
    assert calls is not None and [c.call_id for c in calls] == ["act"]


def test_a_plain_callable_runs_without_recording_and_failures_are_one_line() -> None:
    _, calls = TorchRunner(lambda x: x + 1).run_recording(Inputs((torch.ones(1),)))
    assert calls is None
    with pytest.raises(OnnxModularError, match="the torch model failed") as e:
        TorchRunner(torch.nn.Linear(3, 3)).run(Inputs((torch.ones(2),)))
    assert "\n" not in str(e.value)


def test_a_session_runs_feeds_and_lets_go_of_its_session() -> None:
    loaded = runtime.load_model(_model("Neg", "x", "y"))
    with SessionRunner.open(loaded, "CPUExecutionProvider") as session:
        assert session.name == "CPUExecutionProvider" and session.session_s > 0
        assert session.input_names == ["x"] and session.output_names == ["y"]
        out = session.run(Inputs(feeds={"x": np.array([1.0, -2.0], np.float32)}))
    assert out.values[0].tolist() == [-1.0, 2.0]
    assert session.session is None


def _chain(x: str, y: str) -> onnx.ModelProto:
    """``relu(-x)``, one model."""
    graph = helper.make_graph(
        [helper.make_node("Neg", [x], ["h"]), helper.make_node("Relu", ["h"], [y])], "chain",
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _parts(folder: Path) -> SplitRunner:
    """``relu(-x)`` as two chained parts."""
    onnx.save(_model("Neg", "x", "h"), folder / "a.onnx")
    onnx.save(_model("Relu", "h", "y"), folder / "b.onnx")
    value = {"dtype": "float32", "shape": [2]}
    manifest = {"format": "onnx_modular.parts", "version": 1, "kind": "split",
                "inputs": [{"name": "x", **value}], "outputs": [{"name": "y", **value}],
                "regions": [
                    {"name": "a", "kind": "cpu", "file": "a.onnx",
                     "inputs": [{"name": "x", "from": "input", **value}],
                     "outputs": [{"name": "h", "to": ["b"], **value}]},
                    {"name": "b", "kind": "cpu", "file": "b.onnx",
                     "inputs": [{"name": "h", "from": "a", **value}],
                     "outputs": [{"name": "y", "to": ["output"], **value}]}]}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return SplitRunner(folder, acc_providers="cpu")


def test_torch_a_session_and_chained_parts_run_alike_through_one_protocol(
        tmp_path: Path) -> None:
    """Run then compare: every runner takes the same inputs and gives flat outputs."""
    x = np.array([1.0, -2.0], np.float32)
    inputs = Inputs((torch.from_numpy(x),), {}, {"x": x})
    session = SessionRunner.open(runtime.load_model(_chain("x", "y")), "CPUExecutionProvider")
    runners: list[Runner] = [TorchRunner(lambda t: torch.relu(-t)), session,
                             PartsRunner(_parts(tmp_path))]
    results = {runner.name: runner.run(inputs) for runner in runners}
    assert list(results) == ["torch", "CPUExecutionProvider", "parts"]
    for out in results.values():
        assert [np.asarray(v).tolist() for v in out.values] == [[0.0, 2.0]]
