"""The FX -> ONNX index a support check may read: which ONNX nodes each FX node became."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from onnx_modular.leaves.metadata import fx_name


@dataclasses.dataclass(frozen=True)
class SupportContext:
    """What a support check may look at beyond the FX node: its ONNX translation.

    ``onnx_nodes`` maps an FX node name to the ONNX nodes it became; ``opset_imports`` gives
    the opset version of each ONNX domain in the translated model.
    """

    onnx_nodes: Mapping[str, Sequence[Any]] = dataclasses.field(default_factory=dict)
    opset_imports: Mapping[str, int] = dataclasses.field(default_factory=dict)


def fx_to_onnx_nodes(model: Any) -> dict[str, list[Any]]:
    """FX node name -> the ONNX nodes (``onnx_ir``) translated from it, in graph order.

    Reads ``pkg.torch.onnx.fx_node`` (``%<name> : ...``) of every top-level node; subgraph
    nodes count for their enclosing node.
    """
    result: dict[str, list[Any]] = {}
    for node in model.graph:
        name = fx_name(node)
        if name is not None:
            result.setdefault(name, []).append(node)
    return result

