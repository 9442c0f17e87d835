"""Errors: the catalog of rules every finding follows, and the one way to raise.

A user-facing failure is ``raise fail("what went wrong", rules.X, location) from cause``:
one line naming the rule and where (module path, FX node, source line), with the cause
kept for ``--debug``. A :class:`DiagnosticContext` records the error as it leaves one of
the context's scopes (the pass it failed in). Findings that are not failures go to the
context directly (``ctx.warn``, ``ctx.note``).
"""

from __future__ import annotations

from typing import Any

from onnx_modular.diagnostics import Diagnostic, Level, Location, OnnxModularError, Rule

# ---- the rules -------------------------------------------------------------------------------

def _rule(id_: str, name: str, template: str) -> Rule:
    return Rule(id_, name, template)


class rules:  # noqa: N801 - a namespace, read as ``rules.X``
    """Every rule the package reports, in one place."""

    PASS_FAILED = _rule("OM0001", "pass-failed", "Pass {pass_name} failed: {reason}")
    PRECONDITION = _rule("OM0002", "precondition-failed", "Pass {pass_name} requires: {reason}")
    POSTCONDITION = _rule("OM0003", "postcondition-failed", "Pass {pass_name} ensures: {reason}")
    GRAPH_SNAPSHOT = _rule("OM0004", "graph-snapshot", "Graph {when} pass {pass_name}")
    MISSING_MODULE_STACK = _rule(
        "OM0101", "missing-module-stack",
        "{count} node(s) carry no nn_module_stack and stay in their parent: {nodes}")
    MODULE_CALL_SPLIT = _rule(
        "OM0102", "module-call-split",
        "Module call '{module}' is interleaved with nodes it depends on and was split in {pieces}")
    MUTATION_REFUSED = _rule(
        "OM0103", "unsupported-mutation", "{reason}")
    UNSUPPORTED_INPUT = _rule("OM0104", "unsupported-input", "{reason}")
    EXPORT_FAILED = _rule("OM0201", "export-failed", "{reason}")
    TRANSLATION = _rule("OM0202", "translation", "{reason}")
    FUNCTION_SUMMARY = _rule(
        "OM0203", "functions", "{functions} function(s) for {calls} module call(s)")
    UNOUTLINED = _rule("OM0204", "not-outlined", "{reason}")
    SUPPORT_PREVIEW = _rule("OM0301", "support-preview", "{reason}")
    SPLIT_PREVIEW = _rule("OM0302", "split-preview", "{reason}")
    SPLIT_LIMIT = _rule("OM0303", "split-limit", "{reason}")
    SPLIT_POINT = _rule("OM0304", "split-point", "{reason}")
    STAGE_PLAN = _rule("OM0305", "stage-plan", "{reason}")
    SUPPORT_UNMATCHED = _rule("OM0306", "support-entry-unmatched", "{reason}")
    DENIED_ON_ACC = _rule("OM0307", "denied-op-on-accelerator", "{reason}")
    VALIDATION = _rule("OM0401", "validation", "{reason}")
    BAD_INPUT = _rule("OM0501", "bad-input", "{reason}")
    CHECKPOINT = _rule("OM0502", "checkpoint", "{reason}")

    @classmethod
    def all(cls) -> list[Rule]:
        return [v for v in vars(cls).values() if isinstance(v, Rule)]


def fail(reason: str, rule: Rule = rules.BAD_INPUT, location: Location | None = None,
         **fields: Any) -> OnnxModularError:
    """The one way to make a user-facing error (``raise fail(...) from cause``).

    Every error rule says why, so ``reason`` fills its ``{reason}``; ``fields`` fill the
    rest of its template (``pass_name=`` of ``OM0001``-``OM0003``).
    """
    message = rule.format(reason=reason, **fields)
    return OnnxModularError(Diagnostic(rule, Level.ERROR, message, location or Location()))
