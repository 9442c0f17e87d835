"""emit/inline: RebasingInlinePass inlines every function, and each copy names the module
call it was inlined for (the body was built from the first call)."""

from __future__ import annotations

import ast
import json

import numpy as np
import onnx_ir as ir

from onnx_modular.emit.inline import RebasingInlinePass
from onnx_modular.emit.outline import outline
from onnx_modular.leaves.metadata import (
    CLASS_HIERARCHY,
    META_CALL,
    META_PATH,
    META_SCOPE,
    NAME_SCOPES,
    CallInfo,
)

from .graphs import nested_blocks, run

X = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)

#: torch.onnx's scopes of each FX node of ``nested_blocks``: root, block, [act,] node.
SCOPES = {"mm0": (["", "layers.0"], ["pkg.Model", "pkg.Block"]),
          "r0": (["", "layers.0", "layers.0.act"], ["pkg.Model", "pkg.Block", "pkg.Act"]),
          "mm1": (["", "layers.1"], ["pkg.Model", "pkg.Block"]),
          "r1": (["", "layers.1", "layers.1.act"], ["pkg.Model", "pkg.Block", "pkg.Act"])}


def _labelled() -> tuple[ir.Model, dict[str, tuple[CallInfo, ...]], dict[str, str]]:
    m, chains = nested_blocks()
    original = {}
    for node in m.graph:
        fx = node.outputs[0].name
        paths, classes = SCOPES[fx]
        node.metadata_props[NAME_SCOPES] = repr([*paths, fx])
        node.metadata_props[CLASS_HIERARCHY] = repr([*classes, "aten.op"])
        original[node.op_type + paths[1]] = node.metadata_props[NAME_SCOPES]
    return m, chains, original


def test_inlining_everything_keeps_the_numbers_and_leaves_no_function() -> None:
    m, chains, _ = _labelled()
    (expected,) = run(m, x=X)
    outline(m, chains)
    assert len(m.functions) == 2
    assert RebasingInlinePass()(m).modified
    assert not m.functions
    assert [n.op_type for n in m.graph] == ["MatMul", "Relu", "MatMul", "Relu"]
    np.testing.assert_array_equal(run(m, x=X)[0], expected)


def test_every_copy_names_the_call_it_was_inlined_for() -> None:
    m, chains, original = _labelled()
    outline(m, chains)  # one Block function, built from layers.0, serves layers.1 too
    RebasingInlinePass()(m)
    _, r0, mm1, r1 = m.graph
    assert [n.metadata_props[META_PATH] for n in m.graph] == \
        ["layers.0", "layers.0.act", "layers.1", "layers.1.act"]
    assert r1.metadata_props[META_CALL] == "layers.1.act"
    assert json.loads(r1.metadata_props[META_SCOPE]) == [
        ["", "pkg.Model"], ["layers.1", "pkg.Block"], ["layers.1.act", "pkg.Act"]]
    # module scopes as torch.onnx wrote them for that call (the last entry, the FX node, is
    # the first call's: the body was built from it)
    assert _modules(mm1) == _modules(original["MatMullayers.1"]) == ["", "layers.1"]
    assert _modules(r1) == _modules(original["Relulayers.1"])
    assert r0.metadata_props[NAME_SCOPES] == original["Relulayers.0"]


def _modules(node_or_scopes: ir.Node | str) -> list[str]:
    text = node_or_scopes if isinstance(node_or_scopes, str) else \
        node_or_scopes.metadata_props[NAME_SCOPES]
    return ast.literal_eval(text)[:-1]


def test_a_nested_call_without_torch_onnx_scopes_is_rebased_too() -> None:
    m, chains = nested_blocks()  # no NAME_SCOPES/CLASS_HIERARCHY on any node
    outline(m, chains)
    RebasingInlinePass()(m)
    r1 = list(m.graph)[-1]
    assert json.loads(r1.metadata_props[META_SCOPE]) == [
        ["", ""], ["layers.1", "pkg.Block"], ["layers.1.act", "pkg.Act"]]


def test_a_model_without_functions_is_left_unmodified() -> None:
    m, _ = nested_blocks()
    assert RebasingInlinePass()(m).modified is False
