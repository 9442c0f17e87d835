"""Diagnostics: what a pass found, where, and how serious it is.

Every pass runs inside a :class:`DiagnosticContext`. A diagnostic records the
rule it follows, a level, a message and a location (module path, FX node and the
source line taken from the node's stack trace). A run keeps every diagnostic;
they print readably and export as SARIF 2.1.0 so that IDEs and CI can show them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import re
import string
import urllib.parse
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path, PurePath
from typing import Any, ParamSpec, TypeVar

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
TOOL_NAME = "onnx_modular"


class Level(str, enum.Enum):
    """Severity, named as SARIF names it."""

    ERROR = "error"
    WARNING = "warning"
    NOTE = "note"


@dataclasses.dataclass(frozen=True)
class Rule:
    """A kind of finding; ``message_template`` is formatted with keyword arguments."""

    id: str
    name: str
    message_template: str

    def format(self, **kwargs: Any) -> str:
        return self.message_template.format(**kwargs)

    def to_sarif(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "messageStrings": {"default": {"text": sarif_template(self.message_template)}},
        }


def sarif_template(template: str) -> str:
    """A ``str.format`` template in SARIF's spelling: named fields become ``{0}``, ``{1}``
    ... in the order they first appear; literal braces stay doubled."""
    order: dict[str, int] = {}
    out = []
    for literal, field, _, _ in string.Formatter().parse(template):
        out.append(literal.replace("{", "{{").replace("}", "}}"))
        if field is not None:
            out.append(f"{{{order.setdefault(field, len(order))}}}")
    return "".join(out)


def sarif_uri(path: str) -> str:
    """A file path as an RFC 3986 URI reference: ``file:///...`` when absolute, else a
    relative reference; spaces and non-ASCII characters percent-encoded."""
    pure = PurePath(path)
    if pure.is_absolute():
        try:
            return Path(path).as_uri()
        except ValueError:
            pass
    return urllib.parse.quote(pure.as_posix(), safe="/")


_STACK_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


@dataclasses.dataclass(frozen=True)
class Location:
    """Where a finding is: any of module path, FX node, source file and line."""

    module_path: str | None = None
    fx_node: str | None = None
    source_file: str | None = None
    source_line: int | None = None

    @classmethod
    def of_node(cls, node: Any, module_path: str | None = None) -> Location:
        """The location of an FX node; the source line is the innermost user frame."""
        file, line = None, None
        trace = node.meta.get("stack_trace") if hasattr(node, "meta") else None
        if trace:
            frames = _STACK_LINE.findall(trace)
            user = [f for f in frames if "/site-packages/torch/" not in f[0]]
            if user or frames:
                file, line = (user or frames)[-1]
        return cls(module_path, getattr(node, "name", None), file, int(line) if line else None)

    def __str__(self) -> str:
        parts = []
        if self.module_path is not None:
            parts.append(f"module '{self.module_path or '<root>'}'")
        if self.fx_node:
            parts.append(f"node '{self.fx_node}'")
        if self.source_file:
            parts.append(f"{self.source_file}:{self.source_line}")
        return ", ".join(parts)

    def to_sarif(self) -> dict[str, Any]:
        loc: dict[str, Any] = {}
        if self.source_file:
            region = {"startLine": self.source_line} if self.source_line else {}
            loc["physicalLocation"] = {
                "artifactLocation": {"uri": sarif_uri(self.source_file)},
                **({"region": region} if region else {}),
            }
        logical = []
        if self.module_path is not None:
            logical.append({"fullyQualifiedName": self.module_path or "<root>", "kind": "module"})
        if self.fx_node:
            logical.append({"name": self.fx_node, "kind": "fx_node"})
        if logical:
            loc["logicalLocations"] = logical
        return loc


def one_line(text: str) -> str:
    """``text`` with every control or separator character but the space escaped."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


@dataclasses.dataclass
class Diagnostic:
    rule: Rule
    level: Level
    message: str
    location: Location = dataclasses.field(default_factory=Location)
    detail: str | None = None
    scope: str | None = None  # the pass (or step) that reported it

    def __str__(self) -> str:
        """One line whatever the message quotes: a file name, an ``--input`` or an op name
        holding a newline or a terminal escape is shown escaped (``\\n``, ``\\x1b``)."""
        where = f" [{self.location}]" if str(self.location) else ""
        return one_line(f"{self.level.value}: {self.rule.id} {self.rule.name}: "
                        f"{self.message}{where}")

    def to_sarif(self) -> dict[str, Any]:
        result: dict[str, Any] = {
            "ruleId": self.rule.id,
            "level": self.level.value,
            "message": {"text": self.message},
            "locations": [self.location.to_sarif()],
        }
        properties = {"pass": self.scope, "detail": self.detail}
        if any(properties.values()):
            result["properties"] = {k: v for k, v in properties.items() if v}
        return result


