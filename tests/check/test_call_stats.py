"""Error statistics per module call: histograms, the repeated blocks, and the sentence."""

from __future__ import annotations

import json

import numpy as np
import pytest

from onnx_modular.check.call_stats import (
    HIST_EDGES,
    HIST_LABELS,
    CallError,
    abs_error_histogram,
    find_stack,
)
from onnx_modular.leaves.metadata import CallInfo

BUCKETS = len(HIST_EDGES) + 1


def err(call_id: str, order: int, max_abs: float, ok: bool = True, parent: int | None = None,
        depth: int = 1, module_type: str = "pkg.Block") -> CallError:
    return CallError(CallInfo(call_id, call_id, module_type), order, depth, parent, max_abs,
                     max_abs, 0 if ok else 1, 4, "float32", [0] * BUCKETS, ok)


def test_labels_name_every_bucket() -> None:
    assert len(HIST_LABELS) == BUCKETS


def test_histogram_counts_per_decade_with_an_open_last_bucket() -> None:
    expected = np.zeros(6, np.float32)
    actual = np.array([0, 5e-9, 5e-7, 5e-3, 0.5, 7.0], np.float32)
    h = abs_error_histogram(actual, expected)
    assert sum(h) == 6 and len(h) == BUCKETS
    assert h[0] == 2 and h[2] == 1 and h[6] == 1 and h[8] == 1 and h[-1] == 1


def test_histogram_nan_matches_nan_and_an_unmatched_nan_or_inf_is_worst() -> None:
    e = np.array([np.nan, np.inf, 1.0, 1.0], np.float32)
    a = np.array([np.nan, np.inf, np.nan, np.inf], np.float32)
    h = abs_error_histogram(a, e)
    assert h[0] == 2 and h[-1] == 2


def test_histogram_of_integers_mixed_dtypes_empty_or_misshapen_values() -> None:
    assert abs_error_histogram(np.array([1, 5], np.int64), np.array([1, 3], np.int32))[-1] == 1
    h = abs_error_histogram(np.array([1.0], np.float16), np.array([1.0], np.float32))
    assert h[0] == 1
    zeros = [0] * BUCKETS
    assert abs_error_histogram(np.zeros(0, np.float32), np.zeros(0, np.float32)) == zeros
    assert abs_error_histogram(np.zeros(2, np.float32), np.zeros(3, np.float32)) == zeros


def test_call_error_to_dict_is_json_safe() -> None:
    e = err("h.0", 0, float("inf"), ok=False)
    d = e.to_dict()
    assert (d["call_id"], d["module_type"], d["max_abs_err"], d["ok"]) == ("h.0", "pkg.Block",
                                                                          "inf", False)
    json.dumps(d, allow_nan=False)


def test_no_repeated_calls_no_stack() -> None:
    assert find_stack([]) is None
    assert find_stack([err("a", 0, 1e-6), err("b", 1, 1e-6, module_type="pkg.Other")]) is None


def test_the_stack_names_the_first_call_over_tolerance_and_how_the_rest_grow() -> None:
    root = err("", 0, 0.1, ok=False, depth=0, module_type="pkg.Model")
    layers = [err(f"h.{i}", i + 1, x, ok=x < 1e-3, parent=0)
              for i, x in enumerate([1e-6, 2e-6, 5e-3, 1e-2, 0.1])]
    stack = find_stack([root, *layers])
    assert stack is not None and stack.module_type == "pkg.Block"
    assert [c.call_id for c in stack.calls] == [f"h.{i}" for i in range(5)]
    assert stack.first_bad == 2 and stack.jump is None and stack.parent == ""
    assert stack.summary == ("h.2 (Block 3 of 5) first exceeds tolerance (max abs err 0.005); "
                             "the 2 before stay within it (<= 2e-06); h.3 ... h.4 grow from "
                             "0.01 to 0.1")
    assert stack.to_dict()["first_exceeding"] == "h.2"
    assert stack.to_dict()["first_jump"] is None


def test_within_tolerance_the_stack_shows_where_the_error_leaps() -> None:
    layers = [err(f"h.{i}", i, x) for i, x in enumerate([1e-7, 1e-7, 5e-6, 6e-6])]
    stack = find_stack(layers)
    assert stack is not None and stack.first_bad is None and stack.jump == 2
    assert "the error leaps at h.2 (Block 3 of 4) from <= 1e-07 to 5e-06" in stack.summary
    assert "h.3 is at 6e-06" in stack.summary
    assert stack.to_dict()["first_jump"] == "h.2"


def test_a_flat_healthy_stack_says_all_stay_within_tolerance() -> None:
    stack = find_stack([err(f"h.{i}", i, 1e-7) for i in range(3)])
    assert stack is not None and stack.jump is None
    assert stack.summary == "all 3 Block calls stay within tolerance (max abs err <= 1e-07)"


@pytest.mark.parametrize("tail, words", [([1e-2, 1e-3, 1e-4], "fall from"),
                                         ([1e-2, 1.1e-2, 1e-2], "stay near")])
def test_the_calls_after_the_first_bad_fall_or_stay(tail: list[float], words: str) -> None:
    calls = [err("h.0", 0, 1e-6), err("h.1", 1, 1e-2, ok=False)]
    calls += [err(f"h.{i + 2}", i + 2, x, ok=False) for i, x in enumerate(tail)]
    stack = find_stack(calls)
    assert stack is not None and words in stack.summary
    assert "the one before stays within it" in stack.summary


def test_calls_after_the_first_bad_still_within_tolerance_are_counted() -> None:
    calls = [err("h.0", 0, 1e-2, ok=False), err("h.1", 1, 1e-6), err("h.2", 2, 1e-6)]
    stack = find_stack(calls)
    assert stack is not None and stack.summary.endswith("(2 of them within tolerance)")


def test_the_group_holding_the_focus_wins_over_a_larger_one() -> None:
    """Six projections under one layer against three layers holding the first mismatch."""
    layers = [err(f"h.{i}", i, 1e-6, depth=1) for i in range(3)]
    projections = [err(f"p.{i}", 10 + i, 1e-6, parent=0, depth=2, module_type="pkg.Linear")
                   for i in range(6)]
    assert find_stack([*layers, *projections]).module_type == "pkg.Linear"
    stack = find_stack([*layers, *projections], focus="h.1.attn")
    assert stack is not None and stack.module_type == "pkg.Block"


def test_groups_of_three_or_more_come_before_a_pair_and_the_parent_is_named() -> None:
    root = err("enc", 0, 0.0, depth=0, module_type="pkg.Enc")
    pair = [err(f"enc.proj{i}", 1 + i, 1e-2, ok=False, parent=0, module_type="pkg.Linear")
            for i in range(2)]
    layers = [err(f"enc.h.{i}", 3 + i, 1e-7, parent=0) for i in range(3)]
    stack = find_stack([root, *pair, *layers])
    assert stack is not None and stack.module_type == "pkg.Block" and stack.parent == "enc"


def test_the_stack_lists_its_calls_in_execution_order() -> None:
    calls = [err("h.1", 5, 1e-6), err("h.0", 2, 1e-6), err("h.2", 9, 1e-6)]
    stack = find_stack(calls)
    assert stack is not None and [c.order for c in stack.calls] == [2, 5, 9]
