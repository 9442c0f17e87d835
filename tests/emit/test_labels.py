"""emit/labels: inside a function every label is relative to its module; inlining for a
call makes them absolute again (relativize then absolutize is the identity)."""

from __future__ import annotations

import json

import onnx_ir as ir

from onnx_modular.emit.labels import absolutize, call_scope, relativize, scope_of
from onnx_modular.leaves.metadata import (
    CLASS_HIERARCHY,
    LABELS,
    META_CALL,
    META_PATH,
    META_SCOPE,
    META_TYPE,
    NAME_SCOPES,
    NAMESPACE,
    CallInfo,
)

from .graphs import OPSET, value

BLOCK = CallInfo("h.0@1", "h.0", "pkg.Block")
SCOPES = "['', 'h.0', 'h.0.attn', 'matmul']"
CLASSES = "['pkg.Model', 'pkg.Block', 'pkg.Attn', 'aten.matmul']"
SPACE = ": pkg.Model/h.0: pkg.Block/h.0.attn: pkg.Attn/aten.matmul.default"
ATTN: ir.OperatorIdentifier = ("pkg", "Attn", "")


def _body() -> ir.Function:
    """The body of ``h.0``'s function as outlining builds it: absolute labels."""
    x, w = value("h.0.x"), value("h.0.attn.weight", (4, 4))
    other = value("h.1.out")
    mm = ir.node("MatMul", [x, w], name="h.0.attn.matmul",
                 metadata_props={NAME_SCOPES: SCOPES, CLASS_HIERARCHY: CLASSES,
                                 NAMESPACE: SPACE})
    mm.outputs[0].name = "h.0.attn.matmul"
    nested = ir.node("Attn", [mm.outputs[0], other], domain="pkg", name="h.0.attn",
                     metadata_props={META_PATH: "h.0.attn", META_CALL: "h.0.attn@1",
                                     META_TYPE: "pkg.Attn", META_SCOPE: json.dumps(
                                         [["", "pkg.Model"], ["h.0", "pkg.Block"],
                                          ["h.0.attn", "pkg.Attn"]])})
    graph = ir.Graph([x, w, other], nested.outputs, nodes=[mm, nested],
                     opset_imports={"": OPSET, "pkg": 1}, name="Block")
    return ir.Function("pkg", "Block", graph=graph, attributes=[])


def test_relativize_strips_the_module_path_everywhere() -> None:
    function = _body()
    relativize(function, BLOCK, {ATTN})
    mm, nested = list(function)
    assert function.metadata_props[LABELS] == "relative"
    assert mm.name == "attn.matmul" and mm.outputs[0].name == "attn.matmul"
    assert mm.metadata_props[NAME_SCOPES] == "['attn', 'matmul']"
    assert mm.metadata_props[CLASS_HIERARCHY] == "['pkg.Attn', 'aten.matmul']"
    assert mm.metadata_props[NAMESPACE] == "attn: pkg.Attn/aten.matmul.default"
    # a nested call: relative path, call id without the implied suffix, scope below h.0
    assert nested.metadata_props[META_PATH] == "attn"
    assert nested.metadata_props[META_CALL] == "attn"
    assert json.loads(nested.metadata_props[META_SCOPE]) == [["attn", "pkg.Attn"]]
    # the module's own values keep relative names; inputs from elsewhere are numbered
    assert [v.name for v in function.inputs] == ["x", "attn.weight", "input_2"]
    assert [v.name for v in function.outputs] == ["output_0"]


def test_absolutize_restores_the_labels_of_the_call_inlined_for() -> None:
    function = _body()
    relativize(function, BLOCK, {ATTN})
    call = ir.node("Block", [], domain="pkg", metadata_props={
        META_PATH: "h.0", META_CALL: "h.0@1", META_TYPE: "pkg.Block",
        META_SCOPE: json.dumps([["", "pkg.Model"], ["h.0", "pkg.Block"]])})
    nodes = list(function)
    absolutize(call, function, nodes, {ATTN})
    mm, nested = nodes
    assert mm.metadata_props[NAME_SCOPES] == SCOPES
    assert mm.metadata_props[CLASS_HIERARCHY] == CLASSES
    assert mm.metadata_props[NAMESPACE] == SPACE
    assert nested.metadata_props[META_PATH] == "h.0.attn"
    assert nested.metadata_props[META_CALL] == "h.0.attn@1"
    assert scope_of(nested) == [("", "pkg.Model"), ("h.0", "pkg.Block"),
                                ("h.0.attn", "pkg.Attn")]


def test_absolutize_for_another_call_names_that_call() -> None:
    function = _body()
    relativize(function, BLOCK, {ATTN})
    call = ir.node("Block", [], domain="pkg", metadata_props={
        META_PATH: "h.7", META_CALL: "h.7", META_TYPE: "pkg.Block"})
    nodes = list(function)
    absolutize(call, function, nodes, {ATTN})
    assert nodes[0].metadata_props[NAME_SCOPES] == "['', 'h.7', 'h.7.attn', 'matmul']"
    assert nodes[1].metadata_props[META_PATH] == "h.7.attn"
    assert nodes[1].metadata_props[META_CALL] == "h.7.attn"


def test_a_nested_call_with_its_own_suffix_keeps_it() -> None:
    function = _body()
    next(n for n in function if n.op_type == "Attn").metadata_props[META_CALL] = "h.0.attn@2"
    relativize(function, BLOCK, {ATTN})
    nested = next(n for n in function if n.op_type == "Attn")
    assert nested.metadata_props[META_CALL] == "attn@2"


def test_absolutize_leaves_absolute_bodies_alone() -> None:
    function = _body()  # never relativized: no LABELS mark
    call = ir.node("Block", [], domain="pkg", metadata_props={
        META_PATH: "h.7", META_CALL: "h.7", META_TYPE: "pkg.Block"})
    nodes = list(function)
    absolutize(call, function, nodes, {ATTN})
    assert nodes[0].metadata_props[NAME_SCOPES] == SCOPES


def test_call_scope_reads_torch_onnx_scopes_or_falls_back() -> None:
    node = ir.node("MatMul", [value("x"), value("w")],
                   metadata_props={NAME_SCOPES: SCOPES, CLASS_HIERARCHY: CLASSES})
    attn = CallInfo("h.0.attn", "h.0.attn", "pkg.Attn")
    assert call_scope([node], attn) == [("", "pkg.Model"), ("h.0", "pkg.Block"),
                                        ("h.0.attn", "pkg.Attn")]
    assert call_scope([node], BLOCK) == [("", "pkg.Model"), ("h.0", "pkg.Block")]
    elsewhere = CallInfo("lm_head", "lm_head", "pkg.Head")
    assert call_scope([node], elsewhere) == [("", ""), ("lm_head", "pkg.Head")]
    assert call_scope([ir.node("Relu", [value("x")])], BLOCK) == [("", ""),
                                                                   ("h.0", "pkg.Block")]
