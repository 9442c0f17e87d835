"""A small FX pass framework: explicit pre/post-conditions, a result, a manager.

Each pass runs inside a scope of a :class:`DiagnosticContext`; a failure inside a
pass becomes an :class:`OnnxModularError` that names the rule, the pass and, where
the pass knows it, the module path / FX node / source line. After every pass its output
graph is linted, then held to the pass's ``ensures``.

:class:`PassManager` runs a pipeline of passes on one module, each checked as above, and
threads the module through: a split and the stages run a planner (``PlanRegions`` /
``PlanStages``, an analysis recording its plan on the flat ``program.module()``) then the
one ``CutRegions``. Modularize runs on another module (the decomposed program's graph), so
``api/spine.lower`` calls it alone, as a single pass. Passes run with the cyclic
GC paused: they build many small graph objects and keep them, and collections meanwhile
rescan the whole heap again and again (superlinear in the graph's size).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import TypeVar

import torch.fx

from onnx_modular.diagnostics import DiagnosticContext, Level, OnnxModularError
from onnx_modular.leaves._log import timed
from onnx_modular.leaves._util import gc_paused
from onnx_modular.leaves.errors import fail, rules


class PassConditionError(Exception):
    """Raised by ``requires`` / ``ensures`` with a one-line reason."""


@dataclasses.dataclass
class PassResult:
    graph_module: torch.fx.GraphModule
    modified: bool


R = TypeVar("R", bound=PassResult)


class PassBase(abc.ABC):
    """Subclasses implement :meth:`call`; :meth:`requires` and :meth:`ensures` guard it."""

    @property
    def name(self) -> str:
        return type(self).__name__

    def requires(self, graph_module: torch.fx.GraphModule) -> None:  # noqa: B027 - optional hook
        """Raise :class:`PassConditionError` when the input is not fit for this pass."""

    def ensures(self, graph_module: torch.fx.GraphModule) -> None:  # noqa: B027 - optional hook
        """Raise :class:`PassConditionError` when the output breaks this pass's promise."""

    @abc.abstractmethod
    def call(self, graph_module: torch.fx.GraphModule, ctx: DiagnosticContext) -> PassResult:
        """Run the pass; report findings to ``ctx``."""

    def __call__(self, graph_module: torch.fx.GraphModule,
                 ctx: DiagnosticContext | None = None) -> PassResult:
        ctx = ctx if ctx is not None else DiagnosticContext()
        with ctx.scope(self.name), gc_paused():
            try:
                self.requires(graph_module)
            except PassConditionError as e:
                raise fail(rule=rules.PRECONDITION, pass_name=self.name, reason=str(e)) from e
            if ctx.verbose:
                ctx.log(rules.GRAPH_SNAPSHOT, Level.NOTE, detail=str(graph_module.graph),
                        when="before", pass_name=self.name)
            try:
                with timed(f"pass {self.name}") as log:
                    result = self.call(graph_module, ctx)
                    log["modified"] = result.modified
            except (OnnxModularError, PassConditionError):
                raise
            except Exception as e:  # an internal failure still gets a rule and a pass name
                raise fail(rule=rules.PASS_FAILED, pass_name=self.name,
                                reason=f"{type(e).__name__}: {e}") from e
            if ctx.verbose:
                ctx.log(rules.GRAPH_SNAPSHOT, Level.NOTE, detail=str(result.graph_module.graph),
                        when="after", pass_name=self.name)
            try:
                _check_structure(result.graph_module)
                self.ensures(result.graph_module)
            except PassConditionError as e:
                raise fail(rule=rules.POSTCONDITION, pass_name=self.name, reason=str(e)) from e
        return result


def _check_structure(graph_module: torch.fx.GraphModule) -> None:
    """Every pass's output is a well-formed graph (``Graph.lint``: each value defined before
    it is used, names unique, an output node last), whatever the pass itself ensures."""
    try:
        graph_module.graph.lint()
    except (RuntimeError, ValueError) as e:  # the message ends with the whole graph
        raise PassConditionError(f"a well-formed graph ({str(e).splitlines()[0]})") from e


@dataclasses.dataclass
class PassManagerResult(PassResult):
    """The last module, whether any pass changed it, and every pass's own result."""

    steps: list[PassResult] = dataclasses.field(default_factory=list)

    def of(self, pass_type: type[R]) -> R:
        """The result of the last pass whose result is a ``pass_type``."""
        for step in reversed(self.steps):
            if isinstance(step, pass_type):
                return step
        raise LookupError(f"no pass returned a {pass_type.__name__}")


class PassManager:
    """Runs passes in order, threading the module through; ``modified`` is any pass's."""

    def __init__(self, passes: Sequence[PassBase], ctx: DiagnosticContext | None = None) -> None:
        self.passes = list(passes)
        self.ctx = ctx if ctx is not None else DiagnosticContext()

    def __call__(self, graph_module: torch.fx.GraphModule) -> PassManagerResult:
        steps: list[PassResult] = []
        for p in self.passes:
            result = p(graph_module, self.ctx)
            graph_module = result.graph_module
            steps.append(result)
        return PassManagerResult(graph_module, any(r.modified for r in steps), steps)
