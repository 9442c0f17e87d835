"""A ``torch.onnx.export(..., dynamo=False)`` call read as the dynamo exporter's arguments.

The released Optimum, Olive's default conversion and many scripts still take the TorchScript
path. Under ``om.hook`` such a call is exported hierarchically when none of its options is
TorchScript-only; the result is then held to the interface the TorchScript exporter would
have written (input and output names in order, dynamic dims where ``dynamic_axes`` asked).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import onnx_ir as ir
import torch

from onnx_modular.leaves._compat import torchscript_defaults, tree_leaves, tree_map
from onnx_modular.lower.translate import MIN_HIERARCHICAL_OPSET


@dataclasses.dataclass(frozen=True)
class TorchScriptCall:
    """The arguments of one TorchScript-exporter call, bound to its parameter names."""

    arguments: Mapping[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.arguments.get(name)

    def torchscript_only(self) -> str | None:
        """Why this call can only go the TorchScript way, or None when dynamo can take it."""
        defaults = torchscript_defaults()
        model = self["model"]
        if isinstance(model, (torch.jit.ScriptModule, torch.jit.ScriptFunction)):
            return f"the model is a TorchScript {type(model).__name__}"
        if not isinstance(model, torch.nn.Module):
            return f"the model is a {type(model).__name__}, not an nn.Module"
        training = self["training"]
        if training not in (defaults["eval"], defaults["preserve"]):
            return f"training={training} exports the training graph"
        if training == defaults["preserve"] and any(m.training for m in model.modules()):
            return f"training={training} of a model in training mode exports the training graph"
        opset = self["opset_version"]
        if opset is not None and opset < MIN_HIERARCHICAL_OPSET:
            return f"opset {opset} < {MIN_HIERARCHICAL_OPSET} cannot hold the module functions"
        operator_export_type = self["operator_export_type"]
        if operator_export_type not in (None, defaults["onnx"]):
            return f"operator_export_type={operator_export_type}"
        if self["custom_opsets"]:
            return f"custom_opsets={dict(self['custom_opsets'])!r}"
        f = self["f"]
        if f is not None and not isinstance(f, (str, os.PathLike)) and not hasattr(f, "write"):
            return f"f is a {type(f).__name__}, neither a path nor a writable file"
        return None

    @contextlib.contextmanager
    def export_mode(self) -> Iterator[None]:
        """The model in the mode the TorchScript exporter exports it in: eval for
        ``training=EVAL`` (its default; a train-mode Dropout would otherwise be exported
        active), as it is for ``PRESERVE``. Each module's own mode is put back after, also
        when the export raises."""
        model = self["model"]
        if self["training"] != torchscript_defaults()["eval"]:
            yield
            return
        modes = [(module, module.training) for module in model.modules()]
        model.train(False)
        try:
            yield
        finally:
            for module, training in modes:
                module.training = training

    def functions(self) -> Any:
        """``export_modules_as_functions`` as a ``functions=`` selection, or None (the hook's)."""
        chosen = self["export_modules_as_functions"]
        if chosen is True:
            return "all"
        if chosen:
            return tuple(chosen)
        return None

    def dynamo_arguments(self, shared_dims: bool = True) -> dict[str, Any]:
        """The keyword arguments of ``torch.onnx.export(..., dynamo=True)`` doing this export.

        A dict as the last positional argument holds keyword inputs (the TorchScript
        exporter's convention, which Optimum uses); the file is saved afterwards, once the
        interface has been checked.
        """
        args = self["args"]
        args = tuple(args) if isinstance(args, (tuple, list)) else (
            () if args is None else (args,))  # a tensor, or a dict of keyword inputs (Olive)
        kwargs = dict(self["kwargs"] or {})
        if args and isinstance(args[-1], dict):
            kwargs = {**args[-1], **kwargs}
            args = args[:-1]
        kwargs = _in_signature_order(self["model"], kwargs)
        return {
            "args": args, "kwargs": kwargs or None,
            "input_names": _names(self["input_names"]),
            "output_names": _names(self["output_names"]),
            "opset_version": self["opset_version"],
            "dynamic_shapes": self._dynamic_shapes(args, kwargs, shared=shared_dims),
            "optimize": self["do_constant_folding"] is not False,
            "verbose": bool(self["verbose"]),
        }

    def save(self, onnx_program: Any) -> None:
        """Write the file as the TorchScript exporter would: one file under 2 GB, weights
        listed as inputs after the call's own where ``export_params=False`` (then without
        their data) or ``keep_initializers_as_inputs=True`` asked for it."""
        f = self["f"]
        if f is None:
            return
        graph = onnx_program.model.graph
        inputs, initializers = list(graph.inputs), dict(graph.initializers)
        export_params = self["export_params"] is not False
        if not export_params or self["keep_initializers_as_inputs"]:
            graph.inputs.extend(self._weights_in_order(initializers))
        if not export_params:
            graph.initializers.clear()
        try:
            if isinstance(f, (str, os.PathLike)):
                onnx_program.save(os.fspath(f), external_data=None)
            else:
                f.write(onnx_program.model_proto.SerializeToString())  # a file object (BytesIO)
        finally:
            graph.inputs.clear()
            graph.inputs.extend(inputs)
            if not export_params:
                graph.initializers.update(initializers)

    def _merged_weights(self, model: ir.Model) -> list[str]:
        """The model's weights that are no initializer because an equal one stands for
        them (initializers deduplicated), where the TorchScript exporter keeps each as an
        input of its own when it keeps initializers as inputs."""
        state = self["model"].state_dict(keep_vars=True)
        kept = [state[name] for name in model.graph.initializers if name in state]
        return [name for name, tensor in state.items()
                if name not in model.graph.initializers and any(
                    k.shape == tensor.shape and k.dtype == tensor.dtype and torch.equal(k, tensor)
                    for k in kept)]

    def _weights_in_order(self, initializers: Mapping[str, ir.Value]) -> list[ir.Value]:
        """Initializers in the TorchScript exporter's input order: the model's
        ``state_dict`` order, then weights folded ahead of time (TorchScript's
        ``onnx::MatMul_12``), in the model's order."""
        rank = {name: i for i, name in enumerate(self["model"].state_dict(keep_vars=True))}
        return sorted(initializers.values(), key=lambda v: rank.get(v.name or "", len(rank)))

    def interface_mismatch(self, model: ir.Model) -> str | None:
        """How ``model``'s inputs and outputs differ from what this call asked for, or None."""
        for kind, values in (("input", model.graph.inputs), ("output", model.graph.outputs)):
            wanted = _names(self[f"{kind}_names"]) or []
            have = [v.name for v in values][:len(wanted)]
            if have != wanted:
                return f"{kind} names {have} where the call named {wanted}"
        merged = self._merged_weights(model) if self["keep_initializers_as_inputs"] else []
        if merged:
            return (f"keep_initializers_as_inputs=True lists every weight, but {merged[:3]} "
                    "were merged into equal ones")
        for value, example in zip(model.graph.inputs, self._example_inputs()):
            dims = [] if value.shape is None else list(value.shape)
            if len(dims) != example.dim() or any(
                    isinstance(d, int) and d != n for d, n in zip(dims, example.shape)):
                return (f"input '{value.name}' has shape {dims} where the call's input in "
                        f"that place has {list(example.shape)}")
        return None

    def specializes(self) -> bool:
        """Whether an axis ``dynamic_axes`` names has an example size of 0 or 1, which
        torch.export would fix unless told otherwise."""
        names = _names(self["input_names"]) or []
        axes_by_name = self["dynamic_axes"] or {}
        for name, example in zip(names, self._example_inputs()):
            axes = axes_by_name.get(name) or ()
            for axis in axes.keys() if isinstance(axes, Mapping) else axes:
                if -example.dim() <= axis < example.dim() and example.shape[axis] in (0, 1):
                    return True
        return False

    def name_axes(self, model: ir.Model) -> list[tuple[str, int, int]]:
        """Name the axes as ``dynamic_axes`` does, as the TorchScript exporter writes them:
        symbolic input axes get the call's names, and output axes are declared dynamic
        (torch.onnx may declare the example's sizes there while the graph computes them).

        Returns (name, axis, size) of every input axis ``dynamic_axes`` asked to be dynamic
        that the model fixes: torch.export found the model needs that size (a convolution's
        channels, a ViT's image size), where the TorchScript exporter names the axis all
        the same."""
        inputs = {v.name for v in model.graph.inputs}
        by_name = {v.name: v for v in [*model.graph.inputs, *model.graph.outputs]}
        fixed = []
        for name, axes in (self["dynamic_axes"] or {}).items():
            value = by_name.get(name)
            if value is None or value.shape is None:
                continue  # the TorchScript exporter ignores a name it does not know, too
            dims = list(value.shape)
            named = axes if isinstance(axes, Mapping) else {
                a: f"{name}_dynamic_axes_{i + 1}" for i, a in enumerate(axes)}
            for axis, label in named.items():
                if not -len(dims) <= axis < len(dims):
                    continue
                if name in inputs and isinstance(dims[axis], int):
                    fixed.append((name, axis, dims[axis]))  # the model needs that size
                    continue
                dims[axis] = ir.SymbolicDim(str(label))
            value.shape = ir.Shape(dims)
        return fixed

    def _dynamic_shapes(self, args: tuple[Any, ...], kwargs: dict[str, Any], *,
                        shared: bool) -> dict[str, Any] | None:
        """``dynamic_axes`` (keyed by input name, numbered as the TorchScript exporter
        numbers inputs) as ``dynamic_shapes`` keyed by ``forward``'s parameters. torch.onnx's
        own conversion makes keyword inputs positional and shifts those after a gap.

        ``shared``: axes named alike are one ``Dim`` (what the same name means in ONNX), so
        torch.export knows that every layer's cache has one length: without it each layer
        slices the mask to its own length and layer 0, where the slice is known to be a
        no-op, gets a function of its own.
        """
        axes_by_name = self["dynamic_axes"]
        if not axes_by_name:
            return None
        names = iter(_names(self["input_names"]) or [])
        bound = inspect.signature(self["model"].forward).bind_partial(*args, **kwargs)
        dims: dict[str, Any] = {}

        def dim(name: Any) -> Any:
            if not isinstance(name, str):
                return torch.export.Dim.DYNAMIC
            if not shared or not name.isidentifier():
                return name  # torch.onnx makes it Dim.DYNAMIC and names the ONNX axis so
            return dims.setdefault(name, torch.export.Dim(name))

        def spec(leaf: Any) -> Any:
            if not isinstance(leaf, torch.Tensor):
                return None
            axes = axes_by_name.get(next(names, None))
            if axes is None:
                return None
            if isinstance(axes, Mapping):
                return {int(a): dim(n) for a, n in axes.items()}
            return {int(a): torch.export.Dim.DYNAMIC for a in axes}

        return {name: tree_map(spec, value)
                for name, value in bound.arguments.items()}

    def _example_inputs(self) -> list[torch.Tensor]:
        """The call's tensors in the order the TorchScript exporter numbers its inputs."""
        arguments = self.dynamo_arguments(shared_dims=False)
        leaves = tree_leaves((arguments["args"], arguments["kwargs"] or {}))
        return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def _in_signature_order(model: torch.nn.Module, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Keyword inputs in the order of ``forward``'s parameters, as the TorchScript exporter
    flattens them (the dynamo exporter keeps the call's order): input names follow it."""
    try:
        order = list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return kwargs
    rank = {name: i for i, name in enumerate(order)}
    return dict(sorted(kwargs.items(), key=lambda item: rank.get(item[0], len(rank))))


def _names(names: Sequence[str] | None) -> list[str] | None:
    return None if names is None else [str(n) for n in names]
