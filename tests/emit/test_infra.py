"""The emit pass base on toy passes: ``modified`` read from the model, a failure carrying
its step, broken conditions as one-line OM0002/OM0003 naming the pass; and the conditions'
helpers. (The real passes' conditions are tests/emit/test_pipeline.py's.)"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir
import pytest

from onnx_modular.diagnostics import OnnxModularError
from onnx_modular.emit.infra import (
    EmitPass,
    EmitPassError,
    calls_of_missing_functions,
    listed,
    unlabelled_calls,
)
from onnx_modular.leaves.errors import fail, rules
from onnx_modular.leaves.metadata import META_CALL, META_FX_OUTPUTS, META_PATH

from . import graphs


def _relu() -> ir.Model:
    x = graphs.value("x")
    node = graphs.fx("Relu", [x], "y")
    return graphs.model([x], node.outputs, [node])


class _Doing(EmitPass):
    def __init__(self, change: Callable[[ir.Model], object]) -> None:
        super().__init__()
        self.change = change

    def run(self, model: ir.Model) -> None:
        self.change(model)


def _first(model: ir.Model) -> ir.Node:
    return next(iter(model.graph))


def _replace_with_twin(model: ir.Model) -> None:
    old = _first(model)
    twin = ir.node("Relu", [old.inputs[0]], name=old.name)
    twin.outputs[0].name = "twin"
    old.outputs[0].replace_all_uses_with(twin.outputs[0], replace_graph_outputs=True)
    model.graph.insert_after(old, twin)
    model.graph.remove(old, safe=True)
    twin.outputs[0].name = "y"


def _add_weight(model: ir.Model) -> None:
    model.graph.register_initializer(graphs.weight("w"))


def _new_tensor(model: ir.Model) -> None:
    w = model.graph.initializers["w"]
    w.const_value = ir.tensor(np.zeros((4, 4), np.float32), name="w")


CHANGES = {
    "nothing": (lambda m: None, False),
    "metadata": (lambda m: _first(m).metadata_props.__setitem__("k", "v"), True),
    "attribute": (lambda m: _first(m).attributes.__setitem__(
        "alpha", ir.AttrFloat32("alpha", 1.0)), True),
    "output name": (lambda m: setattr(_first(m).outputs[0], "name", "z"), True),
    "opset": (lambda m: m.opset_imports.__setitem__("pkg", 1), True),
    "initializer": (_add_weight, True),
    "a twin node": (_replace_with_twin, True),
    "a graph input": (lambda m: m.graph.inputs.append(graphs.value("extra")), True),
    "a function": (lambda m: m.functions.__setitem__(
        ("pkg", "F", ""), graphs.function("F", ["Relu"])), True),
    "graph metadata": (lambda m: m.graph.metadata_props.__setitem__("k", "v"), True),
}


@pytest.mark.parametrize("what", list(CHANGES))
def test_modified_is_read_from_the_model(what: str) -> None:
    change, modified = CHANGES[what]
    result = _Doing(change)(_relu())
    assert result.modified is modified


def test_a_new_tensor_for_a_weight_is_a_change_the_same_one_is_not() -> None:
    model = _relu()
    _add_weight(model)
    assert _Doing(_new_tensor)(model).modified
    same = model.graph.initializers["w"].const_value
    assert not _Doing(lambda m: setattr(m.graph.initializers["w"], "const_value", same))(
        model).modified


def test_a_node_replaced_by_an_equal_twin_is_a_change_even_when_nothing_reads_it() -> None:
    x = graphs.value("x")
    dead, live = ir.node("Relu", [x], name="dead"), graphs.fx("Neg", [x], "y")
    dead.outputs[0].name = "unused"
    model = graphs.model([x], live.outputs, [dead, live])

    def swap(m: ir.Model) -> None:
        twin = ir.node("Relu", [x], name="dead")
        twin.outputs[0].name = "unused"
        m.graph.insert_after(dead, twin)
        m.graph.remove(dead, safe=True)

    assert _Doing(swap)(model).modified


def test_a_change_inside_a_subgraph_is_seen() -> None:
    x = graphs.value("x")
    inner = ir.node("Relu", [x])
    branch = ir.Graph([], inner.outputs, nodes=[inner], name="then")
    cond = graphs.value("c", (), ir.DataType.BOOL)
    node = ir.node("If", [cond], attributes={"then_branch": branch, "else_branch": branch})
    model = graphs.model([x, cond], node.outputs, [node])
    result = _Doing(lambda m: inner.metadata_props.__setitem__("k", "v"))(model)
    assert result.modified


def test_the_name_is_the_class_name() -> None:
    assert _Doing(lambda m: None).name == "_Doing"


def test_a_failure_carries_its_step_and_its_cause() -> None:
    def broken(model: ir.Model) -> None:
        raise KeyError("inside")

    step = _Doing(broken)
    with pytest.raises(EmitPassError) as info:
        step(_relu())
    assert info.value.step is step
    assert str(info.value) == "the emit step _Doing failed"
    chain, e = [], info.value
    while e is not None:
        chain.append(e)
        e = e.__cause__
    assert any(isinstance(c, KeyError) for c in chain)


def test_a_user_error_inside_a_step_reaches_the_caller_as_it_was_raised() -> None:
    error = fail("a bad input", rules.BAD_INPUT)

    def refuses(model: ir.Model) -> None:
        raise error

    with pytest.raises(OnnxModularError) as info:
        _Doing(refuses)(_relu())
    assert info.value is error


class _Conditioned(_Doing):
    def __init__(self, need: bool = True, promise: bool = True,
                 crash_in_ensures: bool = False) -> None:
        super().__init__(lambda m: None)
        self.need, self.promise, self.crash = need, promise, crash_in_ensures

    def requires(self, model: ir.Model) -> None:
        if not self.need:
            raise self.precondition_failed("a model with x")

    def ensures(self, model: ir.Model) -> None:
        if self.crash:
            raise RuntimeError("a bug in the condition")
        if not self.promise:
            raise self.postcondition_failed("a model with y")


@pytest.mark.parametrize("kwargs, rule, text", [
    ({"need": False}, rules.PRECONDITION, "error: OM0002 precondition-failed: "
     "Pass _Conditioned requires: a model with x"),
    ({"promise": False}, rules.POSTCONDITION, "error: OM0003 postcondition-failed: "
     "Pass _Conditioned ensures: a model with y"),
])
def test_broken_conditions_are_one_line_errors_naming_the_pass(kwargs, rule, text) -> None:
    with pytest.raises(OnnxModularError) as info:
        _Conditioned(**kwargs)(_relu())
    assert info.value.diagnostic.rule is rule
    assert str(info.value) == text
    assert not isinstance(info.value.__cause__, ir.passes.InvariantError)
    assert info.value.__context__ is None or not isinstance(info.value.__context__,
                                                            ir.passes.InvariantError)


def test_conditions_met_pass_and_a_crashing_condition_is_the_steps_failure() -> None:
    assert not _Conditioned()(_relu()).modified
    step = _Conditioned(crash_in_ensures=True)
    with pytest.raises(EmitPassError) as info:
        step(_relu())
    assert info.value.step is step


def test_a_pass_that_does_not_say_what_it_does_fails_as_its_step() -> None:
    step = EmitPass()
    with pytest.raises(EmitPassError) as info:
        step(_relu())
    assert isinstance(info.value.__cause__, NotImplementedError)


# ---- conditions passes state ------------------------------------------------------------------

def _called(labelled: bool = True, missing: bool = False) -> ir.Model:
    f = graphs.function("Block", ["Relu"])
    m = graphs.calling([f])
    call = _first(m)
    if labelled:
        call.metadata_props.update({META_PATH: "b", META_CALL: "b", META_FX_OUTPUTS: "r"})
    if missing:
        m.functions.clear()
        m.functions[("pkg", "Other", "")] = graphs.function("Other", ["Neg"])
    return m


def test_calls_of_missing_functions_names_the_node_and_where() -> None:
    assert calls_of_missing_functions(_called()) == []
    assert calls_of_missing_functions(_called(missing=True)) == [
        "call_0 (pkg::Block) in the main graph"]


def test_a_call_inside_a_function_body_is_found_too() -> None:
    inner = graphs.function("Inner", ["Relu"])
    outer = graphs.function("Outer", ["Neg"])
    node = next(iter(outer))
    call = ir.node("Gone", [node.outputs[0]], domain="pkg", name="deep")
    outer.append(call)
    m = graphs.calling([outer])
    m.functions[inner.identifier()] = inner
    assert calls_of_missing_functions(m) == ["deep (pkg::Gone) in function Outer"]


def test_unlabelled_calls_name_the_missing_labels() -> None:
    assert unlabelled_calls(_called()) == []
    m = _called()
    _first(m).metadata_props.pop(META_CALL)
    _first(m).metadata_props.pop(META_FX_OUTPUTS)
    assert unlabelled_calls(m) == [
        f"call_0 (Block) in the main graph has no {META_CALL}, {META_FX_OUTPUTS}"]


def test_listed_shows_the_first_few_and_counts_the_rest() -> None:
    assert listed([]) == ""
    assert listed(["a", "b", "c"]) == "a; b; c"
    assert listed(["a", "b", "c", "d", "e"]) == "a; b; c and 2 more"
    assert listed(["a", "b"], limit=1) == "a and 1 more"
