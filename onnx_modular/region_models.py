"""Cut one translated ONNX model into standalone region models, or one model of region functions.

The whole program is translated once; every ONNX node names the FX node it came from
(``pkg.torch.onnx.fx_node``), so the region of an ONNX node is the region of its FX node.
Values crossing a region border become graph outputs of the producing region and graph inputs
(same name) of each consuming region; initializers go to every region that reads them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import onnx_ir as ir
import torch

from onnx_modular.diagnostics import DiagnosticContext, rules
from onnx_modular.operator_support import fx_name_of

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

    @property
    def is_acc(self) -> bool:
        return self.kind != "cpu"


def copy_model(model: ir.Model) -> ir.Model:
    """A deep copy (the translation stays untouched), with local functions inlined."""
    proto = ir.serde.serialize_model(model)
    copy = ir.serde.deserialize_model(proto)
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
        r = region_of_fx.get(fx_name_of(node) or "")
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


def partition(model: ir.Model, region_names: Sequence[tuple[str, str]],
              region_of_fx: Mapping[str, int], fx_meta: Callable[[str], Any],
              ctx: DiagnosticContext | None = None) -> list[RegionGraph]:
    """Standalone models, one per region, from a copy of the translated ``model``.

    ``region_names``: (name, kind) per region in execution order; ``region_of_fx``: FX node
    name -> region index; ``fx_meta``: FX node name -> its ``meta["val"]`` (for types).
    """
    ctx = ctx or DiagnosticContext()
    work = copy_model(model)
    graph = work.graph
    region = _region_of_nodes(graph, region_of_fx)
    top_of = _top_level_owner(graph)
    n = len(region_names)
    nodes_of: list[list[ir.Node]] = [[] for _ in range(n)]
    for node in graph:
        if node in region:
            nodes_of[region[node]].append(node)

    def region_of_use(user: ir.Node) -> int | None:
        return region.get(top_of.get(user, user))

    initializers = set(graph.initializers.values())
    graph_inputs = set(graph.inputs)
    graph_outputs = list(graph.outputs)
    new_inputs: list[list[ir.Value]] = [[] for _ in range(n)]
    new_inits: list[list[ir.Value]] = [[] for _ in range(n)]
    sources: list[dict[str, str]] = [{} for _ in range(n)]
    consumers: list[dict[str, list[str]]] = [{} for _ in range(n)]
    outputs: list[list[ir.Value]] = [[] for _ in range(n)]

    # Every value read by a region but not made there gets a fresh value of the same name.
    values: list[ir.Value] = list(graph.inputs) + list(graph.initializers.values())
    values += [v for node in graph for v in node.outputs]
    for v in values:
        producer = v.producer()
        p_region = region.get(producer) if producer is not None else None
        uses_by_region: dict[int, list[tuple[ir.Node, int]]] = {}
        for user, idx in v.uses():
            r = region_of_use(user)
            if r is not None:
                uses_by_region.setdefault(r, []).append((user, idx))
        for r, uses in sorted(uses_by_region.items()):
            if r == p_region:
                continue
            if p_region is not None and p_region > r:
                raise ctx.error(rules.TRANSLATION, reason=(
                    f"ONNX value '{v.name}' of region {region_names[p_region][0]} is read by "
                    f"the earlier region {region_names[r][0]}"))
            if producer is not None and _is_source(producer):
                # a constant shared by several FX nodes: each region gets its own copy
                clone = ir.Node(producer.domain, producer.op_type, [],
                                [ir.Attr(a.name, a.type, a.value)
                                 for a in producer.attributes.values()],
                                name=f"{producer.name}_{region_names[r][0]}",
                                metadata_props=dict(producer.metadata_props))
                clone.outputs[0].name, clone.outputs[0].type = v.name, v.type
                clone.outputs[0].shape = v.shape
                for user, idx in uses:
                    user.replace_input_with(idx, clone.outputs[0])
                nodes_of[r].insert(0, clone)
                continue
            _fill_type(v, fx_meta)
            fresh = ir.Value(name=v.name, shape=v.shape, type=v.type,
                             const_value=v.const_value if v in initializers else None)
            for user, idx in uses:
                user.replace_input_with(idx, fresh)
            if v in initializers:
                new_inits[r].append(fresh)
            else:
                new_inputs[r].append(fresh)
                src = "input" if v in graph_inputs else region_names[p_region][0]  # type: ignore[index]
                sources[r][v.name or ""] = src
                if p_region is not None:
                    consumers[p_region].setdefault(v.name or "", []).append(region_names[r][0])
        if p_region is not None and v.is_graph_output():
            consumers[p_region].setdefault(v.name or "", []).append("output")
    for r in range(n):
        made = {v for node in nodes_of[r] for v in node.outputs}
        outputs[r] = [v for node in nodes_of[r] for v in node.outputs
                      if v in made and (v.name or "") in consumers[r]]
        for v in outputs[r]:
            _fill_type(v, fx_meta)
    for v in graph_outputs:
        if v in graph_inputs:
            continue  # a model input returned as is: the runner has it from the start
        if v.producer() is None or v.producer() not in region:
            raise ctx.error(rules.TRANSLATION, reason=(
                f"model output '{v.name}' is not computed by any region (a constant returned "
                "as is cannot be split)"))

    graph.outputs.clear()
    graph.remove(list(graph), safe=False)
    result = []
    for r, (name, kind) in enumerate(region_names):
        g = ir.Graph(new_inputs[r], outputs[r], nodes=nodes_of[r], initializers=new_inits[r],
                     opset_imports=dict(graph.opset_imports), name=name)
        m = ir.Model(g, ir_version=work.ir_version, producer_name="onnx_modular",
                     producer_version=work.producer_version)
        result.append(RegionGraph(name, kind, m, sources[r], consumers[r]))
    return result


def single_model(model: ir.Model, regions: Sequence[RegionGraph]) -> ir.Model:
    """One model whose graph calls each region as a local function, in order.

    Initializers stay in the main graph, once each, and enter the functions as inputs.
    """
    work = copy_model(model)
    inits: dict[str, ir.Value] = {}
    for v in work.graph.initializers.values():
        inits[v.name or ""] = ir.Value(name=v.name, shape=v.shape, type=v.type,
                                       const_value=v.const_value)
    env: dict[str, ir.Value] = {}
    main_inputs = []
    for v in work.graph.inputs:
        fresh = ir.Value(name=v.name, shape=v.shape, type=v.type)
        main_inputs.append(fresh)
        env[v.name or ""] = fresh
    calls: list[ir.Node] = []
    functions: dict[ir.OperatorIdentifier, ir.Function] = {}
    opsets = dict(work.graph.opset_imports)
    for region in regions:  # module functions inside regions bring their own domains
        opsets.update(region.model.opset_imports)
    for region in regions:
        region_model = ir.serde.deserialize_model(ir.serde.serialize_model(region.model))
        _merge_functions(functions, region_model, region.name)
        rg = region_model.graph
        weights = list(rg.initializers.values())
        fn_inputs, fn_outputs, nodes = list(rg.inputs) + weights, list(rg.outputs), list(rg)
        rg.initializers.clear()
        rg.inputs.clear()
        rg.outputs.clear()
        rg.remove(nodes, safe=False)
        for w in weights:
            w.const_value = None
        fgraph = ir.Graph(fn_inputs, fn_outputs, nodes=nodes, opset_imports=opsets,
                          name=region.name)
        fn = ir.Function(SPLIT_DOMAIN, region.name, graph=fgraph, attributes=[])
        functions[fn.identifier()] = fn
        args = [env[v.name or ""] for v in region.model.graph.inputs]
        args += [inits[w.name or ""] for w in weights]
        call = ir.Node(SPLIT_DOMAIN, region.name, args,
                       num_outputs=len(region.model.graph.outputs), name=region.name)
        call.metadata_props["onnx_modular.region_kind"] = region.kind
        for out, ref in zip(call.outputs, region.model.graph.outputs):
            out.name, out.shape, out.type = ref.name, ref.shape, ref.type
            env[ref.name or ""] = out
        calls.append(call)
    main_outputs = [env[v.name or ""] for v in work.graph.outputs]
    used = {v.name for c in calls for v in c.inputs if v is not None}
    graph = ir.Graph(main_inputs, main_outputs, nodes=calls,
                     initializers=[v for k, v in inits.items() if k in used],
                     opset_imports={**opsets, SPLIT_DOMAIN: 1}, name="split")
    return ir.Model(graph, ir_version=work.ir_version, producer_name="onnx_modular",
                    producer_version=work.producer_version, functions=list(functions.values()))


def _merge_functions(functions: dict[ir.OperatorIdentifier, ir.Function], model: ir.Model,
                     region: str) -> None:
    """Add the module functions of a region model; same name, other body -> renamed."""
    renames: dict[ir.OperatorIdentifier, str] = {}
    for ident, fn in model.functions.items():
        known = functions.get(ident)
        if known is not None and ir.serde.serialize_function(known) != \
                ir.serde.serialize_function(fn):
            renames[ident] = f"{fn.name}_{region}"
    if renames:
        for node in ir.traversal.RecursiveGraphIterator(model.graph):
            _rename_call(node, renames)
        for fn in model.functions.values():
            for node in ir.traversal.RecursiveGraphIterator(fn):
                _rename_call(node, renames)
        for ident, new_name in renames.items():
            model.functions[ident].name = new_name
    for fn in model.functions.values():
        functions.setdefault(fn.identifier(), fn)


def _rename_call(node: ir.Node, renames: Mapping[ir.OperatorIdentifier, str]) -> None:
    new_name = renames.get((node.domain, node.op_type, node.overload))
    if new_name is not None:
        node.op_type = new_name


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
