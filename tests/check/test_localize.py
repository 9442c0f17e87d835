"""Localization start to end, and a session that localizes later, on a hand-built model."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

import onnx_modular as om
from onnx_modular.check.localize import ProbeInAdvance, ValidationRun, localize
from onnx_modular.check.options import Tolerances
from onnx_modular.check.runners import Inputs, TorchRunner
from onnx_modular.leaves import runtime
from onnx_modular.leaves.metadata import META_CALL, META_PATH, META_TYPE

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


X = np.array([-1.0, 2.0], np.float32)


def _run(proto: onnx.ModelProto) -> ValidationRun:
    return ValidationRun(TorchRunner(Model()), Inputs((torch.from_numpy(X),), {}, {"x": X}),
                         runtime.load_model(proto), "CPUExecutionProvider", Tolerances(),
                         fuse=False)


def _session(proto: onnx.ModelProto, localize: bool | str = False) -> om.Validation:
    return om.Validation(Model(), (torch.from_numpy(X),), proto, providers="cpu",
                         localize=localize)


def test_a_model_that_matches_localizes_to_no_mismatch() -> None:
    loc = localize(_run(hierarchical()))
    assert loc.kind == "hierarchical" and loc.first is None
    assert [e.call_id for e in loc.errors] == ["blk", "blk.act", "head"]


def test_the_wrong_call_is_named_and_the_session_localizes_later() -> None:
    with _session(hierarchical(head="Sigmoid")) as v:  # head computes the wrong thing
        report = v.run()
        assert report.localization is None and v.source is not None
        assert v.source.label == report.model
        later = v.localize()
        assert later.first_mismatch == "head"
        assert later.localization_provider == "CPUExecutionProvider"
        assert report.localization is None  # the earlier report is as it was
        assert v.localization is not None and v.localization.evidence is not None
        v.release()
        assert v.localization is not None and v.localization.evidence is None
        assert v.node_data()  # localizes again for the overlay
        assert later.to_dict()["localization"]["first_mismatch"] == "head"
        assert later.localization.evidence is None  # the report holds no values


def test_a_probe_built_in_advance_is_taken_once_and_later_localizations_build_their_own(
        ) -> None:
    """localize=True on a passing model, release(), then node_data(): the second
    localization must not run the first one's closed probe session."""
    with _session(hierarchical(), localize=True) as v:
        assert v.run().localization.first is None
        v.release()
        assert v.node_data()  # localizes again, on a probe session of its own


def test_a_fused_localization_closes_the_unfused_session_built_in_advance() -> None:
    advance = ProbeInAdvance(runtime.load_model(hierarchical()), "CPUExecutionProvider")
    probe, session, error = advance.take("CPUExecutionProvider", fuse=True)
    assert probe is not None and session is None and error is None
    assert advance._session is None  # not kept alive beside the fused one


def test_a_probe_nobody_took_is_closed_with_its_thread() -> None:
    advance = ProbeInAdvance(runtime.load_model(hierarchical()), "CPUExecutionProvider")
    assert advance.take("CUDAExecutionProvider", fuse=False) is None  # built for another
    advance.close()
    assert not advance.alive and advance._session is None and advance._loaded is None
