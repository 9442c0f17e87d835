"""``om.validate`` returns data; ``om.Validation`` is the session that owns what is alive.

A report holds no torch module, ONNX model, ORT session, thread or tensor (it pickles, and
the model it checked dies with the caller's last reference); localizing later, extracting
and the overlay are the session's, which hands out new records and leaves the report as it
was; nothing of a session outlives its ``with``.
"""

from __future__ import annotations

import dataclasses
import gc
import pickle
import threading
import weakref
from typing import Any

import models
import onnx
import pytest
import torch

import onnx_modular as om
from onnx_modular.check.localize import ProbeInAdvance
from onnx_modular.leaves import runtime

#: What a report must never reach: live models, sessions, threads, values.
LIVE = (torch.nn.Module, torch.Tensor, onnx.ModelProto, runtime.LoadedModel,
        threading.Thread, ProbeInAdvance, torch.export.ExportedProgram)


def _reachable(root: object) -> list[object]:
    """Every object reachable from ``root`` (through containers and instance fields)."""
    seen: dict[int, object] = {}
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, type):
            continue
        seen[id(obj)] = obj
        todo += gc.get_referents(obj)
    return list(seen.values())


def _live(report: om.ValidationReport) -> list[str]:
    return sorted({type(o).__name__ for o in _reachable(report) if isinstance(o, LIVE)})


def _probe_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "onnx_modular-probe"]


@pytest.mark.parametrize("localize", ["auto", True])
@pytest.mark.parametrize("broken", [False, True])
def test_a_report_is_data_and_the_model_dies_with_its_last_reference(localize, broken) -> None:
    model, args = models.net()
    proto = models.hierarchical(model, weight_scale={1: 1.5} if broken else None)
    model_ref = weakref.ref(model)
    report = om.validate(model, args, proto, providers="cpu", localize=localize)
    assert report.ok is not broken
    assert (report.localization is not None) == (broken or localize is True)
    assert _live(report) == []
    assert not _probe_threads()  # the probe built in advance ended with the run
    back = pickle.loads(pickle.dumps(report))
    assert back.to_dict() == report.to_dict() and back.node_data() == report.node_data()
    assert back.first_mismatch == report.first_mismatch == ("layers.1.fc" if broken else None)
    del model
    gc.collect()
    assert model_ref() is None


def test_the_session_owns_the_run_and_hands_out_records(tmp_path) -> None:
    model, args = models.net()
    with om.Validation(model, args, models.hierarchical(model), providers="cpu") as v:
        assert v.report is None
        report = v.run()
        assert v.report is report and report.ok and report.localization is None
        assert v.source is not None and v.localization is None
        data = v.node_data()  # localizes to draw the overlay: the report stays as it was
        assert data and report.localization is None and v.report is report
        assert report.node_data() == {}  # the report localized nothing
        later = v.localize()  # a new report; the first one unchanged
        assert later is v.report and later is not report and report.localization is None
        assert later.ok and later.localization is not None and later.node_data() == data
        assert later.localization.evidence is None and v.localization.evidence is not None
        assert _live(later) == []
        x = v.extract(tmp_path / "x", call="layers.1")
        assert x.call_id == "layers.1" and not x.reproduces
        v.release()
        assert v.localization.evidence is None
        assert v.extract(tmp_path / "y", call="layers.2").call_id == "layers.2"  # anew
    assert v.closed and v.source is None and v.localization is None
    assert later.to_dict()["localization"]["calls_checked"] > 0  # records outlive it
    with pytest.raises(om.OnnxModularError, match="this validation is closed"):
        v.run()
    with pytest.raises(om.OnnxModularError, match="this validation is closed"):
        v.extract(tmp_path / "z", call="layers.1")


def test_a_closed_session_lets_the_model_go() -> None:
    model, args = models.net()
    model_ref = weakref.ref(model)
    session = om.Validation(model, args, models.hierarchical(model, weight_scale={1: 1.5}),
                            providers="cpu")
    with session:
        report = session.run()
        assert session.localization is not None  # its values kept, for extraction
    del model
    gc.collect()
    assert model_ref() is None and report.first_mismatch == "layers.1.fc"


def test_what_needs_a_run_says_so_in_one_line(tmp_path) -> None:
    model, args = models.net()
    with om.Validation(model, args, models.hierarchical(model), providers="cpu") as v:
        for call in (v.localize, v.node_data, lambda: v.extract(tmp_path / "x")):
            with pytest.raises(om.OnnxModularError, match=r"run\(\) the validation first"):
                call()


def test_a_report_method_that_needs_the_models_names_the_session(tmp_path) -> None:
    model, args = models.net()
    # a ModelProto cannot be referenced weakly: the report cannot reopen a session on it
    report = om.validate(model, args, models.hierarchical(model, weight_scale={1: 1.5}),
                         providers="cpu")
    for call, words in ((report.relocalize, "no model to localize"),
                        (lambda: report.extract(tmp_path / "x"), "no model to extract from")):
        with pytest.raises(om.OnnxModularError, match=words) as info:
            call()
        assert "om.Validation(" in str(info.value) and "\n" not in str(info.value)
    assert report.node_data()  # the overlay of its localization is data


