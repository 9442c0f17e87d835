"""``input_names=`` / ``output_names=`` of om.export: the file's names, one value each, and the
numbers unchanged; refusals before the export where the lists alone are wrong."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import onnx_modular as om


class Returns(torch.nn.Module):
    """Returns a computed value twice, an input unchanged, and another computed value."""

    def __init__(self) -> None:
        super().__init__()
        self.l, self.k = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = self.l(x)
        return self.k(torch.relu(h)), h, x, h, y * 2


@pytest.fixture(scope="module")
def model_and_inputs() -> tuple[Returns, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return Returns().eval(), (torch.randn(2, 4), torch.randn(2, 4))


@pytest.mark.parametrize("functions", ["all", "none"])
def test_every_name_is_one_value_and_the_numbers_are_torchs(model_and_inputs,
                                                            functions: str) -> None:
    model, (x, y) = model_and_inputs
    plain = om.export(model, (x, y), functions=functions).model_proto
    taken = next(o for n in plain.graph.node for o in n.output  # an inner value's name
                 if o not in {v.name for v in plain.graph.output})
    names = ["logits", taken, "x_again", "hidden_too"]  # the fifth keeps torch's name
    proto = om.export(model, (x, y), functions=functions, input_names=["ids", "mask"],
                      output_names=names).model_proto
    onnx.checker.check_model(proto, full_check=True)
    assert [v.name for v in proto.graph.input] == ["ids", "mask"]
    assert [v.name for v in proto.graph.output][:4] == names
    produced = [o for n in proto.graph.node for o in n.output]
    assert len(produced) == len(set(produced))  # the inner value moved out of the way
    session = ort.InferenceSession(proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    got = session.run(None, {"ids": x.numpy(), "mask": y.numpy()})
    with torch.no_grad():
        for g, e in zip(got, model(x, y), strict=True):
            np.testing.assert_allclose(g, e.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("names", "message"), [
    ({"input_names": ["a", "a"]}, "input_names repeats a"),
    ({"output_names": "logits"}, "must be a list of non-empty strings"),
    ({"input_names": ["x"], "output_names": ["x"]}, "x names an input and an output"),
    ({"input_names": ["a", "b", "c"]}, "input_names gives 3 names for the model's 2"),
    ({"output_names": ["inner.k.bias"]}, "inner.k.bias is the name of a weight"),
    ({"input_names": ["a"]}, "'a' is the name of another input"),
])
def test_names_that_cannot_name_the_file_are_refused_in_one_line(
        model_and_inputs, names: dict, message: str) -> None:
    model, (x, y) = model_and_inputs

    class Named(torch.nn.Module):  # a second input already called "a"
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, b: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return self.inner(b, a)

    with pytest.raises(om.OnnxModularError, match=message) as error:
        om.export(Named(), (x, y), functions="none", **names)
    assert "\n" not in str(error.value)


def test_two_inputs_can_swap_names(model_and_inputs) -> None:
    """``input_names=["y", "x"]`` was refused: 'y' named the other input, about to be
    renamed itself (torch.onnx takes it)."""
    model, (x, y) = model_and_inputs
    proto = om.export(model, (x, y), functions="none", input_names=["y", "x"]).model_proto
    assert [v.name for v in proto.graph.input] == ["y", "x"]
    session = ort.InferenceSession(proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    got = session.run(None, {"y": x.numpy(), "x": y.numpy()})  # y is the first input now
    with torch.no_grad():
        np.testing.assert_allclose(got[0], model(x, y)[0].numpy(), rtol=1e-5, atol=1e-6)
