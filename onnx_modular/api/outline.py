"""``om.outline``: the module hierarchy put back into any ONNX model that carries its labels.

Users rarely ship the file the exporter writes: the next step quantizes it, runs ONNX
Runtime's transformers optimizer, converts it to fp16, slims it or moves its opset, and
those tools inline, drop or ignore local functions. Every node of a torch.onnx export names
its module (``pkg.torch.onnx.name_scopes``), and the tools keep most of those labels; that is
enough to outline the model again as ``om.export`` does (:mod:`onnx_modular.emit.scopes`
places what the tool added). Nothing is optimized or rewritten on the way: the result
computes what its input computed, node for node, but for what ``om.export`` does too: a size
a layer reads is computed in its body from its own activations, and bodies apart only in
float scalars are one function with attributes.
"""

from __future__ import annotations

import re

import onnx
import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass

from onnx_modular.api.arguments import FunctionSelection
from onnx_modular.api.export import ExportResult
from onnx_modular.diagnostics import DiagnosticContext, OnnxModularError, records_failures
from onnx_modular.emit.explain import annotate_differences
from onnx_modular.emit.infra import calls_of_missing_functions, listed
from onnx_modular.emit.merge import ParametrizeBeforeOptimizing
from onnx_modular.emit.outline import OutlineReport, OutlineRules, Select, outline_nodes
from onnx_modular.emit.pipeline import EmitOptions, EmitReport, report_outline
from onnx_modular.emit.scopes import (
    ScopeReport,
    inline_labelled,
    labels_by_tensor_name,
    node_chains,
    weights_next_to_readers,
)
from onnx_modular.emit.verify import verify
from onnx_modular.emit.walk import all_nodes
from onnx_modular.leaves.errors import fail, rules
from onnx_modular.leaves.runtime import (
    LoadedModel,
    OnnxModelSource,
    first_line,
    load_model,
    make_session,
)

#: ONNX IR version that holds local functions
_FUNCTIONS_IR_VERSION = 8


@records_failures
def outline(onnx_model: OnnxModelSource, functions: FunctionSelection = "all",
            dedupe: bool = True, *, reference: OnnxModelSource | None = None,
            ctx: DiagnosticContext | None = None) -> ExportResult:
    """Rebuild the module hierarchy of ``onnx_model`` (a path, ``ModelProto``, torch.onnx
    ``ONNXProgram`` or export result): one local function per module call, identical calls
    sharing one, as :func:`onnx_modular.export` makes them.

    The model needs torch.onnx's scope labels (any ``torch.onnx.export(..., dynamo=True)``
    file) or ours, also after a tool rewrote it; functions it already holds are inlined
    first. ``functions`` and ``dedupe`` as for ``om.export``. ``reference``: for a tool
    that drops every node's metadata (onnxsim, onnxslim, ``onnx.version_converter``, ONNX
    Runtime's optimized-model file), the labelled model that tool read: its labels are
    carried over to the nodes that write tensors of the same names.
    """
    assert ctx is not None  # made by @records_failures
    options = EmitOptions(functions, dedupe, optimize=False)
    select = options.selection()
    loaded = load_model(onnx_model, "model to outline")
    kept_flat: set[str] = set()  # op types ONNX Runtime cannot type inside a function
    renamed = False  # initializers renamed out of the way of ORT's generated names
    while True:
        model = ir.load(str(loaded.path)) if loaded.path is not None \
            else ir.serde.deserialize_model(loaded.proto)
        if renamed:
            _rename_generated_initializers(model)
        with ctx.scope("Outline"):
            report, found = _outline_once(model, loaded, select, dedupe, reference, kept_flat)
            refused = _ort_refusal(model) if _has_foreign_ops(model) else None
        if refused is None:
            break
        op, reason = refused
        if _REPLACED_TENSOR in reason and not renamed:
            renamed = True
            continue
        if op is None or op in kept_flat or len(kept_flat) >= _MAX_FLAT_OPS:
            raise fail(f"the outlined model of '{loaded.label}' does not load in ONNX Runtime "
                       f"(an onnx_modular defect: please report it): {reason}",
                       rules.TRANSLATION)
        kept_flat.add(op)
    if kept_flat:
        ctx.warn(rules.UNOUTLINED, reason=(
            f"ONNX Runtime cannot type {listed(sorted(kept_flat))} inside a local function; "
            "the module calls holding them stay inlined in their parents"))
    if found.inferred:
        ctx.note(rules.UNOUTLINED, reason=(
            f"{found.inferred} of {found.labelled + found.inferred} nodes carried no module "
            f"label and were placed by the nodes around them ({found.moved} moved into the "
            "call they sat inside)"))
    if found.repeated:
        ctx.note(rules.UNOUTLINED, reason=(
            "modules called more than once, told apart by the data flow: "
            + listed(found.repeated)))
    report_outline(ctx, select, report)
    return ExportResult(model, ctx.diagnostics, None, None, report)


#: ONNX Runtime's fusions inside an inlined function name the initializers they add without
#: looking at the main graph's: a model an ORT optimizer already wrote (its ``gemm_input_shape``)
#: then fails to load with this.
_REPLACED_TENSOR = "Attempt to replace the existing tensor"


def _rename_generated_initializers(model: ir.Model) -> None:
    """Initializers named as a tool generates names (no module path: ``gemm_input_shape``,
    ``val_3``) get an ``om.`` prefix, out of the way of the names ORT generates again."""
    graph = model.graph
    for value in list(graph.initializers.values()):
        if value.name and "." not in value.name and not value.is_graph_input() \
                and not value.is_graph_output():  # a model's interface keeps its names
            graph.initializers.pop(value.name)
            value.name = f"om.{value.name}"
            graph.register_initializer(value)


