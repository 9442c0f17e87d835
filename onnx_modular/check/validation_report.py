"""The report of :func:`onnx_modular.validate`: per provider and output, and the localization.

Data (what was checked, how far off) and its renderings (rich tables, Markdown, JSON) in one
place, apart from the checking, so the command line and notebooks print the same thing.
A report is a frozen record of plain data: no torch model, no ONNX model, no session, no
tensor (it pickles). The work that needs them (localizing later, extracting a call, the
overlay of a report that did not localize) is a :class:`~onnx_modular.check.validate.
Validation` session's, which returns a new report or a record of its own.
"""

from __future__ import annotations

import dataclasses
import json
import math
import weakref
from pathlib import Path
from typing import Any

import torch

from onnx_modular.check.call_stats import HIST_LABELS, CallError, OwnError, OwnErrors
from onnx_modular.check.judge import Localization
from onnx_modular.check.outcome import ProviderResult
from onnx_modular.check.overlay import node_data
from onnx_modular.check.report import OUTPUT_HEAD, Report, fmt_err, md_table, output_rows
from onnx_modular.leaves._compat import tensor_version, tree_flatten, tree_unflatten
from onnx_modular.leaves._io import atomic_write_text, file_stamp
from onnx_modular.leaves.errors import fail
from onnx_modular.leaves.runtime import short_provider

__all__ = ["Reopen", "ValidationReport", "sparkline", "without_values", "write_node_data"]

_SESSION = ("a report is data; use a session: with om.Validation(model, args, onnx_model) "
            "as v: v.run(); v.{}")


class Reopen:
    """A new :class:`~onnx_modular.check.validate.Validation` on what a report checked,
    reached through weak references: the report keeps nothing alive, yet
    ``rep.extract(DIR)`` works while the caller holds the model and inputs (as a script
    does). Data only (weak references, plain values, the pytree spec, a stamp of what was
    checked): pickled, it is dead. A model, input or file changed since is refused, never
    checked in the report's name.
    """

    def __init__(self, session: type | None, refs: list[Any], spec: Any,
                 was_none: list[bool], stamp: tuple[Any, ...] = ()) -> None:
        self._session, self._refs, self._spec = session, refs, spec
        self._was_none, self._stamp = was_none, stamp

    @classmethod
    def of(cls, session: type, arguments: tuple[Any, ...], options: dict[str, Any]
           ) -> Reopen | None:
        """``session``: the session class, called as ``session(*arguments, **options)``;
        None when something cannot be referenced weakly (a protobuf message)."""
        leaves, spec = tree_flatten((arguments, options))
        refs: list[Any] = []
        for leaf in leaves:
            if leaf is None or isinstance(leaf, (str, bytes, int, float, bool, Path)):
                refs.append(leaf)
                continue
            try:
                refs.append(weakref.ref(leaf))
            except TypeError:
                return None
        return cls(session, refs, spec, [leaf is None for leaf in leaves], _stamp(leaves))

    def open(self, **overrides: Any) -> Any:
        """A new session (``overrides`` replace options), or None once anything it needs
        is gone; an error if the model, an input or the ONNX file changed since."""
        if self._session is None:
            return None
        values = [r() if isinstance(r, weakref.ref) else r for r in self._refs]
        if any(v is None and not none for v, none in zip(values, self._was_none)):
            return None
        if _stamp(values) != self._stamp:
            raise fail("the model, an input or the ONNX file changed since this report was "
                       "made: validate again (om.validate, or a session: with "
                       "om.Validation(model, args, onnx_model) as v: ...)")
        arguments, options = tree_unflatten(values, self._spec)
        return self._session(*arguments, **{**options, **overrides})

    def __reduce__(self) -> tuple[type[Reopen], tuple[None, list[Any], None, list[bool]]]:
        return Reopen, (None, [], None, [])


def _file_stamp(path: Path) -> list[int] | None:
    """A model file's stamp (a parts directory's manifest's); None for what is no file."""
    try:
        return file_stamp(path / "manifest.json" if path.is_dir() else path)
    except OSError:  # not a path (a provider's name), or gone
        return None


