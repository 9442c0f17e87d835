"""Inline module functions so that every copy names the module call it stands for.

A function shared by several calls is built from the first of them: the calls nested in its
body, and torch.onnx's ``name_scopes`` of its nodes, name that first call (``layers.0.fc``).
Inlined for ``layers.1``, they must say ``layers.1.fc``, or the flat model labels two calls
alike and whoever reads the labels (a debugger, ``validate``'s localization) picks the wrong
module. Each function records the call it was built from; inlining moves the labels of
every copy from that call to the actual one.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import onnx_ir as ir

from onnx_modular._compat import ObservedInlinePass
from onnx_modular.metadata import (
    CLASS_HIERARCHY,
    META_CALL,
    META_PATH,
    META_TYPE,
    NAME_SCOPES,
    NAMESPACE,
    ORIGIN_CALL,
    ORIGIN_PATH,
)

_CALL_SUFFIX = re.compile(r"(?:[@#]\d+)*$")
_QUOTED = re.compile(r"'([^']*)'")


def record_origin(function: ir.Function, module_path: str, call_id: str) -> None:
    function.metadata_props[ORIGIN_PATH] = module_path
    function.metadata_props[ORIGIN_CALL] = call_id


class _Move:
    """Labels of the call a body was built from -> those of the call it is inlined for.

    Paths move by prefix (``layers.0.fc`` -> ``layers.1.fc``); a nested call id takes the
    actual call's suffix where it had the origin's: inlined for the second call of one
    instance (``shared@1``), the nested ``shared.fc`` becomes ``shared.fc@1``, as
    torch.export names it.
    """

    def __init__(self, origin_path: str, path: str, origin_call: str, call: str) -> None:
        self.origin_path, self.new_path = origin_path, path
        self.origin_suffix = _suffix(origin_call)
        self.new_suffix = _suffix(call)

    def _inside(self, path: str) -> bool:
        return path == self.origin_path or path.startswith(self.origin_path + ".")

    def path(self, path: str) -> str:
        return self.new_path + path[len(self.origin_path):] if self._inside(path) else path

    def call(self, call_id: str) -> str:
        suffix = _suffix(call_id)
        path = call_id[:len(call_id) - len(suffix)]
        if not self._inside(path):
            return call_id
        return self.path(path) + (self.new_suffix if suffix == self.origin_suffix else suffix)


def _suffix(call_id: str) -> str:
    match = _CALL_SUFFIX.search(call_id)
    return match.group() if match else ""


Frame = tuple[str, str]  # (module path, qualified class) of a call, root first


def _retrace(meta: dict[str, str], chain: list[Frame], origin: str, move: _Move) -> None:
    """torch.onnx's scope lists: the calls above the origin become the actual call's chain.

    ``name_scopes`` ``['', 'model', 'model.h.0', 'add_5']`` inlined for ``model.h.1`` reads
    ``['', 'model', 'model.h.1', 'add_5']``; ``class_hierarchy`` and ``namespace`` follow.
    """
    scopes = _QUOTED.findall(meta.get(NAME_SCOPES, ""))
    if origin not in scopes:
        return
    k = scopes.index(origin)
    tail = [move.path(p) for p in scopes[k + 1:]]
    meta[NAME_SCOPES] = repr([path for path, _ in chain] + tail)
    classes = _QUOTED.findall(meta.get(CLASS_HIERARCHY, ""))
    if len(classes) == len(scopes):
        meta[CLASS_HIERARCHY] = repr([cls for _, cls in chain] + classes[k + 1:])
    segments = meta.get(NAMESPACE, "").split("/")
    if len(segments) == len(scopes):
        meta[NAMESPACE] = "/".join([f"{path}: {cls}" for path, cls in chain]
                                   + [f"{move.path(p)}: {c}" for p, _, c in
                                      (seg.partition(": ") for seg in segments[k + 1:])])


class RebasingInlinePass(ObservedInlinePass):
    """onnx_ir's inliner; every inlined node's module labels name the call it was inlined for.

    Calls are inlined outside in, so a call node is already rebased when its own body is
    expanded; the cloner gives primitive nodes the call node's labels, and nested calls and
    torch.onnx's scope lists are moved here.
    """

    def __init__(self, criteria: Callable[[ir.Function], bool] | None = None) -> None:
        super().__init__(criteria)
        self._chains: dict[ir.Node, list[Frame]] = {}  # call node -> its calls, root first

    def _chain_of(self, node: ir.Node, inlined: list[ir.Node]) -> list[Frame]:
        """The call's chain; a main-graph call's root frame is read off torch.onnx's scopes."""
        chain = self._chains.get(node)
        if chain is not None:
            return chain
        root: Frame = ("", "")
        for n in inlined:
            scopes = _QUOTED.findall(n.metadata_props.get(NAME_SCOPES, ""))
            classes = _QUOTED.findall(n.metadata_props.get(CLASS_HIERARCHY, ""))
            if scopes and classes:
                root = (scopes[0], classes[0])
                break
        meta = node.metadata_props
        return [root, (meta.get(META_PATH, ""), meta.get(META_TYPE, ""))]

    def expanded(self, node: ir.Node, function: ir.Function, nodes: list[ir.Node]) -> None:
        origin_path = function.metadata_props.get(ORIGIN_PATH)
        origin_call = function.metadata_props.get(ORIGIN_CALL)
        path = node.metadata_props.get(META_PATH)
        call = node.metadata_props.get(META_CALL)
        if origin_path is None or origin_call is None or path is None or call is None:
            return
        move = _Move(origin_path, path, origin_call, call)
        chain = self._chain_of(node, nodes)
        for inlined in nodes:
            meta = inlined.metadata_props
            if self.function_of(inlined) is not None:  # a nested call: its own labels
                if META_PATH in meta:
                    meta[META_PATH] = move.path(meta[META_PATH])
                if META_CALL in meta:
                    meta[META_CALL] = move.call(meta[META_CALL])
                self._chains[inlined] = [*chain, (meta.get(META_PATH, ""),
                                                  meta.get(META_TYPE, ""))]
            else:
                _retrace(meta, chain, origin_path, move)
