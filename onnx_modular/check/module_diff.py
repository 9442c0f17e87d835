"""Module by module: where model b starts to compute other numbers than model a.

Both models are inlined with their labels (a hierarchical file, an outlined one, or a flat
torch.onnx export: every node names its module) and their nodes placed in module calls as
``om.outline`` places them (:mod:`onnx_modular.emit.scopes`). Model a runs once, every
call's inputs and outputs kept. Then every call of b that a has too runs on **a's values**
of its inputs, in one session holding a copy of each call: its error is the call's **own**,
what this module adds, not the drift it receives from the modules before it. fp32 against
int8 or fp16 says which layer the quantization hurts; a changed weight names its layer.
``validate`` feeds the same copies torch's values instead (:mod:`~onnx_modular.check.own`):
``labelled_calls`` and ``run_fed`` are shared.

Tensors pair by name (tools keep tensor names as they rewrite nodes), else by position
among the call's inputs or outputs; a call whose values cannot be paired is listed, not
compared.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass

from onnx_modular.check.numerics import Diff, check_value
from onnx_modular.check.options import Tolerances
from onnx_modular.check.overlay import GRADIENT, log_error
from onnx_modular.check.probe import node_id
from onnx_modular.diagnostics import OnnxModularError
from onnx_modular.emit.labels import absolute_call
from onnx_modular.emit.scopes import inline_labelled, labels_by_tensor_name, node_chains
from onnx_modular.leaves import runtime
from onnx_modular.leaves.metadata import META_CALL, META_PATH

__all__ = ["Fed", "Labelled", "LabelledCall", "ModuleComparison", "ModuleRow", "compare_modules",
           "labelled_calls", "node_data", "run_exposing", "run_fed"]


@dataclasses.dataclass
class ModuleRow:
    """One module call: b's own error on a's inputs (None: not compared, ``note`` says why)."""

    call_id: str
    module_type: str
    own: Diff | None
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.own is None or self.own.ok

    def to_dict(self) -> dict[str, Any]:
        return {"call_id": self.call_id, "module_type": self.module_type,
                "own": None if self.own is None else self.own.to_dict(), "note": self.note}


@dataclasses.dataclass
class ModuleComparison:
    """Every call of model a in the order calls finish (innermost first), and the first
    whose own error leaves tolerance."""

    rows: list[ModuleRow]
    note: str = ""  # why there are no rows

    @property
    def first_mismatch(self) -> str | None:
        return next((r.call_id for r in self.rows if not r.ok), None)

    def to_dict(self) -> dict[str, Any]:
        return {"first_mismatch": self.first_mismatch, "note": self.note,
                "rows": [r.to_dict() for r in self.rows]}


@dataclasses.dataclass
class LabelledCall:
    """A module call of an inlined model: its nodes, and the values crossing its edge."""

    call_id: str
    module_type: str
    nodes: list[ir.Node]
    inputs: list[ir.Value]  # activations read from outside, first use first
    outputs: list[ir.Value]  # values made inside and read outside (or model outputs)
    end: int  # position of its last node: calls finish in this order
    depth: int = 0  # nesting level: of calls ending on one node, the innermost finishes first


@dataclasses.dataclass
class Labelled:
    """A model inlined with its labels, cut into its module calls by call id."""

    model: ir.Model
    calls: dict[str, LabelledCall]
    config: dict[str, str]  # where ORT finds the model's external data
    prepack: bool = True  # False for a large model: ORT maps its weights, copying none


def labelled_calls(loaded: runtime.LoadedModel, reference: onnx.ModelProto | None = None
                   ) -> Labelled | None:
    """``loaded`` inlined with labels and cut into module calls; None when no node
    carries module labels. ``reference``: a model whose labels its unlabelled nodes take
    by tensor name (model a's, for model b: a quantizer's ``MatMulInteger`` chain ends in
    the tensor the replaced ``Gemm`` wrote, and so stays in that ``Linear``)."""
    model = ir.serde.deserialize_model(loaded.proto)
    if loaded.path is not None:
        ir.external_data.set_base_dir(model.graph, loaded.path.parent)
    if model.functions:
        inline_labelled(model)
    ShapeInferencePass(check_type=False, strict_mode=False, data_prop=False)(model)
    nodes = list(model.graph)
    if reference is not None:
        labels_by_tensor_name(nodes, reference)
    chains, found = node_chains(nodes)
    if not found.labelled:
        return None
    members: dict[str, list[int]] = {}
    types: dict[str, str] = {}
    depths: dict[str, int] = {}
    for i, chain in enumerate(chains):
        for depth, call in enumerate(chain):
            members.setdefault(call.call_id, []).append(i)
            types[call.call_id] = call.module_type
            depths[call.call_id] = depth
    outputs = set(model.graph.outputs)
    calls = {}
    for call_id, indices in members.items():
        inside = [nodes[i] for i in indices]
        own = set(inside)
        ins: dict[ir.Value, None] = {}
        outs: dict[ir.Value, None] = {}
        for node in inside:
            for v in node.inputs:
                if v is not None and v.producer() not in own and not v.is_initializer() \
                        and not _constant(v):
                    ins.setdefault(v)
            for v in node.outputs:
                if v in outputs or any(u.node not in own for u in v.uses()):
                    outs.setdefault(v)
        calls[call_id] = LabelledCall(call_id, types[call_id], inside, list(ins), list(outs),
                                      indices[-1], depths[call_id])
    return Labelled(model, calls, loaded.session_config(), prepack=not loaded.large)


def _constant(value: ir.Value) -> bool:
    """Made from initializers and constants alone (a copy of the call takes it along)."""
    producer = value.producer()
    if producer is None:
        return value.is_initializer()
    return all(v is None or _constant(v) for v in producer.inputs) and not any(
        a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
        for a in producer.attributes.values() if not a.is_ref())


def compare_modules(a: Labelled, b: Labelled, feeds: dict[str, np.ndarray], provider: str,
                    tolerances: Tolerances) -> ModuleComparison:
    """Each call of ``a`` (in finishing order) with b's own error on a's inputs."""
    rtol, atol = tolerances.rtol, tolerances.atol
    plan: Plan = []
    rows: dict[str, ModuleRow] = {}
    for call in sorted(a.calls.values(), key=lambda c: (c.end, -c.depth)):
        rows[call.call_id] = row = ModuleRow(call.call_id, call.module_type, None)
        other = b.calls.get(call.call_id)
        if other is None:
            row.note = "not in model b"
            continue
        fed = _pair(other.inputs, call.inputs)
        wanted = _pair(other.outputs, call.outputs)
        if fed is None or wanted is None:
            row.note = (f"inputs/outputs differ ({len(call.inputs)}/{len(call.outputs)} in a, "
                        f"{len(other.inputs)}/{len(other.outputs)} in b)")
            continue
        plan.append((call, other, fed, wanted))
    needed = {v.name for _, _, fed, wanted in plan for v in (*fed, *wanted)}
    values_a = run_exposing(a, needed, feeds, provider)
    results, refused = run_fed(b, [(call.call_id, other, [values_a[v.name] for v in fed])
                                   for call, other, fed, _ in plan], provider)
    for call_id, why in refused.items():
        rows[call_id].note = "not run on a's inputs: " + why
    for call, _, _, wanted in plan:
        if call.call_id not in results:
            continue
        worst: Diff | None = None
        for actual, expected in zip(results[call.call_id], wanted, strict=True):
            c = check_value(actual, values_a[expected.name], rtol, atol, same_dtype=False)
            if worst is None or (worst.ok and not c.diff.ok) or (
                    worst.ok == c.diff.ok and c.diff.max_abs > worst.max_abs):
                worst = c.diff
        rows[call.call_id].own = worst
    return ModuleComparison(list(rows.values()))


Plan = list[tuple[LabelledCall, LabelledCall, list[ir.Value], list[ir.Value]]]

#: A call to run on given values: a key, the call, and one array per input of the call
#: (``LabelledCall.inputs``, in order).
Fed = tuple[str, LabelledCall, list[np.ndarray]]


def run_fed(labelled: Labelled, fed: list[Fed], provider: str
            ) -> tuple[dict[str, list[np.ndarray]], dict[str, str]]:
    """Each call of ``labelled`` run on the values it is fed, in one session holding a copy
    of each: its outputs by key (in ``LabelledCall.outputs`` order). Where ONNX Runtime refuses
    that (a call of a quantized model reading int8 where the feed is float), each call runs
    on its own; a refused one is left out, and the second dict says why (the end of ORT's
    message)."""
    if not fed:
        return {}, {}
    try:
        model, feeds, outputs = _calls_model(labelled.model, fed)
        return _gather(_run(model, feeds, provider, labelled), outputs), {}
    except OnnxModularError:
        pass
    results: dict[str, list[np.ndarray]] = {}
    refused: dict[str, str] = {}
    for entry in fed:
        try:
            model, feeds, one = _calls_model(labelled.model, [entry])
            results.update(_gather(_run(model, feeds, provider, labelled), one))
        except OnnxModularError as e:
            refused[entry[0]] = e.diagnostic.message[-160:]
    return results, refused


def _gather(values: dict[str, np.ndarray], outputs: dict[str, list[str]]
            ) -> dict[str, list[np.ndarray]]:
    return {key: [values[name] for name in names] for key, names in outputs.items()}


def _pair(mine: Sequence[ir.Value], theirs: Sequence[ir.Value]) -> list[ir.Value] | None:
    """For each of b's values at its call's edge, a's value at the same call's edge it
    stands for: the one of the same name; one a tool renamed pairs with the one a value of
    its type and shape can only be. None where that is ambiguous (two of a kind: the order
    of first use a tool may change says nothing) or impossible: the call is not compared."""
    by_name = {v.name: v for v in theirs}
    paired: list[ir.Value | None] = [by_name.get(v.name) for v in mine]
    left = [v for v in theirs if v not in paired]
    for k, value in enumerate(mine):
        if paired[k] is not None:
            continue
        fits = [v for v in left if _alike(value, v)]
        if len(fits) != 1 or sum(_alike(other, fits[0]) for other, p in zip(mine, paired)
                                 if p is None) != 1:
            return None
        paired[k] = fits[0]
        left.remove(fits[0])
    return paired  # type: ignore[return-value]


def _alike(b: ir.Value, a: ir.Value) -> bool:
    """The same shape (as far as both are known) and a dtype b could stand for a's in (any
    float for a float: an fp16 model's value for an fp32 one's)."""
    if b.dtype != a.dtype and not (b.dtype is not None and a.dtype is not None
                                   and b.dtype.is_floating_point()
                                   and a.dtype.is_floating_point()):
        return False
    if b.shape is None or a.shape is None:
        return b.shape is None and a.shape is None
    return len(b.shape) == len(a.shape) and all(
        str(x) == str(y) for x, y in zip(b.shape, a.shape, strict=True))


def run_exposing(labelled: Labelled, names: set[str], feeds: dict[str, np.ndarray],
                 provider: str) -> dict[str, np.ndarray]:
    """Run the model once with the values ``names`` as extra outputs (and the feeds)."""
    model = labelled.model
    graph = model.graph
    kept = list(graph.outputs)
    present = {v.name for v in kept}
    values = {v.name: v for node in graph for v in node.outputs}
    values.update({v.name: v for v in graph.inputs})
    extra = [values[n] for n in sorted(names) if n in values and n not in present
             and not values[n].is_graph_input()]
    graph.outputs.extend(extra)
    try:
        out = _run(model, {k: v for k, v in feeds.items()
                           if k in {i.name for i in graph.inputs}}, provider,
                   labelled)
    finally:
        graph.outputs.clear()
        graph.outputs.extend(kept)
    out.update(feeds)
    return out


def _calls_model(model: ir.Model, fed: list[Fed]
                 ) -> tuple[onnx.ModelProto, dict[str, np.ndarray], dict[str, list[str]]]:
    """One model holding a copy of each call of ``model`` in ``fed``, its inputs fed the
    given values (cast to the float type the call reads: fp32 into an fp16 model's call);
    the feeds, and each key's output names."""
    proto = ir.serde.serialize_model(model)
    by_output = {o: n for n in proto.graph.node for o in n.output}
    inputs: list[onnx.ValueInfoProto] = []
    outputs: list[onnx.ValueInfoProto] = []
    nodes: list[onnx.NodeProto] = []
    feeds: dict[str, np.ndarray] = {}
    own_outputs: dict[str, list[str]] = {}
    initializers = {i.name for i in proto.graph.initializer}
    for k, (key, call, arrays) in enumerate(fed):
        prefix = f"call{k}/"
        edge = {v.name for v in call.inputs}
        made = {o for node in call.nodes for o in (v.name for v in node.outputs)}
        members = [by_output[next(v.name for v in n.outputs)] for n in call.nodes]
        copied = _with_constants(members, by_output, made | edge, initializers)

        def rename(name: str, prefix: str = prefix, edge: set[str] = edge,
                   local: set[str] = made) -> str:
            return prefix + name if name in edge or name in local else name

        for node in copied:
            clone = onnx.NodeProto()
            clone.CopyFrom(node)
            clone.name = prefix + node.name
            clone.input[:] = [rename(n) if n else n for n in node.input]
            clone.output[:] = [prefix + n if n else n for n in node.output]
            made.update(node.output)
            nodes.append(clone)
        for value, given in zip(call.inputs, arrays, strict=True):
            array = _as_dtype(given, value.dtype)
            feeds[prefix + value.name] = array
            inputs.append(onnx.helper.make_tensor_value_info(
                prefix + value.name, onnx.helper.np_dtype_to_tensor_dtype(array.dtype),
                list(array.shape)))
        own_outputs[key] = [prefix + v.name for v in call.outputs]
        outputs.extend(onnx.ValueInfoProto(name=prefix + v.name) for v in call.outputs)
    graph = onnx.helper.make_graph(nodes, "own_calls", inputs, outputs,
                                   list(proto.graph.initializer))
    model_proto = onnx.helper.make_model(graph, opset_imports=list(proto.opset_import),
                                         ir_version=proto.ir_version)
    return model_proto, feeds, own_outputs


def _as_dtype(array: np.ndarray, dtype: ir.DataType | None) -> np.ndarray:
    """a's value in the float type b's call reads (fp32 into an fp16 model's call)."""
    if dtype is None or not dtype.is_floating_point() or array.dtype.kind != "f":
        return array
    try:
        return array.astype(dtype.numpy(), copy=False)
    except TypeError:  # a type numpy lacks
        return array


def _with_constants(members: list[onnx.NodeProto], by_output: dict[str, onnx.NodeProto],
                    known: set[str], initializers: set[str]) -> list[onnx.NodeProto]:
    """The call's nodes and, before them, the constant nodes outside it they read."""
    extra: list[onnx.NodeProto] = []
    seen = {id(n) for n in members}
    todo = [n for node in members for n in node.input if n and n not in known
            and n not in initializers]
    while todo:
        name = todo.pop()
        node = by_output.get(name)
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        extra.append(node)
        todo.extend(n for n in node.input if n and n not in initializers)
    return [*reversed(extra), *members]


def _run(model: ir.Model | onnx.ModelProto, feeds: dict[str, np.ndarray], provider: str,
         labelled: Labelled) -> dict[str, np.ndarray]:
    proto = model if isinstance(model, onnx.ModelProto) else ir.serde.serialize_model(model)
    session, _ = runtime.make_session(proto.SerializeToString(), provider, labelled.config,
                                      fuse=False, what="the module-by-module probe",
                                      prepack=labelled.prepack)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))



