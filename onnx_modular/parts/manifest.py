"""The on-disk format of a model cut into parts (split regions or pipeline stages).

A parts directory holds one standalone ONNX model per part and ``manifest.json``::

    {"format": "onnx_modular.parts", "version": 1, "kind": "split" | "stages",
     "inputs":  [{"name", "dtype", "shape"}],          # the whole model's flat inputs
     "outputs": [{"name", "dtype", "shape"}],          # ... and flat outputs, in order
     "in_spec": <pytree TreeSpec JSON or null>, "out_spec": <... or null>,
     "regions": [{"name", "kind": "acc" | "cpu" | "stage", "file", "fx_nodes", "onnx_nodes",
                  "inputs":  [{"name", "dtype", "shape", "from": <part name> | "input"}],
                  "outputs": [{"name", "dtype", "shape", "to": [<part name> | "output"]}]}]}

Stages (``kind: "stages"``) add ``"split_by"`` (markers, split_points, callback, or the
balanced plan's ``num_stages=N`` / ``max_stage_bytes=...``), per part
``"parameters"`` and ``"parameter_bytes"``, and ``"shared_parameters": {name: {"stages": [...],
"bytes", "handling": "copied"}}`` for weights several stages read (each holds a copy).

Parts are listed in execution order; values are matched by name. :class:`SplitRunner` runs
any ``kind`` but ``cpu`` on the accelerator providers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx_ir as ir

from onnx_modular._io import atomic_write_bytes, atomic_write_text
from onnx_modular.errors import fail

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "onnx_modular.parts"
MANIFEST_VERSION = 1


def dtype_name(value: ir.Value) -> str | None:
    """numpy's name of the value's element type (``float32``, ``int64``, ``bool``)."""
    if value.type is None or getattr(value.type, "dtype", None) is None:
        return None
    dtype = value.type.dtype
    if dtype == ir.DataType.BOOL:
        return "bool"
    try:
        return str(dtype.numpy())
    except Exception:  # no numpy dtype (bfloat16, float8): ONNX's name
        return dtype.name.lower()


def shape_of(value: ir.Value) -> list[int | str] | None:
    if value.shape is None:
        return None
    return [d if isinstance(d, int) else str(d) for d in value.shape]


def value_entry(value: ir.Value, **extra: Any) -> dict[str, Any]:
    return {"name": value.name, "dtype": dtype_name(value), "shape": shape_of(value), **extra}


def spec_dumps(spec: Any) -> str | None:
    """A pytree spec as JSON text; ``None`` where pytree cannot serialize a container."""
    if spec is None:
        return None
    try:
        from onnx_modular._compat import treespec_dumps

        return treespec_dumps(spec)
    except Exception:
        return None


def build_manifest(model_graph: ir.Graph, parts: Sequence[Any], *, kind: str,
                   in_spec: Any = None, out_spec: Any = None,
                   fx_nodes: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The manifest of ``parts`` (``RegionGraph``s, in order) cut from ``model_graph``."""
    entries = []
    for part in parts:
        graph = part.model.graph
        entries.append({
            "name": part.name,
            "kind": part.kind,
            "file": f"{part.name}.onnx",
            "fx_nodes": (fx_nodes or {}).get(part.name),
            "onnx_nodes": graph.num_nodes(),
            "inputs": [value_entry(v, **{"from": part.sources.get(v.name or "", "input")})
                       for v in graph.inputs],
            "outputs": [value_entry(v, to=part.consumers.get(v.name or "", []))
                        for v in graph.outputs],
        })
    return {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "kind": kind,
        "inputs": [value_entry(v) for v in model_graph.inputs],
        "outputs": [value_entry(v) for v in model_graph.outputs],
        "in_spec": spec_dumps(in_spec),
        "out_spec": spec_dumps(out_spec),
        "regions": entries,
    }


def save_parts(directory: str | os.PathLike[str], parts: Sequence[Any],
               manifest: dict[str, Any]) -> Path:
    """Write each part's model, then the manifest; every file lands whole (temp, rename)."""
    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise fail(f"cannot write parts to '{out}': it is a file, not a directory")
    out.mkdir(parents=True, exist_ok=True)
    for part in parts:
        proto = ir.serde.serialize_model(part.model)
        atomic_write_bytes(out / f"{part.name}.onnx", proto.SerializeToString())
    atomic_write_text(out / MANIFEST, json.dumps(manifest, indent=2))
    return out


def load_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check ``manifest.json`` of a parts directory."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise fail(f"'{directory}' holds no {MANIFEST}; write it with .save(directory)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise fail(f"cannot read '{path}': invalid JSON ({e.msg})") from e
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise fail(f"'{path}' is not an onnx_modular parts manifest")
    if manifest.get("version", 0) > MANIFEST_VERSION:
        raise fail(f"'{path}' has manifest version {manifest.get('version')}; this "
                   f"onnx_modular reads up to {MANIFEST_VERSION}")
    parts = manifest.get("regions")
    if not isinstance(parts, list) or not parts:
        raise fail(f"'{path}' lists no regions")
    return manifest
