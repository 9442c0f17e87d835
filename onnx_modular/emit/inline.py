"""Inline module functions so that every copy names the module call it stands for.

Labels inside a function are relative to its module (:mod:`onnx_modular.emit.labels`);
inlined for ``layers.1``, a copy's nested call ``fc`` must say ``layers.1.fc``, or whoever
reads the labels (a debugger, ``validate``'s localization) cannot tell the calls apart.
"""

from __future__ import annotations

import onnx_ir as ir

from onnx_modular.emit.infra import EmitPass, listed
from onnx_modular.emit.labels import absolutize
from onnx_modular.emit.optimize import finish_inlined, remove_unused_initializers
from onnx_modular.leaves._compat import ObservedInlinePass


class RebasingInlinePass(ObservedInlinePass):
    """onnx_ir's inliner; every inlined node's module labels name the call it was inlined for.

    Calls are inlined outside in, so a call node's labels are absolute when its own body is
    expanded; the cloner gives primitive nodes the call node's labels, and nested calls and
    torch.onnx's scope lists are made absolute here.
    """

    def expanded(self, node: ir.Node, function: ir.Function, nodes: list[ir.Node]) -> None:
        absolutize(node, function, nodes, self.calls)

    @property
    def calls(self) -> set[ir.OperatorIdentifier]:
        """Identifiers of the functions being inlined (their call nodes carry labels)."""
        return self._calls

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self._calls = set(model.functions)
        return super().call(model)

    _calls: set[ir.OperatorIdentifier] = set()


class InlineAll(EmitPass):
    """The flat model: every call inlined; constants shared as initializers again."""

    def __init__(self, optimized: bool) -> None:
        super().__init__()
        self.optimized = optimized

    _inlined: frozenset[ir.OperatorIdentifier] = frozenset()

    def run(self, model: ir.Model) -> None:
        self._inlined = frozenset(model.functions)
        RebasingInlinePass()(model)
        if self.optimized:
            finish_inlined(model)
        remove_unused_initializers(model.graph)
        used = {n.domain for n in model.graph.all_nodes()}
        for domain in list(model.opset_imports):
            if domain not in ("", "ai.onnx") and domain not in used:
                model.opset_imports.pop(domain, None)

    def ensures(self, model: ir.Model) -> None:
        left = [f"{n.name} ({n.op_type})" for n in model.graph.all_nodes()
                if n.op_identifier() in self._inlined or n.op_identifier() in model.functions]
        if model.functions or left:
            raise self.postcondition_failed(
                "no local function and no call of one; left: "
                + listed([f.name for f in model.functions.values()] + left))

