"""Check an emitted model before anyone writes it: ONNX type and shape inference, strict.

torch.export does not run the model's kernels, so inputs that do not fit it (int64 ids into
a ``Linear``) export without complaint into a model that ONNX Runtime rejects. Inference
over the model and every function body finds that; the failure names the module call and
the FX node it happened in, not a file the user later finds broken.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator

import onnx
import onnx.inliner
import onnx_ir as ir

from onnx_modular.diagnostics import Location
from onnx_modular.emit.infra import EmitPass, calls_of_missing_functions, listed
from onnx_modular.leaves.errors import fail, rules
from onnx_modular.leaves.metadata import META_PATH, STACK_TRACE, fx_name

_NODE = re.compile(r"\(op_type:([^,]+), node name: ([^)]*)\)")


#: Initializers up to this size stay in the model inference sees: shapes, axes and scales
#: are data it reads (``Squeeze``'s axes, ``Reshape``'s shape); as bare inputs they would
#: hide an invalid node from it.
KEEP_BYTES = 4096


@contextlib.contextmanager
def _without_weights(model: ir.Model) -> Iterator[None]:
    """Large initializers as plain graph inputs while the model is serialized: inference
    needs their types and shapes only, and a copy of the weights would double the memory."""
    graph = model.graph
    order = list(graph.initializers.values())
    weights = [w for w in order if w.const_value is None
               or getattr(w.const_value, "nbytes", KEEP_BYTES + 1) > KEEP_BYTES]
    inputs = len(graph.inputs)
    for w in weights:
        graph.initializers.pop(w.name)  # type: ignore[arg-type]
    graph.inputs.extend(w for w in weights if w not in set(graph.inputs))
    # a small tensor kept in a data file (a model saved with external data) is read in:
    # inference cannot read data files
    external = {w: w.const_value for w in order if w not in weights
                and isinstance(w.const_value, ir.ExternalTensor)}
    for w, tensor in external.items():
        w.const_value = ir.Tensor(tensor.numpy(), name=w.name)
    try:
        yield
    finally:
        for w, tensor in external.items():
            w.const_value = tensor
        del graph.inputs[inputs:]
        graph.initializers.clear()
        for w in order:  # in their order: the file written after is the same bytes
            graph.register_initializer(w)


#: Why an export fails inference where its inlined form fails too.
EXAMPLE_HINT = "do the example inputs fit the model? eager torch would fail on them too"


def verify(model: ir.Model, what: str = "the exported model",
           hint: str | Callable[[], str] = EXAMPLE_HINT) -> None:
    """Strict type and shape inference over the model; one clear error on a failure.
    ``what`` names the model, ``hint`` says why it may be invalid when its functions
    inlined are invalid too (not an outlining defect then); a callable is asked only then."""
    with _without_weights(model):
        proto = ir.serde.serialize_model(model)
    try:
        onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True)
    except onnx.shape_inference.InferenceError as e:
        # the first line is the first failure; the lines after it are often its consequences
        text = " ".join(next((line for line in str(e).splitlines() if line.strip()),
                             str(e)).split())
        location, where = _locate(model, text)
        why = text.rsplit("):", 1)[-1].strip() or text
        hint = ("an onnx_modular defect: the same model with its functions inlined is "
                "valid; please report it" if _valid_when_inlined(proto) else
                hint if isinstance(hint, str) else hint())
        raise fail(f"{what} is invalid{where}: {why} ({hint})", rules.TRANSLATION,
                   location) from e


class Verify(EmitPass):
    """Strict ONNX type and shape inference (:func:`verify`): a model ONNX Runtime would
    reject is an error here, naming the module and FX node, before anything is written."""

    def requires(self, model: ir.Model) -> None:
        missing = calls_of_missing_functions(model)
        if missing:  # inference would fail on them with a message naming no module
            raise self.precondition_failed(
                f"every called function in the model; missing: {listed(missing)}")

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        verify(model)  # weights leave and come back as they were: nothing changes
        return ir.passes.PassResult(model, modified=False)


def _valid_when_inlined(proto: onnx.ModelProto) -> bool:
    """Does the model pass inference with every function inlined? Then outlining, not the
    example inputs, broke it (a failure path only: inlining copies every body)."""
    try:
        flat = onnx.inliner.inline_local_functions(proto)
        onnx.shape_inference.infer_shapes(flat, check_type=True, strict_mode=True)
    except Exception:  # any failure means "not shown valid"
        return False
    return True


def _locate(model: ir.Model, text: str) -> tuple[Location, str]:
    """Follow ``(op_type:X, node name: Y)`` from the main graph into function bodies."""
    graph: ir.Graph | ir.Function = model.graph
    path: list[str] = []
    node: ir.Node | None = None
    for op_type, name in _NODE.findall(text):
        node = next((n for n in graph if n.name == name and n.op_type == op_type), None)
        if node is None:
            break
        function = model.functions.get(node.op_identifier())
        if function is None:
            break
        if META_PATH in node.metadata_props:
            path.append(node.metadata_props[META_PATH])
        graph = function
    module = ".".join(p for p in path if p)
    if node is None:
        return Location(module_path=module or None), ""
    fx = fx_name(node)
    trace = node.metadata_props.get(STACK_TRACE, "")
    file, line = _last_frame(trace)
    described = f" in module '{module or '<root>'}'" + (f", node '{fx}'" if fx else "")
    return Location(module or "", fx, file, line), described


def _last_frame(trace: str) -> tuple[str | None, int | None]:
    frames = re.findall(r'File "([^"]+)", line (\d+)', trace)
    user = [f for f in frames if "/site-packages/torch/" not in f[0]]
    if not (user or frames):
        return None, None
    file, line = (user or frames)[-1]
    return file, int(line)
