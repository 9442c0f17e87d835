"""The extracted module's values: the tensors that reached the call in torch (so the repro
isolates the module from upstream drift; values torch never passed, such as a mask the ONNX
parent computed from constants, are ONNX's), and torch's outputs as the expected ones."""

from __future__ import annotations

import numpy as np
import torch

from onnx_modular.check.numerics import check_value, dtype_name, to_numpy
from onnx_modular.check.recorder import TorchCall
from onnx_modular.leaves import runtime
from onnx_modular.leaves._compat import tensor_version
from onnx_modular.leaves.errors import fail, rules


def pair_inputs(wanted: list[tuple[str, np.ndarray | None]], tcall: TorchCall
                 ) -> dict[str, tuple[np.ndarray, str]]:
    """Each ONNX input's value: the torch input of its shape and dtype closest to ONNX's
    value (each torch input used once), else ONNX's own value."""
    used: set[int] = set()
    out: dict[str, tuple[np.ndarray, str]] = {}
    for name, value in wanted:
        best: tuple[float, int, torch.Tensor] | None = None
        changed = False  # torch had one, but changed it in place after the call
        for i, (t, version) in enumerate(zip(tcall.inputs, tcall.input_versions, strict=True)):
            if i in used or value is None or tuple(t.shape) != value.shape or \
                    dtype_name(t) != dtype_name(value):
                continue
            if tensor_version(t) != version:
                changed = True
                continue
            d = check_value(value, t, 0.0, 0.0, same_dtype=False).diff.max_abs
            if best is None or d < best[0]:
                best = (d, i, t)
        if best is not None:
            used.add(best[1])
            out[name] = (runtime.to_feed(best[2]), f"torch input {best[1]}")
        elif value is not None:
            why = ("torch changed its tensor in place after the call" if changed
                   else "torch passed no tensor of this shape and dtype")
            out[name] = (value, f"ONNX value ({why})")
        else:
            raise fail(f"no value for input '{name}' of the extracted call '{tcall.call_id}'",
                       rules.VALIDATION)
    return out


def pair_outputs(wanted: list[tuple[str, np.ndarray | None]], tcall: TorchCall
                  ) -> dict[str, tuple[np.ndarray, str]]:
    """Each ONNX output's expected value: the closest torch output of its shape."""
    outputs = [(i, t) for i, (t, v) in enumerate(zip(tcall.outputs, tcall.versions,
                                                     strict=True)) if tensor_version(t) == v]
    used: set[int] = set()
    out: dict[str, tuple[np.ndarray, str]] = {}
    for name, value in wanted:
        best: tuple[tuple[bool, float], int, torch.Tensor] | None = None
        for i, t in outputs:
            if i in used or value is None or tuple(t.shape) != value.shape:
                continue
            d = check_value(value, t, None, None, same_dtype=False).diff
            key = (not d.ok, d.max_abs)
            if best is None or key < best[0]:
                best = (key, i, t)
        if best is not None:
            used.add(best[1])
            out[name] = (to_numpy(best[2]), f"torch output {best[1]}")
    return out
