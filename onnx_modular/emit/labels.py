"""Call-independent bodies: inside a function every label is relative to the module.

A function shared by ``h.0`` ... ``h.47`` is built from the first call; written as that call
saw it, its nested calls, value names and torch.onnx's scopes would say ``h.0`` in every
layer (Netron would show layer 0's weights on layer 7, Model Explorer would draw an ``h.0``
box inside ``GPT2Block``). So a body is rewritten relative to its module when its function
is made: ``h.0.ln_1.weight`` -> ``ln_1.weight``, a nested call ``h.0.attn`` -> ``attn``,
scopes ``['', 'h.0', 'h.0.attn', 'matmul']`` -> ``['attn', 'matmul']``; inputs that are not
the module's own weights become ``input_<i>``, outputs ``output_<i>``. Only call nodes carry
absolute labels: their path, call id and scope chain (``onnx_modular.scope``, root first).

Inlining (the flat export, ``validate``'s probe) does the reverse for every copy: relative
labels + the call it is inlined for = absolute labels of that call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import onnx_ir as ir

from onnx_modular.leaves.metadata import (
    CLASS_HIERARCHY,
    LABELS,
    META_CALL,
    META_PATH,
    META_SCOPE,
    META_TYPE,
    NAME_SCOPES,
    NAMESPACE,
    CallInfo,
)

_CALL_SUFFIX = re.compile(r"(?:[@#]\d+)*$")
_QUOTED = re.compile(r"'([^']*)'")
RELATIVE = "relative"

Frame = tuple[str, str]  # (module path, qualified class)


def torch_scopes(meta: dict[str, str]) -> tuple[list[str], list[str]]:
    """torch.onnx's labels of a node: its module paths and classes, root first, the FX node
    (and its target) last."""
    return (_QUOTED.findall(meta.get(NAME_SCOPES, "")),
            _QUOTED.findall(meta.get(CLASS_HIERARCHY, "")))


def call_suffix(call_id: str) -> str:
    """``h.0@1`` -> ``@1``: the call numbers a nested call inherits from its parent."""
    return _suffix(call_id)


def _suffix(call_id: str) -> str:
    match = _CALL_SUFFIX.search(call_id)
    return match.group() if match else ""


def _join(base: str, relative: str) -> str:
    if not base:
        return relative
    return f"{base}.{relative}" if relative else base


class _Relative:
    """Paths and call ids under one call, made relative to it (and back)."""

    def __init__(self, path: str, call_id: str) -> None:
        self.path, self.suffix = path, _suffix(call_id)
        self.prefix = f"{path}." if path else ""

    def strip(self, path: str) -> str:
        if path == self.path:
            return ""
        return path[len(self.prefix):] if self.prefix and path.startswith(self.prefix) else path

    def strip_call(self, call_id: str) -> str:
        """``h.0.attn`` under ``h.0`` -> ``attn``; the call's own ``@1`` suffix is implied."""
        suffix = _suffix(call_id)
        relative = self.strip(call_id[:len(call_id) - len(suffix)])
        return relative + ("" if suffix == self.suffix else suffix)

    def add(self, relative: str) -> str:
        return _join(self.path, relative)

    def add_call(self, relative_call: str) -> str:
        suffix = _suffix(relative_call)
        return self.add(relative_call[:len(relative_call) - len(suffix)]) + (suffix or
                                                                              self.suffix)


def absolute_call(parent_path: str, parent_call_id: str, relative_path: str,
                  relative_call_id: str) -> tuple[str, str]:
    """(path, call id) of a call node inside the body of ``parent_call_id``'s function,
    whose labels are relative: ``attn`` under ``h.1@1`` -> (``h.1.attn``, ``h.1.attn@1``)."""
    rel = _Relative(parent_path, parent_call_id)
    return rel.add(relative_path), rel.add_call(relative_call_id)


def call_scope(members: list[ir.Node], call: CallInfo,
               enclosing: Sequence[CallInfo] = ()) -> list[Frame]:
    """The chain of module calls from the root to ``call``, read off its members' labels;
    where none carries torch.onnx's scopes (e.g. only folded constants), ``enclosing``
    (the calls around ``call``, outermost first) gives it, so labels stay relative."""
    for node in members:
        chain = scope_of(node)
        if chain is None:
            scopes, classes = (labels[:-1] for labels in torch_scopes(node.metadata_props))
            if not scopes or len(scopes) != len(classes):
                continue
            chain = list(zip(scopes, classes, strict=True))
        paths = [path for path, _ in chain]
        if call.module_path in paths:
            return chain[:paths.index(call.module_path) + 1]
    return [("", ""), *((c.module_path, c.module_type) for c in (*enclosing, call))]


