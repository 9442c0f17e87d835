"""Model Explorer node data from a judged localization on hand-built probes."""

from __future__ import annotations

import numpy as np
import onnx
import torch

from onnx_modular.check.judge import judge
from onnx_modular.check.overlay import FLOOR, GRADIENT, NAME, node_data
from onnx_modular.check.probe import OnnxCall, Probe
from onnx_modular.check.recorder import TorchCall
from onnx_modular.leaves.metadata import CallInfo


def _torch(call_id: str, parent: int | None, depth: int, out: torch.Tensor,
           inp: torch.Tensor, module_type: str = "pkg.Block") -> TorchCall:
    return TorchCall(CallInfo(call_id, call_id, module_type), depth, parent, [out],
                     [out._version], [inp], [inp._version])


def _layers(got: list[float], want: list[float], root: float | None = None):
    """Two layers ``h.0``, ``h.1`` in a root call; layer i returns ``got[i]`` (torch:
    ``want[i]``) in three elements; the root returns the last (torch: ``root``)."""
    x = torch.ones(3)
    outs = [torch.full((3,), w) for w in want]
    root_out = outs[-1] if root is None else torch.full((3,), root)
    calls = [_torch("", None, 0, root_out, x, "pkg.Model"),
             _torch("h.0", 0, 1, outs[0], x), _torch("h.1", 0, 1, outs[1], outs[0])]
    values = {"x": np.ones(3, np.float32)}
    values.update({f"v{i}": np.full(3, g, np.float32) for i, g in enumerate(got)})
    return calls, values


def _hierarchical(got: list[float], want: list[float]):
    """Call nodes of the main graph (``L0``, ``L1`` calling one body) and the root's."""
    calls, values = _layers(got, want)
    onnx_calls = [
        OnnxCall(CallInfo("", "", "pkg.Model"), ["v1"], None, True, ["x"]),
        OnnxCall(CallInfo("h.0", "h.0", "pkg.Block"), ["v0"], 0, True, ["x"],
                 site=("main", "L0")),
        OnnxCall(CallInfo("h.1", "h.1", "pkg.Block"), ["v1"], 0, True, ["v0"],
                 site=("main", "L1")),
    ]
    probe = Probe(b"", onnx_calls, {"x": -1, "v0": 0, "v1": 1}, "hierarchical")
    return judge(probe, values, calls, None, None)


def test_values_are_log10_errors_on_the_call_nodes() -> None:
    loc = _hierarchical([1.0, 2.1], [1.0, 2.0])
    data = node_data(loc)
    assert list(data) == ["main"]
    entry = data["main"]
    assert entry["name"] == NAME and entry["gradient"] == GRADIENT
    assert entry["results"]["L0"] == {"value": FLOOR}  # exact: the floor, not -inf
    assert entry["results"]["L1"]["value"] == round(np.log10(np.float32(2.1) - 2.0), 3)


def test_nan_or_inf_is_drawn_worse_than_any_finite_error() -> None:
    data = node_data(_hierarchical([np.nan, np.inf], [1.0, 2.0]))
    assert data["main"]["results"] == {"L0": {"value": 10.0}, "L1": {"value": 10.0}}


def test_a_shared_body_shows_the_instance_on_the_first_mismatchs_chain() -> None:
    """Both layers' inner call is drawn on one node of the body graph: the diverging
    layer's value wins, though the other's is larger."""
    x = torch.ones(3)
    a0, a1 = torch.zeros(3), torch.zeros(3)
    calls = [_torch("h.0", None, 0, a0, x), _torch("h.0.act", 0, 1, a0, x, "pkg.Act"),
             _torch("h.1", None, 0, a1, a0), _torch("h.1.act", 2, 1, a1, a0, "pkg.Act")]
    body = ("[function]pkg::Block", "act")
    onnx_calls = [
        OnnxCall(CallInfo("h.0", "h.0", "pkg.Block"), ["o0"], None, True, ["x"]),
        OnnxCall(CallInfo("h.0.act", "h.0.act", "pkg.Act"), ["i0"], 0, True, ["x"],
                 site=body),
        OnnxCall(CallInfo("h.1", "h.1", "pkg.Block"), ["o1"], None, True, ["o0"]),
        OnnxCall(CallInfo("h.0.act", "h.0.act", "pkg.Act"), ["i1"], 2, False, ["o0"],
                 site=body),
    ]
    # h.0.act is fed wrong (its input came in off) and off by 1; h.1.act computes wrong
    # from a right input, off by 0.01: the first mismatch is h.1.act
    values = {"x": np.full(3, 5.0, np.float32), "i0": np.ones(3, np.float32),
              "o0": np.zeros(3, np.float32), "i1": np.full(3, 0.01, np.float32),
              "o1": np.zeros(3, np.float32)}
    probe = Probe(b"", onnx_calls, {"x": -1, "i0": 0, "o0": 1, "i1": 2, "o1": 3},
                  "hierarchical")
    loc = judge(probe, values, calls, None, None)
    assert loc.first is not None and loc.first.call_id == "h.1.act"
    value = node_data(loc)[body[0]]["results"][body[1]]["value"]
    assert value == round(float(np.log10(np.float32(0.01))), 3)


def test_a_flat_model_colors_the_nodes_making_a_calls_outputs_innermost_first() -> None:
    nodes = [onnx.helper.make_node("Relu", ["x"], ["v0"], name="relu"),
             onnx.helper.make_node("Neg", ["v0"], ["v1"])]  # no name: <node_1>
    graph = onnx.helper.make_graph(nodes, "g", [], [])
    calls, values = _layers([1.5, 2.0], [1.0, 2.0], root=2.25)
    onnx_calls = [
        OnnxCall(CallInfo("", "", "pkg.Model"), ["v1"], None, True, ["x"], results=["v1"],
                 nodes=[0, 1]),
        OnnxCall(CallInfo("h.0", "h.0", "pkg.Block"), ["v0"], 0, True, ["x"],
                 results=["v0"], nodes=[0]),
        OnnxCall(CallInfo("h.1", "h.1", "pkg.Block"), ["v1"], 0, True, ["v0"],
                 results=["v1"], nodes=[1]),
    ]
    probe = Probe(b"", onnx_calls, {"x": -1, "v0": 0, "v1": 1}, "flat", graph=graph)
    data = node_data(judge(probe, values, calls, None, None))
    # the root call's output node (off by 0.25) is h.1's too (exact): the inner call colors it
    assert data == {"g": {"name": NAME, "gradient": GRADIENT, "results": {
        "relu": {"value": round(float(np.log10(0.5)), 3)}, "<node_1>": {"value": FLOOR}}}}


def test_no_evidence_or_an_inlined_flat_graph_draws_nothing() -> None:
    loc = _hierarchical([1.0, 2.0], [1.0, 2.0])
    loc.evidence = None
    assert node_data(loc) == {}
    calls, values = _layers([1.0, 2.0], [1.0, 2.0])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["v0"])], "g", [], [])
    probe = Probe(b"", [OnnxCall(CallInfo("h.0", "h.0", "pkg.Block"), ["v0"], None, True,
                                 ["x"], results=["v0"], nodes=[0])],
                  {"v0": 0}, "hierarchical", graph=graph, inlined=True)
    assert node_data(judge(probe, values, calls, None, None)) == {}
