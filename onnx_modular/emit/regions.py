"""Cut one translated ONNX model into standalone region models, or one model of region functions.

The whole program is translated once; every ONNX node names the FX node it came from
(``pkg.torch.onnx.fx_node``), so the region of an ONNX node is the region of its FX node.
Values crossing a region border become graph outputs of the producing region and graph inputs
(same name) of each consuming region; initializers go to every region that reads them.
:func:`emit_regions` then runs each region model through the emit pipeline and holds every
accelerator model to the ops its support keeps off it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import onnx_ir as ir
import torch

from onnx_modular.diagnostics import DiagnosticContext
from onnx_modular.emit.merge import merge_equal_functions
from onnx_modular.emit.pipeline import Chains, EmitOptions, emit_model
from onnx_modular.emit.walk import all_nodes, graphs
from onnx_modular.leaves._compat import quiet_loggers
from onnx_modular.leaves._io import proto_without_initializers
from onnx_modular.leaves.errors import fail, rules
from onnx_modular.leaves.metadata import REGION_KIND, fx_name
from onnx_modular.support.operator_support import OnnxOp, OpEntry, onnx_display

SPLIT_DOMAIN = "onnx_modular.split"
_TORCH_TO_IR = {
    torch.float32: ir.DataType.FLOAT, torch.float64: ir.DataType.DOUBLE,
    torch.float16: ir.DataType.FLOAT16, torch.bfloat16: ir.DataType.BFLOAT16,
    torch.int64: ir.DataType.INT64, torch.int32: ir.DataType.INT32,
    torch.int16: ir.DataType.INT16, torch.int8: ir.DataType.INT8,
    torch.uint8: ir.DataType.UINT8, torch.bool: ir.DataType.BOOL,
    torch.complex64: ir.DataType.COMPLEX64, torch.complex128: ir.DataType.COMPLEX128,
}


@dataclasses.dataclass
class RegionGraph:
    """One region's standalone model and where its inputs come from / outputs go."""

    name: str
    kind: str  # "acc", "cpu" or "stage"
    model: ir.Model
    sources: dict[str, str]  # input name -> producing region name, or "input"
    consumers: dict[str, list[str]]  # output name -> consuming region names and/or "output"
    #: the program's weights the region reads (name -> bytes), as cut, before any folding
    weights: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def is_acc(self) -> bool:
        return self.kind != "cpu"


def copy_model(model: ir.Model) -> ir.Model:
    """A deep copy (the translation stays untouched), with local functions inlined.

    The weights are not copied: the copy's initializers hold the same tensors (nothing
    writes into a tensor; a pass that changes a weight makes a new one). A round trip
    with them would hold every weight twice more, as a proto and as its tensors.
    """
    weights = list(model.graph.initializers.values())
    proto = proto_without_initializers(model)
    with quiet_loggers("onnx_ir"):  # the weights' names are not defined in the proto
        copy = ir.serde.deserialize_model(proto)
    readers: dict[str, ir.Value] = {v.name or "": v for v in copy.graph.inputs}
    for node in ir.traversal.RecursiveGraphIterator(copy.graph):
        for value in node.inputs:
            if value is not None and value.name and value.producer() is None:
                readers.setdefault(value.name, value)
    for original in weights:
        name = str(original.name)
        value = readers.get(name) or ir.Value(name=name)
        value.type, value.shape = original.type, original.shape
        value.const_value = original.const_value
        value.metadata_props.update(original.metadata_props)
        copy.graph.initializers[name] = value
    if copy.functions:
        ir.passes.common.InlinePass()(copy)
    return copy


def _fill_type(value: ir.Value, fx_meta: Callable[[str], Any]) -> None:
    """Border values need a type; take it from the FX node's fake tensor where ONNX has none."""
    if value.type is not None and value.shape is not None:
        return
    val = fx_meta(value.name or "")
    if isinstance(val, torch.Tensor) and val.dtype in _TORCH_TO_IR:
        if value.type is None:
            value.type = ir.TensorType(_TORCH_TO_IR[val.dtype])
        if value.shape is None:
            value.shape = ir.Shape([d if isinstance(d, int) else str(d) for d in val.shape])