def scope_of(node: ir.Node) -> list[Frame] | None:
    text = node.metadata_props.get(META_SCOPE)
    return [(p, c) for p, c in json.loads(text)] if text else None


def _unique(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def relativize(function: ir.Function, call: CallInfo, is_call: set[ir.OperatorIdentifier]
               ) -> None:
    """Rewrite the body of a new function (built from ``call``) relative to its module."""
    rel = _Relative(call.module_path, call.call_id)
    graph = function.graph
    inputs = set(graph.inputs)
    taken = {v.name for node in graph for v in node.outputs if v.name}
    for node in graph:
        meta = node.metadata_props
        if node.name:
            node.name = rel.strip(node.name)
        if node.op_identifier() in is_call and META_PATH in meta:
            meta[META_PATH] = rel.strip(meta[META_PATH])
            if META_CALL in meta:
                meta[META_CALL] = rel.strip_call(meta[META_CALL])
            chain = scope_of(node)
            paths = [p for p, _ in chain or ()]
            if chain is not None and call.module_path in paths:
                inner = chain[paths.index(call.module_path) + 1:]
                meta[META_SCOPE] = json.dumps([[rel.strip(p), c] for p, c in inner])
        else:
            _relative_scopes(meta, rel)
        for value in node.outputs:
            if value.name and value.name.startswith(rel.prefix or "\0"):
                value.name = rel.strip(value.name)
    for i, value in enumerate(graph.inputs):
        name = value.name or ""
        own = bool(rel.prefix) and name.startswith(rel.prefix)
        value.name = _unique(rel.strip(name) if own else f"input_{i}", taken)
    for i, value in enumerate(graph.outputs):
        if value not in inputs and not (value.name or "").startswith("output_"):
            value.name = _unique(f"output_{i}", taken)
    function.metadata_props[LABELS] = RELATIVE


def _relative_scopes(meta: dict[str, str], rel: _Relative) -> None:
    scopes = _QUOTED.findall(meta.get(NAME_SCOPES, ""))
    if rel.path not in scopes[:-1]:
        return
    depth = scopes.index(rel.path) + 1
    meta[NAME_SCOPES] = repr([rel.strip(p) for p in scopes[depth:-1]] + scopes[-1:])
    classes = _QUOTED.findall(meta.get(CLASS_HIERARCHY, ""))
    if len(classes) == len(scopes):
        meta[CLASS_HIERARCHY] = repr(classes[depth:])
    segments = meta.get(NAMESPACE, "").split("/")
    if len(segments) == len(scopes):
        parts = [seg.partition(": ") for seg in segments[depth:]]
        meta[NAMESPACE] = "/".join(
            [f"{rel.strip(p)}: {c}" for p, _, c in parts[:-1]] + segments[-1:])


def absolutize(call: ir.Node, function: ir.Function, nodes: list[ir.Node],
               is_call: set[ir.OperatorIdentifier]) -> None:
    """Labels of nodes inlined for ``call`` (whose own labels are absolute) made absolute."""
    if function.metadata_props.get(LABELS) != RELATIVE:
        return
    meta = call.metadata_props
    path, call_id = meta.get(META_PATH), meta.get(META_CALL)
    if path is None or call_id is None:
        return
    rel = _Relative(path, call_id)
    chain = scope_of(call) or [("", ""), (path, meta.get(META_TYPE, ""))]
    for node in nodes:
        own = node.metadata_props
        if node.op_identifier() in is_call and own.get(META_PATH) is not None:
            own[META_PATH] = rel.add(own[META_PATH])
            if META_CALL in own:
                own[META_CALL] = rel.add_call(own[META_CALL])
            inner = scope_of(node) or [(own[META_PATH], own.get(META_TYPE, ""))]
            own[META_SCOPE] = json.dumps([list(f) for f in chain]
                                         + [[rel.add(p), c] for p, c in inner])
            continue
        scopes = _QUOTED.findall(own.get(NAME_SCOPES, ""))
        if not scopes:
            continue
        own[NAME_SCOPES] = repr([p for p, _ in chain] + [rel.add(p) for p in scopes[:-1]]
                                + scopes[-1:])
        classes = _QUOTED.findall(own.get(CLASS_HIERARCHY, ""))
        if len(classes) == len(scopes):
            own[CLASS_HIERARCHY] = repr([c for _, c in chain] + classes)
        segments = own.get(NAMESPACE, "").split("/")
        if len(segments) == len(scopes):
            parts = [seg.partition(": ") for seg in segments[:-1]]
            own[NAMESPACE] = "/".join([f"{p}: {c}" for p, c in chain]
                                      + [f"{rel.add(p)}: {c}" for p, _, c in parts]
                                      + segments[-1:])
