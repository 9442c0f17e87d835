"""emit/regions: a translation cut into standalone region models (partition), pooled back
into one model of region functions (single_model); region_chains, op_types_in."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
import pytest
import torch

from onnx_modular.diagnostics import OnnxModularError
from onnx_modular.emit.regions import (
    SPLIT_DOMAIN,
    RegionGraph,
    op_types_in,
    partition,
    region_chains,
    single_model,
)
from onnx_modular.leaves.metadata import REGION_KIND

from .graphs import call, calling, function, fx, model, run, two_blocks, value

X = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
NAMES = [("acc0", "acc"), ("cpu1", "cpu")]
BY_LAYER = {"mm0": 0, "r0": 0, "mm1": 1, "r1": 1, "neg": 1}


def _no_meta(name: str) -> None:
    return None


def _chained(regions: Sequence[RegionGraph], feeds: dict[str, np.ndarray]
             ) -> dict[str, np.ndarray]:
    """Run the regions in order, each on what earlier ones (or the inputs) made."""
    env = dict(feeds)
    for region in regions:
        names = [v.name for v in region.model.graph.inputs]
        outs = run(region.model, **{n: env[n] for n in names})
        env.update(zip([v.name for v in region.model.graph.outputs], outs))
    return env


def test_regions_chained_give_the_unsplit_outputs() -> None:
    m, _ = two_blocks()
    (expected,) = run(m, x=X)
    regions = partition(m, NAMES, BY_LAYER, _no_meta)
    np.testing.assert_array_equal(_chained(regions, {"x": X})["neg"], expected)
    assert len(list(m.graph)) == 5  # the translation is not touched


def test_borders_become_inputs_and_outputs_with_their_origins() -> None:
    m, _ = two_blocks()
    acc, cpu = partition(m, NAMES, BY_LAYER, _no_meta)
    assert (acc.name, acc.kind, acc.is_acc, cpu.is_acc) == ("acc0", "acc", True, False)
    assert [v.name for v in acc.model.graph.inputs] == ["x"]
    assert [v.name for v in acc.model.graph.outputs] == ["r0"]
    assert [v.name for v in cpu.model.graph.inputs] == ["r0"]
    assert [v.name for v in cpu.model.graph.outputs] == ["neg"]
    assert acc.sources == {"x": "input"} and cpu.sources == {"r0": "acc0"}
    assert acc.consumers == {"r0": ["cpu1"]} and cpu.consumers == {"neg": ["output"]}
    # each region holds only the weights it reads
    assert acc.weights == {"layers.0.weight": 64} and cpu.weights == {"layers.1.weight": 64}
    assert list(cpu.model.graph.initializers) == ["layers.1.weight"]


def test_a_constant_read_across_a_border_is_copied_not_passed() -> None:
    x = value("x")
    c = ir.node("Constant", [], attributes={"value": ir.tensor(np.float32(2.0))}, name="c")
    c.outputs[0].name = "c"
    a = fx("Mul", [x, c.outputs[0]], "a")
    b = fx("Mul", [a.outputs[0], c.outputs[0]], "b")
    m = model([x], b.outputs, [c, a, b])
    first, second = partition(m, NAMES, {"a": 0, "b": 1}, _no_meta)
    assert [v.name for v in second.model.graph.inputs] == ["a"]
    assert [n.op_type for n in second.model.graph] == ["Constant", "Mul"]
    np.testing.assert_array_equal(_chained([first, second], {"x": X})["b"], X * 4)


def test_a_region_reading_a_later_one_is_refused() -> None:
    m, _ = two_blocks()
    backwards = {"mm0": 1, "r0": 1, "mm1": 0, "r1": 0, "neg": 0}
    with pytest.raises(OnnxModularError, match=r"OM0202 .*'r0' of region cpu1 is read by "
                                               r"the earlier region acc0"):
        partition(m, NAMES, backwards, _no_meta)


def test_a_border_value_without_a_type_takes_the_fx_node_s() -> None:
    m, _ = two_blocks()
    r0 = next(n for n in m.graph if n.name == "n_r0").outputs[0]
    r0.type, r0.shape = None, None
    fake = {"r0": torch.empty(2, 4, dtype=torch.float16)}
    _, cpu = partition(m, NAMES, BY_LAYER, fake.get)
    (border,) = cpu.model.graph.inputs
    assert border.dtype == ir.DataType.FLOAT16 and border.shape == ir.Shape([2, 4])


def test_single_model_calls_each_region_once_in_order() -> None:
    m, _ = two_blocks()
    (expected,) = run(m, x=X)
    regions = partition(m, NAMES, BY_LAYER, _no_meta)
    single = single_model(m.graph, regions)
    assert [(n.domain, n.op_type) for n in single.graph] == [(SPLIT_DOMAIN, "acc0"),
                                                              (SPLIT_DOMAIN, "cpu1")]
    assert [n.metadata_props[REGION_KIND] for n in single.graph] == ["acc", "cpu"]
    assert sorted(single.graph.initializers) == ["layers.0.weight", "layers.1.weight"]
    assert all(not f.graph.initializers for f in single.functions.values())
    np.testing.assert_array_equal(run(single, x=X)[0], expected)


def test_single_model_pools_equal_module_functions_across_regions() -> None:
    """Each region has its own ``Block``; pooled, the second is renamed, then merged."""
    def region(name: str, kind: str, source: str) -> RegionGraph:
        r_model = calling([function("Block", ["Relu"])])
        r_model.graph.inputs[0].name = source
        r_model.graph.outputs[0].name = f"{name}_out"
        return RegionGraph(name, kind, r_model, {source: "input"}, {})

    first = region("acc0", "acc", "x")
    second = region("cpu1", "cpu", "acc0_out")
    whole = model([value("x")], [value("cpu1_out")], [])
    single = single_model(whole.graph, [first, second])
    module_functions = [f for f in single.functions.values() if f.domain != SPLIT_DOMAIN]
    assert [f.name for f in module_functions] == ["Block"]
    np.testing.assert_array_equal(run(single, x=X)[0], np.maximum(X, 0))


def test_a_call_straddling_a_border_dissolves_in_both_regions() -> None:
    outer, inner = call("block"), call("block.act", "pkg.Act")
    chains = {"a": (outer,), "b": (outer, inner), "c": (outer,)}
    left, right = region_chains(chains, {"a": 0, "b": 0, "c": 1}, 2)
    assert left == {"a": (), "b": (inner,)} and right == {"c": ()}
    whole, _ = region_chains(chains, {"a": 0, "b": 0, "c": 0}, 2)
    assert whole == chains


def test_op_types_in_lists_ops_but_not_calls() -> None:
    m = calling([function("Block", ["Relu", "Neg"])])
    m.graph.append(ir.node("Abs", [m.graph.outputs[0]], domain="ai.onnx"))
    found = op_types_in(m)
    assert found == {("", "Relu"): ["function Block"], ("", "Neg"): ["function Block"],
                     ("", "Abs"): ["main graph"]}
