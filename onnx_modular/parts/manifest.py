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
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx_ir as ir

from onnx_modular.emit.regions import RegionGraph
from onnx_modular.leaves._io import (
    TWO_GB,
    atomic_write_bytes,
    atomic_write_text,
    inside_folder,
    save_model,
)
from onnx_modular.leaves._io.folders import recover, staged_folder
from onnx_modular.leaves.errors import fail
from onnx_modular.leaves.metadata import PARTS_SET_ID

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "onnx_modular.parts"
MANIFEST_VERSION = 1
#: A part whose weights exceed this many bytes keeps them in a data file beside it.
EXTERNAL_DATA_ABOVE = TWO_GB
#: what each stage reading a shared weight holds: its own copy
SHARED_HANDLING = "copied"


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
        from onnx_modular.leaves._compat import treespec_dumps

        return treespec_dumps(spec)
    except Exception:
        return None


def build_manifest(model_graph: ir.Graph, parts: Sequence[RegionGraph], *, kind: str,
                   in_spec: Any = None, out_spec: Any = None,
                   fx_nodes: Mapping[str, int] | None = None,
                   split_by: str | None = None) -> dict[str, Any]:
    """The manifest of ``parts`` (``RegionGraph``s, in order) cut from ``model_graph``;
    ``split_by`` (stages only): how they were cut, with where each stage's weights went."""
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
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "kind": kind,
        "inputs": [value_entry(v) for v in model_graph.inputs],
        "outputs": [value_entry(v) for v in model_graph.outputs],
        "in_spec": spec_dumps(in_spec),
        "out_spec": spec_dumps(out_spec),
        "regions": entries,
    }
    if split_by is not None:
        for entry, part in zip(entries, parts, strict=True):
            entry["parameters"] = len(part.weights)
            entry["parameter_bytes"] = sum(part.weights.values())
        manifest["split_by"] = split_by
        manifest["shared_parameters"] = shared_parameters(parts)
    return manifest


def shared_parameters(parts: Sequence[RegionGraph]) -> dict[str, dict[str, Any]]:
    """Weights read by more than one part (``RegionGraph.weights``): each holds a copy."""
    parts_of: dict[str, list[str]] = {}
    size: dict[str, int] = {}
    for part in parts:
        for name, nbytes in part.weights.items():
            parts_of.setdefault(name, []).append(part.name)
            size[name] = nbytes
    return {name: {"stages": where, "bytes": size[name], "handling": SHARED_HANDLING}
            for name, where in parts_of.items() if len(where) > 1}


def save_single(path: str | os.PathLike[str], model: ir.Model) -> Path:
    """The single-file split (regions as local functions), written atomically."""
    target = Path(path)
    atomic_write_bytes(target, ir.serde.serialize_model(model).SerializeToString())
    return target


def save_parts(directory: str | os.PathLike[str], parts: Sequence[RegionGraph],
               manifest: dict[str, Any]) -> Path:
    """Write every part, then the manifest, as one set: a reader sees the old directory or
    the new one, never a mix, whatever fails or is killed on the way.

    The set is written into a sibling temporary directory and swapped in
    (:func:`~onnx_modular.leaves._io.folders.staged_folder`: the old set stays beside it until the
    new one is in place, and a save killed on the way is undone by the next save or load).
    Parts above 2 GB get external data. The manifest and every part record one ``set_id``:
    a runner that meets two ids refuses.
    """
    out = check_parts_directory(directory)
    existed = out.exists()
    set_id = secrets.token_hex(8)
    try:
        with staged_folder(out) as staging:
            for part in parts:
                part.model.metadata_props[PARTS_SET_ID] = set_id
                save_model(part.model, staging / f"{part.name}.onnx",
                           external_data_threshold=EXTERNAL_DATA_ABOVE)
            atomic_write_text(staging / MANIFEST, json.dumps({**manifest, "set_id": set_id},
                                                             indent=2))
    except OSError as e:
        raise fail(f"cannot write parts to '{out}': {e.strerror or e}"
                   + ("; nothing was changed" if out.exists() == existed else "")) from e
    return out


