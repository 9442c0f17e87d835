"""Compare two ONNX models: structure after inlining, numerics on the same inputs, cost.

A hierarchical model and its flat twin should inline to the same graph and compute the same
values; ``compare`` shows both, plus file size and ONNX Runtime session and run time. Where
both models name their modules, each module call's own error too (b's call on a's inputs,
:mod:`~onnx_modular.check.module_diff`): the first module that computes other numbers.
Equivalence is numerical (same input signature, outputs within tolerance); the structural
figures (op histogram, node count, a topology hash that ignores names) say *where* two
equivalent models differ in shape, or confirm they do not. The topology hash is the
package's one structural key (:func:`onnx_modular.emit.canonical.structural_key`) with
node order, constant folding and weight values left out. The command line prints the report.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir
from onnx_ir.passes.common.inliner import InlinePass

from onnx_modular.check.compare_report import CompareReport, ModelFacts, OutputDiff
from onnx_modular.check.inputs import (
    declared_inputs,
    feeding_names,
    index_ranges,
    input_signature,
    random_inputs,
)
from onnx_modular.check.inputs import feeds as bind_feeds
from onnx_modular.check.module_diff import ModuleComparison, compare_modules, labelled_calls
from onnx_modular.check.numerics import check_value
from onnx_modular.check.options import Tolerances
from onnx_modular.check.runners import Inputs, SessionRunner
from onnx_modular.diagnostics import OnnxModularError
from onnx_modular.emit.canonical import structural_key
from onnx_modular.leaves import runtime
from onnx_modular.leaves.errors import fail

__all__ = ["CompareReport", "ModelFacts", "OutputDiff", "compare", "random_inputs",
           "topology_hash"]

#: Constants up to this many elements enter the topology hash by value (shapes, axes,
#: scalars); larger ones (weights) by dtype and shape only.
SMALL_CONSTANT = 16


# ---- structure -------------------------------------------------------------------------------

def _topology(graph: ir.Graph) -> str:
    """Name- and order-free; a model and its constant-folded twin hash alike."""
    return structural_key(graph, signature="rank", order_free=True, fold=True,
                          constant_limit=SMALL_CONSTANT)


def topology_hash(model: onnx.ModelProto) -> str:
    """The name-free structural hash of ``model`` after inlining every local function."""
    return _topology(_inlined(model).graph)


def _inlined(model: onnx.ModelProto, folder: Path | None = None) -> ir.Model:
    """``model`` with every local function inlined; external data (small constants enter
    the topology hash by value) is read from ``folder``, the model's, never the current
    directory's file of the same name."""
    m = ir.serde.deserialize_model(model)
    if folder is not None:
        ir.external_data.set_base_dir(m.graph, folder)
    if m.functions:
        InlinePass()(m)
    return m


def _facts(loaded: runtime.LoadedModel) -> tuple[ModelFacts, ir.Model]:
    """The model's facts, and the model inlined (random inputs read its tables)."""
    proto = loaded.proto
    stored = len(proto.graph.node) + sum(len(f.node) for f in proto.functions)
    try:
        model = _inlined(proto, loaded.path.parent if loaded.path is not None else None)
    except Exception as exc:
        raise fail(f"cannot inline ONNX model {loaded.label}: "
                   f"{runtime.first_line(exc)}") from exc
    histogram = collections.Counter(
        f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
        for n in model.graph.all_nodes())
    return ModelFacts(loaded.label, loaded.size_bytes, len(proto.functions), stored,
                      sum(histogram.values()), dict(sorted(histogram.items())),
                      _topology(model.graph)), model


def _random_feeds(la: runtime.LoadedModel, ma: ir.Model, lb: runtime.LoadedModel,
                  mb: ir.Model, drawn: list[str]) -> dict[str, Any]:
    """Random inputs fitting both models; an index input is drawn over the rows of the
    smaller of the two models' tables (an input of one pairs with the other's by position)."""
    ranges = index_ranges(ma)
    theirs = index_ranges(mb)
    names_b = [i.name for i in declared_inputs(lb.proto)]
    names_a = [i.name for i in declared_inputs(la.proto)]
    partner = dict(zip(feeding_names(names_a, names_b), names_b, strict=False))
    for info in declared_inputs(la.proto):
        other = theirs.get(partner[info.name]) if info.name in partner else None
        if other is not None and (info.name not in ranges or other[0] < ranges[info.name][0]):
            ranges[info.name] = other
    return random_inputs(la.proto, other=lb.proto, ranges=ranges, drawn=drawn)


