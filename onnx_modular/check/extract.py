"""Extraction: one module call as a repro anyone can run, fed what reached it in torch.

Localization names the module call that diverges; a compiler or runtime engineer wants
that module alone, on the exact tensors it saw, with torch's answer beside it, and no torch
model. :func:`extract` writes, for one call of a validated model:

- ``module.onnx``: that call as a standalone model. Hierarchical models give the call's
  function body (nested calls stay functions); flat ones the call's nodes (found by their
  ``name_scopes``). Inputs and outputs keep the body's relative names (``input_0``,
  ``ln_1.weight``, ``output_0``); weights are the call's own arguments in the original
  model (external data is read from the model's directory) and become initializers.
- ``inputs.npz``: the tensors that reached the call *in torch*, so the repro isolates this
  module from upstream drift (values torch never passed, such as a mask the ONNX parent
  computed from constants, are ONNX's); ``expected.npz``: torch's outputs for them.
- ``README.md``: the one-line ``compare-io`` command, plain onnxruntime code, and the error
  measured in the full model and on the module alone.
- ``.onnx_modular-extraction.json``: what this extraction wrote (each file's size and time),
  so the next one into the folder replaces exactly those files, unchanged, and refuses a
  folder holding any other (a user's own ``README.md`` or ``module.onnx`` included).

Everything comes from the localization's evidence (:class:`~onnx_modular.check.judge.
Evidence`): no re-export and, for the first mismatch, no second torch run.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import secrets
import shlex
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import torch

from onnx_modular import runtime
from onnx_modular._compat import tensor_version
from onnx_modular._io import (
    atomic_write_bytes,
    atomic_write_text,
    clean_stale_temporaries,
    directory_lock,
    save_model,
)
from onnx_modular.check.call_stats import CallError
from onnx_modular.check.compare_io import compare_io, npz_bytes
from onnx_modular.check.io_report import IOReport
from onnx_modular.check.judge import Evidence, Localization
from onnx_modular.check.numerics import (
    check_value,
    dtype_name,
    is_float,
    to_numpy,
    tolerances_for,
)
from onnx_modular.check.probe import OnnxCall
from onnx_modular.check.recorder import TorchCall
from onnx_modular.check.report import fmt_err
from onnx_modular.errors import fail, rules
from onnx_modular.parts.manifest import restore_interrupted_swap, swap_in

__all__ = ["Extraction", "check_directory", "extract", "find_call"]

MODULE, INPUTS, EXPECTED, README = "module.onnx", "inputs.npz", "expected.npz", "README.md"
#: What an extraction wrote, in the folder: how the next one knows the files are its own.
MARKER = ".onnx_modular-extraction.json"
MARKER_FORMAT = "onnx_modular.extraction"


@dataclasses.dataclass
class Port:
    """One input or output of the extracted module and where its value came from."""

    name: str
    shape: list[int]
    dtype: str
    source: str  # "torch input 0", "ONNX value (not a torch input)", "torch output 1"...


@dataclasses.dataclass
class Extraction:
    """What :func:`extract` wrote, and whether the module alone reproduces the mismatch."""

    directory: Path
    call_id: str
    module_type: str
    kind: str  # "hierarchical" (a function body) or "flat" (the call's nodes)
    inputs: list[Port]
    outputs: list[Port]
    weights: int
    weight_bytes: int
    in_model: CallError | None  # the call's error inside the full model
    alone: IOReport  # the module alone on torch's inputs
    command: str

    @property
    def reproduces(self) -> bool:
        """The module alone diverges from torch on torch's own inputs."""
        return not self.alone.ok

    @property
    def files(self) -> list[Path]:
        return [self.directory / n for n in (MODULE, INPUTS, EXPECTED, README)]

    def __str__(self) -> str:
        state = (f"reproduces the mismatch (max abs err {fmt_err(self.alone.max_abs)})"
                 if self.reproduces else "matches torch on torch's inputs")
        return f"{self.call_id} extracted to {self.directory}: the module alone {state}"


# ---- choosing the call -----------------------------------------------------------------------

