"""Inside ``om.hook``: ONNX Runtime's quantizers and transformers optimizer on hierarchical models.

Those tools skip local functions: ``quantize_dynamic`` of a hierarchical file wrote the fp32
model under the quantized name, the optimizer fused less. While a hook is open, a model that
holds onnx_modular's functions is inlined (every copy keeping its module labels) before the
tool works on it, so the tool does what it does to the flat export; the file it then saves is
outlined again (``om.outline``) in place. Where outlining fails the flat result stays, with a
:class:`~onnx_modular.api.hook.HookWarning`: flat, never unquantized.

The model carries a mark (a model ``metadata_props`` entry) from the inlining to the save,
across the tool's own copies and files; the save takes it off.

Optimum's ``merge_decoders`` (its post-processing of decoders exported without and with
past) builds a new model whose ``If`` branches are the two decoders' graphs, without their
local functions. While a hook is open the functions are carried into the merged model: one
copy of each function the two decoders hold alike, and those of the decoder with past that
differ under a name of their own (their calls in that branch and bodies renamed alike).
Where that fails the merged file is flat, with a ``HookWarning``.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir

from onnx_modular.api.outline import outline
from onnx_modular.diagnostics import DiagnosticContext
from onnx_modular.emit.canonical import graph_key
from onnx_modular.emit.optimize import tensor_constants
from onnx_modular.emit.scopes import inline_labelled
from onnx_modular.leaves._compat import (
    ir_save_external,
    optimum_merge_imported,
    replaced_optimum_decoder_merge,
    replaced_ort_quantization,
    replaced_transformers_optimizer,
)
from onnx_modular.leaves._io import atomic_path, save_model
from onnx_modular.leaves.metadata import LABELS, META_PATH
from onnx_modular.leaves.runtime import first_line

#: On a model inlined for a tool: the token of its outlining (``_pending``).
MARK = "onnx_modular.hook_outline"
#: ORT's quantizers re-infer shapes of a model without this entry (its inlined values need it).
_ORT_INFERRED = "onnx.infer"

#: token -> the labelled reference for outlining: the inlined model the tool read
_pending: dict[str, onnx.ModelProto | None] = {}
_pending_lock = threading.Lock()


def holds_module_functions(proto: onnx.ModelProto) -> bool:
    """Does ``proto`` hold onnx_modular's module functions (which these tools skip)?"""
    if not len(proto.functions):
        return False
    if any(p.key == LABELS for f in proto.functions for p in f.metadata_props):
        return True
    return any(p.key == META_PATH for n in proto.graph.node for p in n.metadata_props)


