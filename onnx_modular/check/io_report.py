"""The report of :func:`~onnx_modular.check.compare_io.compare_io`: a model's outputs on saved
inputs against saved expected outputs, per provider, and its renderings."""

from __future__ import annotations

import dataclasses
from typing import Any

from onnx_modular.check.outcome import ProviderResult
from onnx_modular.check.report import OUTPUT_HEAD, Report, fmt_err, md_table, output_rows
from onnx_modular.leaves import runtime

__all__ = ["IOReport"]


@dataclasses.dataclass
class IOReport(Report):
    """The model's outputs on saved inputs against saved expected outputs, per provider."""

    model: str
    results: list[ProviderResult]
    not_compared: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def max_abs(self) -> float:
        return max((o.diff.max_abs for r in self.results for o in r.outputs), default=0.0)

    @property
    def max_rel(self) -> float:
        return max((o.diff.max_rel for r in self.results for o in r.outputs), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "ok": self.ok,
                "providers": {r.provider: r.to_dict() for r in self.results},
                "not_compared": list(self.not_compared)}

    def _rows(self) -> list[list[str]]:
        """One row per output; the note (NaN/inf not matched, complex...) only when one
        output has one."""
        rows = output_rows(self.results)
        return rows if any(row[-1] for row in rows) else [row[:-1] for row in rows]

    def _head(self, rows: list[list[str]]) -> list[str]:
        return OUTPUT_HEAD[:len(rows[0])] if rows else OUTPUT_HEAD[:-1]

    def summary(self) -> str:
        where = ", ".join(runtime.short_provider(r.provider) for r in self.results)
        if self.ok:
            return f"MATCH: {self.model} reproduces the expected outputs on {where}"
        return (f"MISMATCH: {self.model} differs from the expected outputs on {where} "
                f"(max abs err {fmt_err(self.max_abs)}, max rel err {fmt_err(self.max_rel)})")

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        table = Table(title="ONNX Runtime vs expected outputs", title_justify="left")
        rows = self._rows()
        for h in self._head(rows):
            table.add_column(h, justify="right" if "err" in h else "left")
        for row in rows:
            # names and notes come from the files: plain Text, never markup
            table.add_row(*map(Text, row[:7]), Text(row[7], style="green" if row[7] == "ok"
                                                    else "bold red"), *map(Text, row[8:]))
        parts: list[Any] = [table]
        if self.not_compared:
            parts.append(Text(f"not compared (no expected value): "
                              f"{', '.join(self.not_compared)}", style="yellow"))
        parts.append(Text(self.summary(), style="green" if self.ok else "bold red"))
        return Group(*parts)

    def to_markdown(self) -> str:
        lines = [f"# compare-io: {self.model}", "", f"**{self.summary()}**", ""]
        rows = self._rows()
        lines += md_table(self._head(rows), rows)
        if self.not_compared:
            lines += ["", f"Not compared: {', '.join(self.not_compared)}"]
        return "\n".join(lines) + "\n"
