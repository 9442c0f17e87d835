"""The rich tables of a split or stages result (``preview()``, ``split --preview``): the one
place results are rendered for a terminal. rich is imported when a table is printed, so
``import onnx_modular`` does not load it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from onnx_modular.passes.split import SplitPlan

if TYPE_CHECKING:
    from rich.console import Console


def print_preview(plan: SplitPlan, console: Console | None = None) -> None:
    """The support and region tables of an acc/CPU split plan."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    support = Table(title="Operator support")
    for col in ("operator", "nodes", "supported", "why"):
        support.add_column(col, justify="right" if col == "nodes" else "left")
    rows: Iterable[tuple[str, bool, int]] = sorted(
        [(k, True, v) for k, v in plan.supported_ops.items()]
        + [(k, False, v) for k, v in plan.unsupported_ops.items()],
        key=lambda t: (t[1], -t[2], t[0]))
    for op, ok, count in rows:
        support.add_row(op, str(count), "yes" if ok else "[red]no[/red]",
                        escape(plan.reasons.get((op, ok), "")))
    console.print(support)
    regions = Table(title="Regions")
    for col in ("region", "kind", "nodes", "inputs", "outputs", "input bytes", "output bytes"):
        regions.add_column(col, justify="left" if col in ("region", "kind") else "right")
    for r in plan.regions:
        regions.add_row(r.name, r.kind, str(len(r.node_names)), str(len(r.inputs)),
                        str(len(r.outputs)), str(r.input_bytes), str(r.output_bytes))
    console.print(regions)


def print_stages(plan: SplitPlan, how: str, weight_bytes: Mapping[str, int],
                 console: Console | None = None) -> None:
    """One row per stage: nodes, border values, the bytes of the weights it holds."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"Stages ({how})")
    for col in ("stage", "nodes", "inputs", "outputs", "output bytes", "weight bytes"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    for r in plan.regions:
        table.add_row(r.name, str(len(r.node_names)), str(len(r.inputs)),
                      str(len(r.outputs)), str(r.output_bytes), str(weight_bytes[r.name]))
    console.print(table)
