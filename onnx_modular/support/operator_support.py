"""Which FX nodes an accelerator runs: op-name lists, callables, ONNX Runtime kernel registries.

An :class:`OperatorSupport` answers one question per FX node of a decomposed program, and
says why. It is built from a callable, from allow or deny lists of op names (``aten.gelu.default``,
the whole packet ``aten.gelu``, or an ONNX op ``onnx::Softmax``), from combinations of those
(``&``, ``|``, ``~``), or from an ONNX Runtime execution provider
(``"ort:CUDAExecutionProvider"``): then a node is supported when every ONNX node it translates
to has a kernel registered for that provider. ONNX names and providers are judged on the
ONNX nodes each FX node becomes (a user thinks "Softmax", the graph may say
``scaled_dot_product_attention``); the splitter hands them over in a :class:`SupportContext`.
"""

from __future__ import annotations

import dataclasses
import json
import operator
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TypeAlias

import torch
import torch.fx
from torch.fx.passes.operator_support import OperatorSupportBase

from onnx_modular.leaves._compat import OpOverload, OpOverloadPacket, qualified_name
from onnx_modular.leaves.errors import fail
from onnx_modular.support.onnx_index import SupportContext
from onnx_modular.support.ort_kernels import ort_kernel_registry

#: FX ops that compute something; placeholders, get_attr and output never run on a device.
CALLABLE_OPS = frozenset({"call_function", "call_method", "call_module"})
ORT_PREFIX = "ort:"
_GETITEM_NAMES = ("getitem", "operator.getitem", "_operator.getitem")


# ---- op names --------------------------------------------------------------------------------

#: Prefixes that name an ONNX op in the default domain (``onnx::Softmax``).
ONNX_PREFIXES = ("onnx::", "ai.onnx::")
#: ONNX ops every backend runs (folded into initializers); an allow list need not name them.
_ALWAYS_ALLOWED = frozenset({("", "Constant")})

OnnxOp = tuple[str, str]  # (domain, op_type); the default domain is ""


def normalize_op_name(name: str) -> str:
    """``torch.ops.aten.gelu.default`` / ``aten::gelu.default`` -> ``aten.gelu.default``."""
    name = name.strip()
    name = name.removeprefix("torch.ops.")
    name = name.replace("::", ".")
    if name in _GETITEM_NAMES:
        return "getitem"
    return name


def parse_onnx_name(name: str) -> OnnxOp | None:
    """``onnx::Softmax`` -> ``("", "Softmax")``; ``com.microsoft::Gelu`` -> its domain and
    op; ``None`` for a torch operator name (``aten.gelu``, ``aten::gelu``)."""
    name = name.strip()
    for prefix in ONNX_PREFIXES:
        if name.startswith(prefix):
            return "", name[len(prefix):]
    domain, sep, op = name.partition("::")
    if sep and "." in domain and op and "." not in op:  # an ONNX domain is dotted
        return domain, op
    return None


def onnx_display(op: OnnxOp) -> str:
    """How previews and messages write an ONNX op: ``onnx::Softmax``."""
    domain, op_type = op
    return f"{domain or 'onnx'}::{op_type}"


