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


class SharedTwice(torch.nn.Module):
    """``shared`` called twice, a scale of the model's own between the calls."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.shared, self.b = (torch.nn.Linear(8, 8) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.shared(self.a(x))) * 2.0
        return self.shared(self.b(h))


def _exported_shared_twice() -> tuple[SharedTwice, torch.Tensor, onnx.ModelProto]:
    model, x = SharedTwice().eval(), torch.randn(4, 8)
    return model, x, om.export(model, (x,)).model_proto


def test_the_second_call_of_a_module_is_named_as_a_call(tmp_path) -> None:
    """Only ``shared@1`` reads a scaled weight: the summary said "first diverging module:
    shared", the path the healthy first call has too."""
    model, x, proto = _exported_shared_twice()
    weight = next(t for t in proto.graph.initializer if t.name == "shared.weight")
    scaled = onnx.numpy_helper.to_array(weight) * 1.5
    proto.graph.initializer.append(onnx.numpy_helper.from_array(scaled, "shared.weight.2"))
    second = next(n for n in proto.graph.node if n.name == "shared@1")
    second.input[list(second.input).index("shared.weight")] = "shared.weight.2"
    onnx.save(proto, tmp_path / "bad.onnx")
    report = om.validate(model, (x,), tmp_path / "bad.onnx", localize=True)
    assert not report.ok and report.first_mismatch == "shared"
    assert report.to_dict()["first_mismatch_call"] == "shared@1"
    assert "first diverging module: shared (its call shared@1);" in report.summary()


def test_an_error_outside_module_calls_is_told_as_such(tmp_path) -> None:
    """The model's own ``* 2.0`` changed: ``b`` is the first call that diverges, only because
    its input did; the summary says so instead of naming ``b`` as where the error starts."""
    model, x, proto = _exported_shared_twice()
    (scale,) = [t for t in proto.graph.initializer if t.data_type == TensorProto.FLOAT
                and not t.dims and onnx.numpy_helper.to_array(t) == 2.0]
    scale.CopyFrom(onnx.numpy_helper.from_array(np.array(3.0, np.float32), scale.name))
    onnx.save(proto, tmp_path / "bad.onnx")
    report = om.validate(model, (x,), tmp_path / "bad.onnx", localize=True)
    assert not report.ok and report.first_mismatch == "b"
    assert "first diverging module: b whose inputs differ already" in report.summary()
    assert "outside any module call" in report.summary()
