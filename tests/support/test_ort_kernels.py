"""ONNX Runtime's kernel registry (the CPU EP, offline) and the judging of ONNX nodes."""

from __future__ import annotations

import onnx_ir as ir
import pytest

import onnx_modular as om
from onnx_modular.support import ort_kernels
from onnx_modular.support.ort_kernels import KernelRegistry, ort_kernel_registry


@pytest.fixture(scope="module")
def cpu() -> KernelRegistry:
    return ort_kernel_registry("cpu")


def _node(op: str, dtype: ir.DataType, n_inputs: int = 1, domain: str = "",
          version: int | None = None, out: ir.DataType | None = None) -> ir.Node:
    inputs = [ir.Value(name=f"i{k}", type=ir.TensorType(dtype), shape=ir.Shape([2]))
              for k in range(n_inputs)]
    node = ir.node(op, inputs, domain=domain, version=version)
    node.outputs[0].type = ir.TensorType(out or dtype)
    return node


def test_the_registry_is_the_providers_and_cached(cpu) -> None:
    assert cpu.provider == "CPUExecutionProvider"
    assert ort_kernel_registry("cpu") is cpu  # cached per spelling
    assert ort_kernel_registry("CPUExecutionProvider").kernels == cpu.kernels
    assert ("", "Relu") in cpu.kernels and ("com.microsoft", "FusedGemm") in cpu.kernels


def test_an_op_is_supported_within_its_opset_range_and_types(cpu) -> None:
    assert cpu.supports("Abs", "", 18, {"T": "tensor(float)"})
    assert cpu.supports("Abs", "ai.onnx", 18)  # ai.onnx is the default domain
    assert not cpu.supports("MatMul", "", 18, {"T": "tensor(string)"})
    assert cpu.supports("MatMul", "", 18, {"T": "tensor(float)"})
    assert not cpu.supports("NoSuchOp", "", 18)
    assert not cpu.supports("Abs", "", 0)  # before any kernel's version
    assert cpu.supports("Upsample", "", 9) and not cpu.supports("Upsample", "", 18)  # ended
    assert not cpu.supports("FusedGemm", "", 1)  # com.microsoft's, not the default domain
    assert cpu.supports("FusedGemm", "com.microsoft", 1)


def test_an_op_an_onnx_function_defines_counts_whatever_its_types(cpu) -> None:
    """ORT expands a function op it has no kernel for (Relu is one since opset 14); the
    types are not followed into the expansion."""
    assert cpu.supports("Relu", "", 18, {"T": "tensor(string)"})


def test_answers_are_cached_by_op_version_and_types(cpu) -> None:
    cpu.supports("Abs", "", 13, {"T": "tensor(float)"})
    assert cpu._cache[("", "Abs", 13, (("T", "tensor(float)"),))] is True


def test_constants_and_ops_with_a_function_body_count_without_a_kernel() -> None:
    empty = KernelRegistry("NoneExecutionProvider", {})
    assert empty.supports("Constant", "", 18)
    assert not empty.supports("Abs", "", 18)
    assert not empty.supports("Gelu", "", 18)  # no Gelu before opset 20
    assert empty.supports("Gelu", "", 20)  # an ONNX function: ORT expands it


def test_a_node_is_judged_with_its_bound_types_at_the_models_opset(cpu) -> None:
    opsets = {"": 18}
    assert cpu.supports_node(_node("Add", ir.DataType.FLOAT, 2), opsets)
    assert not cpu.supports_node(_node("Add", ir.DataType.STRING, 2), opsets)
    # every input of a variadic one binds the same constraint
    assert cpu.supports_node(_node("Sum", ir.DataType.FLOAT, 3), opsets)
    assert not cpu.supports_node(_node("Sum", ir.DataType.STRING, 3), opsets)
    # the node's own version wins over the model's opset
    assert not cpu.supports_node(_node("Abs", ir.DataType.FLOAT, version=0), opsets)


def test_formal_types_bind_each_constraint_once_from_inputs_and_outputs() -> None:
    cast = _node("Cast", ir.DataType.FLOAT, out=ir.DataType.INT64)
    assert ort_kernels._formal_types(cast, "", 18) == {"T1": "tensor(float)",
                                                      "T2": "tensor(int64)"}
    assert ort_kernels._formal_types(_node("NoSuchOp", ir.DataType.FLOAT), "", 18) == {}


def test_a_provider_with_no_kernels_is_a_one_line_error() -> None:
    with pytest.raises(om.OnnxModularError) as info:
        ort_kernel_registry("NoSuchExecutionProvider")
    message = str(info.value)
    assert "\n" not in message and "OM0501" in message
    assert "registers no kernels for 'NoSuchExecutionProvider'" in message
    assert "CPUExecutionProvider" in message  # which ones it does register
