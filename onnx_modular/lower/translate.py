"""FX -> ONNX, once, with torch.onnx's exporter (no optimization yet).

Every ONNX node it produces records the FX node it came from in ``pkg.torch.onnx.fx_node``;
the outliner relies on that, and the optimizer would drop it, so optimization comes later.

``torch.onnx.export`` rebuilds its table of torchlib translations on every call (about 0.4 s,
a sixth of a 48-layer export); we build it once per opset and hand it to the exporter's entry
point, falling back to the public call where that entry point is not there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Any

import onnx
import onnx.version_converter
import onnx_ir as ir
import torch
from onnx_ir.passes.common import InlinePass

from onnx_modular.diagnostics import DiagnosticContext, Location
from onnx_modular.leaves._compat import (
    export_window,
    fixed_size,
    quiet_libraries,
    torch_onnx_export,
)
from onnx_modular.leaves.errors import fail, rules
from onnx_modular.leaves.metadata import NO_MODULE, STACK_TRACE
from onnx_modular.lower import repeats

# torchlib's opset: below it torch.onnx converts the model down, dropping node metadata.
MIN_HIERARCHICAL_OPSET = 18


#: The oldest default-domain opset ONNX Runtime runs.
MIN_OPSET = 7


def check_opset(opset: int | None, *, flat: bool, what: str = "a hierarchical model") -> None:
    """Before any work: an opset must be one the installed onnx defines; below 18 torch.onnx
    translates at 18 and converts down with onnx's C converter, which neither knows
    functions nor keeps the node metadata that outlining and splitting follow, so only a
    flat export can go there (as far as the converter has adapters for its ops)."""
    if opset is None:
        return
    newest = onnx.defs.onnx_opset_version()
    if isinstance(opset, bool) or not isinstance(opset, int) \
            or not MIN_OPSET <= opset <= newest:
        raise fail(rule=rules.TRANSLATION, reason=(
            f"opset {opset!r:.20} is not an ONNX opset this onnx can emit: give "
            f"{MIN_OPSET}..{newest}"))
    if opset >= MIN_HIERARCHICAL_OPSET or flat:
        return
    remedy = ("; use opset >= 18, or functions='none' for a flat model, which onnx's version "
              "converter takes below 18 as far as it has adapters for the model's ops"
              if what == "a hierarchical model" else "; use opset >= 18")
    raise fail(rule=rules.UNSUPPORTED_INPUT, reason=(
        f"opset {opset} is below {MIN_HIERARCHICAL_OPSET}, the lowest {what} can be "
        f"emitted at{remedy}"))


_NO_ADAPTER = re.compile(r"No Adapter (?:From|For) Version \$?(\d+) for (\w+)", re.I)


def _conversion_failure(model: ir.Model, opset: int) -> str:
    """Why onnx's version converter cannot take ``model`` to ``opset`` (torch.onnx logs it
    with a traceback and keeps the model as it was): the op without an adapter, and how
    low the model does go."""
    try:
        onnx.version_converter.convert_version(ir.serde.serialize_model(model), opset)
    except Exception as e:
        text = str(e)
        match = _NO_ADAPTER.search(text)
        if match:
            version, op = match.groups()
            return (f"onnx's version converter has no adapter taking {op} below opset "
                    f"{version}; the lowest opset this model reaches is {version}")
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return lines[-1][:200] if lines else type(e).__name__
    return "the converter failed inside torch.onnx"


@dataclasses.dataclass
class Translation:
    model: ir.Model
    program: torch.export.ExportedProgram  # the decomposed program the model came from


def quiet_torch_onnx() -> contextlib.AbstractContextManager[None]:
    """torch.onnx prints progress, logs and warns (torchvision, the version converter's
    traceback); translate() reports failures as one line instead."""
    return quiet_libraries()


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Translation names the node it failed on; decomposition (FX interpreter) names the node too.
_FAILED_NODE = re.compile(
    r"(?:Error when translating node|While executing) %(\w+) : .*?target=([\w.:]+)")


def _failure(error: BaseException, program: torch.export.ExportedProgram) -> tuple[str, Location]:
    """One line for a torch.onnx failure, and where it is.

    torch.onnx's message is a page of advice ending in "Refer to the full stack trace"; the
    facts are in the chained causes: the FX node it was translating (ConversionError) and,
    innermost, why (e.g. "No ONNX function found for <OpOverload(...)>").
    """
    causes: list[BaseException] = []
    seen: BaseException | None = error
    while seen is not None and seen not in causes:
        causes.append(seen)
        seen = seen.__cause__ or seen.__context__
    node_name = target = None
    for cause in causes:
        match = _FAILED_NODE.search(str(cause))
        if match:
            node_name, target = match.groups()
            break
    root = next((c for c in reversed(causes) if str(c).strip()), error)
    lines = [_ANSI.sub("", line).strip() for line in str(root).strip().splitlines()]
    why = next((line for line in lines if line), type(root).__name__)
    if node_name is None:
        return why, Location()
    # A node made by decomposition is not in ``program``: torch.onnx was holding it when it
    # failed, so it is found in the frames of the failure; it carries the module stack.
    node = next((n for n in program.graph.nodes if n.name == node_name), None) \
        or _node_in_tracebacks(causes, node_name)
    location = Location(fx_node=node_name)
    if node is not None:
        location = Location.of_node(node, innermost_module(node))
    return f"node '{node_name}' ({target}): {why}", location


def innermost_module(node: torch.fx.Node) -> str:
    """The module path of the innermost call a node ran in ("" for the model itself)."""
    paths = [str(v[0]) for v in (node.meta.get("nn_module_stack") or {}).values()
             if isinstance(v, tuple) and v[0] != NO_MODULE]
    return paths[-1] if paths else ""


def _node_in_tracebacks(causes: list[BaseException], name: str) -> torch.fx.Node | None:
    for cause in causes:
        tb = cause.__traceback__
        while tb is not None:
            for value in tb.tb_frame.f_locals.values():
                if isinstance(value, torch.fx.Node) and value.name == name:
                    return value
            tb = tb.tb_next
    return None


def translate(program: torch.export.ExportedProgram, *, opset: int | None = None,
              ctx: DiagnosticContext | None = None, once: bool = True) -> Translation:
    """``once``: decompose each distinct module call once (:mod:`.repeats`)."""
    ctx = ctx if ctx is not None else DiagnosticContext()
    try:
        # no autograd, as capture.py: decomposing with it on changes strides (T5 with SDPA)
        with quiet_torch_onnx(), export_window(), torch.no_grad():
            onnx_program = _translate_once(program, opset) if once else None
            if onnx_program is None:
                onnx_program = torch_onnx_export(program, opset)
    except Exception as e:
        detail, location = _failure(e, program)
        raise fail(rule=rules.TRANSLATION, location=location, reason=(
            f"torch.onnx could not translate the program: {detail}")) from e
    assert onnx_program.exported_program is not None
    reached = onnx_program.model.opset_imports.get("")
    if opset is not None and reached != opset:
        # torch.onnx translates at its own opset and converts; when conversion fails it keeps
        # the model unconverted yet uses ops of the newer opset: an invalid model.
        raise fail(rule=rules.TRANSLATION, reason=(
            f"torch.onnx could not convert the model to opset {opset} (it stays at opset "
            f"{reached}): {_conversion_failure(onnx_program.model, opset)}"))
    stable_stack_traces(onnx_program.model)
    inline_translator_functions(onnx_program.model)
    pin_fixed_dims(onnx_program.model, onnx_program.exported_program, ctx)
    return Translation(onnx_program.model, onnx_program.exported_program)


def pin_fixed_dims(model: ir.Model, program: torch.export.ExportedProgram,
                   ctx: DiagnosticContext) -> None:
    """Input dimensions that were symbolic in torch.export's program but that the
    decomposed program holds fixed (a guard of the program, which ONNX does not carry,
    fixed them: Dinov2 with registers computes its position grid in Python; the
    decomposition then has the size as a number, or torch.onnx's a symbol whose range is
    one value) are written as those numbers, so a runtime refuses other sizes instead of
    computing other numbers; a warning names each."""
    fixed: dict[str, dict[int, int]] = {}
    for node in program.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(val, torch.Tensor):
            sizes = {axis: fixed_size(d, program.range_constraints)
                     for axis, d in enumerate(val.shape)}
            fixed[node.name] = {axis: size for axis, size in sizes.items() if size is not None}
    for name, axis, size in _pin(model, fixed):
        ctx.warn(rules.UNSUPPORTED_INPUT, Location(module_path=""), reason=(
            f"dynamic_shapes: input '{name}' axis {axis} was marked dynamic, but the "
            f"program holds only for size {size} (a guard of torch.export's program, which "
            "ONNX cannot check, fixes it: the model computes with that size in Python); "
            f"the file declares {size} there, so ONNX Runtime refuses other sizes instead "
            "of computing other numbers"))


def _pin(model: ir.Model, fixed: dict[str, dict[int, int]]) -> list[tuple[str, int, int]]:
    """``fixed`` (input name -> axis -> size) made static, and every symbolic dimension
    named after a number (``"32"``, as torch.onnx names such a size), intermediate values'
    too; returns the graph inputs' (name, axis, size) so made."""
    pinned: list[tuple[str, int, int]] = []
    inputs = set(model.graph.inputs)
    for value in [*model.graph.inputs, *(v for n in model.graph.all_nodes() for v in n.outputs)]:
        if value.shape is None:
            continue
        sizes = fixed.get(str(value.name), {}) if value in inputs else {}
        dims = list(value.shape)
        for axis, dim in enumerate(dims):
            if isinstance(dim, int):
                continue
            size = sizes.get(axis, _numbered(dim))
            if size is not None:
                dims[axis] = size
                if value in inputs:
                    pinned.append((str(value.name), axis, size))
        if dims != list(value.shape):
            value.shape = ir.Shape(dims)
    return pinned