class Tools:
    """The tools' patches for one installation of the hook; ``active()`` is the hook
    session of the calling thread (None outside any hook)."""

    def __init__(self, active: Callable[[], Any]) -> None:
        self.active = active
        self._late: contextlib.ExitStack | None = None  # patches made after installation
        self._merge_patched = False
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        with replaced_ort_quantization(self.prepare, self.saving), \
                replaced_transformers_optimizer(self.prepare, self.prepare_source, self.saving), \
                contextlib.ExitStack() as late:
            with self._lock:
                self._late, self._merge_patched = late, False
            self.notice_libraries()
            try:
                yield
            finally:
                with self._lock:
                    self._late = None

    def notice_libraries(self) -> None:
        """Patch Optimum's decoder merge once this process has imported it: the hook opens
        before a launched ``optimum-cli`` imports it, and its merge follows its exports, so
        each hooked export looks again."""
        with self._lock:
            if self._late is None or self._merge_patched or not optimum_merge_imported():
                return
            self._late.enter_context(replaced_optimum_decoder_merge(self.merging))
            self._merge_patched = True

    # ---- before the tool ------------------------------------------------------------------

    def prepare(self, proto: Any) -> Any:
        """The inlined, marked copy of a hierarchical ``proto`` inside a hook; else ``proto``."""
        if not isinstance(proto, onnx.ModelProto) or self.active() is None \
                or not holds_module_functions(proto):
            return proto
        model = ir.serde.deserialize_model(proto)
        _inline_for_tool(model)
        flat = ir.serde.serialize_model(model)
        _set_metadata(flat, _ORT_INFERRED, None)
        # its nodes (no weights) lend their labels by tensor name to the nodes the tool
        # writes anew: a Linear that was one Gemm is all new nodes after quantization
        reference = onnx.ModelProto(graph=onnx.GraphProto(node=flat.graph.node))
        _set_metadata(flat, MARK, _register(reference))
        return flat

    def prepare_source(self, source: Any) -> tuple[str, Callable[[str | None], None]] | None:
        """For a tool that reads a file and writes one without node labels (ORT's optimized
        model): the inlined file in a temporary folder, and a callback that marks the file
        the tool wrote for outlining, with the inlined model as its labels' reference."""
        if self.active() is None:
            return None
        if isinstance(source, (str, os.PathLike)):
            proto = onnx.load(os.fspath(source), load_external_data=False)
            if not holds_module_functions(proto):
                return None
            model = ir.load(os.fspath(source))
        elif isinstance(source, onnx.ModelProto) and holds_module_functions(source):
            model = ir.serde.deserialize_model(source)
        else:
            return None
        _inline_for_tool(model)
        folder = tempfile.mkdtemp(prefix=".onnx_modular-inlined-")
        path = os.path.join(folder, "model.onnx")
        # weights inline below 2 GB: from a file with a data file, ORT's transformers
        # optimizer has ORT write its optimized model into another folder, where the weights
        # it left unchanged still name the first file's data (the load then fails)
        save_model(model, path)
        reference = onnx.load(path, load_external_data=False)
        del reference.graph.initializer[:]  # its labels are read, never its weights

        def written(result: str | None) -> None:
            try:
                if result is not None:
                    tool_file = onnx.load(result, load_external_data=False)
                    _set_metadata(tool_file, MARK, _register(reference))
                    onnx.save(tool_file, result)  # its data files as the tool wrote them
            finally:
                shutil.rmtree(folder, ignore_errors=True)

        return path, written

    # ---- after the tool -------------------------------------------------------------------

    def saving(self, proto: Any, tool: str) -> Callable[[str], None] | None:
        """Before a tool saves ``proto``: a marked model loses its mark, and what is
        returned outlines the written file."""
        if not isinstance(proto, onnx.ModelProto):
            return None
        token = _set_metadata(proto, MARK, None)
        if token is None:
            return None
        with _pending_lock:
            reference = _pending.pop(token, None)
        session = self.active()

        def outline_written(path: str) -> None:
            self._outline_in_place(Path(path), reference, tool, session)

        return outline_written

    def _outline_in_place(self, path: Path, reference: onnx.ModelProto | None, tool: str,
                          session: Any) -> None:
        functions, dedupe = ("all", True) if session is None else (
            session.options.functions, session.options.dedupe)
        try:
            result = outline(path, functions, dedupe, reference=reference,
                             ctx=DiagnosticContext())  # the session says what it found
            result.model.metadata_props.pop(MARK, None)
            _write_like_tool(result.model, path)
        except Exception as e:
            reason = (f"the {tool} model '{path}' stays flat: outlining it failed "
                      f"({type(e).__name__}: {first_line(e)})")
            if session is not None:
                session.tool_stays_flat(str(path), reason)
            return
        if session is not None:
            functions = tuple(sorted({f.name for f in result.model.functions.values()}))
            session.tool_outlined(str(path), functions, result.diagnostics)

    # ---- Optimum's decoder merge ------------------------------------------------------------

    def merging(self, decoder: onnx.ModelProto, with_past: onnx.ModelProto
                ) -> Callable[[onnx.ModelProto], Callable[[str], None] | None] | None:
        """Before ``merge_decoders`` reads the two decoders: the functions the merged model
        needs (``with_past``'s differing ones renamed in place), or, where that fails, both
        decoders inlined in place; returns what completes the merged model."""
        session = self.active()
        if session is None or not (len(decoder.functions) or len(with_past.functions)):
            return None
        domains = {f.domain for f in (*decoder.functions, *with_past.functions)}
        ir_version = max(decoder.ir_version, with_past.ir_version)
        functions: list[onnx.FunctionProto] | None = None
        reason: str | None = None
        try:
            functions = carried_functions(decoder, with_past)
        except Exception as e:
            reason = f"carrying the decoders' functions failed ({type(e).__name__}: " \
                     f"{first_line(e)})"
            try:
                for proto in (decoder, with_past):
                    _inline_in_place(proto)
            except Exception:
                return None  # Optimum's own merge, as without the hook

        def finish(merged: onnx.ModelProto) -> Callable[[str], None]:
            nonlocal reason
            if functions is not None:
                reason = _complete_merged(merged, functions, domains, ir_version)

            def saved(path: str) -> None:
                if reason is not None:
                    session.tool_stays_flat(path, f"the merged decoder '{path}' is flat: "
                                                  f"{reason}")
                else:
                    names = tuple(sorted({f.name for f in functions or ()}))
                    session.tool_outlined(path, names, [])

            return saved

        return finish


