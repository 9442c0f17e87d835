"""What every emit pass shares: the base class, its error, and the conditions passes state.

An emit pass is an onnx_ir in-place pass (:class:`EmitPass`). Whether it changed the model
is read from the model itself, before and after, so no pass can claim a change it did not
make; a failure carries the pass object (:class:`EmitPassError`), so whoever reports it
names the pass without reading onnx_ir's message text; a broken pre- or postcondition is an
:class:`OnnxModularError` (``OM0002`` / ``OM0003``) naming the pass.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import onnx_ir as ir

from onnx_modular.diagnostics import Location, OnnxModularError
from onnx_modular.emit.walk import graphs
from onnx_modular.leaves._log import timed
from onnx_modular.leaves.errors import fail, rules
from onnx_modular.leaves.metadata import META_CALL, META_FX_OUTPUTS, META_PATH, CallInfo

#: FX node name -> the module calls it ran in, outermost first.
Chains = Mapping[str, tuple[CallInfo, ...]]

#: What every call node of a local function carries once outlined.
CALL_LABELS = (META_PATH, META_CALL, META_FX_OUTPUTS)


class EmitPassError(ir.passes.PassError):
    """A step failed: carries the step, so the error names it (not read from message text)."""

    def __init__(self, step: ir.passes.PassBase) -> None:
        super().__init__(f"the emit step {type(step).__name__} failed")
        self.step = step


def _shape(model: ir.Model) -> tuple[list[object], list[object]]:
    """What a pass may change, by identity: every node (subgraphs too) with its inputs,
    attributes, output names and metadata; functions, graph inputs/outputs, initializers and
    opsets. The first list keeps the objects alive, so their ids cannot be reused."""
    keep: list[object] = []
    key: list[object] = [tuple(model.opset_imports.items())]
    for graph in graphs(model):
        keep += [graph, *graph.inputs, *graph.outputs]
        key += [id(graph), tuple(map(id, graph.inputs)), tuple(map(id, graph.outputs)),
                tuple(graph.metadata_props.items())]
        for node in ir.traversal.RecursiveGraphIterator(graph):
            attributes = tuple(node.attributes.values())
            keep += [node, *node.inputs, *attributes]
            key += [id(node), node.op_type, node.domain, tuple(map(id, node.inputs)),
                    tuple(map(id, attributes)), tuple(o.name for o in node.outputs),
                    tuple(node.metadata_props.items())]
    for name, value in model.graph.initializers.items():
        keep += [value, value.const_value]
        key += [name, id(value), id(value.const_value)]
    return keep, key


class EmitPass(ir.passes.InPlacePass):
    """A step of the pipeline: ``run`` changes the model in place; whether it did is read
    from the model (:func:`_shape` before and after), and a failure carries the step.

    ``requires``/``ensures`` (onnx_ir's hooks) raise :meth:`precondition_failed` /
    :meth:`postcondition_failed`; the error reaches the caller as it was raised, not
    wrapped in onnx_ir's generic condition error.
    """

    @property
    def name(self) -> str:
        return type(self).__name__

    def run(self, model: ir.Model) -> None:
        raise NotImplementedError

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        alive, before = _shape(model)  # ``alive``: no id in ``before`` is reused meanwhile
        self.run(model)
        modified = _shape(model)[1] != before
        del alive
        return ir.passes.PassResult(model, modified=modified)

    def precondition_failed(self, reason: str, location: Location | None = None
                            ) -> OnnxModularError:
        return fail(reason, rules.PRECONDITION, location, pass_name=self.name)

    def postcondition_failed(self, reason: str, location: Location | None = None
                             ) -> OnnxModularError:
        return fail(reason, rules.POSTCONDITION, location, pass_name=self.name)

    def __call__(self, model_or_result: ir.Model | ir.passes.PassResult, /
                 ) -> ir.passes.PassResult:
        try:
            with timed(f"emit pass {self.name}") as log:
                result = super().__call__(model_or_result)
                log["modified"] = result.modified
            return result
        except OnnxModularError:
            raise  # already says what went wrong, for the user
        except ir.passes.InvariantError as e:  # onnx_ir wraps what requires/ensures raise
            if not isinstance(e.__cause__, OnnxModularError):
                raise EmitPassError(self) from e
            broken = e.__cause__
        except Exception as e:
            raise EmitPassError(self) from e
        raise broken  # outside the handler: the error keeps its own cause, no cycle


# ---- conditions passes state ------------------------------------------------------------------

def _all_nodes(model: ir.Model) -> Iterator[tuple[str, ir.Node]]:
    """(where, node) for every node of the main graph and of every function, subgraphs too."""
    for graph in graphs(model):
        where = "the main graph" if graph is model.graph else f"function {graph.name}"
        for node in graph.all_nodes():
            yield where, node


def calls_of_missing_functions(model: ir.Model) -> list[str]:
    """Call nodes naming a local function the model does not hold (a domain of its local
    functions, an op no function of the model has)."""
    domains = {f.domain for f in model.functions.values()}
    return [f"{node.name} ({node.domain}::{node.op_type}) in {where}"
            for where, node in _all_nodes(model)
            if node.domain in domains and node.op_identifier() not in model.functions]


def unlabelled_calls(model: ir.Model) -> list[str]:
    """Call nodes of local functions without the labels outlining gives every call."""
    return [f"{node.name} ({node.op_type}) in {where} has no "
            + ", ".join(k for k in CALL_LABELS if k not in node.metadata_props)
            for where, node in _all_nodes(model)
            if node.op_identifier() in model.functions
            and any(k not in node.metadata_props for k in CALL_LABELS)]


def listed(found: list[str], limit: int = 3) -> str:
    """The first few findings of a condition, and how many more."""
    more = f" and {len(found) - limit} more" if len(found) > limit else ""
    return "; ".join(found[:limit]) + more