def _domain_key(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def _check_onnx_name(op: OnnxOp, raw: str) -> None:
    """A default-domain op must exist in ONNX, so ``onnx::SoftMax`` is no silent no-op."""
    import difflib

    import onnx.defs

    domain, op_type = op
    if not op_type or not op_type.replace("_", "").isalnum():
        raise fail(f"'{raw}' is not an ONNX operator name; expected e.g. 'onnx::Softmax'")
    if domain == "" and not onnx.defs.has(op_type):
        known = sorted({s.name for s in onnx.defs.get_all_schemas() if s.domain == ""})
        near = difflib.get_close_matches(op_type, known, n=1)
        hint = f" (did you mean 'onnx::{near[0]}'?)" if near else ""
        raise fail(f"unknown ONNX operator '{raw}': the default ONNX domain has no "
                   f"'{op_type}'{hint}")


def node_op_names(node: torch.fx.Node) -> tuple[str, ...]:
    """The names a node answers to, most specific first: overload, then packet."""
    target = node.target
    if node.op == "call_function":
        if target is operator.getitem:
            return ("getitem",)
        if isinstance(target, OpOverload):
            return (str(target), str(target.overloadpacket))
        if isinstance(target, OpOverloadPacket):
            return (str(target),)
        qualified = qualified_name(target)
        return (qualified.removeprefix("torch.ops."),)
    if node.op == "call_method":
        return (f"Tensor.{target}",)
    if node.op == "call_module":
        return (str(target),)
    return ()


def node_op_name(node: torch.fx.Node) -> str:
    """The most specific name of the node's operator, as previews and errors show it."""
    names = node_op_names(node)
    return names[0] if names else node.op


def onnx_op_types(node: torch.fx.Node, context: SupportContext) -> set[OnnxOp]:
    """(domain, op type) of every ONNX node the FX node becomes, subgraphs included."""
    import onnx_ir as ir

    found: set[OnnxOp] = set()
    for onnx_node in context.onnx_nodes.get(node.name, ()):
        found.add((_domain_key(onnx_node.domain), onnx_node.op_type))
        for attr in onnx_node.attributes.values():
            graphs = ([attr.value] if attr.type == ir.AttributeType.GRAPH else
                      list(attr.value) if attr.type == ir.AttributeType.GRAPHS else [])
            for graph in graphs:
                for inner in ir.traversal.RecursiveGraphIterator(graph):
                    found.add((_domain_key(inner.domain), inner.op_type))
    return found


def _check_op_name(name: str) -> None:
    """Refuse names that are no torch operator, so a typo in a deny list never goes silent."""
    if name == "getitem" or name.startswith("Tensor."):
        return
    parts = name.split(".")
    if len(parts) < 2 or not all(parts):
        raise fail(f"'{name}' is not an operator name; expected e.g. 'aten.gelu', "
                   "'aten.gelu.default' or, for an ONNX op, 'onnx::Softmax'")
    namespace, op = parts[0], parts[1]
    try:
        packet = getattr(getattr(torch.ops, namespace), op)
    except (AttributeError, RuntimeError) as e:
        raise fail(f"unknown operator '{name}': torch.ops.{namespace} has no '{op}'") from e
    if len(parts) == 3 and parts[2] not in packet.overloads():
        raise fail(f"unknown operator '{name}': {namespace}.{op} has overloads "
                    f"{', '.join(sorted(packet.overloads()))}")
    if len(parts) > 3:
        raise fail(f"'{name}' is not an operator name; expected e.g. 'aten.gelu.default'")


def _name_sets(names: Iterable[str]) -> tuple[frozenset[str], frozenset[OnnxOp]]:
    """A user's list -> (torch op names, ONNX ops); every name checked."""
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, Iterable):
        # e.g. ``{"allow": 3}`` read from an --acc-ops JSON file: say so, no TypeError
        raise fail(f"expected a list of op names such as ['aten.gelu'], got "
                    f"{type(names).__name__} {names!r}")
    torch_names, onnx_ops = set(), set()
    for raw in names:
        if not isinstance(raw, str):
            raw = str(raw)
        onnx_op = parse_onnx_name(raw)
        if onnx_op is not None:
            _check_onnx_name(onnx_op, raw.strip())
            onnx_ops.add((_domain_key(onnx_op[0]), onnx_op[1]))
            continue
        name = normalize_op_name(raw)
        _check_op_name(name)
        torch_names.add(name)
    return frozenset(torch_names), frozenset(onnx_ops)


def _getitem_source(node: torch.fx.Node) -> torch.fx.Node | None:
    """A ``getitem`` only picks an output of its producer: it is supported where that is."""
    if node.op == "call_function" and node.target is operator.getitem:
        src = node.args[0] if node.args else None
        if isinstance(src, torch.fx.Node) and src.op in CALLABLE_OPS:
            return src
    return None


def _listing(ops: Iterable[OnnxOp]) -> str:
    return ", ".join(op for _, op in sorted(ops))


def _listed(node: torch.fx.Node, names: frozenset[str]) -> tuple[torch.fx.Node, str | None]:
    """The node a list judges (a getitem stands for its producer unless ``getitem`` is
    listed) and the first of its names on the list, if any."""
    src = _getitem_source(node)
    if src is not None and "getitem" not in names:
        node = src
    return node, next((n for n in node_op_names(node) if n in names), None)


# ---- the support object ----------------------------------------------------------------------

