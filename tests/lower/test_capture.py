"""lower/capture: nn.Module + example inputs -> ExportedProgram; every failure one line."""

from __future__ import annotations

import pytest
import torch
from models import TwoLinear
from torch import nn

from onnx_modular.diagnostics import DiagnosticContext, Level, OnnxModularError
from onnx_modular.lower.capture import capture


class Broken(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("shapes do not fit\nsecond line of detail")


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Broken()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


class ReturnsInt(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return x + 1, 3


class ReturnsNothing(nn.Module):
    def forward(self, x: torch.Tensor) -> None:
        x.add_(1)


@pytest.fixture(scope="module")
def program() -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    return capture(TwoLinear(), (torch.randn(3, 4),))


def test_a_module_becomes_a_program_that_computes_the_same(
        program: torch.export.ExportedProgram) -> None:
    model = TwoLinear()
    model.load_state_dict(program.state_dict)
    x = torch.randn(3, 4)
    torch.testing.assert_close(program.module()(x), model(x))
    assert {"fc1.weight", "fc2.bias"} <= set(program.state_dict)


def test_a_program_passes_through(program: torch.export.ExportedProgram) -> None:
    assert capture(program) is program


def test_a_lone_tensor_or_a_list_is_taken_as_the_arguments() -> None:
    model = TwoLinear()
    lone = capture(model, torch.randn(3, 4))
    listed = capture(model, [torch.randn(3, 4)])
    assert len(lone.graph_signature.user_inputs) == len(listed.graph_signature.user_inputs) == 1


def test_something_else_than_a_module_is_refused() -> None:
    with pytest.raises(OnnxModularError, match=r"OM0104 .*must be an nn.Module or an "
                                               r"ExportedProgram, got function"):
        capture(lambda x: x, (torch.randn(2),))


def test_an_export_failure_names_the_innermost_module_and_line() -> None:
    with pytest.raises(OnnxModularError) as caught:
        capture(Outer(), (torch.randn(2),))
    text = str(caught.value)
    assert "OM0201" in text and "\n" not in text
    assert "torch.export failed on Outer: ValueError: shapes do not fit" in text
    location = caught.value.diagnostic.location
    assert location.module_path == "inner" and location.source_file == __file__
    assert isinstance(caught.value.__cause__, ValueError)


def test_a_python_constant_output_is_refused() -> None:
    with pytest.raises(OnnxModularError, match=r"OM0104 .*output #1 of ReturnsInt.forward\(\) "
                                               r"is a constant Python int \(3\)"):
        capture(ReturnsInt(), (torch.randn(2),))


def test_a_forward_returning_no_tensor_is_refused() -> None:
    with pytest.raises(OnnxModularError, match=r"returns no tensor"):
        capture(ReturnsNothing(), (torch.randn(2),))


def test_a_size_zero_example_dimension_is_warned_about() -> None:
    ctx = DiagnosticContext()
    capture(TwoLinear(), (torch.randn(0, 4),), ctx=ctx)
    (warning,) = ctx.of_level(Level.WARNING)
    assert "example input #0 has shape [0, 4]" in warning.message


def test_a_module_on_the_meta_device_needs_its_checkpoint() -> None:
    with torch.device("meta"):
        model = TwoLinear()
    with pytest.raises(OnnxModularError, match=r"'fc1.weight' of TwoLinear is on the meta "
                                               r"device .*weights="):
        capture(model, (torch.randn(3, 4),))
