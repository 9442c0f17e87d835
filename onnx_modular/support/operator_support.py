"""Which FX nodes an accelerator runs: op-name lists, callables, ONNX Runtime kernel registries.

An :class:`OperatorSupport` answers one question per FX node of a decomposed program. It is
built from a callable, from allow or deny lists of op names (``aten.gelu.default`` or the
whole packet ``aten.gelu``), from combinations of those (``&``, ``|``, ``~``), or from an ONNX
Runtime execution provider (``"ort:CUDAExecutionProvider"``): then a node is supported when
every ONNX node it translates to has a kernel registered for that provider. That last check
needs the translated ONNX nodes of each FX node; the splitter hands them over in a
:class:`SupportContext`.
"""

from __future__ import annotations

import json
import operator
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.fx

from onnx_modular._compat import OpOverload, OpOverloadPacket, qualified_name
from onnx_modular.errors import fail
from onnx_modular.support.onnx_index import SupportContext
from onnx_modular.support.ort_kernels import ort_kernel_registry

#: FX ops that compute something; placeholders, get_attr and output never run on a device.
CALLABLE_OPS = frozenset({"call_function", "call_method", "call_module"})
ORT_PREFIX = "ort:"
_GETITEM_NAMES = ("getitem", "operator.getitem", "_operator.getitem")


# ---- op names --------------------------------------------------------------------------------

def normalize_op_name(name: str) -> str:
    """``torch.ops.aten.gelu.default`` / ``aten::gelu.default`` -> ``aten.gelu.default``."""
    name = name.strip()
    name = name.removeprefix("torch.ops.")
    name = name.replace("::", ".")
    if name in _GETITEM_NAMES:
        return "getitem"
    return name


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


def _check_op_name(name: str) -> None:
    """Refuse names that are no torch operator, so a typo in a deny list never goes silent."""
    if name == "getitem" or name.startswith("Tensor."):
        return
    parts = name.split(".")
    if len(parts) < 2 or not all(parts):
        raise fail(f"'{name}' is not an operator name; expected e.g. 'aten.gelu' or "
                    "'aten.gelu.default'")
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


def _name_set(names: Iterable[str]) -> frozenset[str]:
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, Iterable):
        # e.g. ``{"allow": 3}`` read from an --acc-ops JSON file: say so, no TypeError
        raise fail(f"expected a list of op names such as ['aten.gelu'], got "
                    f"{type(names).__name__} {names!r}")
    result = set()
    for raw in names:
        if not isinstance(raw, str):
            raw = str(raw)
        name = normalize_op_name(raw)
        _check_op_name(name)
        result.add(name)
    return frozenset(result)


def _getitem_source(node: torch.fx.Node) -> torch.fx.Node | None:
    """A ``getitem`` only picks an output of its producer: it is supported where that is."""
    if node.op == "call_function" and node.target is operator.getitem:
        src = node.args[0] if node.args else None
        if isinstance(src, torch.fx.Node) and src.op in CALLABLE_OPS:
            return src
    return None


# ---- the support object ----------------------------------------------------------------------

Check = Callable[[torch.fx.Node, SupportContext], bool]


