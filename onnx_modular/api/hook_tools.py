"""Inside ``om.hook``: ONNX Runtime's quantizers and transformers optimizer on hierarchical models.

Those tools skip local functions: ``quantize_dynamic`` of a hierarchical file wrote the fp32
model under the quantized name, the optimizer fused less. While a hook is open, a model that
holds onnx_modular's functions is inlined (every copy keeping its module labels) before the
tool works on it, so the tool does what it does to the flat export; the file it then saves is
outlined again (``om.outline``) in place. Where outlining fails the flat result stays, with a
:class:`~onnx_modular.api.hook.HookWarning`: flat, never unquantized.

The model carries a mark (a model ``metadata_props`` entry) from the inlining to the save,
across the tool's own copies and files; the save takes it off.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir

from onnx_modular._compat import (
    ir_save_external,
    replaced_ort_quantization,
    replaced_transformers_optimizer,
)
from onnx_modular._io import save_model
from onnx_modular.api.outline import outline
from onnx_modular.emit.scopes import inline_labelled
from onnx_modular.metadata import LABELS, META_PATH
from onnx_modular.runtime import first_line

#: On a model inlined for a tool: the token of its outlining (``_pending``).
MARK = "onnx_modular.hook_outline"
#: ORT's quantizers re-infer shapes of a model without this entry (its inlined values need it).
_ORT_INFERRED = "onnx.infer"

#: token -> the labelled reference for outlining (None: the tool keeps node labels)
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

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        with replaced_ort_quantization(self.prepare, self.saving), \
                replaced_transformers_optimizer(self.prepare, self.prepare_source, self.saving):
            yield

    # ---- before the tool ------------------------------------------------------------------

    def prepare(self, proto: Any) -> Any:
        """The inlined, marked copy of a hierarchical ``proto`` inside a hook; else ``proto``."""
        if not isinstance(proto, onnx.ModelProto) or self.active() is None \
                or not holds_module_functions(proto):
            return proto
        model = ir.serde.deserialize_model(proto)
        inline_labelled(model)
        flat = ir.serde.serialize_model(model)
        _set_metadata(flat, _ORT_INFERRED, None)
        _set_metadata(flat, MARK, _register(None))
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
        inline_labelled(model)
        folder = tempfile.mkdtemp(prefix=".onnx_modular-inlined-")
        path = os.path.join(folder, "model.onnx")
        ir_save_external(model, path, "model.onnx.data")
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
            result = outline(path, functions, dedupe, reference=reference)
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
    staging = Path(tempfile.mkdtemp(prefix=".onnx_modular-outlined-", dir=path.parent))
    try:
        ir_save_external(model, staging / path.name, data_name)
        if (staging / data_name).exists():
            os.replace(staging / data_name, path.parent / data_name)
        os.replace(staging / path.name, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
