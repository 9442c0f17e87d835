"""What every report shares: plain-text, Markdown and HTML rendering, atomic saving by suffix."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from onnx_modular.check.outcome import ProviderResult
from onnx_modular.leaves._io import atomic_write_text
from onnx_modular.leaves.errors import fail
from onnx_modular.leaves.runtime import short_provider


def md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table's lines; ``|`` inside a cell is escaped."""
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return out


def fmt_err(x: float) -> str:
    """Errors to three significant digits: enough to read, short enough for a table."""
    return f"{x:.3g}"


def fmt_tol(x: float) -> str:
    """``1e-4`` rather than ``0.0001``; an exact check reads ``0``."""
    return "0" if x == 0 else f"{x:.1e}".replace(".0e", "e").replace("e-0", "e-")


#: The columns of an output table (validate, compare-io): one row per provider and output.
OUTPUT_HEAD = ["EP", "output", "shape", "dtype", "abs err", "rel err", "rtol/atol", "status",
               "note"]


def output_rows(results: Sequence[ProviderResult]) -> list[list[str]]:
    """One row per provider and output, under :data:`OUTPUT_HEAD`."""
    return [[short_provider(r.provider), o.name, "x".join(map(str, o.shape)) or "()", o.dtype,
             fmt_err(o.diff.max_abs), fmt_err(o.diff.max_rel),
             f"{fmt_tol(o.rtol)}/{fmt_tol(o.atol)}", "ok" if o.ok else "FAIL", o.diff.note]
            for r in results for o in r.outputs]


class _NullIO:
    def write(self, _text: str) -> int:
        return 0

    def flush(self) -> None:
        pass


class Report:
    """Subclasses provide ``__rich__``, ``to_dict`` and ``to_markdown``."""

    def __rich__(self) -> Any:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def to_markdown(self) -> str:
        raise NotImplementedError

    def _recorded(self, color: bool) -> Any:
        from rich.console import Console

        console = Console(width=140, record=True, file=_NullIO(),
                          color_system="truecolor" if color else None)
        console.print(self)
        return console

    def __str__(self) -> str:
        return self._recorded(color=False).export_text()

    def render(self, console: Any = None) -> None:
        """Print the report as tables on a rich console."""
        from rich.console import Console

        (console or Console()).print(self)

    def save(self, path: str | Path) -> None:
        """Write ``.json`` (``to_dict``), ``.md`` or ``.html``, atomically."""
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix == ".json":
            text = json.dumps(self.to_dict(), indent=2)
        elif suffix in (".md", ".markdown"):
            text = self.to_markdown()
        elif suffix in (".html", ".htm"):
            text = self._recorded(color=True).export_html()
        else:
            raise fail(f"cannot write report '{path}': use a .json, .md or .html file name")
        try:
            atomic_write_text(path, text)
        except OSError as exc:
            raise fail(f"cannot write report '{path}': {exc}") from exc