class OperatorSupport:
    """Decides per FX node whether the accelerator runs it; combine with ``&``, ``|``, ``~``."""

    def __init__(self, spec: Any = None, *, allow: Iterable[str] | None = None,
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
        self._check: Check = combined._check
        self.description: str = combined.description
        #: True when the check reads the ONNX translation (``SupportContext.onnx_nodes``).
        self.needs_onnx: bool = combined.needs_onnx

    @classmethod
    def _make(cls, check: Check, description: str, needs_onnx: bool = False) -> OperatorSupport:
        obj = cls.__new__(cls)
        obj._check, obj.description, obj.needs_onnx = check, description, needs_onnx
        return obj

    # construction
    @classmethod
    def from_callable(cls, fn: Callable[[torch.fx.Node], bool],
                      description: str | None = None) -> OperatorSupport:
        """Wrap a plain ``node -> bool`` predicate."""
        desc = description or getattr(fn, "__qualname__", None) or repr(fn)
        return cls._make(lambda node, _ctx: bool(fn(node)), desc)

    @classmethod
    def allow(cls, names: Iterable[str]) -> OperatorSupport:
        """Supported: the listed ops (overloads or packets); a getitem follows its producer."""
        allowed = _name_set(names)

        def check(node: torch.fx.Node, _ctx: SupportContext) -> bool:
            src = _getitem_source(node)
            if src is not None and "getitem" not in allowed:
                node = src
            return any(n in allowed for n in node_op_names(node))

        return cls._make(check, f"allow[{', '.join(sorted(allowed))}]")

    from_op_names = allow

    @classmethod
    def deny(cls, names: Iterable[str]) -> OperatorSupport:
        """Supported: every op but the listed ones; a getitem follows its producer."""
        denied = _name_set(names)

        def check(node: torch.fx.Node, _ctx: SupportContext) -> bool:
            src = _getitem_source(node)
            if src is not None and "getitem" not in denied:
                node = src
            return not any(n in denied for n in node_op_names(node))

        return cls._make(check, f"deny[{', '.join(sorted(denied))}]")

    @classmethod
    def everything(cls) -> OperatorSupport:
        return cls._make(lambda _n, _c: True, "all")

    @classmethod
    def nothing(cls) -> OperatorSupport:
        return cls._make(lambda _n, _c: False, "none")

    @classmethod
    def from_ort(cls, provider: str) -> OperatorSupport:
        """Supported: every ONNX node the FX node becomes has a kernel on ``provider``."""
        registry = ort_kernel_registry(provider)

        def check(node: torch.fx.Node, ctx: SupportContext) -> bool:
            return all(registry.supports_node(onnx_node, ctx.opset_imports)
                       for onnx_node in ctx.onnx_nodes.get(node.name, ()))

        return cls._make(check, f"ort:{registry.provider}", needs_onnx=True)

    # use
    def is_node_supported(self, node: torch.fx.Node,
                          context: SupportContext | None = None) -> bool:
        if node.op not in CALLABLE_OPS:
            return False
        if self.needs_onnx and context is None:
            raise fail(f"support '{self.description}' reads the ONNX translation of each "
                        "node; use it through onnx_modular.split()")
        return bool(self._check(node, context or SupportContext()))

    def __call__(self, node: torch.fx.Node, context: SupportContext | None = None) -> bool:
        return self.is_node_supported(node, context)

    # combination
    def __and__(self, other: Any) -> OperatorSupport:
        o = resolve_support(other)
        return OperatorSupport._make(lambda n, c: self._check(n, c) and o._check(n, c),
                               f"({self.description} & {o.description})",
                               self.needs_onnx or o.needs_onnx)

    def __or__(self, other: Any) -> OperatorSupport:
        o = resolve_support(other)
        return OperatorSupport._make(lambda n, c: self._check(n, c) or o._check(n, c),
                               f"({self.description} | {o.description})",
                               self.needs_onnx or o.needs_onnx)

    def __invert__(self) -> OperatorSupport:
        return OperatorSupport._make(lambda n, c: not self._check(n, c), f"~{self.description}",
                               self.needs_onnx)

    def __repr__(self) -> str:
        return f"OperatorSupport({self.description})"


def resolve_support(spec: Any) -> OperatorSupport:
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


def _from_torch_support(base: Any) -> OperatorSupport:
    modules: dict[int, dict[str, torch.nn.Module]] = {}

    def check(node: torch.fx.Node, _ctx: SupportContext) -> bool:
        owner = node.graph.owning_module
        key = id(owner)
        if key not in modules:
            modules[key] = dict(owner.named_modules()) if owner is not None else {}
        return bool(base.is_node_supported(modules[key], node))

    return OperatorSupport._make(check, type(base).__name__)


def load_support_file(path: str | os.PathLike[str]) -> OperatorSupport:
    """Read ``--acc-ops FILE``: JSON (a list, or ``{"allow": [...], "deny": [...]}``) or text.

    Text holds one op name per line; ``#`` starts a comment; a line ``!aten.gelu`` denies.
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