def check_parts_directory(directory: str | os.PathLike[str]) -> Path:
    """The parts directory as a Path, or one line saying why it cannot be written; the
    command line calls this before the work, ``save_parts`` again before writing."""
    if not str(directory):
        raise fail("cannot write parts to '': the output directory is empty")
    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise fail(f"cannot write parts to '{out}': it is a file, not a directory")
    if out.is_dir():
        # the set replaces the folder as a whole: only an earlier set, or nothing, may go
        ours = (out / MANIFEST).is_file()
        foreign = _not_of_the_earlier_set(out) if ours else sorted(e.name for e in out.iterdir())
        shown = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
        if foreign and ours:
            raise fail(f"cannot write parts to '{out}': it holds files its earlier set did "
                       f"not write ({shown}), and a save replaces the folder as a whole: "
                       "move them, or give another folder")
        if foreign:
            raise fail(f"cannot write parts to '{out}': it holds files and no {MANIFEST} "
                       f"({shown}); it is not a parts directory, and saving would replace "
                       "them: give an empty or new folder")
    parent = out.parent
    if not parent.is_dir():
        raise fail(f"cannot write parts to '{out}': directory '{parent}' does not exist")
    if not os.access(parent, os.W_OK):
        raise fail(f"cannot write parts to '{out}': directory '{parent}' is not writable")
    return out


def _not_of_the_earlier_set(folder: Path) -> list[str]:
    """Names in a parts folder that are neither its manifest nor a file of the set it
    lists (a part, or a part's external weights ``<part>.onnx.<id>.data``): yours, which a
    save would delete. None counted where the manifest cannot be read (nothing to go by)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        files = [r["file"] for r in manifest["regions"] if isinstance(r.get("file"), str)]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    return sorted(e.name for e in folder.iterdir()
                  if e.name != MANIFEST and not any(e.name == f or e.name.startswith(f + ".")
                                                    for f in files))


def load_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check ``manifest.json`` of a parts directory: every field the runner uses
    has the right form, and every file is a plain name inside the directory."""
    folder = Path(directory)
    recover(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise fail(f"'{directory}' holds no {MANIFEST}; write it with .save(directory)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise fail(f"cannot read '{path}': invalid JSON ({e})") from e
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise fail(f"'{path}' is not an onnx_modular parts manifest")
    version = manifest.get("version", 0)
    if not isinstance(version, int) or version > MANIFEST_VERSION:
        raise fail(f"'{path}' has manifest version {version!r}; this onnx_modular reads up "
                   f"to {MANIFEST_VERSION}")
    parts = manifest.get("regions")
    if not isinstance(parts, list) or not parts:
        raise fail(f"'{path}' lists no regions")
    for key in ("inputs", "outputs"):
        _check_values(manifest.get(key), f"'{path}': {key}")
    names: set[str] = set()
    for k, part in enumerate(parts):
        where = f"'{path}': region #{k}"
        if not isinstance(part, dict):
            raise fail(f"{where} is not an object")
        for key in ("name", "file"):
            if not isinstance(part.get(key), str) or not part[key]:
                raise fail(f"{where} has no '{key}' (a string)")
        if part["name"] in names:
            raise fail(f"{where}: the name '{part['name']}' is used twice")
        names.add(part["name"])
        if part.get("kind", "acc") not in ("acc", "cpu", "stage"):
            raise fail(f"{where}: kind {part.get('kind')!r} is not acc, cpu or stage")
        inside_directory(folder, part["file"], where)
        _check_values(part.get("inputs", []), f"{where} inputs")
        _check_values(part.get("outputs", []), f"{where} outputs")
    return manifest


def _check_values(values: Any, where: str) -> None:
    if not isinstance(values, list) or not all(
            isinstance(v, dict) and isinstance(v.get("name"), str) for v in values):
        raise fail(f"{where} must be a list of {{\"name\": ...}} objects")


def inside_directory(folder: Path, name: str, where: str) -> Path:
    """``folder/name``, refused unless it is a plain file name of a regular file inside
    ``folder`` (no ``..``, no absolute path, no symbolic link): :func:`_io.inside_folder`,
    the rule checkpoint shards follow too."""
    return inside_folder(folder, name, where)