def node_data(b: onnx.ModelProto, comparison: ModuleComparison) -> dict[str, Any]:
    """Model Explorer node data for model b: ``log10`` of each call's own error, on its call
    node (hierarchical b: in the main graph, or in the body of its parent's function, where
    a body many calls share shows the worst of them), or on the nodes making its outputs
    (flat b, the innermost call winning). The same ids and colors as ``validate``'s."""
    own = {r.call_id: r.own for r in comparison.rows if r.own is not None}
    picked: dict[tuple[str, str], tuple[int, float]] = {}  # (graph, node) -> (depth, value)

    def put(graph: str, node: str, call_id: str) -> None:
        diff = own.get(call_id)
        if diff is None:
            return
        depth, value = call_id.count("."), log_error(diff.max_abs)
        old = picked.get((graph, node))
        if old is None or (depth, value) > old:
            picked[(graph, node)] = (depth, value)

    main = b.graph.name or "<main>"
    if b.functions:
        for i, node in enumerate(b.graph.node):
            meta = {p.key: p.value for p in node.metadata_props}
            if META_CALL in meta:
                put(main, node_id(node, i), meta[META_CALL])
        _nested_sites(b, own, put)
    else:
        chains, _ = node_chains(list(ir.serde.deserialize_graph(b.graph)))
        nodes = list(b.graph.node)
        readers: dict[str, set[int]] = {}
        for i, node in enumerate(nodes):
            for name in node.input:
                readers.setdefault(name, set()).add(i)
        outputs = {o.name for o in b.graph.output}
        for i, (node, chain) in enumerate(zip(nodes, chains, strict=True)):
            for call in chain:  # a node making one of the call's outputs
                if any(o in outputs or any(call not in chains[r] for r in readers.get(o, ()))
                       for o in node.output):
                    put(main, node_id(node, i), call.call_id)
    data: dict[str, Any] = {}
    for (graph, node), (_, value) in sorted(picked.items()):
        entry = data.setdefault(graph, {"name": "log10 own max abs error (b on a's inputs)",
                                        "results": {}, "gradient": GRADIENT})
        entry["results"][node] = {"value": value}
    return data


