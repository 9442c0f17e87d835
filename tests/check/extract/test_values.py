"""The repro's values: each ONNX input gets the torch input of its shape and dtype closest to
ONNX's value (each used once), else ONNX's own with the reason; each output the closest
torch output of its shape; a tensor torch changed in place after the call is never used."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from onnx_modular.check.extract.values import pair_inputs, pair_outputs
from onnx_modular.leaves._compat import tensor_version
from onnx_modular.leaves.errors import OnnxModularError


def call(inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> SimpleNamespace:
    return SimpleNamespace(call_id="layer", inputs=inputs, outputs=outputs,
                           input_versions=[tensor_version(t) for t in inputs],
                           versions=[tensor_version(t) for t in outputs])


def test_inputs_are_torchs_where_torch_had_them() -> None:
    a, b = torch.zeros(2, 3), torch.ones(2, 3)
    tcall = call([a, b], [])
    onnx_b = np.full((2, 3), 0.9, np.float32)  # drifted from b: still b's place
    onnx_a = np.full((2, 3), 0.1, np.float32)
    mask = np.ones(4, np.int64)  # torch passed nothing of this shape
    got = pair_inputs([("input_0", onnx_b), ("input_1", onnx_a), ("mask", mask)], tcall)
    assert [src for _, src in got.values()] == [
        "torch input 1", "torch input 0", "ONNX value (torch passed no tensor of this shape "
        "and dtype)"]
    np.testing.assert_array_equal(got["input_0"][0], b.numpy())  # torch's own value
    with pytest.raises(OnnxModularError, match="no value for input 'x'"):
        pair_inputs([("x", None)], tcall)


def test_a_tensor_changed_in_place_after_the_call_is_not_torchs_value() -> None:
    a = torch.zeros(2)
    tcall = call([a], [a])
    a.add_(1)  # after the call
    onnx = np.zeros(2, np.float32)
    ((value, source),) = pair_inputs([("input_0", onnx)], tcall).values()
    assert source == "ONNX value (torch changed its tensor in place after the call)"
    assert value is onnx
    assert pair_outputs([("output_0", onnx)], tcall) == {}  # nothing to compare


def test_outputs_pair_with_the_closest_torch_output_of_their_shape() -> None:
    near, far, other = torch.ones(3), torch.full((3,), 5.0), torch.ones(2, 2)
    tcall = call([], [far, other, near])
    got = pair_outputs([("output_0", np.ones(3, np.float32)),
                        ("output_1", np.ones((2, 2), np.float32)),
                        ("output_2", np.ones(7, np.float32))], tcall)
    assert {n: src for n, (_, src) in got.items()} == {
        "output_0": "torch output 2", "output_1": "torch output 1"}
