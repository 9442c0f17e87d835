"""CallRecord: every check's record of a module call reads its identity from one CallInfo."""

from __future__ import annotations

import dataclasses

from onnx_modular.check.calls import CallRecord
from onnx_modular.leaves.metadata import CallInfo


def test_a_record_reads_its_identity_from_its_call_info() -> None:
    info = CallInfo("h.0@1", "h.0", "pkg.Block")
    record = CallRecord(info)
    assert (record.call_id, record.module_path, record.module_type) == ("h.0@1", "h.0",
                                                                        "pkg.Block")
    assert record.call is info


def test_a_subclass_adds_what_it_saw_and_keeps_the_identity() -> None:
    @dataclasses.dataclass
    class Seen(CallRecord):
        outputs: list[str]

    seen = Seen(CallInfo("a", "a", "m.A"), ["v"])
    assert seen.call_id == "a" and seen.outputs == ["v"]
    # two records of one call compare equal: the identity is the CallInfo's
    assert Seen(CallInfo("a", "a", "m.A"), ["v"]) == seen
    assert Seen(CallInfo("a@1", "a", "m.A"), ["v"]) != seen


def test_the_identity_follows_the_call_info_it_holds() -> None:
    record = CallRecord(CallInfo("x", "x", "T"))
    record.call = CallInfo("y", "p.y", "U")
    assert (record.call_id, record.module_path, record.module_type) == ("y", "p.y", "U")