# ---- compare ---------------------------------------------------------------------------------

def compare(a: runtime.OnnxModelSource, b: runtime.OnnxModelSource, inputs: Any = None, *,
            kwargs: dict[str, Any] | None = None, provider: str = "cpu",
            rtol: float | None = None, atol: float | None = None) -> CompareReport:
    """Compare ONNX models ``a`` and ``b`` (paths, ModelProtos or export results).

    ``inputs``: None (random, from ``a``'s declared inputs: see
    :func:`~onnx_modular.check.inputs.random_inputs`; the report lists what was drawn), a
    sequence in input order, or a mapping by input name; numpy arrays or torch tensors.
    ``kwargs``: keyword inputs, as a torch model took them (by input name, else in order
    after ``inputs``). Model a is the reference.
    """
    tolerances = Tolerances.checked(rtol, atol)
    la, lb = runtime.load_model(a, "model a"), runtime.load_model(b, "model b")
    (chosen,) = runtime.resolve_providers([provider])
    (fa, ma), (fb, mb) = _facts(la), _facts(lb)
    reasons: list[str] = []
    names_a = [i.name for i in declared_inputs(la.proto)]
    names_b = [i.name for i in declared_inputs(lb.proto)]
    sig_a = dict(zip(names_a, input_signature(la.proto), strict=True))
    sig_b = dict(zip(feeding_names(names_a, names_b), input_signature(lb.proto), strict=False))
    if len(names_a) != len(names_b) or any(sig_a[n] != sig_b[n] for n in sig_b):
        reasons.append(f"input signatures differ: {input_signature(la.proto)} vs "
                       f"{input_signature(lb.proto)}")
    outs_a = [o.name for o in la.proto.graph.output]
    outs_b = [o.name for o in lb.proto.graph.output]
    if len(outs_a) != len(outs_b):
        reasons.append(f"output counts differ: {len(outs_a)} vs {len(outs_b)}")
    diffs: list[OutputDiff] = []
    drawn: list[str] = []
    if not reasons:
        if inputs is None and not kwargs:
            given = _random_feeds(la, ma, lb, mb, drawn)
        else:
            given = bind_feeds(la.proto, inputs, kwargs)
        del ma, mb
        values = []
        for which, loaded, facts in (("a", la, fa), ("b", lb, fb)):
            with SessionRunner.open(loaded, chosen) as session:  # one model's weights at a time
                feed = {mine: given[theirs] for mine, theirs in zip(
                    session.input_names, feeding_names(list(given), session.input_names),
                    strict=True)}
                try:
                    out = session.run(Inputs(feeds=feed))
                except OnnxModularError as exc:
                    raise fail(f"model {which} ({loaded.label}): "
                               f"{exc.diagnostic.message}") from exc
            facts.session_s, facts.run_s = session.session_s, out.seconds
            values.append(out.values)
        for i, (x, y) in enumerate(zip(*values, strict=True)):
            c = check_value(y, x, rtol, atol)
            diffs.append(OutputDiff(i, outs_a[i], outs_b[i], c.dtype, c.rtol, c.atol, c.diff))
        modules = _by_module(la, lb, dict(given), chosen, tolerances)
    return CompareReport(fa, fb, diffs, chosen, reasons, drawn,
                         modules=None if reasons else modules)


def _by_module(la: runtime.LoadedModel, lb: runtime.LoadedModel, feeds: dict[str, Any],
               provider: str, tolerances: Tolerances) -> ModuleComparison | None:
    """Each module call's own error, where both models name their modules."""
    a = labelled_calls(la)
    b = labelled_calls(lb, reference=la.proto) if a is not None else None
    if a is None or b is None:
        return None
    arrays = {name: runtime.to_feed(value) for name, value in feeds.items()}
    try:
        return compare_modules(a, b, arrays, provider, tolerances)
    except OnnxModularError as e:  # the outputs' verdict stands; the table says why it is empty
        return ModuleComparison([], note=f"not compared: {e.diagnostic.message}")