#: node -> (supported, why): every check says why, so previews can tell the user.
Decide = Callable[[torch.fx.Node, SupportContext], tuple[bool, str]]


@dataclasses.dataclass(frozen=True)
class OpEntry:
    """One name of an allow or deny list, as the user wrote it (for unmatched-entry checks)."""

    name: str  # "aten.softmax", "onnx::Softmax"
    kind: str  # "allow" | "deny"
    onnx: OnnxOp | None = None  # set for ONNX names


class OperatorSupport:
    """Decides per FX node whether the accelerator runs it; combine with ``&``, ``|``, ``~``.

    Lists may name torch ops (``aten.gelu``) and ONNX ops (``onnx::Softmax``): an ONNX name
    is judged on the ONNX nodes each FX node becomes (``scaled_dot_product_attention``
    becomes MatMul, Softmax, ...), so ``deny=["onnx::Softmax"]`` keeps every node that
    emits a Softmax off the accelerator.
    """

    def __init__(self, spec: SupportSpec | None = None, *, allow: Iterable[str] | None = None,
                 deny: Iterable[str] | None = None) -> None:
        """``spec``: any form :func:`resolve_support` takes; ``allow`` / ``deny``: op names.

        All given parts must agree (they combine with ``&``); none given supports everything.
        """
        parts = []
        if spec is not None:
            parts.append(resolve_support(spec))
        if allow is not None:
            parts.append(OperatorSupport.allow(allow))
        if deny is not None:
            parts.append(OperatorSupport.deny(deny))
        combined = parts[0] if parts else OperatorSupport.everything()
        for part in parts[1:]:
            combined = combined & part
        self._decide: Decide = combined._decide
        self.description: str = combined.description
        #: True when the check reads the ONNX translation (``SupportContext.onnx_nodes``).
        self.needs_onnx: bool = combined.needs_onnx
        #: every allow/deny list name inside, for the check that each one matches a node
        self.entries: tuple[OpEntry, ...] = combined.entries

    @classmethod
    def _make(cls, decide: Decide, description: str, needs_onnx: bool = False,
              entries: tuple[OpEntry, ...] = ()) -> OperatorSupport:
        obj = cls.__new__(cls)
        obj._decide, obj.description, obj.needs_onnx = decide, description, needs_onnx
        obj.entries = entries
        return obj

    # construction
    @classmethod
    def from_callable(cls, fn: Callable[[torch.fx.Node], bool],
                      description: str | None = None) -> OperatorSupport:
        """Wrap a plain ``node -> bool`` predicate."""
        desc = description or getattr(fn, "__qualname__", None) or repr(fn)

        def decide(node: torch.fx.Node, _ctx: SupportContext) -> tuple[bool, str]:
            ok = bool(fn(node))
            return ok, f"{desc} returns {ok}"

        return cls._make(decide, desc)

    @classmethod
    def allow(cls, names: Iterable[str]) -> OperatorSupport:
        """Supported: the listed torch ops (overloads or packets), and nodes whose every ONNX
        node is of a listed ONNX op; a getitem follows its producer."""
        allowed, onnx_ops = _name_sets(names)

        def decide(node: torch.fx.Node, ctx: SupportContext) -> tuple[bool, str]:
            node, hit = _listed(node, allowed)
            if hit is not None:
                return True, f"allowed by '{hit}'"
            if onnx_ops:
                emitted = onnx_op_types(node, ctx) - _ALWAYS_ALLOWED
                missing = emitted - onnx_ops
                if not missing:
                    return True, (f"emits only allowed ONNX ops ({_listing(emitted)})"
                                  if emitted else "emits no ONNX op")
                return False, f"emits {_listing(missing)}, not in the allow list"
            return False, "not in the allow list"

        shown = sorted(allowed) + sorted(onnx_display(o) for o in onnx_ops)
        entries = tuple(OpEntry(n, "allow") for n in sorted(allowed)) + tuple(
            OpEntry(onnx_display(o), "allow", o) for o in sorted(onnx_ops))
        return cls._make(decide, f"allow[{', '.join(shown)}]", bool(onnx_ops), entries)

    from_op_names = allow

    @classmethod
    def deny(cls, names: Iterable[str]) -> OperatorSupport:
        """Supported: every op but the listed torch ops and every node that emits a listed
        ONNX op; a getitem follows its producer."""
        denied, onnx_ops = _name_sets(names)

        def decide(node: torch.fx.Node, ctx: SupportContext) -> tuple[bool, str]:
            node, hit = _listed(node, denied)
            if hit is not None:
                return False, f"denied by '{hit}'"
            if onnx_ops:
                bad = onnx_op_types(node, ctx) & onnx_ops
                if bad:
                    names = ", ".join(f"'{onnx_display(o)}'" for o in sorted(bad))
                    return False, f"emits {_listing(bad)}, denied by {names}"
            return True, "not denied"

        shown = sorted(denied) + sorted(onnx_display(o) for o in onnx_ops)
        entries = tuple(OpEntry(n, "deny") for n in sorted(denied)) + tuple(
            OpEntry(onnx_display(o), "deny", o) for o in sorted(onnx_ops))
        return cls._make(decide, f"deny[{', '.join(shown)}]", bool(onnx_ops), entries)

    @classmethod
    def everything(cls) -> OperatorSupport:
        return cls._make(lambda _n, _c: (True, "everything is supported"), "all")

    @classmethod
    def nothing(cls) -> OperatorSupport:
        return cls._make(lambda _n, _c: (False, "nothing is supported"), "none")

    @classmethod
    def from_ort(cls, provider: str) -> OperatorSupport:
        """Supported: every ONNX node the FX node becomes has a kernel on ``provider``."""
        registry = ort_kernel_registry(provider)

        def decide(node: torch.fx.Node, ctx: SupportContext) -> tuple[bool, str]:
            missing = sorted({n.op_type for n in ctx.onnx_nodes.get(node.name, ())
                              if not registry.supports_node(n, ctx.opset_imports)})
            if missing:
                return False, (f"no {registry.provider} kernel for {', '.join(missing)} "
                               "(at this opset and these types)")
            return True, f"{registry.provider} has a kernel for every ONNX op it emits"

        return cls._make(decide, f"ort:{registry.provider}", needs_onnx=True)

    # use
    def explain(self, node: torch.fx.Node,
                context: SupportContext | None = None) -> tuple[bool, str]:
        """(supported, why) for one node, e.g. ``(False, "emits Softmax, denied by
        'onnx::Softmax'")``."""
        if node.op not in CALLABLE_OPS:
            return False, f"a {node.op} node runs nowhere"
        if self.needs_onnx and context is None:
            raise fail(f"support '{self.description}' reads the ONNX translation of each "
                        "node; use it through onnx_modular.split()")
        ok, why = self._decide(node, context or SupportContext())
        return bool(ok), why

    def is_node_supported(self, node: torch.fx.Node,
                          context: SupportContext | None = None) -> bool:
        return self.explain(node, context)[0]

    def __call__(self, node: torch.fx.Node, context: SupportContext | None = None) -> bool:
        return self.is_node_supported(node, context)

    # combination
    def __and__(self, other: SupportSpec) -> OperatorSupport:
        o = resolve_support(other)

        def decide(n: torch.fx.Node, c: SupportContext) -> tuple[bool, str]:
            ok, why = self._decide(n, c)
            return o._decide(n, c) if ok else (ok, why)

        return OperatorSupport._make(decide, f"({self.description} & {o.description})",
                                     self.needs_onnx or o.needs_onnx,
                                     self.entries + o.entries)

    def __or__(self, other: SupportSpec) -> OperatorSupport:
        o = resolve_support(other)

        def decide(n: torch.fx.Node, c: SupportContext) -> tuple[bool, str]:
            ok, why = self._decide(n, c)
            if ok:
                return ok, why
            ok2, why2 = o._decide(n, c)
            return (ok2, why2) if ok2 else (False, f"{why}; {why2}")

        return OperatorSupport._make(decide, f"({self.description} | {o.description})",
                                     self.needs_onnx or o.needs_onnx,
                                     self.entries + o.entries)

    def __invert__(self) -> OperatorSupport:
        def decide(n: torch.fx.Node, c: SupportContext) -> tuple[bool, str]:
            ok, why = self._decide(n, c)
            return not ok, f"not ({why})"

        flipped = tuple(dataclasses.replace(e, kind="deny" if e.kind == "allow" else "allow")
                        for e in self.entries)
        return OperatorSupport._make(decide, f"~{self.description}", self.needs_onnx, flipped)

    def __repr__(self) -> str:
        return f"OperatorSupport({self.description})"


