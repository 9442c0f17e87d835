"""compare-io: run an ONNX model on saved inputs and compare with saved expected outputs.

The other half of an extracted repro (:mod:`onnx_modular.check.extract`): anyone with the
three files and onnxruntime can see the mismatch, without the torch model. Inputs and
expected outputs are ``.npz`` files keyed by the model's input and output names; values
are judged as ``validate`` judges them (:mod:`onnx_modular.check.numerics`); the report is
rendered by :mod:`onnx_modular.check.io_report`.
"""

from __future__ import annotations

import io
import math
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from onnx_modular.check.inputs import declared_inputs
from onnx_modular.check.io_report import IOReport
from onnx_modular.check.numerics import check_value, dtype_name, onnx_elem_name, tolerances_for
from onnx_modular.check.outcome import OutputCheck, ProviderResult
from onnx_modular.check.runners import Inputs, SessionRunner
from onnx_modular.leaves import runtime
from onnx_modular.leaves._util import check_allocation
from onnx_modular.leaves.errors import fail

__all__ = ["IOReport", "compare_io", "load_npz", "npz_bytes"]


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """An ``.npz`` archive of ``arrays`` in memory (written atomically by the caller).

    numpy cannot store bfloat16: such arrays are stored as their uint16 bit patterns, and
    :func:`compare_io` views them back by the dtype the model declares.
    """
    out = {}
    for name, array in arrays.items():
        array = np.asarray(array)
        if array.dtype.name == "bfloat16":
            array = array.view(np.uint16)
        out[name] = array
    buffer = io.BytesIO()
    np.savez(buffer, **out)  # type: ignore[arg-type]
    return buffer.getvalue()