def _region_of_nodes(graph: ir.Graph, region_of_fx: Mapping[str, int]) -> dict[ir.Node, int]:
    """Region of each top-level node; nodes without a known FX origin join their first user."""
    region: dict[ir.Node, int] = {}
    floating: list[ir.Node] = []
    for node in graph:
        r = region_of_fx.get(fx_name(node) or "")
        if r is None:
            floating.append(node)
        else:
            region[node] = r
    top_of = _top_level_owner(graph)
    for node in reversed(floating):  # reverse order: users are placed before producers
        users = [top_of.get(u, u) for v in node.outputs for u, _ in v.uses()]
        placed = [region[u] for u in users if u in region]
        if placed:
            region[node] = min(placed)
        elif users or any(v.is_graph_output() for v in node.outputs):
            region[node] = max(region.values(), default=0)
    return region


def _is_source(node: ir.Node) -> bool:
    """A node that reads nothing (a constant): cheaper to copy than to pass between regions."""
    return (not node.inputs and len(node.outputs) == 1 and not any(
        a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
        for a in node.attributes.values()))


def _top_level_owner(graph: ir.Graph) -> dict[ir.Node, ir.Node]:
    """Nodes inside subgraphs (If/Loop/Scan bodies) -> the top-level node that owns them."""
    owner: dict[ir.Node, ir.Node] = {}
    for node in graph:
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                subs = [attr.value]
            elif attr.type == ir.AttributeType.GRAPHS:
                subs = list(attr.value)
            else:
                continue
            for sub in subs:
                for inner in ir.traversal.RecursiveGraphIterator(sub):
                    owner[inner] = node
    return owner


class _Cut:
    """One partition under way: the working copy's nodes by region and, per region, the
    values it reads from elsewhere (fresh inputs, its own copy of each weight), where its
    inputs come from and which regions (or the model's output) read its values."""

    def __init__(self, graph: ir.Graph, region_names: Sequence[tuple[str, str]],
                 region_of_fx: Mapping[str, int], fx_meta: Callable[[str], Any]) -> None:
        self.names = [name for name, _ in region_names]
        self.fx_meta = fx_meta
        self.region = _region_of_nodes(graph, region_of_fx)
        self.top_of = _top_level_owner(graph)
        n = len(region_names)
        self.nodes_of: list[list[ir.Node]] = [[] for _ in range(n)]
        for node in graph:
            if node in self.region:
                self.nodes_of[self.region[node]].append(node)
        self.initializers = set(graph.initializers.values())
        self.graph_inputs = set(graph.inputs)
        self.inputs: list[list[ir.Value]] = [[] for _ in range(n)]
        self.weights: list[list[ir.Value]] = [[] for _ in range(n)]
        self.sources: list[dict[str, str]] = [{} for _ in range(n)]
        self.consumers: list[dict[str, list[str]]] = [{} for _ in range(n)]

    def cross(self, v: ir.Value) -> None:
        """Every region reading ``v`` but not making it gets a fresh value of its name (a
        constant: its own copy of the node making it)."""
        producer = v.producer()
        p_region = self.region.get(producer) if producer is not None else None
        uses_by_region: dict[int, list[tuple[ir.Node, int]]] = {}
        for user, idx in v.uses():
            r = self.region.get(self.top_of.get(user, user))
            if r is not None:
                uses_by_region.setdefault(r, []).append((user, idx))
        for r, uses in sorted(uses_by_region.items()):
            if r == p_region:
                continue
            if producer is not None and _is_source(producer):
                self._copy_constant(producer, v, r, uses)
            else:
                self._pass(v, p_region, r, uses)
        if p_region is not None and v.is_graph_output():
            self.consumers[p_region].setdefault(v.name or "", []).append("output")

    def _copy_constant(self, producer: ir.Node, v: ir.Value, r: int,
                       uses: list[tuple[ir.Node, int]]) -> None:
        """A constant shared by several FX nodes: each region gets its own copy, an earlier
        region too (the translation made it once, for whichever came first)."""
        clone = ir.Node(producer.domain, producer.op_type, [],
                        [ir.Attr(a.name, a.type, a.value) for a in producer.attributes.values()],
                        name=f"{producer.name}_{self.names[r]}",
                        metadata_props=dict(producer.metadata_props))
        clone.outputs[0].name, clone.outputs[0].type = v.name, v.type
        clone.outputs[0].shape = v.shape
        for user, idx in uses:
            user.replace_input_with(idx, clone.outputs[0])
        self.nodes_of[r].insert(0, clone)

    def _pass(self, v: ir.Value, p_region: int | None, r: int,
              uses: list[tuple[ir.Node, int]]) -> None:
        """``v`` into region ``r``: a weight of its own, or an input from where it is made."""
        if p_region is not None and p_region > r:
            raise fail(rule=rules.TRANSLATION, reason=(
                f"ONNX value '{v.name}' of region {self.names[p_region]} is read by "
                f"the earlier region {self.names[r]}"))
        _fill_type(v, self.fx_meta)
        weight = v in self.initializers
        fresh = ir.Value(name=v.name, shape=v.shape, type=v.type,
                         const_value=v.const_value if weight else None)
        for user, idx in uses:
            user.replace_input_with(idx, fresh)
        if weight:
            self.weights[r].append(fresh)
            return
        self.inputs[r].append(fresh)
        src = "input" if v in self.graph_inputs else self.names[p_region]  # type: ignore[index]
        self.sources[r][v.name or ""] = src
        if p_region is not None:
            self.consumers[p_region].setdefault(v.name or "", []).append(self.names[r])

    def outputs(self, r: int) -> list[ir.Value]:
        """The values region ``r`` makes that another region or the model's output reads."""
        found = [v for node in self.nodes_of[r] for v in node.outputs
                 if (v.name or "") in self.consumers[r]]
        for v in found:
            _fill_type(v, self.fx_meta)
        return found

    def check_outputs(self, graph_outputs: Sequence[ir.Value]) -> None:
        """Every model output is made by a region (or is a model input, returned as is)."""
        for v in graph_outputs:
            if v in self.graph_inputs:
                continue  # a model input returned as is: the runner has it from the start
            if v.producer() is None or v.producer() not in self.region:
                raise fail(rule=rules.TRANSLATION, reason=(
                    f"model output '{v.name}' is not computed by any region (a constant "
                    "returned as is cannot be split)"))