def carried_functions(first: onnx.ModelProto, second: onnx.ModelProto
                      ) -> list[onnx.FunctionProto]:
    """The functions of two models whose graphs become one model's subgraphs: one copy of
    each function both hold alike (same body up to value names and labels), and those of
    ``second`` that differ from a function of ``first`` of the same name renamed, in place,
    with their calls in ``second`` (its graph, subgraphs and function bodies). A function
    that calls a renamed one differs too; ``second``'s other functions are kept."""
    def key(f: onnx.FunctionProto) -> tuple[str, str, str]:
        return f.domain, f.name, f.overload

    own = {key(f): f for f in first.functions}
    theirs = {key(f): f for f in second.functions}
    calls = {k: {_call_key(n) for n in _all_nodes(f.node)} & theirs.keys()
             for k, f in theirs.items()}
    renamed = {k for k in theirs.keys() & own.keys() if _body_key(own[k]) != _body_key(theirs[k])}
    while True:  # a caller's body changes with its callee's name
        more = {k for k in theirs.keys() & own.keys() - renamed if calls[k] & renamed}
        if not more:
            break
        renamed |= more
    taken = {*own, *theirs}
    names: dict[tuple[str, str, str], str] = {}
    for f in second.functions:
        if key(f) in renamed:
            base = re.sub(r"_\d+$", "", f.name)
            n = 1
            while (f.domain, f"{base}_{n}", f.overload) in taken:
                n += 1
            names[key(f)] = f"{base}_{n}"
            taken.add((f.domain, names[key(f)], f.overload))
    for node in _all_nodes([*second.graph.node, *(n for f in second.functions for n in f.node)]):
        new = names.get(_call_key(node))
        if new is not None:
            node.op_type = new
    kept = []
    for f in second.functions:
        if key(f) in names:
            f.name = names[key(f)]
        if key(f) not in own:  # renamed now, or only in ``second``
            kept.append(f)
    return [*first.functions, *kept]


def _call_key(node: onnx.NodeProto) -> tuple[str, str, str]:
    return node.domain, node.op_type, node.overload


def _all_nodes(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """``nodes`` and the nodes of their subgraphs, at any depth."""
    for node in nodes:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attr.g.node)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for graph in attr.graphs:
                    yield from _all_nodes(graph.node)


def _body_key(f: onnx.FunctionProto) -> tuple[object, ...]:
    """Equal for interchangeable functions: the body's structure (not its value names or
    labels), its interface and the opsets it imports."""
    function = ir.serde.deserialize_function(f)
    return (graph_key(function.graph, signature=False), len(f.input), len(f.output),
            tuple(f.attribute), tuple(a.SerializeToString() for a in f.attribute_proto),
            tuple(sorted((o.domain, o.version) for o in f.opset_import)))


def _complete_merged(merged: onnx.ModelProto, functions: list[onnx.FunctionProto],
                     domains: set[str], ir_version: int) -> str | None:
    """Give the merged model (in place) the functions its branches call and the imports of
    their domains; None when it then checks, else why it was inlined instead."""
    merged.functions.extend(functions)
    imported = {o.domain for o in merged.opset_import}
    for f in functions:
        for o in [*f.opset_import, onnx.helper.make_opsetid(f.domain, 1)]:
            if o.domain not in imported:
                merged.opset_import.append(o)
                imported.add(o.domain)
    merged.ir_version = max(merged.ir_version, ir_version)  # the functions' fields need it
    try:
        check_merged(merged, domains)
        return None
    except Exception as e:
        reason = f"the merged model with its functions does not check ({type(e).__name__}: " \
                 f"{first_line(e)})"
    merged.CopyFrom(onnx.inliner.inline_local_functions(merged))
    return reason


