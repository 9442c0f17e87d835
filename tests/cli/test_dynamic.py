"""``--dynamic`` specs -> ``dynamic_shapes``: parsing, positions, names, one-line refusals."""

from __future__ import annotations

import pytest
import torch

import onnx_modular as om
from onnx_modular.cli.dynamic import dynamic_shapes


class TwoInputs(torch.nn.Module):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                scale: float = 1.0) -> torch.Tensor:
        return input_ids * attention_mask * scale


ARGS = (torch.ones(2, 8), torch.ones(2, 8))


def test_specs_become_named_axes_of_every_input_by_parameter_name() -> None:
    shapes = dynamic_shapes(["input_ids:0=batch,1=seq", "1: 0 = batch , -1=seq"],
                            TwoInputs(), ARGS, {})
    assert shapes == {"input_ids": {0: "batch", 1: "seq"},
                      "attention_mask": {0: "batch", 1: "seq"}}
    assert dynamic_shapes(["0:1=seq"], TwoInputs(), ARGS[:1],
                          {"attention_mask": ARGS[1]}) == {"input_ids": {1: "seq"},
                                                          "attention_mask": None}
    assert dynamic_shapes(None, TwoInputs(), ARGS, {}) is None


@pytest.mark.parametrize(("spec", "message"), [
    ("input_ids", "expected INPUT:AXIS=NAME"),
    ("input_ids:batch", "'batch' is not AXIS=NAME"),
    ("input_ids:0=1x", "'0=1x' is not AXIS=NAME"),
    ("ids:0=batch", "takes no input 'ids' (its inputs: input_ids, attention_mask"),
    ("5:0=batch", "takes no input '5'"),
    ("input_ids:2=seq", "input 'input_ids' has 2 axes (shape [2, 8]); there is no axis 2"),
    ("input_ids:0=batch,-2=b", "axis -2 of 'input_ids' is named twice"),
])
def test_a_bad_spec_is_one_line_naming_it(spec: str, message: str) -> None:
    with pytest.raises(om.OnnxModularError, match=message.replace("[", r"\[")
                       .replace("(", r"\(").replace(")", r"\)")) as error:
        dynamic_shapes([spec], TwoInputs(), ARGS, {})
    assert "\n" not in str(error.value)


def test_an_input_given_twice_or_a_program_is_refused() -> None:
    with pytest.raises(om.OnnxModularError, match="'input_ids' is given twice"):
        dynamic_shapes(["0:0=batch", "input_ids:1=seq"], TwoInputs(), ARGS, {})
    program = torch.export.export(TwoInputs(), ARGS)
    with pytest.raises(om.OnnxModularError, match="not an ExportedProgram"):
        dynamic_shapes(["0:0=batch"], program, ARGS, {})


class _Collects(torch.nn.Module):
    def forward(self, x: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
        return x * kwargs["scale"]


def test_inputs_a_var_keyword_collects_are_refused_before_torch_fails_inside() -> None:
    """torch.export failed with ``Must provide a tree_name`` (or named keys the user never
    wrote) for any dynamic shapes of such a call."""
    with pytest.raises(om.OnnxModularError, match=r"forward collects scale in \*\*kwargs"):
        dynamic_shapes(["x:0=batch"], _Collects(), (torch.ones(2, 3),),
                       {"scale": torch.tensor(2.0)})