def partition(model: ir.Model, region_names: Sequence[tuple[str, str]],
              region_of_fx: Mapping[str, int], fx_meta: Callable[[str], Any]
              ) -> list[RegionGraph]:
    """Standalone models, one per region, from a copy of the translated ``model``.

    ``region_names``: (name, kind) per region in execution order; ``region_of_fx``: FX node
    name -> region index; ``fx_meta``: FX node name -> its ``meta["val"]`` (for types).
    """
    work = copy_model(model)
    graph = work.graph
    cut = _Cut(graph, region_names, region_of_fx, fx_meta)
    graph_outputs = list(graph.outputs)
    # Every value read by a region but not made there gets a fresh value of the same name.
    values: list[ir.Value] = list(graph.inputs) + list(graph.initializers.values())
    for v in values + [v for node in graph for v in node.outputs]:
        cut.cross(v)
    outputs = [cut.outputs(r) for r in range(len(region_names))]
    cut.check_outputs(graph_outputs)
    graph.outputs.clear()
    graph.remove(list(graph), safe=False)
    result = []
    for r, (name, kind) in enumerate(region_names):
        g = ir.Graph(cut.inputs[r], outputs[r], nodes=cut.nodes_of[r],
                     initializers=cut.weights[r], opset_imports=dict(graph.opset_imports),
                     name=name)
        m = ir.Model(g, ir_version=work.ir_version, producer_name="onnx_modular",
                     producer_version=work.producer_version)
        weights = {v.name or "": v.const_value.nbytes for v in cut.weights[r]
                   if v.const_value is not None}
        result.append(RegionGraph(name, kind, m, cut.sources[r], cut.consumers[r], weights))
    return result


