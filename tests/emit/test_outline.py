"""emit/outline: module calls -> nested functions (outline, selector, chains_per_node) on
hand-built graphs."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from onnx_modular.emit.outline import Selection, chains_per_node, outline, selector
from onnx_modular.leaves.metadata import (
    FX_NODE,
    LABELS,
    META_CALL,
    META_FX_OUTPUTS,
    META_PATH,
    META_SCOPE,
    META_TYPE,
    CallInfo,
)

from .graphs import call, fx, model, nested_blocks, run, two_blocks, value

X = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)


def _calls(m: ir.Model) -> list[ir.Node]:
    return [n for n in m.graph if n.op_identifier() in m.functions]


def test_equal_calls_share_one_function_and_keep_the_numbers() -> None:
    m, chains = two_blocks()
    (expected,) = run(m, x=X)
    report = outline(m, chains)
    assert (report.calls, report.functions, report.skipped) == (2, 1, [])
    assert report.function_of_call == {"layers.0": "Block", "layers.1": "Block"}
    assert [n.op_type for n in m.graph] == ["Block", "Block", "Neg"]
    ((domain, name, _),) = m.functions
    assert (domain, name) == ("pkg", "Block") and m.opset_imports["pkg"] == 1
    onnx.checker.check_model(ir.serde.serialize_model(m), full_check=True)
    np.testing.assert_array_equal(run(m, x=X)[0], expected)


def test_call_nodes_carry_absolute_labels_and_bodies_relative_ones() -> None:
    m, chains = two_blocks()
    outline(m, chains)
    first, second = _calls(m)
    assert first.metadata_props[META_PATH] == "layers.0"
    assert second.metadata_props[META_CALL] == "layers.1"
    assert first.metadata_props[META_TYPE] == "pkg.Block"
    assert json.loads(second.metadata_props[META_FX_OUTPUTS]) == ["r1"]
    assert json.loads(second.metadata_props[META_SCOPE])[-1] == ["layers.1", "pkg.Block"]
    body = next(iter(m.functions.values()))
    assert body.metadata_props[LABELS] == "relative"
    # the module's own weight keeps its relative name, anything else is numbered
    assert [v.name for v in body.inputs] == ["input_0", "weight"]
    assert [v.name for v in body.outputs] == ["output_0"]


def test_weights_enter_functions_as_inputs() -> None:
    m, chains = two_blocks()
    outline(m, chains)
    assert set(m.graph.initializers) == {"layers.0.weight", "layers.1.weight"}
    assert all(not f.graph.initializers for f in m.functions.values())
    assert [v.name for v in _calls(m)[1].inputs] == ["r0", "layers.1.weight"]


def test_different_input_shapes_make_different_functions() -> None:
    m, chains = two_blocks(second_shape=(4, 3))
    report = outline(m, chains)
    assert report.functions == 2
    assert [n.op_type for n in _calls(m)] == ["Block", "Block_1"]


def test_without_dedupe_every_call_gets_its_own_function() -> None:
    m, chains = two_blocks()
    report = outline(m, chains, dedupe=False)
    assert report.functions == 2 and report.function_of_call["layers.1"] == "Block_1"


def test_nested_calls_are_outlined_innermost_first() -> None:
    m, chains = nested_blocks()
    (expected,) = run(m, x=X)
    report = outline(m, chains)
    assert (report.calls, report.functions) == (4, 2)
    block = next(f for f in m.functions.values() if f.name == "Block")
    inner = [n for n in block if n.op_type == "Act"]
    assert len(inner) == 1 and inner[0].metadata_props[META_PATH] == "act"
    assert [n.op_type for n in m.graph] == ["Block", "Block"]
    np.testing.assert_array_equal(run(m, x=X)[0], expected)


def test_selected_calls_only_become_functions() -> None:
    m, chains = two_blocks()
    select = selector(["layers.0"])
    report = outline(m, chains, select=select)
    assert report.calls == 1
    assert [n.op_type for n in m.graph] == ["Block", "MatMul", "Relu", "Neg"]
    assert isinstance(select, Selection) and select.unmatched() == []


def test_functions_none_leaves_the_model_flat() -> None:
    m, chains = two_blocks()
    report = outline(m, chains, select=selector("none"))
    assert report.calls == 0 and not m.functions


def test_a_call_whose_outputs_nobody_reads_is_skipped() -> None:
    x = value("x")
    used = fx("Relu", [x], "used")
    dead = fx("Neg", [x], "dead")
    m = model([x], used.outputs, [used, dead])
    report = outline(m, {"used": (), "dead": (call("unused", "pkg.Dead"),)})
    assert report.skipped == ["unused"] and report.calls == 0


def test_a_shared_constant_is_copied_into_each_call() -> None:
    """torch.onnx reuses one Constant across FX nodes; each call must hold its own."""
    x = value("x")
    one = ir.node("Constant", [], attributes={"value": ir.tensor(np.float32(1.0))},
                  metadata_props={FX_NODE: "%c : const"})
    one.outputs[0].name = "c"
    a0 = fx("Add", [x, one.outputs[0]], "a0")
    a1 = fx("Add", [a0.outputs[0], one.outputs[0]], "a1")
    m = model([x], a1.outputs, [one, a0, a1])
    chains = {"c": (call("layers.0"),), "a0": (call("layers.0"),), "a1": (call("layers.1"),)}
    report = outline(m, chains)
    assert report.functions == 1  # the second call does not take the constant as an input
    assert all(len(n.inputs) == 1 for n in _calls(m))


class _Block:
    """Stands for a module class given to ``functions=``."""


def test_selector_forms() -> None:
    assert selector("all") is None and selector(None) is None
    none = selector("none")
    assert none is not None and not none(call("a"))
    by_name = selector("Block")
    assert by_name is not None and by_name(call("h.0")) and not by_name(call("h.0", "pkg.Mlp"))
    by_class = selector(_Block)
    qualified = f"{_Block.__module__}.{_Block.__qualname__}"
    assert by_class is not None and by_class(call("h.0", qualified))


def test_selection_reports_names_that_matched_nothing() -> None:
    select = Selection(["Block", "Blok", "h.3"])
    select(call("h.0"))
    assert select.unmatched() == ["Blok", "h.3"]


def test_a_node_of_unknown_origin_takes_its_surroundings_chain() -> None:
    outer, a, b = call("m"), call("m.a", "pkg.A"), call("m.b", "pkg.B")
    x = value("x")
    nodes = [fx("Relu", [x], "n0"), ir.node("Neg", [x]), fx("Relu", [x], "n2"),
             ir.node("Abs", [x])]
    chains = {"n0": (outer, a), "n2": (outer, b)}
    assert chains_per_node(nodes, chains, None) == [(outer, a), (outer,), (outer, b), ()]
    only_outer = chains_per_node(nodes, chains, lambda c: c.module_path == "m")
    assert only_outer == [(outer,), (outer,), (outer,), ()]


@pytest.mark.parametrize("chain", [(), (CallInfo("a", "a", "pkg.A"),)])
def test_chains_per_node_keeps_known_chains(chain: tuple[CallInfo, ...]) -> None:
    x = value("x")
    assert chains_per_node([fx("Relu", [x], "n")], {"n": chain}, None) == [chain]
