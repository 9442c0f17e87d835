"""Own errors in ``validate``: each module call alone on torch's inputs of it, against torch.

A quantized or fp16 file drifts everywhere after its first lossy layer; the localization's
per-call errors are the propagated ones. Each call's own error names the layers the
conversion hurts (the quantized ``Conv1D`` calls, not the LayerNorms after them) and a
changed weight's layer alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import onnx_modular as om
from onnx_modular.check.call_stats import OwnError, OwnErrors
from onnx_modular.check.options import Tolerances
from onnx_modular.check.own import _finishing_order, _judged, _same_kind
from onnx_modular.check.recorder import TorchCall
from onnx_modular.check.validation_report import ValidationReport
from onnx_modular.cli import main
from onnx_modular.leaves.metadata import CallInfo
from onnx_modular.lower.translate import quiet_torch_onnx
from tests import models

CPU = "CPUExecutionProvider"


# ---- fast: ordering, dtypes, the report --------------------------------------------------------

def _torch_call(call_id: str, depth: int, parent: int | None) -> TorchCall:
    return TorchCall(CallInfo(call_id, call_id, "M"), depth, parent, [])


def test_calls_finish_after_everything_they_called() -> None:
    calls = [_torch_call("a", 0, None), _torch_call("a.x", 1, 0), _torch_call("a.x.k", 2, 1),
             _torch_call("a.y", 1, 0), _torch_call("b", 0, None)]
    assert _finishing_order(calls) == [2, 1, 3, 0, 4]


def test_floats_feed_floats_of_any_width_and_integers_only_their_own() -> None:
    assert _same_kind("float32", "float16") and _same_kind("float32", "float32")
    assert _same_kind("int64", None)
    assert not _same_kind("float32", "int8") and not _same_kind("int64", "int32")


def _row(call_id: str, order: int, depth: int, max_abs: float, ok: bool,
         compared: bool = True, note: str = "", propagated: float | None = None) -> OwnError:
    return OwnError(CallInfo(call_id, call_id, f"pkg.{call_id.title()}"), order, depth,
                    max_abs, max_abs, 0 if ok else 3, 8, "float32", [0] * 10, ok,
                    compared=compared, note=note, propagated=propagated)


def test_the_report_shows_own_errors_beside_the_propagated_ones() -> None:
    from onnx_modular.check.judge import Localization
    from onnx_modular.check.numerics import Diff
    from onnx_modular.check.outcome import OutputCheck, ProviderResult

    own = OwnErrors([_row("fc", 0, 0, 0.5, False, propagated=0.5),
                     _row("norm", 1, 0, 1e-7, True, propagated=2.0),
                     _row("gate", 2, 0, float("nan"), True, compared=False,
                          note="no value for input(s) x")], "fc")
    check = OutputCheck("float32", 1e-4, 1e-4, Diff(2.0, 1.0, False, 4), "y", [2])
    report = ValidationReport("q.onnx", [ProviderResult(CPU, [check], 0, 0)], 0.0,
                              Localization("flat", 0, [], None, own=own), CPU)
    assert report.first_own_mismatch == "fc"
    assert report.summary().endswith("first module whose own error leaves tolerance: fc")
    d = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    rows = d["localization"]["own"]["calls"]
    assert d["localization"]["own"]["first_mismatch"] == "fc"
    assert [r["call_id"] for r in rows] == ["fc", "norm", "gate"]
    assert rows[1]["propagated_max_abs_err"] == 2.0 and rows[2]["ok"] is None
    text = str(report)
    assert "Own error per module call" in text and "FIRST" in text and "not run" in text
    md = report.to_markdown()
    assert "## Own error by module call" in md and "no value for input(s) x" in md


def test_a_long_table_shows_the_failing_calls_in_the_terminal() -> None:
    from onnx_modular.check.judge import Localization

    rows = [_row(f"m{i}", i, 0, 1e-8, True) for i in range(ValidationReport.OWN_ROWS_SHOWN)]
    rows.append(_row("bad", len(rows), 0, 1.0, False))
    report = ValidationReport("m.onnx", [], 0.0,
                              Localization("flat", 0, [], None, own=OwnErrors(rows, "bad")),
                              CPU)
    text = str(report)
    assert "bad" in text and " m1 " not in text and "60 calls within tolerance not shown" \
        in " ".join(text.split())
    assert "| m1 |" in report.to_markdown()


# ---- slow: a tiny GPT-2, flat, quantized, fp16, a changed weight ------------------------------

@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, tuple, Path]:
    model, args = models.gpt2(2)
    path = tmp_path_factory.mktemp("gpt2") / "flat.onnx"
    with quiet_torch_onnx(), torch.no_grad():
        torch.onnx.export(model, args, dynamo=True).save(str(path))
    return model, args, path


@pytest.fixture(scope="module")
def quantized(gpt2: tuple[torch.nn.Module, tuple, Path]) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    path = gpt2[2].with_name("int8.onnx")
    quantize_dynamic(str(gpt2[2]), str(path), weight_type=QuantType.QInt8)
    return path


def _rows(rep: ValidationReport) -> dict[str, OwnError]:
    assert rep.own is not None and rep.own.calls, rep.own
    return {r.call_id: r for r in rep.own.calls}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_quantized_layers_add_their_own_error_and_the_norms_none(gpt2, quantized) -> None:
    model, args, _ = gpt2
    rep = om.validate(model, args, quantized, providers="cpu")
    assert not rep.ok
    rows = _rows(rep)
    linears = [r for r in rows.values() if r.module_type.endswith(".Conv1D")]
    norms = [r for r in rows.values() if r.module_type.endswith(".LayerNorm")]
    assert len(linears) == 8 and len(norms) == 5
    for r in linears:  # every quantized layer adds error of its own
        assert r.compared and r.max_abs > 1e-5 and not r.ok, r
    for r in norms:  # the norms add none, whatever drift reaches them in the model
        assert r.compared and r.ok and r.max_abs < 1e-5, r
        assert r.propagated is not None and r.propagated > 1e-3
    # the first lossy call: the quantized embedding Gather, else the first projection
    assert rep.first_own_mismatch in ("model.wte", "model.h.0.attn.c_attn")
    assert [r.order for r in rep.own.calls] == sorted(r.order for r in rep.own.calls)
    own = json.loads(json.dumps(rep.to_dict(), allow_nan=False))["localization"]["own"]
    assert own["first_mismatch"] == rep.first_own_mismatch
    assert own["calls_compared"] == len(rows)
    assert "first module whose own error leaves tolerance" in rep.summary()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_a_changed_weight_is_first_and_the_layers_after_it_add_nothing(gpt2, tmp_path) -> None:
    model, args, path = gpt2
    proto = onnx.load(str(path))
    for init in proto.graph.initializer:  # noise, not a shift a LayerNorm before would cancel
        if init.name == "model.h.0.mlp.c_fc.weight":
            array = numpy_helper.to_array(init).copy()
            array += np.random.default_rng(0).normal(0, 0.5, array.shape).astype(array.dtype)
            init.CopyFrom(numpy_helper.from_array(array, init.name))
    changed = tmp_path / "changed.onnx"
    onnx.save(proto, str(changed))
    rep = om.validate(model, args, changed, providers="cpu")
    assert rep.first_own_mismatch == "model.h.0.mlp.c_fc"
    rows = _rows(rep)
    after = [r for r in rows.values() if r.call_id.startswith(("model.h.1", "model.ln_f"))]
    assert len(after) == 11  # model.h.1, its 9 calls, model.ln_f
    for r in after:
        assert r.ok and r.max_abs < 1e-5, r  # on torch's inputs: nothing of their own
        assert r.propagated is not None and r.propagated > 1e-3, r  # in the model: the drift
    assert {r.call_id for r in rows.values() if not r.ok} == {
        "model", "model.h.0", "model.h.0.mlp", "model.h.0.mlp.c_fc"}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_an_fp16_file_is_fed_torchs_values_cast(gpt2, tmp_path) -> None:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model, args, path = gpt2
    half = tmp_path / "fp16.onnx"
    onnx.save(convert_float_to_float16(onnx.load(str(path)), keep_io_types=True), str(half))
    rep = om.validate(model, args, half, providers="cpu", localize=True)
    rows = _rows(rep)
    assert all(r.compared for r in rows.values()), [r.note for r in rows.values()]
    norm = rows["model.h.0.ln_1"]
    assert norm.dtypes == "float32 -> float16" and 0 < norm.max_abs < 1e-2
    # judged at the precision each call computes in (fp16's), the root's fp32 output too
    assert rep.first_own_mismatch is None and rows["model"].ok


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_the_command_line_prints_the_own_table(gpt2, quantized, tmp_path, capsys) -> None:
    spec = tmp_path / "spec.py"
    spec.write_text("from tests import models\n\n"
                    "def model():\n    return models.gpt2(2)[0]\n\n"
                    "def inputs():\n    return models.gpt2(2)[1]\n")
    report = tmp_path / "rep.json"
    code = main(["validate", f"{spec}:model", "--inputs", f"{spec}:inputs", str(quantized),
                 "--providers", "cpu", "--report", str(report)])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 1
    assert "Own error per module call" in out and "model.h.1.mlp.c_fc" in out
    assert "first module whose own error leaves tolerance:" in out
    assert json.loads(report.read_text())["localization"]["own"]["calls"]
    # a passing model localizes, and prints the table, when asked
    assert main(["validate", f"{spec}:model", "--inputs", f"{spec}:inputs", str(gpt2[2]),
                 "--providers", "cpu", "--localize"]) == 0
    assert "Own error per module call" in capsys.readouterr().out


def test_each_torch_output_is_judged_once() -> None:
    """Two ONNX outputs equal to torch's first output do not both pass against it: with
    as many outputs of the same shapes, they pair in order (torch's second is checked)."""
    import types

    ones, fives = torch.ones(2, 3), torch.full((2, 3), 5.0)
    tcall = types.SimpleNamespace(call=CallInfo("blk", "blk", "pkg.Blk"), depth=1,
                                  intact_outputs=lambda: [ones, fives])
    wrong = [np.ones((2, 3), np.float32), np.ones((2, 3), np.float32)]
    assert not _judged(tcall, 0, wrong, "float32", Tolerances()).ok
    swapped = [np.full((2, 3), 5.0, np.float32), np.ones((2, 3), np.float32)]
    assert not _judged(tcall, 0, swapped, "float32", Tolerances()).ok
    right = [np.ones((2, 3), np.float32), np.full((2, 3), 5.0, np.float32)]
    assert _judged(tcall, 0, right, "float32", Tolerances()).ok