def single_model(model_graph: ir.Graph, regions: Sequence[RegionGraph]) -> ir.Model:
    """One model whose graph calls each region as a local function, in order.

    ``model_graph``: the whole model's graph (its inputs and outputs name the model's).
    Weights stay in the main graph, once each, and enter the region functions as inputs;
    the module functions of all regions are pooled, equal bodies merged to a fixpoint.
    """
    main_inputs = [ir.Value(name=v.name, shape=v.shape, type=v.type) for v in model_graph.inputs]
    env: dict[str, ir.Value] = {v.name or "": v for v in main_inputs}
    inits: dict[str, ir.Value] = {}
    calls: list[ir.Node] = []
    functions: dict[ir.OperatorIdentifier, ir.Function] = {}
    opsets: dict[str, int] = dict(model_graph.opset_imports)
    for region in regions:
        region_model = ir.serde.deserialize_model(ir.serde.serialize_model(region.model))
        opsets.update(region_model.opset_imports)
        _pool_functions(functions, region_model)
        rg = region_model.graph
        weights = list(rg.initializers.values())
        passed = [_main_initializer(inits, w, region.name) for w in weights]
        fn_inputs, fn_outputs, nodes = list(rg.inputs) + weights, list(rg.outputs), list(rg)
        rg.initializers.clear()
        rg.inputs.clear()
        rg.outputs.clear()
        rg.remove(nodes, safe=False)
        for w in weights:
            w.const_value = None
        for k, out in enumerate(fn_outputs):  # an output that is an input (a folded weight)
            if out.producer() is None:
                identity = ir.node("Identity", [out], name=f"{region.name}_out_{k}")
                identity.outputs[0].name = f"{out.name}__out"
                identity.outputs[0].type, identity.outputs[0].shape = out.type, out.shape
                nodes.append(identity)
                fn_outputs[k] = identity.outputs[0]
        fgraph = ir.Graph(fn_inputs, fn_outputs, nodes=nodes, opset_imports=opsets,
                          name=region.name)
        fn = ir.Function(SPLIT_DOMAIN, region.name, graph=fgraph, attributes=[])
        fn.doc_string = region.name  # never merged with another region's function
        functions[fn.identifier()] = fn
        args = [env[v.name or ""] for v in region.model.graph.inputs] + passed
        call = ir.Node(SPLIT_DOMAIN, region.name, args,
                       num_outputs=len(region.model.graph.outputs), name=region.name)
        call.metadata_props[REGION_KIND] = region.kind
        for out, ref in zip(call.outputs, region.model.graph.outputs):
            # a folded weight passed on keeps its initializer's name in the main graph
            out.name = ref.name if ref.name not in inits else f"{ref.name}__{region.name}"
            out.shape, out.type = ref.shape, ref.type
            env[ref.name or ""] = out
        calls.append(call)
    main_outputs = [env[v.name or ""] for v in model_graph.outputs]
    graph = ir.Graph(main_inputs, main_outputs, nodes=calls, initializers=list(inits.values()),
                     opset_imports={**opsets, SPLIT_DOMAIN: 1}, name="split")
    single = ir.Model(graph, ir_version=regions[0].model.ir_version if regions else 10,
                      producer_name="onnx_modular", functions=list(functions.values()))
    merge_equal_functions(single)
    return single


def _main_initializer(inits: dict[str, ir.Value], weight: ir.Value, region: str) -> ir.Value:
    """The main graph's initializer ``weight`` enters its region's call as: one per name for a
    weight several regions read, but a name another region gave another value (each part's
    translation numbers its own constants: ``val_8`` is ``[-1, 8]`` in one, ``7.0`` in the
    next) gets one of its own, or the later region would compute with the earlier's."""
    name = weight.name or ""
    kept = inits.get(name)
    if kept is not None and _same_tensor(kept, weight):
        return kept
    if kept is not None:
        name = f"{name}__{region}"
        k = 1
        while name in inits:
            name, k = f"{weight.name}__{region}_{k}", k + 1
    inits[name] = ir.Value(name=name, shape=weight.shape, type=weight.type,
                           const_value=weight.const_value)
    return inits[name]


def _same_tensor(a: ir.Value, b: ir.Value) -> bool:
    x, y = a.const_value, b.const_value
    if x is None or y is None:
        return x is y
    if x is y:
        return True
    return x.dtype == y.dtype and tuple(x.shape) == tuple(y.shape) \
        and x.tobytes() == y.tobytes()


def _pool_functions(functions: dict[ir.OperatorIdentifier, ir.Function],
                    model: ir.Model) -> None:
    """Add a region model's module functions; a name already taken gets a fresh one (equal
    bodies are merged afterwards, across regions)."""
    renames: dict[ir.OperatorIdentifier, ir.Function] = {}
    for identifier, fn in model.functions.items():
        if identifier in functions:
            k = 1
            while (fn.domain, f"{fn.name}_r{k}", fn.overload) in functions:
                k += 1
            fn.name = f"{fn.name}_r{k}"
            renames[identifier] = fn
        functions[fn.identifier()] = fn
    if renames:
        for node in list(all_nodes(model)):
            target = renames.get(node.op_identifier())
            if target is not None:
                node.op_type = target.name


