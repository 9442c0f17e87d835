"""lower/capture: nn.Module + example inputs -> ExportedProgram; every failure one line."""

from __future__ import annotations

import warnings

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


class _Masked(nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * mask.unsqueeze(-1)


def test_dimensions_named_by_strings_are_dynamic_and_name_the_files_axes() -> None:
    """``{0: "batch"}`` as torch.onnx takes it (torch.export refuses a string): the axes
    are dynamic and the file calls them by those names."""
    import numpy as np
    import onnxruntime as ort

    import onnx_modular as om

    x, mask = torch.randn(2, 6, 4), torch.ones(2, 6)
    shapes = {"x": {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"}}
    proto = om.export(_Masked(), (x, mask), dynamic_shapes=shapes).model_proto
    dims = [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
            for i in proto.graph.input]
    assert dims == [["batch", "seq", 4], ["batch", "seq"]]
    other = torch.randn(3, 5, 4), (torch.rand(3, 5) > 0.5).float()
    session = ort.InferenceSession(proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": other[0].numpy(), "mask": other[1].numpy()})[0]
    np.testing.assert_allclose(got, _Masked()(*other).numpy(), atol=1e-6)


class _SlicedMask(nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return x * mask[:, : x.shape[1]]


def test_axes_of_one_name_torch_keeps_apart_get_names_of_their_own() -> None:
    """The mask may be longer than x: torch keeps two symbols under the one name "seq";
    the mask's axis kept torch's own symbol (``s43``)."""
    import onnx_modular as om

    x, mask = torch.randn(2, 6), torch.ones(2, 8)
    shapes = {"x": {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the guard seq <= seq_2 the file cannot check
        proto = om.export(_SlicedMask(), (x, mask), dynamic_shapes=shapes).model_proto
    dims = [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
            for i in proto.graph.input]
    assert dims == [["batch", "seq"], ["batch", "seq_2"]]


class _ThreeMasks(nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor, z: torch.Tensor
                ) -> tuple[torch.Tensor, ...]:
        return x * 2, mask * 2, z * 2


def test_a_renamed_axis_never_takes_a_name_the_user_gave_a_dim() -> None:
    """``seq`` on two axes torch keeps apart and ``Dim("seq_2")`` on a third: the second
    ``seq`` was named ``seq_2`` too, so two axes of other sizes shared a name."""
    import onnx_modular as om

    args = (torch.randn(2, 5), torch.randn(2, 7), torch.randn(2, 9))
    shapes = {"x": {1: "seq"}, "mask": {1: "seq"}, "z": {1: torch.export.Dim("seq_2")}}
    proto = om.export(_ThreeMasks(), args, dynamic_shapes=shapes).model_proto
    names = [i.type.tensor_type.shape.dim[1].dim_param for i in proto.graph.input]
    assert names[0] == "seq" and names[2] == "seq_2" and names[1] not in ("seq", "seq_2")


@pytest.mark.slow
def test_guards_torch_cannot_prove_become_assumptions_the_warning_lists() -> None:
    """LongT5's local attention pads the sequence to blocks of 5: torch.export fails (first
    with an AssertionError while wording its error, then with guards such as
    ``seq % 5 != 0`` and no suggested fix). As torch.onnx does, the guards are deferred; the
    file then matches torch at sizes that break them, and a warning lists them by name."""
    import transformers

    import onnx_modular as om

    torch.manual_seed(0)
    config = transformers.LongT5Config(
        vocab_size=99, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
        use_cache=False, decoder_start_token_id=0, encoder_attention_type="local",
        local_radius=4)
    model = transformers.LongT5Model(config).eval()

    def inputs(batch: int, seq: int, dseq: int) -> dict[str, torch.Tensor]:
        return {"input_ids": torch.randint(1, 99, (batch, seq)),
                "attention_mask": torch.ones(batch, seq, dtype=torch.long),
                "decoder_input_ids": torch.randint(1, 99, (batch, dseq))}

    dim = torch.export.Dim
    batch, seq = dim("batch", min=1, max=16), dim("seq", min=2, max=32)
    shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq},
              "decoder_input_ids": {0: batch, 1: dim("dseq", min=2, max=32)}}
    result = om.export(model, (), kwargs=inputs(2, 8, 8), dynamic_shapes=shapes)
    (warning,) = [d for d in result.diagnostics if "runtime assertions" in d.message]
    assert "(seq % 5) != 0" in warning.message and "batch != 1" in warning.message
    for size in [(1, 10, 3), (3, 5, 4)]:  # a batch of 1, sequences in whole blocks
        assert om.validate(model, (), result.model_proto, kwargs=inputs(*size),
                           providers="cpu").ok


def test_one_string_on_two_different_sizes_names_one_of_them() -> None:
    """torch.onnx would call both ``seq``, which tells a runtime they are one size."""
    import onnx_modular as om

    class _Sums(nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x.sum(1) + y.sum(1)

    proto = om.export(_Sums(), (torch.randn(2, 6), torch.randn(2, 4)),
                      dynamic_shapes={"x": {1: "seq"}, "y": {1: "seq"}}).model_proto
    x, y = ([d.dim_param for d in i.type.tensor_type.shape.dim] for i in proto.graph.input)
    assert x[1] == "seq" and y[1] not in ("seq", "")


class _ScaledByBlocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * float(x.shape[1] // 8)  # a Python float: torch guards its value


@pytest.mark.parametrize("dim", ["seq", torch.export.Dim.DYNAMIC, torch.export.Dim.AUTO])
def test_a_guard_the_file_cannot_check_is_warned_about(dim: object) -> None:
    """With Dim.DYNAMIC or a string, torch.export made ``float(seq // 8)`` the constant 4.0
    under a guard and kept the axis dynamic: the file computed other numbers at seq 16, and
    nothing said so. A plain bound (BERT's ``seq <= 64``) is no such condition."""
    ctx = DiagnosticContext()
    program = capture(_ScaledByBlocks(), (torch.randn(2, 32, 8),),
                      dynamic_shapes=({0: "batch", 1: dim},), ctx=ctx)
    assert program.graph_module is not None
    (warning,) = [d for d in ctx.diagnostics if d.level == Level.WARNING]
    assert "specialized the program under (x.size()[1] // 8) == 4" in warning.message
    again = DiagnosticContext()
    capture(program, ctx=again)  # a program of the user's holds them too
    assert [d.message for d in again.diagnostics] == [warning.message]
    bounded = DiagnosticContext()
    capture(TwoLinear(), (torch.randn(2, 4),), dynamic_shapes=({0: "batch"},), ctx=bounded)
    assert not [d for d in bounded.diagnostics if d.level == Level.WARNING]
