"""Inline module functions so that every copy names the module call it stands for.

Labels inside a function are relative to its module (:mod:`onnx_modular.emit.labels`);
inlined for ``layers.1``, a copy's nested call ``fc`` must say ``layers.1.fc``, or whoever
reads the labels (a debugger, ``validate``'s localization) cannot tell the calls apart.
"""

from __future__ import annotations

import onnx_ir as ir

from onnx_modular._compat import ObservedInlinePass
from onnx_modular.emit.infra import EmitPass
from onnx_modular.emit.labels import absolutize
from onnx_modular.emit.optimize import finish_inlined, remove_unused_initializers


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

    def run(self, model: ir.Model) -> None:
        RebasingInlinePass()(model)
        if self.optimized:
            finish_inlined(model)
        remove_unused_initializers(model.graph)
        used = {n.domain for n in model.graph.all_nodes()}
        for domain in list(model.opset_imports):
            if domain not in ("", "ai.onnx") and domain not in used:
                model.opset_imports.pop(domain, None)