def region_chains(chains: Mapping[str, tuple[Any, ...]], region_of_fx: Mapping[str, int],
                  n_regions: int) -> list[dict[str, tuple[Any, ...]]]:
    """Per region, each FX node's chain of module calls cut to the calls wholly inside it.

    A module call becomes a function of a region model only when every node of the call
    lies in that region; a call that straddles a border dissolves: its parts in the region
    sit at the region's top level, their wholly contained sub-calls still functions.
    """
    regions_of_call: dict[str, set[int]] = {}
    for name, chain in chains.items():
        r = region_of_fx.get(name)
        if r is None:
            continue
        for call in chain:
            regions_of_call.setdefault(call.call_id, set()).add(r)
    result: list[dict[str, tuple[Any, ...]]] = [{} for _ in range(n_regions)]
    for name, chain in chains.items():
        r = region_of_fx.get(name)
        if r is None:
            continue
        # the calls wholly inside r are a suffix: a call's nodes include its callees' nodes
        first = next((i for i, call in enumerate(chain)
                      if regions_of_call[call.call_id] == {r}), len(chain))
        result[r][name] = tuple(chain[first:])
    return result


def op_types_in(model: ir.Model) -> dict[tuple[str, str], list[str]]:
    """(domain, op type) -> where it occurs ("main graph", "function GPT2Block", ...): every
    node of the graph, of every function body and of their subgraphs; calls of the model's
    own functions are not ops."""
    own = set(model.functions)
    found: dict[tuple[str, str], list[str]] = {}
    for graph in graphs(model):
        where = "main graph" if graph is model.graph else f"function {graph.name}"
        for node in graph.all_nodes():
            if node.op_identifier() in own:
                continue
            domain = "" if node.domain in ("", "ai.onnx") else node.domain
            places = found.setdefault((domain, node.op_type), [])
            if where not in places:
                places.append(where)
    return found


class PlannedRegion(Protocol):
    """A region as the FX split planned it (``passes.split.Region``): its FX nodes."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def node_names(self) -> Sequence[str]: ...


@dataclasses.dataclass(frozen=True)
class AccLimits:
    """ONNX ops no accelerator model may hold, and the support's allow/deny entries (why)."""

    forbidden_ops: frozenset[OnnxOp] = frozenset()
    entries: tuple[OpEntry, ...] = ()


@dataclasses.dataclass(frozen=True)
class RegionEmission:
    """How every part's model is emitted, decided once by the split's entry point:
    ``hierarchical`` (module calls wholly in a part become functions of its model) and
    ``limits`` (the ONNX ops no accelerator model may hold)."""

    hierarchical: bool = True
    limits: AccLimits = AccLimits()

    def options(self, graph: RegionGraph) -> EmitOptions:
        """The emit pipeline's options for one part (an accelerator part avoids the ops
        its limits forbid)."""
        options = EmitOptions("all" if self.hierarchical else "none")
        if not graph.is_acc:
            return options
        return dataclasses.replace(
            options, avoid_ops=frozenset(op for _, op in self.limits.forbidden_ops))


class Translated(Protocol):
    """The translation parts are cut from (``api.spine.Lowered``): the unoptimized model,
    each FX node's module calls and the names of the program's weights."""

    @property
    def model(self) -> ir.Model: ...

    @property
    def chains(self) -> Chains: ...

    @property
    def weights(self) -> frozenset[str]: ...


def emit_regions(translated: Translated, regions: Sequence[PlannedRegion],
                 fx_meta: Callable[[str], Any], emission: RegionEmission,
                 ctx: DiagnosticContext) -> list[RegionGraph]:
    """One standalone, emitted model per region, cut from the translation.

    Each region gets its share of the chains (:func:`region_chains`); accelerator regions
    are emitted avoiding ``emission.limits.forbidden_ops`` and then checked for them.
    """
    index = {n: i for i, r in enumerate(regions) for n in r.node_names}
    graphs = partition(translated.model, [(r.name, r.kind) for r in regions], index, fx_meta)
    shares = region_chains(translated.chains, index, len(graphs))
    for graph, chain in zip(graphs, shares, strict=True):
        with ctx.scope(graph.name):
            emit_model(graph.model, chain, translated.weights, emission.options(graph), ctx)
            if graph.is_acc:
                check_acc_model(graph, emission.limits)
    return graphs


def check_acc_model(graph: RegionGraph, limits: AccLimits) -> None:
    """The final word on a denied op: the emitted acc model, function bodies included."""
    held = op_types_in(graph.model)
    for op in sorted(limits.forbidden_ops & set(held)):
        denied = any(e.onnx == op and e.kind == "deny" for e in limits.entries)
        why = (f"'{onnx_display(op)}' is denied" if denied else
               "only nodes the support keeps off the accelerator emit it")
        raise fail(rule=rules.DENIED_ON_ACC, reason=(
            f"accelerator region '{graph.name}' holds {op[1]} ({held[op][0]}) although "
            f"{why}; the emit pipeline made it from supported nodes — this is a bug, "
            "please report it (workaround: deny the ops it was made from)"))