#: what an accelerator runs: an OperatorSupport, ``fx.Node -> bool``, op names (an allow
#: list), ``{"allow": [...], "deny": [...]}`` or ``"ort:<ExecutionProvider>"``
SupportSpec: TypeAlias = (OperatorSupport | Callable[[torch.fx.Node], bool] | Iterable[str]
                          | Mapping[str, Iterable[str]] | str)


def resolve_support(spec: SupportSpec) -> OperatorSupport:
    """Any accepted form -> :class:`OperatorSupport`.

    Accepted: an ``OperatorSupport``; ``"ort:<ExecutionProvider>"``; a callable
    ``fx.Node -> bool``; an iterable of op names (an allow list); a mapping
    ``{"allow": [...], "deny": [...]}`` (both given: allowed and not denied); torch.fx's
    ``OperatorSupportBase`` or its ``support_dict`` (op name -> dtypes; names only).
    """
    if isinstance(spec, OperatorSupport):
        return spec
    if isinstance(spec, str):
        if spec.startswith(ORT_PREFIX):
            return OperatorSupport.from_ort(spec[len(ORT_PREFIX):])
        return OperatorSupport.allow([spec])
    if isinstance(spec, Mapping):
        if not spec or not set(spec) <= {"allow", "deny"}:
            # torch.fx's ``support_dict``: op name -> dtypes (dtypes are not checked here)
            return OperatorSupport.allow([str(k) for k in spec])
        result = OperatorSupport.everything()
        if "allow" in spec:
            result = OperatorSupport.allow(spec["allow"])
        if "deny" in spec:
            result = result & OperatorSupport.deny(spec["deny"])
        return result
    if hasattr(spec, "is_node_supported"):  # torch.fx.passes OperatorSupportBase
        return _from_torch_support(spec)
    if callable(spec):
        return OperatorSupport.from_callable(spec)
    if isinstance(spec, Iterable):
        return OperatorSupport.allow(list(spec))
    raise fail(f"support must be an OperatorSupport, a callable(fx.Node) -> bool, an "
                f"iterable of op names or 'ort:<ExecutionProvider>', got {type(spec).__name__}")


