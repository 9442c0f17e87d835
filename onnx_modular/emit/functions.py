"""A model's local functions, as outlining makes them and merging keeps them: their names,
the report of which function each call got, and the condition that every call finds its
function.

Outlining names each new function after its module class (``GPT2Block``, then
``GPT2Block_1`` for a second body of the class), never after an operator
(:func:`function_base`); merging numbers the functions left densely again and keeps the
report (:class:`OutlineReport`) true.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Protocol

import onnx
import onnx_ir as ir

from onnx_modular.emit.infra import EmitPass, calls_of_missing_functions, listed
from onnx_modular.leaves._compat import ort_contrib_operator_names
from onnx_modular.leaves._util import class_identifier


@dataclasses.dataclass
class OutlineReport:
    calls: int = 0
    functions: int = 0
    skipped: list[str] = dataclasses.field(default_factory=list)  # calls with no output
    function_of_call: dict[str, str] = dataclasses.field(default_factory=dict)


class HoldsOutlineReport(Protocol):
    """Where the outline passes keep their report (the pipeline's ``EmitReport``)."""

    outline: OutlineReport | None


@functools.cache
def operator_names() -> frozenset[str]:
    """Operators of the default ONNX domain (every version) and of ``com.microsoft``."""
    standard = {s.name for s in onnx.defs.get_all_schemas_with_history()
                if s.domain in ("", "ai.onnx")}
    return frozenset(standard) | ort_contrib_operator_names()


def function_base(type_name: str) -> str:
    """A function's name before numbering: its class name, suffixed where it is an operator
    name (``Softmax`` -> ``Softmax_module``). IREE and TVM ignore a call's domain and would
    run a function named ``Softmax`` as the standard op, silently giving other numbers."""
    base = class_identifier(type_name)
    return f"{base}_module" if base in operator_names() else base


def ensure_calls_resolve(step: EmitPass, model: ir.Model) -> None:
    """``step``'s postcondition: every call of a local function calls one the model holds."""
    missing = calls_of_missing_functions(model)
    if missing:
        raise step.postcondition_failed(
            f"every called function in the model; missing: {listed(missing)}")