def check_merged(merged: onnx.ModelProto, domains: set[str]) -> None:
    """Raise unless every call of a function domain resolves and ONNX's checker passes
    (Optimum's own check would otherwise fail, or ONNX Runtime at loading)."""
    defined = {(f.domain, f.name, f.overload) for f in merged.functions}
    every = _all_nodes([*merged.graph.node, *(n for f in merged.functions for n in f.node)])
    missing = sorted({f"{n.domain}:{n.op_type}" for n in every
                      if n.domain in domains and _call_key(n) not in defined})
    if missing:
        raise ValueError(f"calls without a function: {', '.join(missing[:4])}")
    if merged.ByteSize() < onnx.checker.MAXIMUM_PROTOBUF:  # larger ones check from the file
        onnx.checker.check_model(merged)


def _inline_for_tool(model: ir.Model) -> None:
    """Inline ``model``'s functions (module labels kept on every copy) into the form the
    tools read as they read a flat export: a body's ``Constant(value_ints=...)`` becomes
    ``Constant(value=<tensor>)``, the one form ORT's symbolic shape inference and
    ``OnnxModel.get_constant_value`` read (with the others the transformers optimizer's shape
    inference failed and it fused no ``SkipLayerNormalization``, silently)."""
    inline_labelled(model)
    tensor_constants(model.graph)  # (files of other exporters hold them too)


def _inline_in_place(proto: onnx.ModelProto) -> None:
    """Replace ``proto`` by its inlined form (module labels kept on every copy)."""
    model = ir.serde.deserialize_model(proto)
    inline_labelled(model)
    proto.CopyFrom(ir.serde.serialize_model(model))


def _register(reference: onnx.ModelProto | None) -> str:
    token = secrets.token_hex(8)
    with _pending_lock:
        _pending[token] = reference
    return token


def _set_metadata(proto: onnx.ModelProto, key: str, value: str | None) -> str | None:
    """Set (or, with None, remove) a model ``metadata_props`` entry; its old value."""
    old = None
    for i in reversed(range(len(proto.metadata_props))):
        if proto.metadata_props[i].key == key:
            old = proto.metadata_props[i].value
            del proto.metadata_props[i]
    if value is not None:
        proto.metadata_props.add(key=key, value=value)
    return old


def _write_like_tool(model: ir.Model, path: Path) -> None:
    """Write ``model`` over the tool's file as the tool wrote it: weights inline, or in the
    one data file the tool named (replaced, not added beside)."""
    written = onnx.load(str(path), load_external_data=False)
    locations = sorted({e.value for t in written.graph.initializer for e in t.external_data
                        if e.key == "location"})
    if not locations:
        save_model(model, path)
        return
    data_name = locations[0]
    # Never a model beside weights it was not written with: the new weights go in under a
    # name of their own and the model naming them replaces the tool's; only then do they
    # take the tool's name, and the model is pointed at it. Killed in between, the model
    # names a file that is not there: an error on load, never other weights.
    partial = f"{data_name}.{secrets.token_hex(4)}.partial"
    staging = Path(tempfile.mkdtemp(prefix=".onnx_modular-outlined-", dir=path.parent))
    try:
        ir_save_external(model, staging / path.name, partial)
        if not (staging / partial).exists():  # weights small enough to stay inline
            os.replace(staging / path.name, path)
            return
        os.replace(staging / partial, path.parent / partial)
        os.replace(staging / path.name, path)
        os.replace(path.parent / partial, path.parent / data_name)
        _point_data_at(path, partial, data_name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _point_data_at(path: Path, old: str, new: str) -> None:
    """Rewrite the model at ``path`` (weights left where they are) to read ``new`` where it
    read ``old``, atomically."""
    proto = onnx.load(str(path), load_external_data=False)
    for tensor in proto.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value == old:
                entry.value = new
    with atomic_path(path) as tmp:
        onnx.save(proto, str(tmp))
