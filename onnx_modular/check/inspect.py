"""Read a (hierarchical) ONNX file back: module/function tree and call counts, for ``inspect``."""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import onnx
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from onnx_modular.emit.sizes import SHAPE_ARITHMETIC
from onnx_modular.leaves import runtime
from onnx_modular.leaves.errors import fail
from onnx_modular.leaves.metadata import DIFFERS_FROM, META_PATH


def load_onnx(path: str | os.PathLike[str], load_external_data: bool = True) -> onnx.ModelProto:
    """Load with a one-line error for a missing, unreadable or corrupt file."""
    file = Path(path)
    if file.is_dir():
        raise fail(f"'{file}' is a directory, not an ONNX file")
    if not file.is_file():
        raise fail(f"no such ONNX file: '{file}'")
    try:
        model = onnx.load(str(file), load_external_data=load_external_data)
    except Exception as e:  # protobuf raises DecodeError and others for corrupt files
        raise fail(f"'{file}' is not a readable ONNX model: {type(e).__name__}: "
                   f"{runtime.first_line(e)}") from e
    if not model.graph.node and not model.graph.output and not model.functions:
        # protobuf parses an empty (or all-zero-field) file as an empty model
        raise fail(f"'{path}' holds no ONNX graph (an empty or truncated file?)")
    field = runtime.non_text_field(model)
    if field is not None:
        raise fail(f"'{file}' is not a readable ONNX model: a {field} holds bytes that are "
                   "not UTF-8 text")
    runtime.require_defined_calls(model, str(file))
    return model


@dataclasses.dataclass
class FunctionStats:
    name: str
    domain: str
    nodes: int
    calls: int
    differs_from: str = ""  # why an extra function of a class is not its first


def function_stats(model: onnx.ModelProto) -> list[FunctionStats]:
    """Every local function with its body size and how often it is called, anywhere."""
    calls: collections.Counter[tuple[str, str]] = collections.Counter()
    for node in _all_nodes(model):
        calls[(node.domain, node.op_type)] += 1
    return [FunctionStats(f.name, f.domain, len(f.node), calls[(f.domain, f.name)],
                          {p.key: p.value for p in f.metadata_props}.get(DIFFERS_FROM, ""))
            for f in model.functions]


#: Ops of shape arithmetic (what a body's sizes are computed with): a value they make from
#: shapes is a size, not data.
_SHAPE_OPS = SHAPE_ARITHMETIC | {"Size"}
#: Ops whose values are their first input's (moved, not computed): a slice of a weight by a
#: size (BERT-like position ids, ``position_ids[:, :seq]``) is data, not a size.
_DATA_FIRST = frozenset({"Gather", "Slice", "Reshape", "Squeeze", "Unsqueeze", "Identity",
                         "Cast"})


def input_kinds(model: onnx.ModelProto) -> dict[str, list[str]]:
    """Each function's inputs by what its calls pass: ``activation``, ``weight`` (an
    initializer, through any number of calls), ``size`` (shape arithmetic made from a
    ``Shape``, also where a call computed it and returned it: what a compiler wants
    computed in the body instead) or ``constant``; an input the body never reads is
    ``unused``. An input any call passes a size to is a size."""
    functions = {(f.domain, f.name): f for f in model.functions}
    kinds: dict[str, list[str]] = {}
    seen: set[tuple[str, tuple[str, ...]]] = set()

    def resolver(nodes: Sequence[onnx.NodeProto], known: dict[str, str]) -> Callable[[str], str]:
        made = {out: node for node in nodes for out in node.output}
        cache: dict[str, str] = {}

        def kind(name: str) -> str:
            if name in known:
                return known[name]
            if name not in cache:
                cache[name] = "activation"  # first, in case of a cycle through it
                node = made.get(name)
                function = functions.get((node.domain, node.op_type)) if node else None
                if node is None:
                    pass
                elif function is not None:  # what the body computes it from
                    inner = resolver(function.node, dict(zip(
                        function.input, [kind(i) if i else "activation" for i in node.input])))
                    cache[name] = inner(function.output[list(node.output).index(name)])
                elif node.op_type == "Constant":
                    cache[name] = "constant"
                elif node.op_type == "Shape":
                    cache[name] = "size"
                else:
                    froms = [kind(i) for i in node.input if i]
                    if node.op_type in _SHAPE_OPS and "size" in froms and all(
                            k in ("size", "constant", "weight") for k in froms) and (
                            node.op_type not in _DATA_FIRST or froms[0] == "size"):
                        cache[name] = "size"
            return cache[name]

        return kind

    def walk(nodes: Sequence[onnx.NodeProto], known: dict[str, str]) -> None:
        kind = resolver(nodes, known)
        for node in nodes:
            function = functions.get((node.domain, node.op_type))
            if function is None:
                continue
            passed = [kind(name) if name else "activation" for name in node.input]
            if (function.name, tuple(passed)) in seen:
                continue
            seen.add((function.name, tuple(passed)))
            read = _names_read(function.node) | set(function.output)
            found = [k if name in read else "unused" for name, k in zip(function.input, passed)]
            before = kinds.setdefault(function.name, found)
            kinds[function.name] = [b if b in ("unused", "size") or f != "size" else f
                                    for b, f in zip(before, found)]
            walk(function.node, dict(zip(function.input, passed)))

    walk(model.graph.node, {i.name: "weight" for i in model.graph.initializer})
    return kinds