def _from_torch_support(base: OperatorSupportBase) -> OperatorSupport:
    modules: dict[int, dict[str, torch.nn.Module]] = {}

    def decide(node: torch.fx.Node, _ctx: SupportContext) -> tuple[bool, str]:
        owner = node.graph.owning_module
        key = id(owner)
        if key not in modules:
            modules[key] = dict(owner.named_modules()) if owner is not None else {}
        ok = bool(base.is_node_supported(modules[key], node))
        return ok, f"{type(base).__name__} says {'yes' if ok else 'no'}"

    return OperatorSupport._make(decide, type(base).__name__)


def load_support_file(path: str | os.PathLike[str]) -> OperatorSupport:
    """Read ``--acc-ops FILE``: JSON (a list, or ``{"allow": [...], "deny": [...]}``) or text.

    Text holds one op name per line (``aten.gelu`` or ``onnx::Softmax``); ``#`` starts a
    comment; a line ``!aten.gelu`` denies.
    Text with only ``!`` lines is a deny list (everything else supported).
    """
    p = Path(path)
    if not p.is_file():
        raise fail(f"cannot read op list '{p}': no such file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise fail(f"cannot read op list '{p}': not UTF-8 text (byte {e.start}: "
                   f"{e.object[e.start:e.start + 1]!r}); save it as UTF-8") from e
    except OSError as e:
        raise fail(f"cannot read op list '{p}': {e.strerror or e}") from e
    stripped = text.lstrip()
    if stripped.startswith(("[", "{")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise fail(f"cannot read op list '{p}': invalid JSON ({e.msg} at line {e.lineno})"
                       ) from e
        if not isinstance(data, (list, dict)):
            raise fail(f"op list '{p}' must hold a JSON list or an object with allow/deny")
        return resolve_support(data)
    allow, deny = [], []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        (deny if line.startswith("!") else allow).append(line.lstrip("!").strip())
    if not allow and not deny:
        raise fail(f"op list '{p}' names no operator")
    spec: dict[str, list[str]] = {}
    if allow:
        spec["allow"] = allow
    if deny:
        spec["deny"] = deny
    return resolve_support(spec)
