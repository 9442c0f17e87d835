"""emit/functions: what outlining and merging share about local functions: their names
(never an operator's) and the condition that every call finds its function."""

from __future__ import annotations

import pytest

from onnx_modular.diagnostics import OnnxModularError
from onnx_modular.emit.functions import ensure_calls_resolve, function_base
from onnx_modular.emit.infra import EmitPass
from onnx_modular.leaves.errors import rules

from .graphs import calling, function


def test_function_names_never_shadow_an_operator() -> None:
    assert function_base("torch.nn.modules.activation.Softmax") == "Softmax_module"
    assert function_base("pkg.Gelu") == "Gelu_module"  # an ONNX op since opset 20
    assert function_base("pkg.FastGelu") == "FastGelu_module"  # com.microsoft
    assert function_base("pkg.GPT2Block") == "GPT2Block"
    assert function_base("pkg.<locals>.My-Block") == "My_Block"


def test_a_call_of_a_missing_function_breaks_the_postcondition() -> None:
    m = calling([function("Block", ["Relu"])])
    ensure_calls_resolve(EmitPass(), m)  # every call resolves: nothing to say
    m.functions.clear()
    other = function("Other", ["Neg"])
    m.functions[other.identifier()] = other  # a function of the domain, not the one called
    with pytest.raises(OnnxModularError) as info:
        ensure_calls_resolve(EmitPass(), m)
    assert info.value.diagnostic.rule is rules.POSTCONDITION
    assert "missing: call_0 (pkg::Block) in the main graph" in str(info.value)
