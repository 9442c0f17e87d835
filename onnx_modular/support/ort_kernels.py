"""The kernels an ONNX Runtime execution provider registers, to judge ONNX nodes against.

``"ort:CUDAExecutionProvider"`` support asks, for every ONNX node an FX node becomes,
whether the provider has a kernel for its op at the model's opset and with its types.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from onnx_modular.leaves._compat import ort_kernel_defs
from onnx_modular.leaves.errors import fail
from onnx_modular.leaves.runtime import provider_name


def _domain_key(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


@dataclasses.dataclass
class KernelRegistry:
    """The kernels one execution provider registers: (domain, op) -> [(since, until, types)]."""

    provider: str
    kernels: dict[tuple[str, str], list[tuple[int, int, dict[str, list[str]]]]]
    _cache: dict[tuple[Any, ...], bool] = dataclasses.field(default_factory=dict)

    def supports(self, op_type: str, domain: str, version: int,
                 types: Mapping[str, str] | None = None) -> bool:
        """Is there a kernel for this op at this opset version (and these formal types)?"""
        key = (_domain_key(domain), op_type, version,
               tuple(sorted(types.items())) if types else ())
        hit = self._cache.get(key)
        if hit is None:
            hit = self._lookup(key[0], op_type, version, types or {})
            self._cache[key] = hit
        return hit

    def _lookup(self, domain: str, op_type: str, version: int,
                types: Mapping[str, str]) -> bool:
        for since, until, constraints in self.kernels.get((domain, op_type), ()):
            if not since <= version <= until:
                continue
            if all(t in constraints[name] for name, t in types.items()
                   if constraints.get(name)):
                return True
        # No kernel: ORT still runs constants (folded into initializers) and ops that an
        # ONNX function defines (expanded into ops that do have kernels).
        return op_type in _FOLDED_BY_ORT or _has_function_body(op_type, domain, version)

    def supports_node(self, node: Any, opset_imports: Mapping[str, int]) -> bool:
        """An ``onnx_ir`` node: its op at the model's opset for its domain, with its types."""
        domain = _domain_key(node.domain)
        version = node.version
        if version is None:
            version = opset_imports.get(domain, opset_imports.get("ai.onnx", 1))
        return self.supports(node.op_type, domain, int(version),
                             _formal_types(node, domain, int(version)))


@functools.lru_cache(maxsize=4096)
def _schema_formals(op_type: str, domain: str, version: int) -> tuple[tuple[str, ...],
                                                                        tuple[str, ...],
                                                                        bool] | None:
    """(input type names, output type names, last input variadic) of the op's schema."""
    import onnx.defs

    try:
        schema = onnx.defs.get_schema(op_type, version, domain)
    except Exception:
        return None
    ins = tuple(p.type_str for p in schema.inputs)
    outs = tuple(p.type_str for p in schema.outputs)
    variadic = bool(schema.inputs) and schema.inputs[-1].option == \
        onnx.defs.OpSchema.FormalParameterOption.Variadic
    return ins, outs, variadic


_FOLDED_BY_ORT = frozenset({"Constant"})


@functools.lru_cache(maxsize=1024)
def _has_function_body(op_type: str, domain: str, version: int) -> bool:
    import onnx.defs

    try:
        schema = onnx.defs.get_schema(op_type, version, domain)
    except Exception:
        return False
    return bool(schema.has_function or schema.has_context_dependent_function)


def _ort_type_name(value: Any) -> str | None:
    """The ``tensor(float)`` spelling ORT's registry uses for a value's element type."""
    import onnx_ir as ir

    if value is None or not isinstance(value.type, ir.TensorType):
        return None
    return f"tensor({value.type.dtype.name.lower()})"


def _formal_types(node: Any, domain: str, version: int) -> dict[str, str]:
    """Type-constraint name -> the ORT type string of the value bound to it, where known."""
    formals = _schema_formals(node.op_type, domain, version)
    if formals is None:
        return {}
    ins, outs, variadic = formals
    bound: dict[str, str] = {}

    def bind(formal: str, value: Any) -> None:
        t = _ort_type_name(value)
        if t is not None and not formal.startswith("tensor(") and formal not in bound:
            bound[formal] = t

    for i, value in enumerate(node.inputs):
        if i < len(ins):
            bind(ins[i], value)
        elif variadic and ins:
            bind(ins[-1], value)
    for i, value in enumerate(node.outputs):
        if i < len(outs):
            bind(outs[i], value)
    return bound


@functools.lru_cache(maxsize=16)
def ort_kernel_registry(provider: str) -> KernelRegistry:
    """The kernels ``provider`` registers in the installed onnxruntime (names as in ORT)."""
    name = provider_name(provider)
    kernels: dict[tuple[str, str], list[tuple[int, int, dict[str, list[str]]]]] = {}
    providers = set()
    for k in ort_kernel_defs():
        providers.add(k.provider)
        if k.provider != name:
            continue
        since, until = k.version_range
        kernels.setdefault((_domain_key(k.domain), k.op_name), []).append(
            (int(since), int(until), {c: list(ts) for c, ts in k.type_constraints.items()}))
    if not kernels:
        raise fail(f"onnxruntime registers no kernels for '{name}' (registered providers: "
                    f"{', '.join(sorted(providers)) or 'none'}); install the onnxruntime "
                    "package that ships it (e.g. onnxruntime-gpu for CUDA)")
    return KernelRegistry(name, kernels)
