"""Localization start to end, and a report that localizes later, on a hand-built model."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

from onnx_modular import runtime
from onnx_modular.check.localize import ProbeInAdvance, ValidationRun, localize
from onnx_modular.check.runners import Inputs, TorchRunner
from onnx_modular.check.validation_report import ValidationReport
from onnx_modular.metadata import META_CALL, META_PATH, META_TYPE

OPSET = [helper.make_opsetid("", 18), helper.make_opsetid("local", 1)]


def _call(function: str, x: str, y: str, call_id: str) -> onnx.NodeProto:
    node = helper.make_node(function, [x], [y], domain="local", name=call_id)
    for key, value in ((META_CALL, call_id), (META_PATH, call_id), (META_TYPE, function)):
        node.metadata_props.add(key=key, value=value)
    return node


def _function(name: str, nodes: list[onnx.NodeProto]) -> onnx.FunctionProto:
    return helper.make_function("local", name, ["x"], ["y"], nodes, OPSET)


def hierarchical(head: str = "Relu") -> onnx.ModelProto:
    """``blk`` calls ``blk.act`` (Relu) and negates; ``head`` applies ``head``."""
    functions = [_function("Act", [helper.make_node("Relu", ["x"], ["y"])]),
                 _function("Head", [helper.make_node(head, ["x"], ["y"])]),
                 _function("Block", [_call("Act", "x", "h", "blk.act"),
                                     helper.make_node("Neg", ["h"], ["y"])])]
    value = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in "xy"]
    graph = helper.make_graph([_call("Block", "x", "b", "blk"), _call("Head", "b", "y", "head")],
                              "main", value[:1], value[1:])
    return helper.make_model(graph, opset_imports=OPSET, functions=functions)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.act = torch.nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -self.act(x)


class Model(torch.nn.Module):
    """The torch twin of :func:`hierarchical`: ``blk`` (act, then neg), ``head``."""

    def __init__(self) -> None:
        super().__init__()
        self.blk = Block()
        self.head = torch.nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blk(x))


def _run(proto: onnx.ModelProto) -> ValidationRun:
    x = np.array([-1.0, 2.0], np.float32)
    return ValidationRun(TorchRunner(Model()), Inputs((torch.from_numpy(x),), {}, {"x": x}),
                         runtime.load_model(proto), "CPUExecutionProvider", None, None,
                         fuse=False)


def test_a_model_that_matches_localizes_to_no_mismatch() -> None:
    loc = localize(_run(hierarchical()))
    assert loc.kind == "hierarchical" and loc.first is None
    assert [e.call_id for e in loc.errors] == ["blk", "blk.act", "head"]


def test_the_wrong_call_is_named_and_the_report_localizes_later() -> None:
    run = _run(hierarchical(head="Sigmoid"))  # head computes the wrong thing
    report = ValidationReport(run.loaded.label, [], 0.0, run=run)
    assert report.localization is None and report.source is run.loaded
    loc = report.relocalize()
    assert report.first_mismatch == "head" and report.localization_provider == run.provider
    assert loc.evidence is not None and run.calls is None  # the evidence holds them now
    report.release()
    assert report.localization is not None and report.localization.evidence is None
    assert report.node_data()  # localizes again for the overlay
    assert report.to_dict()["localization"]["first_mismatch"] == "head"


def test_a_probe_built_in_advance_is_taken_once_and_later_localizations_build_their_own(
        ) -> None:
    """validate(localize=True) on a passing model, release(), then node_data(): the second
    localization must not run the first one's closed probe session."""
    run = _run(hierarchical())
    run.advance = ProbeInAdvance(run.loaded, run.provider)
    report = ValidationReport(run.loaded.label, [], 0.0, run=run)
    assert report.relocalize().first is None and run.advance is None
    report.release()
    assert report.node_data()  # localizes again, on a probe session of its own


def test_a_fused_localization_closes_the_unfused_session_built_in_advance() -> None:
    advance = ProbeInAdvance(runtime.load_model(hierarchical()), "CPUExecutionProvider")
    probe, session, error = advance.take("CPUExecutionProvider", fuse=True)
    assert probe is not None and session is None and error is None
    assert advance._session is None  # not kept alive beside the fused one
