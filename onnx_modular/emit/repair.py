"""Repair what torch.onnx translates unfaithfully, where the repair is provably torch's meaning.

torch's ``squeeze(dim)`` does nothing to a dimension whose size is not 1; torch.onnx
translates it to ``Squeeze(axes=[dim])`` whatever the size, which ONNX forbids (strict
inference and ONNX Runtime reject the model: diffusers' PixArt). An axis whose size is known
not to be 1 (a static size, or a symbolic one torch left in place: the output keeps the
rank) is dropped, and a Squeeze left with no axis becomes ``Identity``. Each repair is
recorded, and reported as a warning naming the node and its module.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from onnx_modular.emit.infra import Chains, EmitPass
from onnx_modular.emit.walk import all_nodes
from onnx_modular.leaves.metadata import fx_name


@dataclasses.dataclass(frozen=True)
class Repair:
    """One node changed: where it is and what was done, in words."""

    fx_node: str | None
    module_path: str | None
    what: str


class RepairSqueeze(EmitPass):
    """Squeeze axes of dimensions torch did not squeeze are dropped (see the module doc)."""

    def __init__(self, chains: Chains, repairs: list[Repair]) -> None:
        super().__init__()
        self.chains, self.repairs = chains, repairs

    def run(self, model: ir.Model) -> None:
        for node in list(all_nodes(model)):
            if node.op_type == "Squeeze" and node.domain in ("", "ai.onnx"):
                self._repair(node)

    def _repair(self, node: ir.Node) -> None:
        data, shape = node.inputs[0], node.inputs[0].shape if node.inputs[0] else None
        axes_value = node.inputs[1] if len(node.inputs) > 1 else None
        if data is None or shape is None or axes_value is None:
            return
        tensor = ir.convenience.get_const_tensor(axes_value)
        if tensor is None:
            return
        rank = len(shape)
        axes = [int(a) for a in np.asarray(tensor.numpy()).reshape(-1)]
        if any(not -rank <= a < rank for a in axes):
            return  # out of range: not ours to guess; Verify names it
        axes = [a % rank for a in axes]
        out = node.outputs[0].shape
        squeezed = rank - len(out) if out is not None else None  # as torch computed it
        drop = [a for a in axes if isinstance(shape[a], int) and shape[a] != 1]
        rest = [a for a in axes if a not in drop]
        if squeezed == 0 and rest:  # symbolic sizes torch left in place
            drop, rest = axes, []
        if not drop or (squeezed is not None and squeezed != len(rest)):
            return  # nothing provably wrong, or torch's shape disagrees: leave it
        graph = node.graph
        assert graph is not None
        if rest:
            constant = ir.node("Constant", [], attributes={
                "value": ir.tensor(np.array(rest, dtype=np.int64), name=None)},
                name=f"{node.name}_axes")
            constant.metadata_props.update(node.metadata_props)
            graph.insert_before(node, constant)
            node.replace_input_with(1, constant.outputs[0])
        else:
            node.op_type = "Identity"
            node.resize_inputs(1)
        producer = axes_value.producer()
        if producer is not None and producer.op_type == "Constant" and not axes_value.uses() \
                and not axes_value.is_graph_output():
            producer.graph.remove(producer, safe=True)  # type: ignore[union-attr]
        fx = fx_name(node)
        chain = self.chains.get(fx, ()) if fx else ()
        sizes = ", ".join(f"{a} (size {shape[a]})" for a in drop)
        self.repairs.append(Repair(fx, chain[-1].module_path if chain else None, (
            f"torch.onnx translated squeeze of dimension {sizes} into an invalid ONNX "
            "Squeeze; torch's squeeze leaves a dimension not of size 1 as it is, so "
            + (f"the Squeeze keeps axes {rest} only" if rest else
               "the Squeeze became Identity"))))