def _nested_sites(b: onnx.ModelProto, own: dict[str, Diff], put: Any) -> None:
    """Call nodes inside function bodies, whose labels are relative: a body serves every
    call of its function, so each of its call nodes stands for one call per caller."""
    callers: dict[tuple[str, str], list[tuple[str, str]]] = {}  # function -> (path, call id)
    for node in b.graph.node:
        meta = {p.key: p.value for p in node.metadata_props}
        if META_CALL in meta:
            callers.setdefault((node.domain, node.op_type), []).append(
                (meta.get(META_PATH, meta[META_CALL]), meta[META_CALL]))
    todo = list(b.functions)
    while todo:  # a body's calls are known once its callers' are (any order in the file)
        ready = [f for f in todo if (f.domain, f.name) in callers]
        if not ready:
            break
        function = ready[0]
        todo.remove(function)
        graph = f"[function]{function.domain}::{function.name}"
        for i, node in enumerate(function.node):
            meta = {p.key: p.value for p in node.metadata_props}
            if META_CALL not in meta:
                continue
            for path, call_id in callers.get((function.domain, function.name), []):
                inner = absolute_call(path, call_id, meta.get(META_PATH, meta[META_CALL]),
                                      meta[META_CALL])
                put(graph, node_id(node, i), inner[1])
                callers.setdefault((node.domain, node.op_type), []).append(inner)
