"""ONNX Runtime plumbing shared by validate and compare: loading, providers, sessions, errors.

Everything a user can get wrong here (an unreadable file, a provider that is not installed,
a model ORT rejects) becomes a one-line :class:`OnnxModularError`, never a traceback.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from onnx_modular.diagnostics import DiagnosticContext, OnnxModularError
from onnx_modular.errors import rules

#: Short names users type on the command line.
PROVIDER_ALIASES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "gpu": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "trt": "TensorrtExecutionProvider",
}
DEFAULT_PROVIDERS = ("CUDAExecutionProvider", "CPUExecutionProvider")


def provider_name(short: str) -> str:
    """``cuda`` / ``CUDA`` / ``CUDAExecutionProvider`` -> ``CUDAExecutionProvider``."""
    name = PROVIDER_ALIASES.get(short.strip().lower(), short.strip())
    return name if name.endswith("ExecutionProvider") else name + "ExecutionProvider"


def _fail(reason: str, rule: Any = rules.BAD_INPUT) -> OnnxModularError:
    return DiagnosticContext().error(rule, reason=reason)


class ProviderUnavailableError(OnnxModularError):
    """An execution provider that ONNX Runtime lists but cannot start (no GPU, no driver).

    Its own class so that validation with default providers can skip it with the reason,
    while an explicit request for it stays an error.
    """


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = lines[0] if lines else text
    return line if len(line) <= 300 else line[:297] + "..."


# ---- loading ---------------------------------------------------------------------------------

@dataclasses.dataclass
class LoadedModel:
    """A model and where it came from; ``path`` lets ORT find external data beside it."""

    proto: onnx.ModelProto
    label: str
    path: Path | None = None
    _bytes: bytes | None = dataclasses.field(default=None, repr=False)

    @property
    def size_bytes(self) -> int:
        if self.path is not None:
            total = self.path.stat().st_size
            for name in _external_files(self.proto):
                ext = self.path.parent / name
                if ext.is_file():
                    total += ext.stat().st_size
            return total
        return self.proto.ByteSize()

    @property
    def has_external_data(self) -> bool:
        return bool(_external_files(self.proto))

    def model_bytes(self) -> bytes:
        """The serialized model (the file's own bytes for a path), made once."""
        if self._bytes is None:
            self._bytes = (self.path.read_bytes() if self.path is not None
                           else self.proto.SerializeToString())
        return self._bytes

    def session_source(self) -> str | bytes:
        """What to hand to ``InferenceSession``: the path when there is one (external data)."""
        return str(self.path) if self.path is not None else self.model_bytes()

    def session_config(self) -> dict[str, str]:
        """Lets ORT find external data when it loads bytes derived from this model."""
        if self.path is not None and self.has_external_data:
            return {"session.model_external_initializers_file_folder_path":
                    str(self.path.parent.resolve())}
        return {}


def _external_files(proto: onnx.ModelProto) -> set[str]:
    names = set()
    for init in proto.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            for entry in init.external_data:
                if entry.key == "location":
                    names.add(entry.value)
    return names


def load_model(onnx_model: Any, what: str = "ONNX model") -> LoadedModel:
    """A path, an ``onnx.ModelProto`` or anything with ``.model_proto`` (an export result).

    A :class:`LoadedModel` passes through, so the command line can read a file once, early
    (a corrupt file fails before the torch model is built), and keep its path as the label.
    """
    if isinstance(onnx_model, LoadedModel):
        return onnx_model
    if isinstance(onnx_model, onnx.ModelProto):
        return LoadedModel(onnx_model, "<ModelProto>")
    proto = getattr(onnx_model, "model_proto", None)
    if isinstance(proto, onnx.ModelProto):
        return LoadedModel(proto, f"<{type(onnx_model).__name__}>")
    if isinstance(onnx_model, (str, os.PathLike)):
        path = Path(onnx_model)
        if path.is_dir():
            raise _fail(f"cannot read {what} '{path}': it is a directory, not an ONNX file")
        if not path.is_file():
            raise _fail(f"cannot read {what} '{path}': no such file")
        try:
            proto = onnx.load(str(path))
        except Exception as exc:  # DecodeError, missing external data, ...
            raise _fail(f"cannot read {what} '{path}': not a valid ONNX file "
                        f"({_first_line(exc)})") from None
        if not proto.graph.node and not proto.graph.output:
            raise _fail(f"cannot read {what} '{path}': the file holds no ONNX graph")
        return LoadedModel(proto, str(path), path)
    raise _fail(f"{what} must be a path, an onnx.ModelProto or an export result with "
                f".model_proto, got {type(onnx_model).__name__}")


# ---- providers and sessions ----------------------------------------------------------------

def available_providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


def resolve_providers(providers: str | Sequence[str] | None) -> list[str]:
    """Full EP names; ``None`` means every available one of CUDA and CPU."""
    available = available_providers()
    if providers is None:
        return [p for p in DEFAULT_PROVIDERS if p in available]
    if isinstance(providers, str):
        providers = [p for p in providers.split(",") if p.strip()]
    resolved: list[str] = []
    for p in providers:
        name = provider_name(p)
        if name not in available:
            hint = (" (it needs the onnxruntime-gpu package and a CUDA GPU)"
                    if name == "CUDAExecutionProvider" else "")
            raise _fail(f"execution provider '{p}' is not available{hint}; "
                        f"available: {', '.join(available)}")
        if name not in resolved:
            resolved.append(name)
    if not resolved:
        raise _fail("no execution provider given")
    return resolved


def unavailable_defaults(chosen: Sequence[str]) -> dict[str, str]:
    """Default providers missing from ``chosen``, each with why (stated, not silent)."""
    return {p: ("this onnxruntime has no CUDAExecutionProvider (it needs the onnxruntime-gpu "
                "package and a CUDA GPU)" if p == "CUDAExecutionProvider"
                else "not available in this onnxruntime")
            for p in DEFAULT_PROVIDERS if p not in chosen}


def short_provider(name: str) -> str:
    return name.removesuffix("ExecutionProvider")


def make_session(source: str | bytes, provider: str,
                 config: dict[str, str] | None = None) -> tuple[Any, float]:
    """An ORT session on one provider (CPU as fallback for nodes it lacks) and its build time."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    chain = [provider] if provider == "CPUExecutionProvider" else [provider, "CPUExecutionProvider"]
    start = time.perf_counter()
    try:
        session = ort.InferenceSession(source, options, providers=chain)
    except Exception as exc:
        raise _fail(f"ONNX Runtime cannot load the model on {short_provider(provider)}: "
                    f"{_first_line(exc)}", rules.VALIDATION) from None
    elapsed = time.perf_counter() - start
    if provider not in session.get_providers():
        raise ProviderUnavailableError(_fail(
            f"{provider} could not be initialized (ONNX Runtime fell back to "
            f"{', '.join(session.get_providers())}); check the GPU, CUDA and cuDNN install",
            rules.VALIDATION).diagnostic)
    return session, elapsed


def run_session(session: Any, feeds: dict[str, np.ndarray],
                output_names: list[str] | None = None) -> tuple[list[np.ndarray], float]:
    start = time.perf_counter()
    try:
        outputs = session.run(output_names, feeds)
    except Exception as exc:
        raise _fail(f"ONNX Runtime failed to run the model: {_first_line(exc)}",
                    rules.VALIDATION) from None
    return outputs, time.perf_counter() - start


# ---- dtypes and tolerances -----------------------------------------------------------------

#: (rtol, atol) by ONNX element type name; integers and bool compare exactly.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-3),
    "bfloat16": (1.6e-2, 1e-2),
}


def is_float(dtype_name: str) -> bool:
    return dtype_name in DEFAULT_TOLERANCES or dtype_name.startswith("float8")


def tolerances_for(dtype_name: str, rtol: float | None, atol: float | None) -> tuple[float, float]:
    """User values apply to floating outputs; integers and bool are always exact."""
    if not is_float(dtype_name):
        return 0.0, 0.0
    d_rtol, d_atol = DEFAULT_TOLERANCES.get(dtype_name, (1.6e-2, 1e-2))
    return (d_rtol if rtol is None else rtol), (d_atol if atol is None else atol)


def dtype_name(array: np.ndarray) -> str:
    return "bool" if array.dtype == np.bool_ else str(array.dtype)


def onnx_elem_name(elem_type: int) -> str:
    try:
        np_type = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    except Exception:
        return onnx.TensorProto.DataType.Name(elem_type).lower()
    return "bool" if np_type == np.bool_ else str(np.dtype(np_type))


@dataclasses.dataclass
class Diff:
    """How far ``actual`` is from ``expected``; ``ok`` is an allclose with NaN == NaN."""

    max_abs: float
    max_rel: float
    ok: bool
    mismatched: int = 0
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"max_abs_err": _json_float(self.max_abs), "max_rel_err": _json_float(self.max_rel),
                "ok": self.ok, "mismatched": self.mismatched, "note": self.note}


def _json_float(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def diff(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> Diff:
    """Max abs and rel error (rel over ``max(|expected|, atol)``), and pass/fail."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape:
        return Diff(math.inf, math.inf, False, int(expected.size),
                    f"shape {list(actual.shape)} != expected {list(expected.shape)}")
    if actual.size == 0:
        return Diff(0.0, 0.0, True)
    fast = _diff_finite(actual, expected, rtol, atol)
    if fast is not None:
        return fast
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    both_nan = np.isnan(a) & np.isnan(e)
    same_inf = np.isinf(a) & np.isinf(e) & (np.sign(a) == np.sign(e))
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(a - e)
        err = np.where(both_nan | same_inf, 0.0, err)
        err = np.where(np.isnan(err), np.inf, err)
        bad = err > atol + rtol * np.abs(e)
        rel = err / np.maximum(np.abs(e), max(atol, np.finfo(np.float64).tiny))
    mismatched = int(np.count_nonzero(bad))
    return Diff(float(err.max()), float(np.nan_to_num(rel, nan=np.inf).max()),
                mismatched == 0, mismatched)


def _diff_finite(actual: np.ndarray, expected: np.ndarray, rtol: float,
                 atol: float) -> Diff | None:
    """The common case in the arrays' own float type; None when NaN or inf is involved."""
    if actual.dtype != expected.dtype or actual.dtype not in (np.float32, np.float64):
        return None
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(actual - expected)
        max_abs = float(err.max())
        if not math.isfinite(max_abs):
            return None
        scale = np.abs(expected)
        limit = scale * rtol
        limit += atol
        mismatched = int(np.count_nonzero(err > limit))
        np.maximum(scale, max(atol, np.finfo(actual.dtype).tiny), out=scale)
        max_rel = float((err / scale).max())
    return Diff(max_abs, max_rel, mismatched == 0, mismatched)
