"""Extraction, start to end: the call chosen, cut out with its values, and every file of
the repro written into the staged-folder transaction (:func:`~onnx_modular.leaves._io.folders.
staged_folder`), which swaps the folder in as a whole under a lock on its parent, so two
extractions at once leave one whole repro, never a mix."""

from __future__ import annotations

import dataclasses
import errno
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from onnx_modular.check.call_stats import CallError
from onnx_modular.check.compare_io import compare_io, npz_bytes
from onnx_modular.check.extract.choose import find_call
from onnx_modular.check.extract.cut import Built, cut, nbytes, standalone_model, weight
from onnx_modular.check.extract.folder import (
    EXPECTED,
    INPUTS,
    MODULE,
    README,
    check_directory,
    mark,
)
from onnx_modular.check.extract.record import Extraction, Port, Target, command, readme
from onnx_modular.check.extract.values import pair_inputs, pair_outputs
from onnx_modular.check.judge import Evidence, Localization
from onnx_modular.check.numerics import dtype_name
from onnx_modular.check.recorder import TorchCall
from onnx_modular.leaves import runtime
from onnx_modular.leaves._io import atomic_write_bytes, atomic_write_text, save_model
from onnx_modular.leaves._io.folders import staged_folder
from onnx_modular.leaves.errors import fail, rules


@dataclasses.dataclass(frozen=True)
class Repro:
    """The call cut out with its values: the module as a model (``kind``: hierarchical or
    flat), its weights, the inputs torch passed (or ONNX's, each with where it came from),
    torch's outputs as the expected values, and ONNX's values of the outputs."""

    call: TorchCall
    kind: str
    built: Built
    model: onnx.ModelProto
    weights: list[onnx.TensorProto]
    inputs: dict[str, tuple[np.ndarray, str]]
    expected: dict[str, tuple[np.ndarray, str]]
    outputs: dict[str, np.ndarray | None]


def extract(localization: Localization, loaded: runtime.LoadedModel, provider: str,
            directory: str | Path, call: str | None = None) -> Extraction:
    """Write the repro of ``call`` (default: the first mismatch) into ``directory``."""
    evidence = localization.evidence
    if evidence is None:
        raise fail("nothing to extract from: the localization kept no values",
                   rules.VALIDATION)
    if call is None:
        if localization.first is None:
            raise fail("no module call diverges, so there is nothing to extract by default; "
                       "name a call to extract one anyway", rules.VALIDATION)
        call = localization.first.call_id
    j = find_call(evidence.torch_calls, call, set(evidence.mapping.values()))
    tcall = evidence.torch_calls[j]
    k = evidence.onnx_call_of(j)
    if k is None:
        raise fail(f"module call '{tcall.call_id}' has no counterpart in the ONNX model "
                   "that could be paired with torch, so it cannot be extracted",
                   rules.VALIDATION)
    target = Target(Path(directory), provider, loaded.label, evidence.rtol, evidence.atol)
    repro = _cut(evidence, k, j, loaded)
    return _write(target, repro, next((e for e in localization.errors if e.order == j), None))


def _cut(evidence: Evidence, k: int, j: int, loaded: runtime.LoadedModel) -> Repro:
    """ONNX call ``k`` (torch call ``j``) of the validated model as a :class:`Repro`."""
    probe, tcall = evidence.probe, evidence.torch_calls[j]
    proto = loaded.proto
    graph = probe.graph if probe.graph is not None else proto.graph
    built, kind = cut(proto, graph, probe.calls[k], tcall.call_id)
    values = evidence.values
    inputs = pair_inputs([(n, values.get(a)) for n, a in built.inputs], tcall)
    expected = pair_outputs([(n, values.get(a)) for n, a in built.outputs], tcall)
    if not expected:
        raise fail(f"torch's outputs of '{tcall.call_id}' cannot be paired with the ONNX "
                   "call's (changed in place, or of other shapes): nothing to compare",
                   rules.VALIDATION)
    initializers = {i.name: i for i in proto.graph.initializer}
    base = loaded.path.parent if loaded.path is not None else None
    weights = [weight(initializers[actual], name, base) for name, actual in built.weights]
    outputs = {n: values.get(a) for n, a in built.outputs}
    model = standalone_model(proto, built, weights, {n: v for n, (v, _) in inputs.items()},
                             outputs, tcall, loaded.label)
    return Repro(tcall, kind, built, model, weights, inputs, expected, outputs)


def _write(target: Target, repro: Repro, in_model: CallError | None) -> Extraction:
    """Every file of the repro into the folder, swapped in as a whole; the folder is checked
    again under the lock (what another writer did meanwhile is ours, or refused)."""
    directory = target.directory
    folder = check_directory(directory)
    try:
        with staged_folder(folder, check=lambda: check_directory(directory),
                           keep_cwd=True) as staging:
            extraction = _stage(staging, target, repro, in_model)
            mark(staging, repro.call.call_id)
    except OSError as exc:
        why = "no space left on the device" if exc.errno == errno.ENOSPC else \
            exc.strerror or str(exc)
        raise fail(f"cannot extract to '{directory}': {why} (the folder was left as it was)",
                   rules.VALIDATION) from exc
    return extraction


def _stage(staging: Path, target: Target, repro: Repro, in_model: CallError | None
           ) -> Extraction:
    """Every file of the repro, written into ``staging`` and checked there."""
    inputs, expected, out_values = repro.inputs, repro.expected, repro.outputs
    atomic_write_bytes(staging / INPUTS, npz_bytes({n: v for n, (v, _) in inputs.items()}))
    atomic_write_bytes(staging / EXPECTED,
                       npz_bytes({n: v for n, (v, _) in expected.items()}))
    save_model(ir.serde.deserialize_model(repro.model), staging / MODULE)
    alone = compare_io(staging / MODULE, staging / INPUTS, staging / EXPECTED,
                       providers=[target.provider], rtol=target.rtol, atol=target.atol)
    extraction = Extraction(
        target.directory, repro.call.call_id, repro.call.module_type, repro.kind,
        [Port(n, list(v.shape), dtype_name(v), src) for n, (v, src) in inputs.items()],
        [Port(n, list(expected[n][0].shape) if n in expected else
              list(getattr(out_values[n], "shape", [])),
              dtype_name(out_values[n]) if out_values[n] is not None else "?",
              expected[n][1] if n in expected else "not compared")
         for n, _ in repro.built.outputs],
        len(repro.weights), sum(nbytes(w) for w in repro.weights), in_model, alone,
        command(target, prefix=f"{target.directory}/"))
    atomic_write_text(staging / README, readme(extraction, target))
    return extraction