def test_a_report_reopens_a_session_while_the_caller_holds_the_model(tmp_path) -> None:
    """``rep.extract(DIR)`` as before this round: through weak references, so the model
    still dies with the caller's last reference, and then it is one line."""
    model, args = models.net()
    path = tmp_path / "m.onnx"
    onnx.save(models.hierarchical(model, weight_scale={1: 1.5}), str(path))
    report = om.validate(model, args, path, providers="cpu")
    assert report.first_mismatch == "layers.1.fc"
    assert report.extract(tmp_path / "repro").call_id.startswith("layers.1")
    assert report.relocalize().first.module_path == "layers.1.fc"
    assert _live(report) == []
    model_ref = weakref.ref(model)
    del model
    gc.collect()
    assert model_ref() is None
    with pytest.raises(om.OnnxModularError, match="no model to extract from"):
        report.extract(tmp_path / "again")
    back = pickle.loads(pickle.dumps(report))
    with pytest.raises(om.OnnxModularError, match="no model to extract from"):
        back.extract(tmp_path / "again")


def test_options_are_checked_when_the_session_is_made() -> None:
    model, args = models.net()
    with pytest.raises(om.OnnxModularError, match="rtol must be"):
        om.Validation(model, args, models.hierarchical(model), rtol=-1)
    v = om.Validation(model, args, models.hierarchical(model), providers="cpu", atol=0.5)
    assert v.options.tolerances.atol == 0.5 and v.options.plan.providers == (
        "CPUExecutionProvider",)
    assert v.run().results[0].outputs[0].atol == 0.5
    v.close()


@pytest.mark.slow
def test_a_parts_directory_session_checks_end_to_end_and_localizes_nothing(tmp_path) -> None:
    model, args = models.net()
    parts = om.split_stages(model, args, split_points={"layers.1": "beginning"})
    directory = parts.save(tmp_path / "parts")
    with om.Validation(model, args, directory, providers="cpu") as v:
        report = v.run()
        assert report.ok and report.model == str(directory) and v.source is None
        with pytest.raises(om.OnnxModularError, match="is a parts directory"):
            v.extract(tmp_path / "x", call="layers.1")
    assert _live(report) == []


def _fields(report: om.ValidationReport) -> dict[str, Any]:
    return {f.name: getattr(report, f.name) for f in dataclasses.fields(report)}


def test_the_report_fields_are_plain_data() -> None:
    model, args = models.net()
    report = om.validate(model, args, models.hierarchical(model, weight_scale={1: 1.5}),
                         providers="cpu", localize=True)
    assert set(_fields(report)) == {"model", "results", "torch_s", "localization",
                                    "localization_provider", "skipped", "unchecked", "reopen"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.model = "x"  # type: ignore[misc]


def test_a_report_refuses_to_reopen_on_what_changed_since(tmp_path) -> None:
    """A report never checks another model in its name: the file written over, or the
    model's weights changed in place, and reopening is one line instead."""
    model, args = models.net()
    path = tmp_path / "m.onnx"
    onnx.save(models.hierarchical(model, weight_scale={1: 1.5}), str(path))
    report = om.validate(model, args, path, providers="cpu")
    onnx.save(models.hierarchical(model, weight_scale={2: 1.5}), str(path))
    with pytest.raises(om.OnnxModularError, match="changed since this report") as info:
        report.extract(tmp_path / "repro")
    assert "\n" not in str(info.value) and not (tmp_path / "repro").exists()
    onnx.save(models.hierarchical(model, weight_scale={1: 1.5}), str(path))
    again = om.validate(model, args, path, providers="cpu")
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    with pytest.raises(om.OnnxModularError, match="changed since this report"):
        again.relocalize()


def test_the_overlay_of_a_report_that_did_not_localize(tmp_path) -> None:
    """``save(format="model-explorer")`` localizes through a new session, as before this
    round; without a model to reach it is one line, never an empty overlay."""
    model, args = models.net()
    path = tmp_path / "m.onnx"
    onnx.save(models.hierarchical(model, weight_scale={1: 1.5}), str(path))
    report = om.validate(model, args, path, providers="cpu", localize=False)
    assert report.localization is None
    report.save(tmp_path / "overlay.json", format="model-explorer")
    assert (tmp_path / "overlay.json").read_text() != "{}"
    held = om.validate(model, args, models.hierarchical(model, weight_scale={1: 1.5}),
                       providers="cpu", localize=False)  # a ModelProto: cannot reopen
    with pytest.raises(om.OnnxModularError, match="did not localize") as info:
        held.save(tmp_path / "none.json", format="model-explorer")
    assert "\n" not in str(info.value) and not (tmp_path / "none.json").exists()