def find_call(calls: list[TorchCall], wanted: str, paired: set[int] | None = None) -> int:
    """The torch call a user names: a call id or module path, exactly or by its tail
    (``h.17.attn`` for ``model.h.17.attn``); an unknown or ambiguous name is an error.

    ``paired``: calls with an ONNX counterpart, preferred where one call was recorded twice
    (a modularized program runs each call's GraphModule inside a wrapper of the same id).
    """
    def pick(found: list[int]) -> int:
        return next((i for i in found if paired is None or i in paired), found[0])

    for rule in (lambda c: c.call_id == wanted, lambda c: c.module_path == wanted):
        found = [i for i, c in enumerate(calls) if rule(c)]
        if found:
            return pick(found)
    tail = [i for i, c in enumerate(calls) if c.call_id.endswith("." + wanted)]
    if len({calls[i].call_id for i in tail}) == 1:
        return pick(tail)
    if tail:
        names = ", ".join(dict.fromkeys(calls[i].call_id for i in tail[:8]))
        raise fail(f"call '{wanted}' is ambiguous: {names}; give the full call id",
                   rules.VALIDATION)
    import difflib

    close = difflib.get_close_matches(wanted, list(dict.fromkeys(c.call_id for c in calls)),
                                      n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise fail(f"no module call '{wanted}' in the torch model{hint}", rules.VALIDATION)


# ---- the standalone model --------------------------------------------------------------------

@dataclasses.dataclass
class _Built:
    """The module as a graph: its nodes and functions, which of its inputs are weights
    (with the original initializer), constants to embed, and the other inputs/outputs
    (with the value names they carry in the probe)."""

    nodes: list[onnx.NodeProto]
    functions: list[onnx.FunctionProto]
    weights: list[tuple[str, str]]
    constants: list[onnx.NodeProto]
    inputs: list[tuple[str, str]]
    outputs: list[tuple[str, str]]
    value_info: list[onnx.ValueInfoProto]


def _reachable(nodes: list[onnx.NodeProto], functions: dict[tuple[str, str, str], Any]
               ) -> list[onnx.FunctionProto]:
    """The functions ``nodes`` call, directly or not, in the model's order."""
    seen: set[tuple[str, str, str]] = set()
    todo = list(nodes)
    while todo:
        node = todo.pop()
        key = (node.domain, node.op_type, node.overload)
        if key in functions and key not in seen:
            seen.add(key)
            todo.extend(functions[key].node)
    return [f for k, f in functions.items() if k in seen]


def _constant(name: str, producer: onnx.NodeProto) -> onnx.NodeProto:
    node = onnx.NodeProto()
    node.CopyFrom(producer)
    del node.output[:]
    node.output.append(name)
    return node


def _rename(nodes: list[onnx.NodeProto], names: dict[str, str]) -> list[onnx.NodeProto]:
    out = []
    for original in nodes:
        node = onnx.NodeProto()
        node.CopyFrom(original)
        for field in (node.input, node.output):
            for i, name in enumerate(field):
                if name in names:
                    field[i] = names[name]
        out.append(node)
    return out


def _from_function(proto: onnx.ModelProto, call: OnnxCall, weights: set[str],
                   producers: dict[str, onnx.NodeProto]) -> _Built:
    """A hierarchical call: its function's body, arguments sorted into kinds."""
    functions = {(f.domain, f.name, f.overload): f for f in proto.functions}
    assert call.function is not None
    body = functions.get(tuple(call.function))  # type: ignore[arg-type]
    if body is None:
        raise fail(f"the function of call '{call.call_id}' is not in the model",
                   rules.VALIDATION)
    site = producers.get(call.results[0]) if call.results else None  # a leaf call stays
    if site is None or site.op_type != body.name:  # expanded: the main graph's call node
        site = next((n for n in proto.graph.node if list(n.output) == list(call.results)),
                    site)
    bound = _attribute_values(body, site)
    if bound is None:
        raise fail(f"function {body.name} of call '{call.call_id}' takes attributes its call "
                   "sets from an enclosing function's; extracting it is not supported",
                   rules.VALIDATION)
    built = _Built([], [], [], [], [], [], list(body.value_info))
    absent = set()
    for i, formal in enumerate(body.input):
        actual = call.arguments[i] if i < len(call.arguments) else None
        if not actual:
            absent.add(formal)
        elif actual in weights:
            built.weights.append((formal, actual))
        elif actual in producers and _is_constant(producers[actual]):
            built.constants.append(_constant(formal, producers[actual]))
        else:
            built.inputs.append((formal, actual))
    built.nodes = _rename(list(body.node), dict.fromkeys(absent, ""))
    _bind(built.nodes, bound)
    built.outputs = list(zip(body.output, call.results, strict=False))
    built.functions = _reachable(built.nodes, functions)
    return built


def _attribute_values(body: onnx.FunctionProto, call: onnx.NodeProto | None
                      ) -> dict[str, onnx.AttributeProto] | None:
    """What a parametrized body's attributes are at this call (its defaults, then the call
    node's values); None when the call node is not found or passes references on."""
    names = [*body.attribute, *(a.name for a in body.attribute_proto)]
    if not names:
        return {}
    if call is None or (call.domain, call.op_type) != (body.domain, body.name) \
            or any(a.ref_attr_name for a in call.attribute):
        return None
    values = {a.name: a for a in body.attribute_proto}
    values.update({a.name: a for a in call.attribute})
    return values if set(names) <= values.keys() else None


def _bind(nodes: list[onnx.NodeProto], values: dict[str, onnx.AttributeProto]) -> None:
    """Replace attribute references (``ref_attr_name``) by the values, subgraphs included."""
    for node in nodes:
        for attr in node.attribute:
            if attr.ref_attr_name:
                name = attr.name
                attr.CopyFrom(values[attr.ref_attr_name])
                attr.name = name
            elif attr.type == onnx.AttributeProto.GRAPH:
                _bind(list(attr.g.node), values)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for graph in attr.graphs:
                    _bind(list(graph.node), values)


def _is_constant(node: onnx.NodeProto) -> bool:
    return node.op_type == "Constant" and node.domain in ("", "ai.onnx") and not node.input


def _from_nodes(proto: onnx.ModelProto, graph: onnx.GraphProto, call: OnnxCall,
                weights: set[str], producers: dict[str, onnx.NodeProto]) -> _Built:
    """A flat call: its nodes, renamed relative to the module like a function body."""
    prefix = f"{call.module_path}." if call.module_path else ""
    names: dict[str, str] = {}
    taken: set[str] = set()
    built = _Built([], [], [], [], [], [], [])

    def unique(name: str) -> str:
        while name in taken:
            name += "_"
        taken.add(name)
        return name

    for name in call.arguments:
        if not name or name in names:
            continue
        if name in weights:
            local = unique(name[len(prefix):] if prefix and name.startswith(prefix) else name)
            built.weights.append((local, name))
        elif name in producers and _is_constant(producers[name]):
            local = unique(name)
            built.constants.append(_constant(local, producers[name]))
        else:
            local = unique(f"input_{len(built.inputs)}")
            built.inputs.append((local, name))
        names[name] = local
    for i, name in enumerate(call.results):
        names[name] = unique(f"output_{i}")
        built.outputs.append((names[name], name))
    built.nodes = _rename([graph.node[i] for i in call.nodes], names)
    functions = {(f.domain, f.name, f.overload): f for f in proto.functions}
    built.functions = _reachable(built.nodes, functions)
    return built


def _weight(init: onnx.TensorProto, name: str, base: Path | None) -> onnx.TensorProto:
    """A copy of initializer ``init`` named ``name``, its data read in when external."""
    tensor = onnx.TensorProto()
    tensor.CopyFrom(init)
    tensor.name = name
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        if base is None:
            raise fail(f"weight '{init.name}' is stored as external data and the model was "
                       "given without a path: validate the .onnx file to extract from it",
                       rules.VALIDATION)
        from onnx.external_data_helper import load_external_data_for_tensor

        try:
            load_external_data_for_tensor(tensor, str(base))
        except Exception as exc:  # OSError, or onnx's ValidationError for a missing file
            raise fail(f"cannot read the external data of weight '{init.name}' beside the "
                       f"model in '{base}': {runtime.first_line(exc)}", rules.VALIDATION
                       ) from exc
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]
    return tensor


