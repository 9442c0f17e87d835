"""pipe_split() markers: a no-op at run time that torch.export keeps, erased before translation."""

from __future__ import annotations

import torch
from models import Marked

import onnx_modular as om
from onnx_modular.lower.markers import is_marker, pipe_split, without_markers


def test_pipe_split_is_the_public_marker_and_does_nothing_when_run() -> None:
    assert om.pipe_split is pipe_split
    model, x = Marked(4), torch.randn(2, 4)
    hidden = torch.relu(model.b(model.a(x)))
    assert torch.equal(model(x), model.c(hidden) + hidden)


def test_export_keeps_each_marker_and_without_markers_erases_them_on_a_copy() -> None:
    model, x = Marked(4), torch.randn(2, 4)
    program = torch.export.export(model, (x,))
    assert sum(is_marker(n) for n in program.graph.nodes) == 3
    clean = without_markers(program)
    assert clean is not program
    assert not any(is_marker(n) for n in clean.graph.nodes)
    assert sum(is_marker(n) for n in program.graph.nodes) == 3  # the caller's program is untouched
    assert torch.equal(clean.module()(x), model(x))


def test_a_program_without_markers_is_passed_through_as_it_is() -> None:
    program = torch.export.export(torch.nn.Linear(3, 2), (torch.randn(1, 3),))
    assert without_markers(program) is program
    assert not any(is_marker(n) for n in program.graph.nodes)
