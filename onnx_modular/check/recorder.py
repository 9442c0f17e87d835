"""The torch side of localization: every module call of one eager run, with what it returned.

One run with forward hooks records each module call (its path, call index, parent and the
tensors it took and returned). No re-export is needed, so localizing costs little more than
the plain validation run. An ``ExportedProgram`` runs through its modularized
``GraphModule``, whose sub-modules stand for the module calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from onnx_modular.check.calls import CallRecord
from onnx_modular.leaves._compat import tensor_version, tree_leaves
from onnx_modular.leaves.metadata import CallInfo

__all__ = ["TorchCall", "record_calls"]


@dataclasses.dataclass
class TorchCall(CallRecord):
    """One module call seen in eager mode; ``outputs`` are its returned tensors.

    They are kept, not copied; ``versions`` (their ``_version`` counters when returned)
    tells when later code changed one in place, and such a value is not compared.
    """

    depth: int
    parent: int | None  # index of the enclosing call in the recorded list
    outputs: list[torch.Tensor]
    versions: list[int] = dataclasses.field(default_factory=list)
    inputs: list[torch.Tensor] = dataclasses.field(default_factory=list)
    input_versions: list[int] = dataclasses.field(default_factory=list)

    def intact_outputs(self) -> list[torch.Tensor]:
        """The outputs no later code changed in place (only those can be compared)."""
        return [t for t, v in zip(self.outputs, self.versions, strict=True)
                if tensor_version(t) == v]

    def intact_inputs(self) -> list[torch.Tensor]:
        """The inputs no later code changed in place."""
        return [t for t, v in zip(self.inputs, self.input_versions, strict=True)
                if tensor_version(t) == v]


def _type_name(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _tensor_leaves(value: Any) -> list[torch.Tensor]:
    leaves = tree_leaves(value)
    return [t.detach() for t in leaves if isinstance(t, torch.Tensor)]


class _Hooks:
    """The hook pair of one recording: a pre-hook opens a call, the forward hook closes it."""

    def __init__(self, modularized: bool) -> None:
        self.modularized = modularized
        self.calls: list[TorchCall] = []
        self._stack: list[int] = []  # open calls; -1 for a module re-entering itself
        self._counts: dict[int, int] = {}
        self._running: list[torch.nn.Module] = []

    def _call_info(self, name: str, module: torch.nn.Module) -> CallInfo:
        if self.modularized:
            return CallInfo(str(module.call_id), str(module.module_path),
                            str(module.module_type))
        k = self._counts.get(id(module), 0)
        self._counts[id(module)] = k + 1
        return CallInfo(name if k == 0 else f"{name}@{k}", name, _type_name(module))

    def pre(self, name: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            if self._running and self._running[-1] is module:
                # the module calling itself again, as a lazily compiled GraphModule does on
                # its first call: one module call, not a nested second one
                self._running.append(module)
                self._stack.append(-1)
                return
            self._running.append(module)
            inputs = _tensor_leaves((args, kwargs))
            open_calls = [i for i in self._stack if i >= 0]
            self.calls.append(TorchCall(
                self._call_info(name, module), len(open_calls),
                open_calls[-1] if open_calls else None, [], [], inputs,
                [tensor_version(t) for t in inputs]))
            self._stack.append(len(self.calls) - 1)
        return hook

    def post(self, module: torch.nn.Module, _args: Any, output: Any) -> None:
        self._running.pop()
        index = self._stack.pop()
        if index < 0:
            return
        call = self.calls[index]
        call.outputs = _tensor_leaves(output)
        call.versions = [tensor_version(t) for t in call.outputs]


def record_calls(
    model: torch.nn.Module, run: Callable[[], Any], *, modularized: bool = False
) -> tuple[Any, list[TorchCall]]:
    """Run ``run()`` with hooks on every submodule; the output and the calls, in call order.

    ``modularized``: submodules are generated sub-GraphModules carrying ``call_id``,
    ``module_path`` and ``module_type`` (from :func:`onnx_modular.modularize`).
    """
    hooks = _Hooks(modularized)
    handles = []
    try:
        for name, module in model.named_modules():
            if not name or (modularized and not hasattr(module, "call_id")):
                continue
            handles.append(module.register_forward_pre_hook(hooks.pre(name), with_kwargs=True))
            handles.append(module.register_forward_hook(hooks.post))
        result = run()
    finally:
        for h in handles:
            h.remove()
    return result, hooks.calls
