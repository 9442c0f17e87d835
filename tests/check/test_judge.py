"""The judge on hand-built probes and torch calls: no model, no ONNX Runtime."""

from __future__ import annotations

import numpy as np
import torch

from onnx_modular.check.judge import judge, resolve
from onnx_modular.check.probe import OnnxCall, Probe
from onnx_modular.check.recorder import TorchCall
from onnx_modular.leaves.metadata import CallInfo


def _torch(call_id: str, module_type: str, parent: int | None, depth: int,
           outputs: list[torch.Tensor], inputs: list[torch.Tensor] = ()) -> TorchCall:
    inputs = list(inputs)
    return TorchCall(CallInfo(call_id, call_id, module_type), depth, parent, outputs,
                     [t._version for t in outputs], inputs, [t._version for t in inputs])


def _onnx(call_id: str, module_type: str, outputs: list[str], inputs: list[str] = (),
          parent: int | None = None, exact: bool = True) -> OnnxCall:
    return OnnxCall(CallInfo(call_id, call_id, module_type), outputs, parent, exact,
                    list(inputs))


def test_a_call_inlined_from_a_shared_body_resolves_under_its_parent() -> None:
    """``h.1``'s body was built from ``h.0``: its inner call says ``h.0.attn``."""
    torch_calls = [_torch("h.0", "Block", None, 0, []), _torch("h.0.attn", "Attn", 0, 1, []),
                   _torch("h.1", "Block", None, 0, []), _torch("h.1.attn", "Attn", 2, 1, [])]
    onnx_calls = [_onnx("h.0", "Block", []), _onnx("h.0.attn", "Attn", [], parent=0),
                  _onnx("h.1", "Block", []),
                  _onnx("h.0.attn", "Attn", [], parent=2, exact=False)]
    assert resolve(onnx_calls, torch_calls) == {0: 0, 1: 1, 2: 2, 3: 3}


def test_the_first_mismatch_is_where_the_error_arises_not_where_it_flows() -> None:
    """``a`` is fed right and computes wrong; ``b`` is fed ``a``'s wrong value."""
    x, a, b = torch.ones(3), torch.full((3,), 2.0), torch.full((3,), 3.0)
    torch_calls = [_torch("a", "m.A", None, 0, [a], [x]), _torch("b", "m.B", None, 0, [b], [a])]
    probe = Probe(b"", [_onnx("a", "m.A", ["va"], ["x"]), _onnx("b", "m.B", ["vb"], ["va"])],
                  {"x": -1, "va": 0, "vb": 1}, "flat")
    values = {"x": np.ones(3, np.float32), "va": np.full(3, 2.5, np.float32),
              "vb": np.full(3, 3.5, np.float32)}
    loc = judge(probe, values, torch_calls, None, None)
    assert [d.call_id for d in loc.divergences] == ["a", "b"]
    assert loc.first is not None and loc.first.call_id == "a" and not loc.first.inherited
    assert loc.divergences[1].inherited
    assert [(e.order, e.ok, e.max_abs) for e in loc.errors] == [(0, False, 0.5),
                                                                (1, False, 0.5)]
    assert loc.to_dict()["first_mismatch"] == "a"
    assert loc.to_dict()["calls"][0]["module_type"] == "m.A"
    assert loc.evidence is not None and loc.evidence.onnx_call_of(1) == 1


def test_outputs_pair_by_shape_and_closeness_so_an_order_change_still_matches() -> None:
    p, q = torch.zeros(2), torch.ones(2)
    torch_calls = [_torch("m", "M", None, 0, [p, q])]
    probe = Probe(b"", [_onnx("m", "M", ["o1", "o0"])], {"o0": 0, "o1": 1}, "flat")
    values = {"o0": np.zeros(2, np.float32), "o1": np.ones(2, np.float32)}
    loc = judge(probe, values, torch_calls, None, None)
    assert loc.first is None and loc.calls_checked == 1 and loc.errors[0].ok


def test_nothing_paired_says_so() -> None:
    loc = judge(Probe(b"", [_onnx("x", "X", ["v"])], {"v": 0}, "flat"), {}, [], None, None)
    assert loc.calls_checked == 0 and "could be paired with torch" in loc.note
