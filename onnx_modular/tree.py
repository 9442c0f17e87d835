"""Readable module trees: of a modularized GraphModule, for the Quickstart and ``inspect``."""

from __future__ import annotations

import torch.fx
from rich.tree import Tree

from onnx_modular.passes.modularize import iter_module_calls


def _short(type_name: str) -> str:
    return type_name.rsplit(".", 1)[-1]


def _op_count(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method"))


def module_tree(gm: torch.fx.GraphModule, label: str | None = None) -> Tree:
    """A rich Tree: one line per module call with its class, call id and own op count."""
    title = label or f"[bold]{_short(getattr(gm, 'module_type', type(gm).__name__))}[/bold]"
    tree = Tree(f"{title}  [dim]{_op_count(gm)} ops[/dim]")

    def add(parent: Tree, module: torch.fx.GraphModule) -> None:
        for node in module.graph.nodes:
            if node.op != "call_module" or node.meta.get("om_call") is None:
                continue
            sub = getattr(module, str(node.target))
            call_id = sub.call_id
            suffix = f" [dim](call {call_id})[/dim]" if call_id != sub.module_path else ""
            branch = parent.add(
                f"[cyan]{sub.module_path}[/cyan]: {_short(sub.module_type)}{suffix}"
                f"  [dim]{_op_count(sub)} ops[/dim]")
            add(branch, sub)

    add(tree, gm)
    return tree


def count_calls(gm: torch.fx.GraphModule) -> int:
    return sum(1 for _ in iter_module_calls(gm))