def load_npz(path: str | Path, what: str) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` file; one-line errors for what cannot be read.

    Each array's header is read before its data, so a header declaring more elements than
    memory holds fails in one line instead of a MemoryError; a ``.npy`` file, an empty
    archive, and arrays that are not numbers (strings, records, objects) are refused.
    """
    file = Path(path)
    where = f"cannot read {what} '{str(file)[:80]}'"
    try:
        if not file.is_file():
            raise fail(f"cannot read {what} '{file}': no such file")
    except OSError as exc:  # a name too long for the file system, ...
        raise fail(f"{where}: {exc.strerror or exc}") from exc
    try:
        with open(file, "rb") as handle:
            magic = handle.read(6)
        if magic == b"\x93NUMPY":
            raise fail(f"{where}: it is one .npy array, not an .npz archive of arrays named "
                       "after the model's values (numpy.savez(path, name=array))")
        if not zipfile.is_zipfile(file):
            raise fail(f"{where}: not a numpy .npz archive")
        arrays: dict[str, np.ndarray] = {}
        with zipfile.ZipFile(file) as archive:
            members = [m for m in archive.namelist() if m.endswith(".npy")]
            if not members:
                raise fail(f"{where}: the archive holds no arrays")
            for member in members:
                name = member.removesuffix(".npy")
                with archive.open(member) as stream:
                    arrays[name] = _read_array(stream, f"{where}: array '{name}'")
        return arrays
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, MemoryError) as exc:
        raise fail(f"{where}: not a numpy .npz archive ({runtime.first_line(exc)})") from exc


def _read_array(stream: Any, where: str) -> np.ndarray:
    """One ``.npy`` member: its header checked (numbers, a size memory holds), then read."""
    version = np.lib.format.read_magic(stream)
    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                   else np.lib.format.read_array_header_2_0)
    shape, fortran, dtype = read_header(stream)
    if dtype.fields is not None or dtype.kind not in "biufc":
        raise fail(f"{where} holds {dtype} values, not numbers")
    check_allocation(shape, dtype.itemsize, where)
    count = math.prod(shape)
    data = bytearray(count * dtype.itemsize)  # read in place: one copy of the values
    view, got = memoryview(data), 0
    while got < len(data):
        n = stream.readinto(view[got:])
        if not n:
            raise fail(f"{where} is truncated ({got} of {len(data)} bytes)")
        got += n
    array = np.frombuffer(data, dtype=dtype, count=count)
    return array.reshape(shape, order="F" if fortran else "C")


def _as_declared(name: str, array: np.ndarray, elem: str) -> np.ndarray:
    """``array`` in the dtype the model declares for input ``name``."""
    if elem == "bfloat16" and array.dtype.itemsize == 2 and array.dtype.kind in "uV":
        import ml_dtypes

        return array.view(np.uint16).view(ml_dtypes.bfloat16)
    have = "bool" if array.dtype == np.bool_ else str(array.dtype)
    if have != elem:
        raise fail(f"input '{name}' is {have} in the inputs file but the model expects {elem}")
    return array


def _tolerances(got: np.ndarray, want: np.ndarray, rtol: float | None,
                atol: float | None) -> tuple[float | None, float | None]:
    """The looser of the two dtypes' defaults: a bfloat16 output's expected value is stored
    widened to float32, and must not be held to float32's tolerance."""
    if rtol is not None and atol is not None:
        return rtol, atol
    pairs = [tolerances_for(dtype_name(x), None, None) for x in (got, want)]
    return (max(r for r, _ in pairs) if rtol is None else rtol,
            max(a for _, a in pairs) if atol is None else atol)


def compare_io(model: runtime.OnnxModelSource | bytes,
               inputs: str | Path | Mapping[str, np.ndarray],
               expected: str | Path | Mapping[str, np.ndarray], *,
               providers: str | Sequence[str] | None = None, rtol: float | None = None,
               atol: float | None = None) -> IOReport:
    """Run ``model`` (a path, ``ModelProto`` or bytes) on ``inputs`` and compare every output
    named in ``expected`` within the per-dtype tolerances (``rtol``/``atol`` override).

    Inputs are bound by name; a missing, extra or mistyped input, or an expected name the
    model does not output, is a one-line error (a usage error, not a mismatch).
    """
    if isinstance(model, bytes):
        import onnx

        loaded = runtime.LoadedModel(onnx.load_from_string(model), "<bytes>", _bytes=model)
    else:
        loaded = runtime.load_model(model)
    feeds_in = inputs if isinstance(inputs, Mapping) else load_npz(inputs, "inputs")
    wanted = expected if isinstance(expected, Mapping) else load_npz(expected, "expected")
    declared = {i.name: onnx_elem_name(i.type.tensor_type.elem_type)
                for i in declared_inputs(loaded.proto)}
    missing = [n for n in declared if n not in feeds_in]
    extra = [n for n in feeds_in if n not in declared]
    if missing or extra:
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"unknown {', '.join(extra)}"] if extra else [])
        raise fail(f"the inputs do not fit {loaded.label} (inputs {', '.join(declared)}): "
                   f"{'; '.join(parts)}")
    feeds = {n: runtime.to_feed(_as_declared(n, np.asarray(feeds_in[n]), declared[n]))
             for n in declared}
    output_names = [o.name for o in loaded.proto.graph.output]
    unknown = [n for n in wanted if n not in output_names]
    if unknown:
        raise fail(f"expected output(s) {', '.join(unknown)} are not outputs of "
                   f"{loaded.label} (outputs {', '.join(output_names)})")
    compared = [n for n in output_names if n in wanted]
    results = []
    for provider in runtime.resolve_providers(providers):
        with SessionRunner.open(loaded, provider, config=loaded.session_config(),
                                output_names=compared) as session:
            actual = session.run(Inputs(feeds=feeds))
        checks = []
        for name, got in zip(compared, actual.values, strict=True):
            want = np.asarray(wanted[name])
            r, a = _tolerances(got, want, rtol, atol)
            c = check_value(got, want, r, a, same_dtype=False)
            checks.append(OutputCheck.of(name, list(want.shape), c))
        results.append(ProviderResult(provider, checks, session.session_s, actual.seconds))
    return IOReport(loaded.label, results, [n for n in output_names if n not in wanted])
