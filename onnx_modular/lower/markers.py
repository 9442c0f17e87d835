"""``pipe_split()`` stage markers: a no-op ``forward`` may call, which ``torch.export`` keeps.

A capture-level concept: the stages read the markers on the captured program
(``passes/stages.py``); every lowering erases them before translation, since they are no
operator torch.onnx could translate.
"""

from __future__ import annotations

import copy

import torch
import torch.fx

_LIB = torch.library.Library("onnx_modular", "FRAGMENT")
_LIB.define("pipe_split() -> ()")
_LIB.impl("pipe_split", lambda: None, "CompositeExplicitAutograd")
torch.fx.node.has_side_effect(torch.ops.onnx_modular.pipe_split.default)


def pipe_split() -> None:
    """Mark a stage boundary inside ``forward``; does nothing when the model runs."""
    torch.ops.onnx_modular.pipe_split()


def is_marker(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target in (
        torch.ops.onnx_modular.pipe_split.default, torch.ops.onnx_modular.pipe_split)


def without_markers(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """A copy of the program with the markers erased, ready to translate."""
    if not any(is_marker(n) for n in ep.graph.nodes):
        return ep
    ep = copy.deepcopy(ep)
    for node in [n for n in ep.graph.nodes if is_marker(n)]:
        ep.graph.erase_node(node)
    ep.graph_module.recompile()
    return ep
