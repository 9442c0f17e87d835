"""The names a user gives the file's inputs and outputs (``input_names=``, ``output_names=``,
as ``torch.onnx.export`` takes them): ``input_ids``, ``logits`` instead of torch's node names.

A name a value computed in the main graph holds moves that value out of the way (function
bodies are scopes of their own); another input's name is an error. A value that needs a
second name (an output that is an input or a weight, or one value returned twice) gets an
``Identity``, so each name is one value. A list longer than the inputs or outputs, a
repeated name or a weight's name is an error: two values of one name break the file.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnx_modular.leaves.errors import fail, rules


def name_inputs_and_outputs(model: ir.Model, input_names: Sequence[str] | None,
                            output_names: Sequence[str] | None) -> None:
    """Rename the main graph's first inputs and outputs to the names given, in place."""
    graph = model.graph
    check_io_names(input_names, output_names)
    _fits(input_names, "input_names", len(graph.inputs), graph)
    _fits(output_names, "output_names", len(graph.outputs), graph)
    named = list(zip(graph.inputs, input_names or (), strict=False))
    for value, _ in named:  # out of each other's way first: ["y", "x"] swaps two names
        value.name = f"{value.name}\0"
    for value, name in named:
        _give(graph, value, name)
    for k, name in enumerate(output_names or ()):
        value = graph.outputs[k]
        if value.is_graph_input() or value.is_initializer() or \
                graph.outputs.count(value) > 1:  # it keeps its name; a copy takes this one
            copy = ir.node("Identity", [value], name=f"output_{name}")
            copy.outputs[0].type, copy.outputs[0].shape = value.type, value.shape
            graph.append(copy)
            graph.outputs[k] = value = copy.outputs[0]
        _give(graph, value, name)


def check_io_names(input_names: Sequence[str] | None,
                   output_names: Sequence[str] | None) -> None:
    """What can be checked before an export: lists of distinct non-empty strings."""
    for names, what in ((input_names, "input_names"), (output_names, "output_names")):
        if names is None:
            continue
        if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
            raise fail(f"{what} must be a list of non-empty strings, got {names!r}",
                       rules.BAD_INPUT)
        repeated = sorted({n for n in names if list(names).count(n) > 1})
        if repeated:
            raise fail(f"{what} repeats {', '.join(repeated)}: one name per value",
                       rules.BAD_INPUT)
    both = sorted(set(input_names or ()) & set(output_names or ()))
    if both:
        raise fail(f"{', '.join(both)} names an input and an output: one name per value",
                   rules.BAD_INPUT)


def _fits(names: Sequence[str] | None, what: str, count: int, graph: ir.Graph) -> None:
    if names is None:
        return
    if len(names) > count:
        raise fail(f"{what} gives {len(names)} names for the model's {count}",
                   rules.BAD_INPUT)
    weights = sorted(set(names) & set(graph.initializers))
    if weights:
        raise fail(f"{what}: {', '.join(weights)} is the name of a weight of the model",
                   rules.BAD_INPUT)


def _give(graph: ir.Graph, value: ir.Value, name: str) -> None:
    """``value`` named ``name``; a main-graph value holding it is renamed first."""
    if value.name == name:
        return
    values = _main_values(graph)
    holder = next((v for v in values if v.name == name and v is not value), None)
    if holder is not None and holder.is_graph_input():
        raise fail(f"'{name}' is the name of another input of the model; name that input "
                   "too (input_names=)", rules.BAD_INPUT)
    if holder is not None:
        taken = {v.name for v in values}
        suffix = 1
        while f"{name}_{suffix}" in taken:
            suffix += 1
        holder.name = f"{name}_{suffix}"
    value.name = name


def _main_values(graph: ir.Graph) -> list[ir.Value]:
    return [*graph.inputs, *graph.initializers.values(),
            *(out for node in graph for out in node.outputs)]