def _stamp(values: list[Any]) -> tuple[Any, ...]:
    """What changes when a checked object does: a file's size and time, a tensor's version
    counter (bumped by every in-place change), each parameter's and buffer's of a module."""
    stamp: list[Any] = []
    for value in values:
        if isinstance(value, (str, Path)):
            stamp.append(_file_stamp(Path(value)))
        elif isinstance(value, torch.Tensor):
            stamp.append(tensor_version(value))
        elif isinstance(value, torch.nn.Module):
            stamp.append(tuple(tensor_version(t) for t in (*value.parameters(),
                                                           *value.buffers())))
        else:
            stamp.append(None)
    return tuple(stamp)


@dataclasses.dataclass(frozen=True)
class ValidationReport(Report):
    """The outcome of :func:`validate`: per provider and output, and the localization
    (its values never kept: a localization given with them keeps their overlay as data)."""

    model: str
    results: list[ProviderResult]
    torch_s: float
    localization: Localization | None = None
    localization_provider: str | None = None
    #: default providers that were not checked, with the reason (e.g. no CUDA here)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    #: what torch returns that no output of the file stands for, in words ("" when none)
    unchecked: str = ""
    #: how to open a new session on the same model and inputs, by weak references only
    reopen: Reopen | None = dataclasses.field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.localization is not None and self.localization.evidence is not None:
            object.__setattr__(self, "localization", without_values(self.localization))

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def first_mismatch(self) -> str | None:
        """Module path of the first (deepest) diverging module call, or None."""
        loc = self.localization
        return loc.first.module_path if loc is not None and loc.first is not None else None

    @property
    def first_mismatch_call(self) -> str | None:
        """Call id of that call (``shared@1``: the second call of ``shared``), or None."""
        loc = self.localization
        return loc.first.call_id if loc is not None and loc.first is not None else None

    @property
    def first_own_mismatch(self) -> str | None:
        """Call id of the first module call whose own error (the call alone on torch's
        inputs of it) leaves tolerance, or None: the layer a conversion hurts first."""
        own = self.own
        return own.first if own is not None else None

    @property
    def own(self) -> OwnErrors | None:
        """Every module call's own error, when the report localized."""
        return self.localization.own if self.localization is not None else None

    @property
    def source(self) -> None:
        """None: a report holds no model (a :class:`Validation` session's ``source`` is
        the ONNX model it checks)."""
        return None

    @property
    def providers(self) -> list[str]:
        return [r.provider for r in self.results]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "ok": self.ok,
            "first_mismatch": self.first_mismatch,
            "first_mismatch_call": self.first_mismatch_call,
            "torch_s": self.torch_s,
            "providers": {r.provider: r.to_dict() for r in self.results},
            "skipped": dict(self.skipped),
            "unchecked": self.unchecked,
            "localization": None if self.localization is None else {
                "provider": self.localization_provider, **self.localization.to_dict()},
        }

    # -- what needs a session -----------------------------------------------------------------

    def relocalize(self) -> Localization:
        """The localization again, from a new :class:`Validation` on the same model and
        inputs (while the caller still holds them: the report keeps no reference that
        would keep them alive); the report itself is unchanged."""
        with self._session("localize", "localize()") as session:
            session.run()  # (localize=False: localized once, below)
            localized = session.localize().localization
        assert localized is not None
        return localized

    def extract(self, directory: str | Path, call: str | None = None) -> Any:
        """``Validation.extract`` on a new session on the same model and inputs (see
        :meth:`relocalize`)."""
        with self._session("extract from", f"extract({str(directory)!r})") as session:
            session.run()
            return session.extract(directory, call)

    def _session(self, verb: str, call: str) -> Any:
        session = self.reopen.open(localize=False) if self.reopen is not None else None
        if session is None:
            raise fail(f"this report has no model to {verb} (it does not reach its model "
                       "or inputs: freed, held in a form it cannot reference weakly, or "
                       "unpickled): " + _SESSION.format(call))
        return session

    def release(self) -> None:
        """Nothing to let go: a report keeps no values (``Validation.release`` lets a
        session's go)."""

    def node_data(self) -> dict[str, Any]:
        """The errors of the localization as Model Explorer node data (see
        :mod:`onnx_modular.check.overlay`). A report that did not localize localizes now,
        through a new session while the caller holds the model and inputs (see
        :meth:`relocalize`); ``{}`` where it cannot."""
        if self.localization is not None:
            return self.localization.node_data
        session = self.reopen.open(localize=False) if self.reopen is not None else None
        if session is None:
            return {}
        with session:
            session.run()
            return session.node_data()

    def save(self, path: str | Path, format: str | None = None) -> None:
        """Write ``.json`` (``to_dict``), ``.md`` or ``.html``, atomically; with
        ``format="model-explorer"`` the errors as Model Explorer node data instead, for
        ``model-explorer MODEL.onnx --extensions model_explorer_onnx --node_data_paths PATH``."""
        if format in (None, "report"):
            return super().save(path)
        if format not in ("model-explorer", "node-data"):
            raise fail(f"unknown report format '{format}': use 'report' or 'model-explorer'")
        data = self.node_data()
        if not data and self.localization is None:  # never an empty overlay, silently
            raise fail("this report did not localize and cannot reach its model to do it: "
                       + _SESSION.format("node_data()"))
        write_node_data(path, data)

    # -- rendering --------------------------------------------------------------------------

    def _rows(self) -> list[list[str]]:
        return output_rows(self.results)

    _LOC_HEAD = ["#", "module call", "type", "first diverging value", "max abs err",
                 "max rel err", "mismatched", "inputs"]

    def _loc_rows(self) -> list[list[str]]:
        loc = self.localization
        if loc is None:
            return []
        return [[str(i + 1), d.call_id, d.module_type.rsplit(".", 1)[-1], d.output,
                 fmt_err(d.max_abs), fmt_err(d.max_rel), str(d.mismatched),
                 "diverged" if d.inherited else "ok"]
                for i, d in enumerate(loc.divergences)]

    def _timings(self) -> str:
        parts = [f"{short_provider(r.provider)}: session {r.session_s * 1e3:.0f} ms, "
                 f"run {r.run_s * 1e3:.1f} ms" for r in self.results]
        return "; ".join([*parts, f"torch {self.torch_s * 1e3:.0f} ms"])

    def _skipped_line(self) -> str:
        return "; ".join(f"{short_provider(p)} skipped: {why}"
                         for p, why in self.skipped.items())

    def summary(self) -> str:
        if self.ok:
            caveat = f" ({self.unchecked})" if self.unchecked else ""
            return f"OK: {self.model} matches torch on {', '.join(self.providers)}{caveat}"
        failed = [r.provider for r in self.results if not r.ok]
        where = f"; first diverging module: {self._first_described()}" \
            if self.first_mismatch else ""
        if self.localization is not None and self.first_mismatch is None:
            where = f"; no module localized ({self.localization.note or 'no module diverged'})"
        if self.first_own_mismatch is not None:
            where += f"; first module whose own error leaves tolerance: {self.first_own_mismatch}"
        return f"MISMATCH: {self.model} differs from torch on {', '.join(failed)}{where}"

    def _first_described(self) -> str:
        """The first divergence in words: which call of a module called more than once, and
        where its inputs differ already, that the error starts outside module calls."""
        first = self.localization.first if self.localization is not None else None
        if first is None:
            return ""
        text = first.module_path
        if first.call_id != first.module_path:
            text += f" (its call {first.call_id})"
        if first.inherited:
            text += (" whose inputs differ already: the error likely starts before it, in "
                     "operations outside any module call (the parent module's own code)")
        return text

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        rows = self._rows()
        show_note = any(row[-1] for row in rows)
        table = Table(title="ONNX Runtime vs torch eager", title_justify="left",
                      caption=self._timings(), caption_justify="left")
        for h in OUTPUT_HEAD if show_note else OUTPUT_HEAD[:-1]:
            table.add_column(h, justify="right" if "err" in h else "left",
                             no_wrap=h in ("EP", "status", "rtol/atol"))
        for row in rows:
            style = "green" if row[7] == "ok" else "bold red"
            # output names and module paths come from the model: plain Text, not markup
            table.add_row(*map(Text, row[:7]), Text(row[7], style=style),
                          *map(Text, row[8:8 + show_note]))
        parts: list[Any] = [table]
        if self.localization is not None and self.localization.divergences:
            loc = Table(title=f"Diverging module calls on {self.localization_provider} "
                        "(execution order; bold: the first mismatch)", title_justify="left")
            for h in self._LOC_HEAD:
                loc.add_column(h, justify="right" if "err" in h or h == "mismatched" else "left")
            first = self.localization.divergences.index(self.localization.first) \
                if self.localization.first is not None else -1
            for i, row in enumerate(self._loc_rows()):
                loc.add_row(*map(Text, row), style="bold" if i == first else None)
            parts.append(loc)
        growth = self._growth_table()
        if growth is not None:
            parts.append(growth)
        own = self._own_table()
        if own is not None:
            parts.append(own)
        if self.skipped:
            parts.append(Text(self._skipped_line(), style="yellow"))
        parts.append(Text(self.summary(), style="green" if self.ok else "bold red"))
        return Group(*parts)

    _ERR_HEAD = ["#", "module call", "type", "max abs err", "max rel err", "mismatched",
                 "dtype", "abs err per decade", "status"]

    def _error_rows(self, errors: list[CallError], first: str | None,
                    leap: str | None = None) -> list[list[str]]:
        def status(e: CallError) -> str:
            if not e.ok:
                return "FIRST" if e.call_id == first else "FAIL"
            return "ok, leaps" if e.call_id == leap else "ok"

        return [[str(i + 1), e.call_id, e.module_type.rsplit(".", 1)[-1], fmt_err(e.max_abs),
                 fmt_err(e.max_rel), f"{e.mismatched}/{e.size}", e.dtypes,
                 sparkline(e.histogram), status(e)] for i, e in enumerate(errors)]

    def _first_call_id(self) -> str | None:
        loc = self.localization
        return loc.first.call_id if loc is not None and loc.first is not None else None

    def _growth_table(self) -> Any:
        """The repeated blocks' errors in execution order, and where the error grows."""
        from rich.table import Table

        loc = self.localization
        stack = loc.stack() if loc is not None else None
        if stack is None:
            return None
        table = Table(title=f"Error per {stack.module_type.rsplit('.', 1)[-1]} call in "
                      f"{stack.parent or 'the model'} (execution order; histogram: "
                      f"{HIST_LABELS[0]} ... {HIST_LABELS[-1]})", title_justify="left",
                      caption=stack.summary, caption_justify="left")
        for h in self._ERR_HEAD:
            table.add_column(h, justify="right" if ("err" in h and "decade" not in h)
                             or h == "mismatched" else "left")
        first = self._first_call_id()
        leap = stack.calls[stack.jump].call_id if stack.jump is not None else None
        styles = {"ok": None, "ok, leaps": "bold yellow", "FIRST": "bold red", "FAIL": "red"}
        for row in self._error_rows(stack.calls, first, leap):
            table.add_row(*row, style=styles[row[-1]])
        return table

    def to_markdown(self) -> str:
        lines = [f"# Validation of {self.model}", "", f"**{self.summary()}**", ""]
        lines += [*md_table(OUTPUT_HEAD, self._rows()), "", f"Timings: {self._timings()}"]
        if self.skipped:
            lines += ["", f"Not checked: {self._skipped_line()}"]
        if self.unchecked:
            lines += ["", f"Not compared: {self.unchecked}"]
        if self.localization is not None:
            lines += ["", f"## Diverging module calls ({self.localization_provider})", ""]
            if self.localization.divergences:
                lines += md_table(self._LOC_HEAD, self._loc_rows())
            else:
                lines.append(self.localization.note or "No module call diverges.")
            lines += self._errors_markdown()
            lines += self._own_markdown()
        return "\n".join(lines) + "\n"

    def _errors_markdown(self) -> list[str]:
        loc = self.localization
        if loc is None or not loc.errors:
            return []
        first = self._first_call_id()
        lines = ["", "## Error by module call", ""]
        stack = loc.stack()
        if stack is not None:
            lines += [f"**{stack.summary}**", ""]
            lines += [*md_table(self._ERR_HEAD, self._error_rows(stack.calls, first)), ""]
        lines += [f"Every compared call in execution order ({len(loc.errors)}); absolute "
                  f"error per decade, {HIST_LABELS[0]} to {HIST_LABELS[-1]}:", "",
                  "<details><summary>all module calls</summary>", ""]
        rows = self._error_rows(loc.errors, first)
        for row, e in zip(rows, loc.errors, strict=True):
            row[1] = "&nbsp;" * 2 * e.depth + row[1]
            row[7] = " ".join(map(str, e.histogram))
        lines += [*md_table(self._ERR_HEAD, rows), "", "</details>"]
        return lines


    # -- own errors ---------------------------------------------------------------------------

    _OWN_HEAD = ["#", "module call", "type", "own max abs err", "own max rel err", "mismatched",
                 "dtype", "in the model", "status", "note"]
    #: The terminal shows every call up to this many; beyond, the failing ones and the first.
    OWN_ROWS_SHOWN = 60

    def _own_title(self) -> str:
        return (f"Own error per module call on {short_provider(self.localization_provider or '')}"
                " (each call alone on torch's inputs of it; execution order; 'in the model':"
                " its max abs err after the drift before it)")

    def _own_rows(self, calls: list[OwnError], indent: str) -> list[list[str]]:
        own = self.own
        first = own.first if own is not None else None

        def status(c: OwnError) -> str:
            if not c.compared:
                return "not run"
            if not c.ok:
                return "FIRST" if c.call_id == first else "FAIL"
            return "ok"

        return [[str(i + 1), indent * c.depth + c.call_id,
                 c.module_type.rsplit(".", 1)[-1],
                 fmt_err(c.max_abs) if c.compared else "-",
                 fmt_err(c.max_rel) if c.compared else "-",
                 f"{c.mismatched}/{c.size}" if c.compared else "-", c.dtypes,
                 fmt_err(c.propagated) if c.propagated is not None else "-", status(c), c.note]
                for i, c in enumerate(calls)]

    def _own_shown(self) -> tuple[list[OwnError], int]:
        """The calls the terminal shows, and how many passing ones it leaves out."""
        own = self.own
        assert own is not None
        if len(own.calls) <= self.OWN_ROWS_SHOWN:
            return own.calls, 0
        shown = [c for c in own.calls if not c.compared or not c.ok]
        return shown, len(own.calls) - len(shown)

    def _own_caption(self) -> str:
        own = self.own
        assert own is not None
        compared = sum(c.compared for c in own.calls)
        text = (f"first module call whose own error leaves tolerance: {own.first}"
                if own.first else
                f"every one of {compared} calls compared stays within tolerance on its own "
                "(each at the precision it computes in)")
        if compared < len(own.calls):
            text += f"; {len(own.calls) - compared} not run (see note)"
        return text

    def _own_table(self) -> Any:
        from rich.table import Table
        from rich.text import Text

        own = self.own
        if own is None:
            return None
        if not own.calls:
            return Text(f"Own errors per module call: none ({own.note})", style="yellow")
        calls, hidden = self._own_shown()
        caption = self._own_caption()
        if hidden:
            caption += (f"; {hidden} calls within tolerance not shown (the JSON and Markdown "
                        "reports list every call)")
        table = Table(title=self._own_title(), title_justify="left", caption=caption,
                      caption_justify="left")
        for h in self._OWN_HEAD:
            table.add_column(h, justify="right" if "err" in h or h in ("mismatched",
                                                                       "in the model")
                             else "left", no_wrap=h in ("module call", "status"))
        styles = {"ok": None, "FIRST": "bold red", "FAIL": "red", "not run": "yellow"}
        for row in self._own_rows(calls, "  "):
            table.add_row(*map(Text, row), style=styles[row[8]])
        return table

    def _own_markdown(self) -> list[str]:
        own = self.own
        if own is None:
            return []
        lines = ["", "## Own error by module call", ""]
        if not own.calls:
            return [*lines, f"Not measured: {own.note}"]
        lines += [f"**{self._own_caption()}**", "",
                  "Each module call run alone on the tensors torch passed it, against torch's "
                  "outputs of it: the error the call adds (execution order; *in the model*: "
                  "its max abs error after the drift before it).", ""]
        return [*lines, *md_table(self._OWN_HEAD, self._own_rows(own.calls, "&nbsp;" * 2))]


def without_values(localization: Localization) -> Localization:
    """A copy holding no values (no probe, no tensors): what a report keeps, with the
    overlay of the values (:func:`~onnx_modular.check.overlay.node_data`) as data."""
    data = node_data(localization) if localization.evidence is not None else \
        localization.node_data
    return dataclasses.replace(localization, evidence=None, node_data=data)


def write_node_data(path: str | Path, data: dict[str, Any]) -> None:
    """Model Explorer node data (``ValidationReport.node_data``), written atomically."""
    try:
        atomic_write_text(path, json.dumps(data, indent=1))
    except OSError as exc:
        raise fail(f"cannot write node data '{path}': {exc}") from exc


_BARS = " ▁▂▃▄▅▆▇█"


def sparkline(histogram: list[int]) -> str:
    """The histogram as one bar per decade, log-scaled counts (fits a table cell)."""
    top = max(histogram, default=0)
    if top == 0:
        return ""
    scale = math.log1p(top)
    return "".join(_BARS[0] if c == 0 else _BARS[max(1, round(math.log1p(c) / scale * 8))]
                   for c in histogram)
