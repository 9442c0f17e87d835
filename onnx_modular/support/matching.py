"""Does every allow/deny entry mean what the user said? Entries checked against the graph.

A deny list is a promise about the accelerator: an entry that matches no node must not pass
silently. ``aten.softmax`` matches nothing in a GPT-2 whose attention is one
``scaled_dot_product_attention`` node, yet its ONNX translation holds the Softmax the user
wanted off the accelerator; the finding says so and names the ONNX spelling that catches it.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Iterable, Mapping

import torch
import torch.fx

from onnx_modular.leaves._compat import torchlib_onnx_ops
from onnx_modular.support.onnx_index import SupportContext
from onnx_modular.support.operator_support import (
    OnnxOp,
    OpEntry,
    OperatorSupport,
    node_op_name,
    node_op_names,
    onnx_display,
    onnx_op_types,
)

#: Ops a translation uses to move data around; they say nothing about what an op computes.
_GLUE = frozenset({"Cast", "CastLike", "Constant", "ConstantOfShape", "Identity", "Shape",
                   "Size", "Reshape", "Squeeze", "Unsqueeze", "Expand", "Transpose", "Slice",
                   "Gather", "Concat", "Where", "Equal", "IsNaN", "Dropout"})


@dataclasses.dataclass(frozen=True)
class EntryFinding:
    """One entry that may not mean what the user said; ``warning`` False means a note."""

    entry: OpEntry
    warning: bool
    message: str


@functools.lru_cache(maxsize=256)
def characteristic_onnx_ops(op_name: str) -> frozenset[str]:
    """The ONNX op types that stand for a torch op (``aten.softmax`` -> Softmax): torchlib's
    translation less data-moving glue, else an ONNX op of the same name."""
    import onnx.defs

    emitted = torchlib_onnx_ops(op_name) or frozenset()
    core = frozenset(emitted - _GLUE)
    if core:
        return core
    bare = op_name.split(".")[1].lstrip("_") if "." in op_name else op_name
    by_lower = {s.name.lower(): s.name for s in onnx.defs.get_all_schemas() if s.domain == ""}
    same = by_lower.get(bare.replace("_", "").lower())
    return frozenset({same}) if same else frozenset(emitted)


def _matches(entry: OpEntry, node: torch.fx.Node, context: SupportContext) -> bool:
    if entry.onnx is not None:
        return entry.onnx in onnx_op_types(node, context)
    return entry.name in node_op_names(node)


def _who_emits(ops: Iterable[str], nodes: Iterable[torch.fx.Node],
               context: SupportContext) -> dict[str, collections.Counter[str]]:
    """ONNX op type -> (torch op -> count) of the nodes whose translation holds it."""
    wanted = set(ops)
    found: dict[str, collections.Counter[str]] = {}
    for node in nodes:
        for _, op_type in onnx_op_types(node, context):
            if op_type in wanted:
                found.setdefault(op_type, collections.Counter())[_packet(node)] += 1
    return found


def _packet(node: torch.fx.Node) -> str:
    names = node_op_names(node)
    return names[-1] if names else node_op_name(node)


def _hiding(found: Mapping[str, collections.Counter[str]]) -> str:
    """"`Softmax` is emitted by 12 `aten.scaled_dot_product_attention` nodes"."""
    parts = []
    for op_type, by in sorted(found.items()):
        who = ", ".join(f"{n} `{p}`" for p, n in by.most_common())
        total = sum(by.values())
        parts.append(f"`{op_type}` is emitted by {who} node{'s' if total != 1 else ''}")
    return "; ".join(parts)


def _remedy(found: Mapping[str, collections.Counter[str]]) -> str:
    names = ", ".join(f"`{onnx_display(('', t))}`" for t in sorted(found))
    return f"deny {names} to keep it off the accelerator"


def entry_findings(support: OperatorSupport, nodes: list[torch.fx.Node],
                   context: SupportContext | None, acc: set[torch.fx.Node]
                   ) -> list[EntryFinding]:
    """Findings for the entries of ``support`` over ``nodes`` (the compute nodes).

    A deny entry that matches no node is a warning, with where the op hides when the ONNX
    translation tells; so is a matched torch deny entry whose op's ONNX form is also emitted
    by nodes that stay on the accelerator. Unmatched allow entries are notes.
    """
    context = context or SupportContext()
    findings: list[EntryFinding] = []
    seen: set[OpEntry] = set()
    for entry in support.entries:
        if entry in seen:
            continue
        seen.add(entry)
        if entry.onnx is not None and not context.onnx_nodes:
            continue  # judged without a translation: nothing to say
        matched = [n for n in nodes if _matches(entry, n, context)]
        if entry.kind == "allow":
            if not matched:
                findings.append(EntryFinding(entry, False, (
                    f"allow entry '{entry.name}' matched no node")))
            continue
        if entry.onnx is not None:
            if not matched:
                findings.append(EntryFinding(entry, True, (
                    f"deny entry '{entry.name}' matched no node: no node's ONNX translation "
                    f"emits `{entry.onnx[1]}` (it only keeps the optimizer from making "
                    "one on the accelerator)")))
            continue
        findings.extend(_torch_deny_finding(entry, matched, nodes, context, acc))
    return findings


def _torch_deny_finding(entry: OpEntry, matched: list[torch.fx.Node],
                        nodes: list[torch.fx.Node], context: SupportContext,
                        acc: set[torch.fx.Node]) -> list[EntryFinding]:
    if not context.onnx_nodes:  # judged on FX alone: no translation to look into
        if matched:
            return []
        return [EntryFinding(entry, True, f"{entry.name} matched no node; it denies nothing")]
    ops = characteristic_onnx_ops(entry.name)
    if not matched:
        found = _who_emits(ops, [n for n in nodes if n in acc], context)
        if found:
            return [EntryFinding(entry, True, (
                f"{entry.name} matched no node; {_hiding(found)} — {_remedy(found)}"))]
        elsewhere = _who_emits(ops, nodes, context)
        if elsewhere:
            return [EntryFinding(entry, True, (
                f"{entry.name} matched no node; {_hiding(elsewhere)}, which the support "
                "keeps off the accelerator anyway"))]
        what = f" (and no node emits {', '.join(f'`{o}`' for o in sorted(ops))})" if ops else ""
        return [EntryFinding(entry, True, (
            f"{entry.name} matched no node{what}; it denies nothing"))]
    others = _who_emits(ops, [n for n in nodes if n in acc and n not in set(matched)], context)
    if others:
        return [EntryFinding(entry, True, (
            f"{entry.name} keeps {len(matched)} node(s) off the accelerator, but on it "
            f"{_hiding(others)} — {_remedy(others)}"))]
    return []


def forbidden_onnx_ops(support: OperatorSupport, nodes: Iterable[torch.fx.Node],
                       unsupported: set[torch.fx.Node], context: SupportContext | None,
                       acc_ops: set[OnnxOp]) -> frozenset[OnnxOp]:
    """ONNX ops no accelerator model may hold, so that no optimizer rewrite brings back
    what the user kept off the accelerator: the ops denied by ONNX name; those only
    unsupported nodes emit (``acc_ops``: what the acc nodes' translations hold), which is
    how a torch name is spelled in ONNX; and, where an allow list names ONNX ops, every
    default-domain op neither allowed nor already on the accelerator."""
    import onnx.defs

    denied = {e.onnx for e in support.entries if e.kind == "deny" and e.onnx is not None}
    allowed = {e.onnx for e in support.entries if e.kind == "allow" and e.onnx is not None}
    if allowed:
        every = {("", s.name) for s in onnx.defs.get_all_schemas() if s.domain == ""}
        denied |= every - allowed - acc_ops - {("", "Constant")}
    for entry in support.entries:  # aten.clamp: no rewrite may make a Clip of Min and Max
        if entry.kind == "deny" and entry.onnx is None:
            denied |= {("", op) for op in characteristic_onnx_ops(entry.name)} - acc_ops
    if context is None or not context.onnx_nodes:
        return frozenset(denied)
    made_off_acc: set[OnnxOp] = set()
    for node in nodes:
        if node in unsupported:
            made_off_acc |= onnx_op_types(node, context)
    return frozenset(denied | (made_off_acc - acc_ops))
