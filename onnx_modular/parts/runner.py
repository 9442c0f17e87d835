"""Run a directory of part models (split regions or pipeline stages) in ONNX Runtime, chained.

The manifest (``manifest.json``) lists the parts in execution order, each with its file, kind
and the names of the values it reads and writes. Acc parts (any kind but ``cpu``) run on
``acc_providers``, CPU parts on ``cpu_providers``. Values flow between sessions as OrtValues
through IOBinding, so a tensor an acc part leaves on the device feeds the next acc part without
a round trip through host memory; it is copied to the host only where a CPU part reads it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from onnx_modular.leaves import _compat, runtime
from onnx_modular.leaves.errors import fail, rules
from onnx_modular.leaves.metadata import PARTS_SET_ID
from onnx_modular.parts.manifest import inside_directory, load_manifest


def _device_of(providers: Sequence[str]) -> str:
    return "cuda" if providers and providers[0] == "CUDAExecutionProvider" else "cpu"


def ordered_kwargs(kwargs: dict[str, Any], in_spec: Any) -> dict[str, Any]:
    """Keyword inputs in the order the model was captured with (``in_spec``, the program's
    input TreeSpec: torch.export flattens keywords in the order of the call), whatever
    order they come in: inputs are matched by position, so ``run(b=, a=)`` must not swap a
    and b. Without a spec of ``(args, kwargs)``, the caller's order (the call's)."""
    if not kwargs or in_spec is None:
        return kwargs
    try:
        kw_spec = in_spec.child(1) if in_spec.type is tuple and in_spec.num_children == 2 \
            else None
    except Exception:  # a spec pytree cannot read: keep the caller's order
        return kwargs
    if kw_spec is None or kw_spec.type is not dict:
        return kwargs
    expected = list(kw_spec.context)
    if set(kwargs) != set(expected):
        raise fail(f"the model was captured with keyword input(s) "
                   f"{', '.join(expected) or 'none'}; got {', '.join(kwargs)}")
    return {k: kwargs[k] for k in expected}


class SplitRunner:
    """Chains the part models of ``directory`` (written by ``save``) and returns the outputs."""

    def __init__(self, directory: str | os.PathLike[str],
                 acc_providers: Sequence[str] | str | None = None,
                 cpu_providers: Sequence[str] | str | None = None) -> None:
        self.directory = Path(directory)
        self.manifest: dict[str, Any] = load_manifest(self.directory)
        self.parts: list[dict[str, Any]] = self.manifest["regions"]
        # None: CUDA where this onnxruntime has it, else CPU (with CPU as fallback either way)
        acc = runtime.resolve_providers(acc_providers)
        if acc[0] != "CPUExecutionProvider" and "CPUExecutionProvider" not in acc:
            acc = [*acc, "CPUExecutionProvider"]
        self.acc_providers = acc
        self._acc_defaulted = acc_providers is None
        self.cpu_providers = (["CPUExecutionProvider"] if cpu_providers is None
                              else runtime.resolve_providers(cpu_providers))
        self._sessions: dict[str, Any] = {}
        self._specs: dict[str, Any] = {}  # parsed pytree specs of the manifest
        self._lock = threading.Lock()  # threads share one runner: one session per part
        self._set_id = self.manifest.get("set_id")

    def providers_of(self, part: dict[str, Any]) -> list[str]:
        return self.cpu_providers if part.get("kind") == "cpu" else self.acc_providers

    def close(self) -> None:
        """Let every part's session go (a later run makes them again)."""
        with self._lock:
            self._sessions.clear()

    def open_sessions(self) -> None:
        """Make every part's session now (a missing file or provider fails here, before a
        run; a check times session creation apart from the run)."""
        for part in self.parts:
            if part.get("outputs"):
                self.session(part)

    def session(self, part: dict[str, Any]) -> Any:
        """The ORT session of one part (created on first use, once, whatever the threads)."""
        name = part["name"]
        session = self._sessions.get(name)
        if session is None:
            with self._lock:
                session = self._sessions.get(name)
                if session is None:
                    session = self._sessions[name] = self._new_session(part)
        return session

    def _new_session(self, part: dict[str, Any]) -> Any:
        name = part["name"]
        file = inside_directory(self.directory, part["file"], f"part '{name}'")
        if not file.is_file():
            raise fail(f"part '{name}' of '{self.directory}' is missing its file "
                       f"'{part['file']}'")
        _check_external_data(file, self.directory, name)
        try:
            session, _ = runtime.make_session(str(file), self.providers_of(part),
                                              what=f"part '{name}'")
        except runtime.ProviderUnavailableError:
            # onnxruntime-gpu lists CUDA even where no GPU or driver is present: the
            # default acc provider then is CPU; an explicit request stays an error
            if not self._acc_defaulted or part.get("kind") == "cpu":
                raise
            self.acc_providers = ["CPUExecutionProvider"]
            session, _ = runtime.make_session(str(file), self.providers_of(part),
                                              what=f"part '{name}'")
        found = session.get_modelmeta().custom_metadata_map.get(PARTS_SET_ID)
        if self._set_id is not None and found != self._set_id:
            raise fail(f"part '{name}' of '{self.directory}' belongs to another save than "
                       "its manifest.json (the directory was written over while it was "
                       "read, or files were copied in); save the parts again")
        return session

    # inputs and outputs
    def _flat_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        declared = self.manifest.get("inputs", [])
        kwargs = self._ordered_kwargs(kwargs)
        leaves = _compat.tree_leaves((args, kwargs))
        arrays = [x for x in leaves if _is_array(x)]
        if len(arrays) != len(declared):
            raise fail(f"the model takes {len(declared)} tensor input(s) "
                       f"({', '.join(d['name'] for d in declared)}), got {len(arrays)}")
        return arrays

    def _spec(self, key: str) -> Any:
        """The manifest's pytree spec ``key`` (``in_spec``/``out_spec``), parsed on first
        use; None when absent or unreadable by this torch (then flat inputs/outputs)."""
        if key not in self._specs:
            try:
                text = self.manifest.get(key)
                self._specs[key] = _compat.treespec_loads(text) if text else None
            except Exception:
                self._specs[key] = None
        return self._specs[key]

    def _ordered_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Keyword inputs in the parts' input order: by the manifest's input names where
        they name them all (the files' own names: a spec edited or unreadable cannot swap
        two inputs of a shape), else by the input spec, else the one given, else refused."""
        declared = [d["name"] for d in self.manifest.get("inputs", [])]
        if kwargs and set(kwargs) <= set(declared):
            return dict(sorted(kwargs.items(), key=lambda item: declared.index(item[0])))
        spec = self._spec("in_spec") if kwargs else None
        if spec is not None:
            return ordered_kwargs(kwargs, spec)
        if len(kwargs) < 2:
            return kwargs
        raise fail(f"'{self.directory / 'manifest.json'}' holds no input structure this "
                   f"torch can read, so keyword inputs cannot be ordered: pass "
                   f"{', '.join(kwargs)} positionally, in the order the model takes them")

    def _structure(self, flat: list[Any], as_torch: bool) -> Any:
        if as_torch:  # (np.ascontiguousarray would make a 0-d output 1-d)
            flat = [torch.from_numpy(x if x.flags.c_contiguous else np.ascontiguousarray(x))
                    for x in flat]
        spec = self._spec("out_spec")
        if not flat or (spec is not None and spec.num_leaves < len(flat)):
            # a manifest changed by hand: never answer with no outputs, or with more than
            # the model has (fewer is a model returning None beside its tensors)
            raise fail(f"'{self.directory / 'manifest.json'}' lists {len(flat)} model "
                       "output(s)" + ("" if spec is None else
                                      f", its output structure holds {spec.num_leaves}")
                       + "; save the parts again", rules.VALIDATION)
        if spec is not None and spec.num_leaves == len(flat):
            return _compat.tree_unflatten(flat, spec)
        return flat[0] if len(flat) == 1 else tuple(flat)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """Run every part in order; outputs come back in the model's output structure."""
        import onnxruntime as ort

        arrays = self._flat_inputs(args, kwargs)
        as_torch = any(type(x).__module__.startswith("torch") for x in arrays)
        env: dict[str, Any] = {}
        feeds = []  # what the input OrtValues read, without a copy
        for decl, value in zip(self.manifest["inputs"], arrays):
            feeds.append(runtime.to_feed(value))
            env[decl["name"]] = ort.OrtValue.ortvalue_from_numpy(feeds[-1])
        for part in self.parts:
            if not part.get("outputs"):
                continue  # a part whose result nobody reads (only checks): nothing to run
            session = self.session(part)
            device = _device_of(self.providers_of(part))
            binding = session.io_binding()
            for entry in session.get_inputs():
                value = env.get(entry.name)
                if value is None:
                    raise fail(f"part '{part['name']}' reads '{entry.name}', which no earlier "
                               "part produces", rules.VALIDATION)
                if device == "cpu" and value.device_name().lower() != "cpu":
                    value = ort.OrtValue.ortvalue_from_numpy(value.numpy())
                binding.bind_ortvalue_input(entry.name, value)
            for entry in session.get_outputs():
                binding.bind_output(entry.name, device)
            try:
                session.run_with_iobinding(binding)
            except Exception as e:
                raise fail(f"part '{part['name']}' failed in ONNX Runtime: "
                           f"{runtime.first_line(e)}", rules.VALIDATION) from e
            for entry, value in zip(session.get_outputs(), binding.get_outputs()):
                env[entry.name] = value
        flat = []
        for out in self.manifest["outputs"]:
            if out["name"] not in env:
                raise fail(f"no part produces the model output '{out['name']}'",
                           rules.VALIDATION)
            flat.append(_owned(env[out["name"]].numpy(), feeds))
        return self._structure(flat, as_torch)

    __call__ = run


def _owned(array: np.ndarray, feeds: list[np.ndarray]) -> np.ndarray:
    """An output that is an input passed through (``return y, x``) is a view of memory the
    caller's tensor, or this run's contiguous copy of it, owns: it is copied, or it would
    read freed memory once either is gone."""
    if any(np.may_share_memory(array, feed) for feed in feeds):
        return array.copy()
    return array


def _is_array(x: Any) -> bool:
    return isinstance(x, (np.ndarray, torch.Tensor))


def _check_external_data(file: Path, folder: Path, name: str) -> None:
    """External data a part names must be a plain file inside the parts directory too."""
    import onnx

    try:
        proto = onnx.load(str(file), load_external_data=False)
    except Exception as e:
        raise fail(f"part '{name}': '{file}' is not a readable ONNX model "
                   f"({runtime.first_line(e)})") from e
    for init in proto.graph.initializer:
        if init.data_location != onnx.TensorProto.EXTERNAL:
            continue
        for entry in init.external_data:
            if entry.key == "location":
                inside_directory(folder, entry.value, f"part '{name}' external data")
