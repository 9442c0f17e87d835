"""The report of :func:`onnx_modular.compare`: two models' facts side by side, and their outputs.

Data and its renderings (rich tables, Markdown, JSON), apart from the comparing, so the
command line and notebooks print the same thing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from onnx_modular.check.module_diff import ModuleComparison
from onnx_modular.check.numerics import Diff
from onnx_modular.check.report import Report, md_table
from onnx_modular.leaves.runtime import short_provider

__all__ = ["CompareReport", "ModelFacts", "OutputDiff"]


@dataclasses.dataclass
class ModelFacts:
    """What one model is: size, structure (before and after inlining), ORT cost."""

    label: str
    size_bytes: int
    functions: int
    nodes: int  # main graph + every function body, as stored
    inlined_nodes: int
    op_histogram: dict[str, int]
    topology: str
    session_s: float = 0.0
    run_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class OutputDiff:
    """Output ``index`` of model b against model a's (the reference)."""

    index: int
    name_a: str
    name_b: str
    dtype: str
    rtol: float
    atol: float
    diff: Diff

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "name_a": self.name_a, "name_b": self.name_b,
                "dtype": self.dtype, "rtol": self.rtol, "atol": self.atol,
                **self.diff.to_dict()}


@dataclasses.dataclass
class CompareReport(Report):
    """Two models side by side; ``equivalent`` is numerical, ``same_structure`` structural."""

    a: ModelFacts
    b: ModelFacts
    outputs: list[OutputDiff]
    provider: str
    reasons: list[str]
    #: What random inputs were drawn, one line per input (empty when inputs were given).
    inputs_drawn: list[str] = dataclasses.field(default_factory=list)
    #: Each module call's own error, where both models name their modules (else None).
    modules: ModuleComparison | None = None

    @property
    def first_mismatch(self) -> str | None:
        """The first module call (innermost first) whose own error leaves tolerance."""
        return self.modules.first_mismatch if self.modules is not None else None

    @property
    def equivalent(self) -> bool:
        return not self.reasons and all(o.diff.ok for o in self.outputs)

    @property
    def ok(self) -> bool:
        """:attr:`equivalent`, under the name ``validate``'s and ``compare_io``'s reports
        give their verdict (a user's first ``report.ok`` was an AttributeError)."""
        return self.equivalent

    @property
    def same_structure(self) -> bool:
        return self.a.topology == self.b.topology

    @property
    def exit_code(self) -> int:
        return 0 if self.equivalent else 1

    def to_dict(self) -> dict[str, Any]:
        return {"equivalent": self.equivalent, "same_structure": self.same_structure,
                "provider": self.provider, "reasons": self.reasons,
                "inputs_drawn": list(self.inputs_drawn),
                "a": self.a.to_dict(), "b": self.b.to_dict(),
                "outputs": [o.to_dict() for o in self.outputs],
                "first_mismatch": self.first_mismatch,
                "modules": None if self.modules is None else self.modules.to_dict()}

    def summary(self) -> str:
        if self.equivalent:
            shape = "same structure" if self.same_structure else "different structure"
            return f"EQUIVALENT ({shape} after inlining)"
        bad = [f"output #{o.index} ({o.name_a}: max abs err {o.diff.max_abs:.3g})"
               for o in self.outputs if not o.diff.ok]
        first = ([f"first diverging module: {self.first_mismatch}"]
                 if self.first_mismatch else [])
        return "DIFFERENT: " + "; ".join(self.reasons + bad + first)

    _MOD_HEAD = ["module call", "class", "own max abs err", "own max rel err", "status"]

    def _module_rows(self) -> list[list[str]]:
        if self.modules is None:
            return []
        return [[r.call_id, r.module_type.rsplit(".", 1)[-1],
                 f"{r.own.max_abs:.3g}" if r.own else "-",
                 f"{r.own.max_rel:.3g}" if r.own else "-",
                 r.note or ("ok" if r.ok else "FAIL")] for r in self.modules.rows]

    def _fact_rows(self) -> list[list[str]]:
        a, b = self.a, self.b
        ops = sorted(set(a.op_histogram) | set(b.op_histogram))
        rows = [
            ["file size", f"{a.size_bytes:,} B", f"{b.size_bytes:,} B"],
            ["functions", str(a.functions), str(b.functions)],
            ["nodes (stored)", str(a.nodes), str(b.nodes)],
            ["nodes (inlined)", str(a.inlined_nodes), str(b.inlined_nodes)],
            ["topology hash", a.topology[:12], b.topology[:12]],
            ["ORT session (ms)", f"{a.session_s * 1e3:.1f}", f"{b.session_s * 1e3:.1f}"],
            ["ORT run (ms)", f"{a.run_s * 1e3:.2f}", f"{b.run_s * 1e3:.2f}"],
        ]
        rows += [[f"  {op}", str(a.op_histogram.get(op, 0)), str(b.op_histogram.get(op, 0))]
                 for op in ops if a.op_histogram.get(op, 0) != b.op_histogram.get(op, 0)]
        return rows

    def _output_rows(self) -> list[list[str]]:
        return [[str(o.index), o.name_a, o.name_b, o.dtype, f"{o.diff.max_abs:.3g}",
                 f"{o.diff.max_rel:.3g}", "ok" if o.diff.ok else "FAIL", o.diff.note]
                for o in self.outputs]

    _OUT_HEAD = ["#", "output (a)", "output (b)", "dtype", "max abs err", "max rel err",
                 "status", "note"]

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        # names come from the user and the files: plain Text, never read as markup
        facts = Table(title="Structure and cost", title_justify="left")
        facts.add_column("")
        facts.add_column(Text(f"a: {self.a.label}"), justify="right")
        facts.add_column(Text(f"b: {self.b.label}"), justify="right")
        for row in self._fact_rows():
            facts.add_row(*map(Text, row))
        outs = Table(title=f"Outputs on {short_provider(self.provider)}",
                     title_justify="left")
        for h in self._OUT_HEAD:
            outs.add_column(h)
        for row in self._output_rows():
            outs.add_row(*map(Text, row))
        parts: list[Any] = [facts, outs]
        if self.modules is not None:
            mods = Table(title="Modules, in the order they finish: model b's call on model a's "
                         "inputs (its own error)", title_justify="left")
            for h in self._MOD_HEAD:
                mods.add_column(h)
            for row in self._module_rows():
                mods.add_row(*map(Text, row), style=None if row[-1] != "FAIL" else "red")
            parts.append(mods if self.modules.rows else Text(self.modules.note, style="dim"))
        if self.inputs_drawn:
            parts.append(Text(self._drawn_line(), style="dim"))
        parts.append(Text(self.summary(), style="green" if self.equivalent else "bold red"))
        return Group(*parts)

    def _drawn_line(self) -> str:
        return "Random inputs (seed 0): " + "; ".join(self.inputs_drawn)

    def to_markdown(self) -> str:
        lines = [f"# Compare {self.a.label} and {self.b.label}", "", f"**{self.summary()}**", ""]
        lines += [*md_table(["", "a", "b"], self._fact_rows()), ""]
        lines += md_table(self._OUT_HEAD, self._output_rows())
        if self.modules is not None:
            lines += ["", "## Modules (model b's call on model a's inputs)", ""]
            lines += md_table(self._MOD_HEAD, self._module_rows())
        if self.inputs_drawn:
            lines += ["", self._drawn_line()]
        return "\n".join(lines) + "\n"
