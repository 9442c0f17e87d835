"""The shared fixtures fail when they should: a comparison that cannot fail hides defects."""

from __future__ import annotations

import models
import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper


def test_assert_close_fails_on_values_counts_shapes_dtypes_and_structure(assert_close) -> None:
    a = torch.tensor([1.0, 2.0])
    assert_close(a.numpy(), a, 0)
    assert_close([a.numpy() + 1e-5], (a,), 1e-4)
    for actual, expected, tol in [
        (a + 2e-4, a, 1e-4),
        (a * 1e6 * (1 + 1e-6), a * 1e6, 1e-4),  # absolute: no relative slack
        ([a, a], (a,), 1e-4),  # one output too many
        (a.reshape(2, 1), a, 1e-4),
        (a.double(), a, 1e-4),
        (a, (a,), 1e-4),  # a tuple expected, a bare tensor given
        ({"b": a}, {"a": a}, 1e-4),
        (torch.tensor([float("nan"), 2.0]), torch.tensor([float("nan"), 2.0]), 1e-4),
    ]:
        with pytest.raises(AssertionError):
            assert_close(actual, expected, tol)
    # ORT's flat output list against a dict output (model output classes are mappings)
    assert_close([a.numpy(), a.numpy()], {"x": a, "skip": None, "y": (a,)}, 0)


def test_ort_outputs_takes_protos_paths_results_and_named_feeds(ort_outputs, tmp_path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Sub", ["x", "y"], ["z"])], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in "xy"],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x, y = torch.tensor([3.0, 4.0]), torch.tensor([1.0, 1.0])
    onnx.save(proto, tmp_path / "m.onnx")
    for source in (proto, tmp_path / "m.onnx", str(tmp_path / "m.onnx")):
        np.testing.assert_array_equal(ort_outputs(source, (x, y))[0], [2.0, 3.0])
    np.testing.assert_array_equal(ort_outputs(proto, {"y": x, "x": y})[0], [-2.0, -3.0])
    with pytest.raises(AssertionError, match="1 value"):
        ort_outputs(proto, (x,))

    class Result:  # anything with .model_proto, as om.export's result
        model_proto = proto

    np.testing.assert_array_equal(ort_outputs(Result(), [[x], {"y": y}])[0], [2.0, 3.0])


def test_registry_entries_build_with_no_argument() -> None:
    for name in models.names("hand"):
        model, args = models.ARCHITECTURES[name]()
        assert isinstance(model, torch.nn.Module) and isinstance(args, tuple), name
    assert models.names("core") == ["gpt2", "bert", "llama", "qwen2"]
    assert set(models.names("vision")) == {"vit", "clip_vision", "swin", "detr", "convnet",
                                            "conv_bn"}