class OnnxModularError(Exception):
    """A user-facing failure: one line naming the rule and the location."""

    def __init__(self, diagnostic: Diagnostic) -> None:
        self.diagnostic = diagnostic
        super().__init__(str(diagnostic))


# ---- contexts ---------------------------------------------------------------------------------

class DiagnosticContext:
    """Collects the diagnostics of one run; passes open nested scopes with :meth:`scope`.

    A failure is raised (``raise fail(...)``, :mod:`onnx_modular.leaves.errors`), never logged by
    hand: an :class:`OnnxModularError` leaving a scope is recorded there, once, under the
    innermost scope it left, so the run's log and its SARIF list it with the pass it
    failed in.
    """

    def __init__(self, verbose: bool = False) -> None:
        self.verbose = verbose
        self.diagnostics: list[Diagnostic] = []
        self._scopes: list[str] = []

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[DiagnosticContext]:
        """A pass (or step) named ``name``: what it logs, and the error it fails with."""
        self._scopes.append(name)
        try:
            with self.recording_failures():
                yield self
        finally:
            self._scopes.pop()

    @contextlib.contextmanager
    def recording_failures(self) -> Iterator[DiagnosticContext]:
        """Record an :class:`OnnxModularError` leaving this block (under the current scope,
        unless recorded already), then let it go on."""
        try:
            yield self
        except OnnxModularError as e:
            self.record_failure(e)
            raise

    def record_failure(self, error: OnnxModularError) -> None:
        """Keep ``error``'s diagnostic, once, with the scope it failed in."""
        diagnostic = error.diagnostic
        if any(d is diagnostic for d in self.diagnostics):
            return
        if diagnostic.scope is None:
            diagnostic.scope = self.current_scope
        self.diagnostics.append(diagnostic)

    @property
    def current_scope(self) -> str | None:
        return self._scopes[-1] if self._scopes else None

    def log(self, rule: Rule, level: Level, location: Location | None = None,
            detail: str | None = None, **fmt: Any) -> Diagnostic:
        diag = Diagnostic(rule, level, rule.format(**fmt), location or Location(), detail,
                          self.current_scope)
        self.diagnostics.append(diag)
        return diag

    def note(self, rule: Rule, location: Location | None = None, **fmt: Any) -> Diagnostic:
        return self.log(rule, Level.NOTE, location, **fmt)

    def warn(self, rule: Rule, location: Location | None = None, **fmt: Any) -> Diagnostic:
        return self.log(rule, Level.WARNING, location, **fmt)

    def extend(self, diagnostics: list[Diagnostic]) -> None:
        self.diagnostics.extend(diagnostics)

    def of_level(self, level: Level) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.level == level]

    def to_sarif(self) -> dict[str, Any]:
        return to_sarif(self.diagnostics)

    def __str__(self) -> str:
        return "\n".join(str(d) for d in self.diagnostics)


def to_sarif(diagnostics: list[Diagnostic]) -> dict[str, Any]:
    """A SARIF 2.1.0 log with one run; rules are the ones the diagnostics used."""
    from onnx_modular.leaves._version import __version__

    used: dict[str, Rule] = {}
    for d in diagnostics:
        used.setdefault(d.rule.id, d.rule)
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": TOOL_NAME,
                "version": __version__,
                "informationUri": "https://github.com/onnx-modular/onnx_modular",
                "rules": [r.to_sarif() for r in sorted(used.values(), key=lambda r: r.id)],
            }},
            "results": [d.to_sarif() for d in diagnostics],
        }],
    }



P = ParamSpec("P")
R = TypeVar("R")


def records_failures(entry: Callable[P, R]) -> Callable[P, R]:
    """An entry point taking ``ctx=``: its user errors land in that context too (the run's
    log, SARIF on failure); the context is made here when the caller gives none."""

    @functools.wraps(entry)
    def recorded(*args: P.args, **kwargs: P.kwargs) -> R:
        ctx = kwargs.get("ctx")
        made_here = ctx is None
        if made_here:
            ctx = kwargs["ctx"] = DiagnosticContext()
        assert isinstance(ctx, DiagnosticContext)
        with ctx.recording_failures():
            result = entry(*args, **kwargs)
        if made_here:  # nobody else reads this context: what the user must know, as warnings
            for diagnostic in ctx.of_level(Level.WARNING):
                warnings.warn(str(diagnostic), OnnxModularWarning, stacklevel=2)
        return result

    return recorded


class OnnxModularWarning(UserWarning):
    """A warning-level diagnostic of a call given no ``ctx=``: the file differs from what
    was asked (a size torch fixed, a call left inlined, an input left out); the result's
    ``diagnostics`` hold it too."""