def _names_read(nodes: Sequence[onnx.NodeProto]) -> set[str]:
    """Every name ``nodes`` read, those of their subgraphs too (an ``If`` branch reads a
    function's input by its name, not as an input of the ``If``)."""
    read: set[str] = set()
    for node in nodes:
        read.update(node.input)
        for attribute in node.attribute:
            for graph in [*([attribute.g] if attribute.HasField("g") else []),
                          *attribute.graphs]:
                read |= _names_read(graph.node) | {o.name for o in graph.output}
    return read


def _all_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    nodes = list(model.graph.node)
    for f in model.functions:
        nodes.extend(f.node)
    return nodes


def call_tree(model: onnx.ModelProto, max_children: int = 64) -> Tree:
    """The nesting of function calls as written, from the main graph down.

    A body is expanded at its first call; a run of further calls of a body already shown
    (48 decoder layers) is one line: ``h.1 ... h.47: GPT2Block x47``.
    """
    functions = {(f.domain, f.name): f for f in model.functions}
    # every name below is the file's: escaped, so that "[/x]" is text, not markup
    root = Tree(f"[bold]{escape(model.graph.name or 'main graph')}[/bold]  "
                f"[dim]{len(model.graph.node)} nodes[/dim]")
    expanded: set[tuple[str, str]] = set()

    def label(node: onnx.NodeProto) -> str:
        meta = {p.key: p.value for p in node.metadata_props}
        return escape(meta.get(META_PATH, node.name))

    def add(parent: Tree, nodes: list[onnx.NodeProto], depth: int) -> None:
        calls = [(node, functions[(node.domain, node.op_type)]) for node in nodes
                 if (node.domain, node.op_type) in functions]
        shown, i = 0, 0
        while i < len(calls):
            if shown == max_children:
                parent.add("[dim]...[/dim]")
                return
            shown += 1
            node, body = calls[i]
            key = (body.domain, body.name)
            size = f"{len(body.node)} nodes"
            if key not in expanded:
                expanded.add(key)
                branch = parent.add(f"[cyan]{label(node)}[/cyan]: {escape(body.name)} "
                                    f"[dim]({escape(body.domain)}, {size})[/dim]")
                if depth < 32:
                    add(branch, list(body.node), depth + 1)
                i += 1
                continue
            run = 1
            while i + run < len(calls) and calls[i + run][1] is body:
                run += 1
            paths = (f"{label(node)} ... {label(calls[i + run - 1][0])}" if run > 1
                     else label(node))
            times = f" x{run}" if run > 1 else ""
            parent.add(f"[cyan]{paths}[/cyan]: {escape(body.name)}{times} "
                       f"[dim]({size}, body shown above)[/dim]")
            i += run

    add(root, list(model.graph.node), 0)
    return root


def function_table(model: onnx.ModelProto) -> Table:
    stats = function_stats(model)
    kinds = input_kinds(model)
    explained = any(s.differs_from for s in stats)
    table = Table(title="Functions")
    columns = ["function", "domain", "nodes", "call sites", "inputs"] + (
        ["differs from"] * explained)
    for column in columns:
        table.add_column(column, justify="right" if column in ("nodes", "call sites")
                         else "left")
    for s in sorted(stats, key=lambda s: (-s.calls, s.name)):
        table.add_row(Text(s.name), Text(s.domain), str(s.nodes), str(s.calls),
                      Text(_kinds_text(kinds.get(s.name, []))),
                      *([Text(s.differs_from)] * explained))
    return table


def _kinds_text(kinds: list[str]) -> str:
    """``2 activations, 12 weights`` (sizes, constants and unused inputs named too)."""
    counts = collections.Counter(kinds)
    order = ("activation", "weight", "size", "constant", "unused")
    return ", ".join(f"{counts[k]} {k}{'s' if counts[k] != 1 and k != 'unused' else ''}"
                     for k in order if counts[k])


def summary(model: onnx.ModelProto) -> dict[str, int]:
    stats = function_stats(model)
    return {
        "main_graph_nodes": len(model.graph.node),
        "functions": len(stats),
        "function_nodes": sum(s.nodes for s in stats),
        "calls": sum(s.calls for s in stats),
        "initializers": len(model.graph.initializer),
    }