#: How many op types may be kept out of functions before outlining gives up.
_MAX_FLAT_OPS = 8


def _outline_once(model: ir.Model, loaded: LoadedModel, select: Select | None, dedupe: bool,
                  reference: OnnxModelSource | None, kept_flat: set[str]
                  ) -> tuple[OutlineReport, ScopeReport]:
    """One outlining of ``model``, in place; calls holding an op of ``kept_flat`` are not
    outlined (nor the calls around them)."""
    _refuse_missing_functions(model, loaded.label)
    if model.functions:
        inline_labelled(model)
    # shapes on every value, so that equal bodies key alike whatever value_info the tool
    # kept; inference failing leaves the model as it was
    ShapeInferencePass(check_type=False, strict_mode=False, data_prop=False)(model)
    weights_next_to_readers(model.graph)
    nodes = list(model.graph)
    if reference is not None:
        _labels_from(reference, nodes)
    per_node, found = node_chains(nodes)
    if not found.labelled:
        raise fail(f"cannot outline '{loaded.label}': none of its {len(nodes)} nodes "
                   "carries module labels (torch.onnx's pkg.torch.onnx.name_scopes and "
                   "class_hierarchy, written by torch.onnx.export(..., dynamo=True), or "
                   "onnx_modular's call labels); where a tool dropped them (onnxsim, "
                   "onnxslim, the version converter, ORT's optimized model), give the "
                   "labelled file it read as reference= (--reference)",
                   rules.UNSUPPORTED_INPUT)
    flat = {c.call_id for node, chain in zip(nodes, per_node)
            if node.op_type in kept_flat for c in chain}
    if select is not None or flat:
        per_node = [tuple(c for c in chain if c.call_id not in flat
                          and (select is None or select(c))) for chain in per_node]
    try:
        report = outline_nodes(model, nodes, per_node, OutlineRules(
            dedupe=dedupe, own_sizes=True, shared_to_caller=True))
    except ValueError as e:  # a placement the graph cannot take (a cycle): a defect of ours
        raise fail(f"cannot outline '{loaded.label}': {first_line(e)} (an onnx_modular "
                   "defect: please report it)", rules.TRANSLATION) from e
    if model.functions and (model.ir_version or 0) < _FUNCTIONS_IR_VERSION:
        model.ir_version = _FUNCTIONS_IR_VERSION
    if dedupe:  # layers apart only in float scalars (eps, a slope): one function, as export
        ParametrizeBeforeOptimizing(EmitReport(outline=report))(model)  # makes them
        annotate_differences(model)
    if not _has_foreign_ops(model):
        verify(model, f"the outlined '{loaded.label}'",  # strict, as every model we write
               lambda: _why_invalid(loaded.proto))
    return report, found


def _why_invalid(given: onnx.ModelProto) -> str:
    """Why an outlined model fails strict inference: the file as given fails it too (a
    tool broke it), or it does not (outlining did: a defect of ours)."""
    try:
        onnx.shape_inference.infer_shapes(given, check_type=True, strict_mode=True)
    except Exception:
        return ("the file as given fails this check too: the tool that wrote it may have "
                "broken it; onnx.checker.check_model(path, full_check=True) tells")
    return "the file as given passes it: an onnx_modular defect; please report it"


def _has_foreign_ops(model: ir.Model) -> bool:
    """Ops outside the ONNX standard (ONNX Runtime's fused and quantized operators): ONNX's
    inference cannot type them, ONNX Runtime is the judge of such a model."""
    local = set(model.functions)
    return any(n.op_identifier() not in local and not onnx.defs.has(n.op_type, n.domain)
               for n in all_nodes(model))


_OP_IN_ERROR = re.compile(r"op_type:([A-Za-z0-9_]+), node name: [^)]*\)")


def _ort_refusal(model: ir.Model) -> tuple[str | None, str] | None:
    """None when ONNX Runtime loads the outlined model; else the innermost op it could not
    type inside a function (or None) and its first line."""
    try:
        make_session(ir.serde.serialize_model(model).SerializeToString(),
                     "CPUExecutionProvider", what="the outlined model")
    except OnnxModularError as e:
        full = str(e.__cause__ or e).strip()
        ops = _OP_IN_ERROR.findall(full.splitlines()[0])  # the first failure: outermost
        # call first, the op that failed last
        if _REPLACED_TENSOR in full:
            return None, _REPLACED_TENSOR
        return (ops[-1] if ops else None), first_line(e)
    return None


def _labels_from(reference: OnnxModelSource, nodes: list[ir.Node]) -> int:
    """Labels of the reference's nodes by tensor name (:func:`labels_by_tensor_name`)."""
    loaded = load_model(reference, "reference model")
    carried = labels_by_tensor_name(nodes, loaded.proto)
    if carried is None:
        raise fail(f"the reference '{loaded.label}' carries no torch.onnx module labels "
                   "either: give the file torch.onnx.export(..., dynamo=True) wrote",
                   rules.UNSUPPORTED_INPUT)
    return carried


def _refuse_missing_functions(model: ir.Model, label: str) -> None:
    """A call of a function the model does not define (``onnx.version_converter`` drops
    them) computes nothing anyone can name: one line, before anything else."""
    missing = calls_of_missing_functions(model)
    if missing:
        raise fail(f"cannot outline '{label}': it calls functions it does not define "
                   f"({listed(missing)}); a tool dropped them (onnx.version_converter "
                   "does): run that tool on the flat model, then outline its result",
                   rules.UNSUPPORTED_INPUT)
