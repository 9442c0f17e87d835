"""emit/symbolic: a size by its value, from a run of an activation's dimensions."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnx_modular.emit.symbolic import by_value


def _dynamic(name: str, shape: list[object]) -> ir.Value:
    dims = [ir.SymbolicDim(d) if isinstance(d, str) else d for d in shape]
    return ir.Value(name=name, type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(dims))


def test_a_size_no_activation_has_by_parts_is_taken_by_its_value() -> None:
    """``((h - 1)//2 + 1) * ((w - 1)//2 + 1)`` computed from the model input's ``h`` and
    ``w`` is the product of the activation's last two dimensions: one Shape slice of it."""
    sample = _dynamic("sample", ["b", 3, "h", "w"])
    act = _dynamic("act", ["b", 8, "(((h - 1)//2)) + 1", "(((w - 1)//2)) + 1"])
    one, two = (ir.Value(name=n, type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([]),
                         const_value=ir.tensor(np.array(v, dtype=np.int64), name=n))
                for n, v in (("one", 1), ("two", 2)))
    nodes, halves = [], []
    for axis in (2, 3):
        shape = ir.node("Shape", [sample], attributes={"start": axis, "end": axis + 1})
        squeeze = ir.node("Squeeze", [shape.outputs[0]])
        minus = ir.node("Sub", [squeeze.outputs[0], one])
        half = ir.node("Div", [minus.outputs[0], two])
        plus = ir.node("Add", [half.outputs[0], one])
        nodes += [shape, squeeze, minus, half, plus]
        halves.append(plus.outputs[0])
    product = ir.node("Mul", halves)
    nodes.append(product)
    size = product.outputs[0]
    size.dtype, size.shape = ir.DataType.INT64, ir.Shape([])
    made = by_value(size, nodes, [(act, act)], "hw")
    assert made is not None and [n.op_type for n in made][:2] == ["Shape", "ReduceProd"]
    assert made[0].attributes.get_int("start") == 2 and made[0].attributes.get_int("end") == 4
    assert by_value(size, nodes, [(sample, sample)], "hw") is None  # h * w is not it


def test_dimension_names_that_are_sympy_constants_are_symbols() -> None:
    """``S``, ``N``, ``E`` or ``I`` would be sympy's singletons and numbers without the
    names given as symbols: ``N * S`` must stay a product of two sizes."""
    from onnx_modular.emit.symbolic import _parsed

    product = _parsed("N*S")
    assert product is not None and {str(s) for s in product.free_symbols} == {"N", "S"}