def _value_info(name: str, array: np.ndarray) -> onnx.ValueInfoProto:
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(array.dtype))
    return onnx.helper.make_tensor_value_info(name, elem, list(array.shape))


def _model(proto: onnx.ModelProto, built: _Built, weights: list[onnx.TensorProto],
           inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray | None],
           call: TorchCall, label: str) -> onnx.ModelProto:
    graph = onnx.helper.make_graph(
        [*built.constants, *built.nodes], f"{call.call_id} ({call.module_type})",
        [_value_info(n, a) for n, a in inputs.items()],
        [_value_info(n, a) if a is not None else onnx.ValueInfoProto(name=n)
         for n, a in outputs.items()], weights, value_info=built.value_info)
    model = onnx.helper.make_model(graph, opset_imports=list(proto.opset_import),
                                   functions=built.functions)
    model.ir_version = proto.ir_version
    model.producer_name = "onnx_modular extract"
    for key, value in (("onnx_modular.extracted_call", call.call_id),
                       ("onnx_modular.extracted_type", call.module_type),
                       ("onnx_modular.extracted_from", label)):
        model.metadata_props.add(key=key, value=value)
    return model


# ---- values: torch's where torch had them ----------------------------------------------------

def _pair_inputs(wanted: list[tuple[str, np.ndarray | None]], tcall: TorchCall
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


def _pair_outputs(wanted: list[tuple[str, np.ndarray | None]], tcall: TorchCall
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


# ---- writing ---------------------------------------------------------------------------------

def _command(provider: str, rtol: float | None, atol: float | None, prefix: str = "") -> str:
    """The compare-io command line, each path shell-quoted (a folder may hold a space)."""
    tol = "".join(f" --{k} {v:g}" for k, v in (("rtol", rtol), ("atol", atol)) if v is not None)
    short = runtime.short_provider(provider).lower()
    files = " ".join(shlex.quote(f"{prefix}{name}") for name in (MODULE, INPUTS, EXPECTED))
    return f"python -m onnx_modular compare-io {files} --providers {short}{tol}"


#: What a repro folder holds (``module.onnx.<id>.data``: the weights of a module over 2 GB).
_REPRO_FILE = re.compile(rf"^({re.escape(MODULE)}|{re.escape(INPUTS)}|{re.escape(EXPECTED)}|"
                         rf"{re.escape(README)}|{re.escape(MODULE)}\.[0-9a-f]+\.data)$")


def check_directory(directory: str | Path) -> Path:
    """The folder a repro may be written to, resolved (``.`` and symlinks), or one line
    saying why not: a new folder, an empty one or an earlier repro of ours, unchanged since
    (:data:`MARKER` lists its files; it is replaced as a whole); never a folder holding
    other files, which the repro would replace, whatever their names."""
    if not str(directory):
        raise fail("cannot extract to '': the folder name is empty", rules.BAD_INPUT)
    given = Path(directory)
    if given.exists() and not given.is_dir():
        raise fail(f"cannot extract to '{given}': it is a file, not a directory",
                   rules.BAD_INPUT)
    target = given.resolve()
    if target.is_dir():
        foreign = _foreign(target)
        if foreign:
            shown = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
            raise fail(f"cannot extract to '{given}': it holds files no earlier extraction "
                       f"wrote, or changed since ({shown}), which it would replace; give an "
                       "empty or new folder", rules.BAD_INPUT)
    parent = target.parent
    if not parent.is_dir():
        raise fail(f"cannot extract to '{given}': directory '{parent}' does not exist",
                   rules.BAD_INPUT)
    if not os.access(parent, os.W_OK) or (target.is_dir() and not os.access(target, os.W_OK)):
        raise fail(f"cannot extract to '{given}': it is not writable", rules.BAD_INPUT)
    return target


def _stamp(path: Path) -> list[int]:
    """What a file of ours looks like as written: its size and modification time (renames
    keep both), so a file the user replaced or edited since is no longer ours."""
    st = os.lstat(path)
    return [st.st_size, st.st_mtime_ns]


def _foreign(folder: Path) -> list[str]:
    """Entries of ``folder`` that are not files of an earlier extraction, as its marker
    lists them (repro file names only, regular files, unchanged)."""
    entries = sorted(e.name for e in folder.iterdir())
    try:
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
        ours = marker["files"] if marker.get("format") == MARKER_FORMAT else {}
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        ours = {}
    if not isinstance(ours, dict) or not ours:
        return entries
    return [name for name in entries if name != MARKER and not (
        _REPRO_FILE.match(name) and (folder / name).is_file()
        and not (folder / name).is_symlink() and ours.get(name) == _stamp(folder / name))]


def _mark(staging: Path, call_id: str) -> None:
    """The marker of the files just staged (written last: they no longer change)."""
    files = {e.name: _stamp(e) for e in sorted(staging.iterdir()) if _REPRO_FILE.match(e.name)}
    atomic_write_text(staging / MARKER, json.dumps(
        {"format": MARKER_FORMAT, "call": call_id, "files": files}, indent=1))


def _publish(staging: Path, target: Path, directory: Path) -> None:
    """The staged repro in place of ``target``'s, as one set: the folder is swapped in with
    renames, one extraction at a time (a lock on the parent folder), so two at once leave
    one whole repro, never a mix; the folder is checked again under the lock. The current
    directory (or one holding it) keeps its inode: its files are renamed in one by one."""
    cwd = Path.cwd().resolve()
    with directory_lock(target.parent):
        restore_interrupted_swap(target)
        check_directory(directory)  # what another writer did meanwhile is ours, or refused
        if target == cwd or target in cwd.parents:
            for entry in sorted(target.iterdir()):  # every one ours: checked just above
                if not (staging / entry.name).exists():
                    entry.unlink()
            for entry in sorted(staging.iterdir()):
                os.replace(entry, target / entry.name)
            return
        swap_in(staging, target)


def _readme(x: Extraction, label: str, provider: str, rtol: float | None,
            atol: float | None) -> str:
    short = runtime.short_provider(provider)
    dtype = next((p.dtype for p in x.outputs if is_float(p.dtype)), "float32")
    r, a = tolerances_for(dtype, rtol, atol)  # the snippet's, for its first float output
    if x.reproduces:
        verdict = "**reproduces the mismatch**"
    elif x.in_model is not None and not x.in_model.ok:
        verdict = ("**matches torch**: the error it shows in the full model came in with its "
                   "inputs, from upstream")
    else:
        verdict = "**matches torch**, as it does in the full model"
    lines = [f"# Repro: `{x.call_id}` ({x.module_type})", "",
             f"Extracted from `{label}` by `onnx_modular validate`: the {x.kind} "
             f"module call alone, fed the tensors that reached it in torch.", ""]
    if x.in_model is not None:
        e = x.in_model
        lines.append(f"- In the full model on {short}: max abs err {fmt_err(e.max_abs)}, max rel "
                     f"err {fmt_err(e.max_rel)} ({e.mismatched} of {e.size} values out of "
                     f"tolerance{'; its inputs had diverged already' if e.inherited else ''}).")
    lines += [f"- This module alone on {short}: max abs err {fmt_err(x.alone.max_abs)}, max rel "
              f"err {fmt_err(x.alone.max_rel)}: it {verdict}.", "",
              "## Reproduce", "", "From this directory (exit status 1: mismatch, 0: match, "
              "2: usage error):", "", "```sh", _command(provider, rtol, atol), "```", "",
              "Without onnx_modular, with numpy and onnxruntime only:", "", "```python",
              "import numpy as np",
              "import onnxruntime as ort", "",
              f'session = ort.InferenceSession("{MODULE}", providers=["{provider}"])',
              f'inputs = dict(np.load("{INPUTS}"))',
              f'expected = np.load("{EXPECTED}")',
              "names = [o.name for o in session.get_outputs()]",
              "for name, got in zip(names, session.run(None, inputs)):",
              "    if name not in expected:",
              "        continue",
              "    want = expected[name]",
              "    if np.issubdtype(want.dtype, np.inexact):  # NaN matches only NaN",
              f"        ok = np.isclose(got.astype(np.float64), want, rtol={r:g}, "
              f"atol={a:g}, equal_nan=True)",
              "    else:  # integers and bool: exactly",
              "        ok = got == want",
              '    print(name, int((~ok).sum()), "of", ok.size, "values out of tolerance")',
              "```", ""]
    if any(p.dtype == "bfloat16" for p in x.inputs):
        lines += ["bfloat16 inputs are stored as their uint16 bit patterns (numpy has no "
                  "bfloat16): view them with `ml_dtypes.bfloat16` before feeding.", ""]
    lines += ["## Files", "", f"- `{MODULE}`: {x.weights} initializer(s) (the call's weights "
              f"and constants), {x.weight_bytes / 1e6:.2f} MB", "",
              "| input | shape | dtype | value |", "|---|---|---|---|"]
    lines += [f"| `{p.name}` | {list(p.shape)} | {p.dtype} | {p.source} |" for p in x.inputs]
    lines += ["", "| output | shape | dtype | expected |", "|---|---|---|---|"]
    lines += [f"| `{p.name}` | {list(p.shape)} | {p.dtype} | {p.source} |" for p in x.outputs]
    return "\n".join(lines) + "\n"


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
    return _write(evidence, k, j, loaded, provider, Path(directory),
                  next((e for e in localization.errors if e.order == j), None))


def _write(evidence: Evidence, k: int, j: int, loaded: runtime.LoadedModel, provider: str,
           directory: Path, in_model: CallError | None) -> Extraction:
    probe, ocall, tcall = evidence.probe, evidence.probe.calls[k], evidence.torch_calls[j]
    proto = loaded.proto
    initializers = {i.name: i for i in proto.graph.initializer}
    graph = probe.graph if probe.graph is not None else proto.graph
    producers = {o: n for n in graph.node for o in n.output if o}
    if ocall.function is not None:
        built, kind = _from_function(proto, ocall, set(initializers), producers), "hierarchical"
    elif ocall.nodes:
        built, kind = _from_nodes(proto, graph, ocall, set(initializers), producers), "flat"
    else:
        raise fail(f"module call '{tcall.call_id}' cannot be cut out of the ONNX model",
                   rules.VALIDATION)

    values = evidence.values
    inputs = _pair_inputs([(n, values.get(a)) for n, a in built.inputs], tcall)
    expected = _pair_outputs([(n, values.get(a)) for n, a in built.outputs], tcall)
    if not expected:
        raise fail(f"torch's outputs of '{tcall.call_id}' cannot be paired with the ONNX "
                   "call's (changed in place, or of other shapes): nothing to compare",
                   rules.VALIDATION)
    base = loaded.path.parent if loaded.path is not None else None
    weights = [_weight(initializers[actual], name, base) for name, actual in built.weights]
    model = _model(proto, built, weights, {n: v for n, (v, _) in inputs.items()},
                   {n: values.get(a) for n, a in built.outputs}, tcall, loaded.label)

    target = check_directory(directory)
    restore_interrupted_swap(target)  # before the cleaning, which would take the old set
    clean_stale_temporaries(target.parent, target.name)
    staging = target.parent / f".{target.name}.om{os.getpid()}-{secrets.token_hex(4)}.tmp"
    try:
        staging.mkdir()
        extraction = _stage(staging, directory, evidence, built, tcall, kind, model, inputs,
                            expected, weights, values, in_model, provider, loaded.label)
        _mark(staging, tcall.call_id)
        _publish(staging, target, directory)
    except OSError as exc:
        why = "no space left on the device" if exc.errno == errno.ENOSPC else \
            exc.strerror or str(exc)
        raise fail(f"cannot extract to '{directory}': {why} (the folder was left as it was)",
                   rules.VALIDATION) from exc
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return extraction


def _stage(staging: Path, directory: Path, evidence: Evidence, built: _Built, tcall: TorchCall,
           kind: str, model: onnx.ModelProto, inputs: dict[str, tuple[np.ndarray, str]],
           expected: dict[str, tuple[np.ndarray, str]], weights: list[onnx.TensorProto],
           values: dict[str, np.ndarray], in_model: CallError | None, provider: str,
           label: str) -> Extraction:
    """Every file of the repro, written into ``staging`` and checked there."""
    atomic_write_bytes(staging / INPUTS, npz_bytes({n: v for n, (v, _) in inputs.items()}))
    atomic_write_bytes(staging / EXPECTED,
                       npz_bytes({n: v for n, (v, _) in expected.items()}))
    save_model(ir.serde.deserialize_model(model), staging / MODULE)
    alone = compare_io(staging / MODULE, staging / INPUTS, staging / EXPECTED,
                       providers=[provider], rtol=evidence.rtol, atol=evidence.atol)
    out_values = {n: values.get(a) for n, a in built.outputs}
    extraction = Extraction(
        directory, tcall.call_id, tcall.module_type, kind,
        [Port(n, list(v.shape), dtype_name(v), src) for n, (v, src) in inputs.items()],
        [Port(n, list(expected[n][0].shape) if n in expected else
              list(getattr(out_values[n], "shape", [])),
              dtype_name(out_values[n]) if out_values[n] is not None else "?",
              expected[n][1] if n in expected else "not compared")
         for n, _ in built.outputs],
        len(weights), sum(_nbytes(w) for w in weights), in_model, alone,
        _command(provider, evidence.rtol, evidence.atol, prefix=f"{directory}/"))
    atomic_write_text(staging / README,
                      _readme(extraction, label, provider, evidence.rtol, evidence.atol))
    return extraction


def _nbytes(tensor: onnx.TensorProto) -> int:
    if tensor.raw_data:
        return len(tensor.raw_data)
    return tensor.ByteSize()