def _numbered(dim: object) -> int | None:
    """The size a symbolic dimension named after a number stands for (``"32"``)."""
    name = getattr(dim, "value", None)
    return int(name) if isinstance(name, str) and name.isdigit() else None


def _translate_once(program: torch.export.ExportedProgram, opset: int | None) -> Any:
    """torch.onnx's export with repeated calls decomposed once; None when nothing repeats or
    this torch.onnx cannot be split into its two steps."""
    reduced = repeats.reduce(program)
    if reduced is None:
        return None
    program, plan = reduced
    try:
        return torch_onnx_export(program, opset, between=lambda d: repeats.expand(d, plan))
    except NotImplementedError:
        return None
    finally:
        plan.release()


_GENERATED_FILE = re.compile(r"<eval_with_key>\.\d+")


def inline_translator_functions(model: ir.Model) -> None:
    """Functions the translation holds already (torchlib's helpers under onnxscript < 0.7:
    ``aten_split``, ``aten_getitem``; an ``invoke_subgraph`` body) are inlined: the module
    hierarchy decides the functions, and onnx_ir's inliner gives each copy its call's FX
    labels, so it lands in the module that call ran in."""
    if model.functions:
        InlinePass()(model)
        model.functions.clear()


def stable_stack_traces(model: ir.Model) -> None:
    """Source locations in generated code (torch.cond branches, a GraphModule as the model)
    name ``<eval_with_key>.N``, N counting FX compilations in this process: without the
    number the same export gives the same bytes (invariant 6)."""
    for node in model.graph.all_nodes():
        trace = node.metadata_props.get(STACK_TRACE)
        if trace and "<eval_with_key>." in trace:
            node.metadata_props[STACK_TRACE] = _GENERATED_FILE.sub("<eval_with_key>", trace)
