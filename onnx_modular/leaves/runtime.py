"""ONNX Runtime plumbing shared by validate, compare and the part runner.

Loading models, naming and resolving execution providers, creating and running sessions, and
turning a tensor into a feed: one path for each, so that every ORT session in the package is
made and fails the same way. Everything a user can get wrong here (an unreadable file, a
provider that is not installed, a model ORT rejects) becomes a one-line
:class:`OnnxModularError`, never a traceback. Numerics (tolerances, diffs) live in
:mod:`onnx_modular.check.numerics`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, TypeAlias

import numpy as np
import onnx
from google.protobuf.descriptor import FieldDescriptor
from onnx.external_data_helper import ExternalDataInfo

from onnx_modular.diagnostics import OnnxModularError
from onnx_modular.leaves._compat import ort_operator_domains
from onnx_modular.leaves.errors import fail, rules

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


class ProviderUnavailableError(OnnxModularError):
    """An execution provider that ONNX Runtime lists but cannot start (no GPU, no driver).

    Its own class so that validation with default providers can skip it with the reason,
    while an explicit request for it stays an error.
    """


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, short enough for a one-line error."""
    text = str(exc).strip() or type(exc).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = lines[0] if lines else text
    return line if len(line) <= 300 else line[:297] + "..."


# ---- loading ---------------------------------------------------------------------------------

#: A model this large gets one-run sessions that do not prepack their weights (see
#: ``make_session``): no packed copy is made, and the weights of a model saved with
#: external data are mapped from its file instead of copied beside torch's; a check builds
#: one session at a time.
LARGE_MODEL_BYTES = 512 * 2**20


@dataclasses.dataclass
class LoadedModel:
    """A model and where it came from; ``path`` lets ORT find external data beside it.

    ``external_files`` are the data files the file on disk names, noted before
    ``onnx.load`` pulls their bytes in (and forgets where they came from): a session made
    from bytes derived from this model must be told the model's folder, or ONNX Runtime
    looks in the current directory, where another export's data file of the same name
    would be read instead.
    """

    proto: onnx.ModelProto
    label: str
    path: Path | None = None
    _bytes: bytes | None = dataclasses.field(default=None, repr=False)
    external_files: frozenset[str] = frozenset()

    @property
    def size_bytes(self) -> int:
        if self.path is not None:
            total = self.path.stat().st_size
            for name in self.external_files:
                ext = self.path.parent / name
                if ext.is_file():
                    total += ext.stat().st_size
            return total
        return len(self.model_bytes())  # serialized once: the session is made from it

    @property
    def large(self) -> bool:
        """Checked for memory over speed (see ``LARGE_MODEL_BYTES``)."""
        return self.size_bytes >= LARGE_MODEL_BYTES

    @property
    def has_external_data(self) -> bool:
        return bool(self.external_files)

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


_STRING, _MESSAGE = FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE
_TEXT_FIELDS: dict[str, tuple[list[str], list[str]]] = {}


class HasModelProto(Protocol):
    """An export result: anything that hands out its ``model_proto``."""

    @property
    def model_proto(self) -> onnx.ModelProto: ...


#: an ONNX model as every check takes it: a path, a ModelProto, an export result, or a
#: model loaded already (the command line reads a file once, early)
OnnxModelSource: TypeAlias = (
    str | os.PathLike[str] | onnx.ModelProto | HasModelProto | LoadedModel)


def non_text_field(message: Any) -> str | None:
    """The name of the first string field of ``message`` (nested ones too) that holds bytes
    that are not UTF-8, or None.

    protobuf hands such a field to Python as ``bytes`` instead of ``str`` (ONNX's schema is
    proto2, which does not check), and every name the package reads would then break in
    its own way: a corrupt file must fail once, at loading. Only string and message fields
    are read, never tensor data.
    """
    todo = [message]
    while todo:
        msg = todo.pop()
        key = msg.DESCRIPTOR.full_name
        if key not in _TEXT_FIELDS:
            fields = msg.DESCRIPTOR.fields
            _TEXT_FIELDS[key] = ([f.name for f in fields if f.type == _STRING],
                                 [f.name for f in fields if f.type == _MESSAGE])
        strings, messages = _TEXT_FIELDS[key]
        for name in strings:
            value = getattr(msg, name)
            for item in ([value] if isinstance(value, (str, bytes)) else value):
                if not isinstance(item, str):
                    return f"{msg.DESCRIPTOR.name}.{name}"
        for name in messages:
            value = getattr(msg, name)
            if hasattr(value, "ListFields"):  # a singular message
                if value.ListFields():
                    todo.append(value)
            else:
                todo.extend(value)
    return None


def _external_files(proto: onnx.ModelProto) -> set[str]:
    names = set()
    for init in proto.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            for entry in init.external_data:
                if entry.key == "location":
                    names.add(entry.value)
    return names


def _check_external_data(proto: onnx.ModelProto, folder: Path) -> None:
    """Every external weight's file is a plain file in ``folder`` and holds its bytes."""
    sizes: dict[str, int] = {}
    for init in proto.graph.initializer:
        if init.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = ExternalDataInfo(init)
        location = Path(info.location)
        if location.is_absolute() or ".." in location.parts:
            raise ValueError(f"weight '{init.name}' names data outside the model's folder "
                             f"({info.location})")
        if info.location not in sizes:
            file = folder / location
            if not file.is_file():
                raise FileNotFoundError(f"the data file '{info.location}' of weight "
                                        f"'{init.name}' is not beside the model")
            sizes[info.location] = file.stat().st_size
        end = (info.offset or 0) + (info.length or 0)
        if end > sizes[info.location]:
            raise ValueError(f"the data file '{info.location}' ends at byte "
                             f"{sizes[info.location]}, before weight '{init.name}' does "
                             f"({end}): truncated")


def undefined_calls(proto: onnx.ModelProto) -> list[str]:
    """Nodes calling what neither the model's functions nor a known operator domain define:
    ``onnx.version_converter`` drops every local function and leaves their calls behind, a
    file ``check_model(full_check=True)`` passes and ONNX Runtime refuses."""
    known = _operator_domains()
    local = {(f.domain, f.name) for f in proto.functions}
    found: list[str] = []

    def walk(nodes: Any, where: str) -> None:
        for node in nodes:
            if node.domain not in known and (node.domain, node.op_type) not in local:
                found.append(f"'{node.name or node.op_type}' ({node.domain}::{node.op_type}) "
                             f"in {where}")
            for attr in node.attribute:
                for graph in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    walk(graph.node, where)

    walk(proto.graph.node, "the main graph")
    for function in proto.functions:
        walk(function.node, f"function {function.name}")
    return found


@functools.cache
def _operator_domains() -> frozenset[str]:
    onnx_domains = {s.domain for s in onnx.defs.get_all_schemas_with_history()}
    return frozenset({"ai.onnx", *onnx_domains, *ort_operator_domains()})


def require_defined_calls(proto: onnx.ModelProto, label: str) -> None:
    """One line, naming the first call, for a model calling functions it does not hold."""
    missing = undefined_calls(proto)
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise fail(f"'{label}' calls a function it does not define: {missing[0]}{more}. A "
                   "tool dropped its functions (onnx.version_converter does): run that tool "
                   "on the flat model (export --flat), then 'outline' its result",
                   rules.BAD_INPUT)


def load_model(onnx_model: OnnxModelSource, what: str = "ONNX model") -> LoadedModel:
    """A path, an ``onnx.ModelProto`` or anything with ``.model_proto`` (an export result).

    A :class:`LoadedModel` passes through, so the command line can read a file once, early
    (a corrupt file fails before the torch model is built), and keep its path as the label.
    """
    if isinstance(onnx_model, LoadedModel):
        return onnx_model
    if isinstance(onnx_model, onnx.ModelProto):
        return _in_memory(onnx_model, "<ModelProto>", what)
    proto = getattr(onnx_model, "model_proto", None)
    if isinstance(proto, onnx.ModelProto):
        return _in_memory(proto, f"<{type(onnx_model).__name__}>", what)
    if isinstance(onnx_model, (str, os.PathLike)):
        path = Path(onnx_model)
        try:
            if path.is_dir():
                raise fail(f"cannot read {what} '{path}': it is a directory, not an ONNX file "
                           "(a parts directory holds a manifest.json, written by .save(dir))")
            if not path.is_file():
                raise fail(f"cannot read {what} '{path}': no such file")
        except OSError as exc:  # a name too long for the file system, ...
            raise fail(f"cannot read {what} '{str(path)[:80]}': {exc.strerror or exc}") from exc
        try:
            proto = onnx.load(str(path), load_external_data=False)
            external = frozenset(_external_files(proto))
            # checked, not read: ORT reads the weights itself; a copy here would be one
            # more copy of every weight in memory (validate peaked at 4x the weights)
            _check_external_data(proto, path.parent)
        except Exception as exc:  # DecodeError, missing external data, ...
            raise fail(f"cannot read {what} '{path}': not a valid ONNX file "
                       f"({first_line(exc)})") from exc
        if not proto.graph.node and not proto.graph.output:
            raise fail(f"cannot read {what} '{path}': the file holds no ONNX graph")
        field = non_text_field(proto)
        if field is not None:
            raise fail(f"cannot read {what} '{path}': not a valid ONNX file (a {field} "
                       "holds bytes that are not UTF-8 text)")
        require_defined_calls(proto, str(path))
        return LoadedModel(proto, str(path), path, external_files=external)
    raise fail(f"{what} must be a path, an onnx.ModelProto or an export result with "
               f".model_proto, got {type(onnx_model).__name__}")


def _in_memory(proto: onnx.ModelProto, label: str, what: str) -> LoadedModel:
    """A model without a file: its weights must be in it. External data named by a proto
    has no folder to be read from; ONNX Runtime would take the file of that name in the
    current directory, which may hold another model's weights."""
    external = _external_files(proto)
    if external:
        raise fail(f"{what} {label} refers to external data ({', '.join(sorted(external))}) "
                   "but has no file to find it beside; pass the model's path, or load it "
                   "with onnx.load(path) (which reads the data in)")
    require_defined_calls(proto, label)
    return LoadedModel(proto, label)


# ---- providers and sessions ----------------------------------------------------------------

def available_providers() -> list[str]:
    """What this onnxruntime lists (a listed GPU provider may still fail to start)."""
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
            raise fail(f"execution provider '{p}' is not available{hint}; "
                       f"available: {', '.join(available)}")
        if name not in resolved:
            resolved.append(name)
    if not resolved:
        raise fail("no execution provider given")
    return resolved


def unavailable_defaults(chosen: Sequence[str]) -> dict[str, str]:
    """Default providers missing from ``chosen``, each with why (stated, not silent)."""
    return {p: ("this onnxruntime has no CUDAExecutionProvider (it needs the onnxruntime-gpu "
                "package and a CUDA GPU)" if p == "CUDAExecutionProvider"
                else "not available in this onnxruntime")
            for p in DEFAULT_PROVIDERS if p not in chosen}


def short_provider(name: str) -> str:
    """``CUDAExecutionProvider`` -> ``CUDA``, for tables and messages."""
    return name.removesuffix("ExecutionProvider")


def make_session(source: str | bytes, providers: str | Sequence[str],
                 config: dict[str, str] | None = None,
                 what: str = "the model", fuse: bool = True,
                 prepack: bool = True, spin: bool = True) -> tuple[Any, float]:
    """An ORT session and its build time: the one way the package creates sessions.

    ``providers``: one provider (CPU is added as fallback for nodes it lacks) or the whole
    chain. The first one must come up: ORT falls back to CPU silently when a listed GPU
    provider cannot start, and a check on CUDA that ran on CPU would prove nothing.
    ``fuse=False`` runs the graph as it is (no rewrites, no fusions): a session built for
    one run (the localization probe) is made in ~50% of the time. ``spin=False``: ORT's
    worker threads sleep instead of spinning between parallel sections, so a session built
    or run beside other work (validation builds the probe while the plain session is
    built) leaves the other core to it: on two cores localization went from 2.2x to 1.7x
    plain validation.
    ``prepack=False``: weights are used where they lie instead of being packed for the CPU's
    GEMM up front: ORT maps an external data file rather than copying it, so a large
    model's session holds no private copy of its weights and is made in a fraction of the
    time (2.3 GB Llama: 0.1 s instead of 5 s, 30 MB private instead of 1.9 GB); each run
    packs as it goes (outputs differ in the last bits, ~1e-6 relative).
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not fuse:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if not prepack:
        options.add_session_config_entry("session.disable_prepacking", "1")
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    if isinstance(providers, str):
        chain = [providers] if providers == "CPUExecutionProvider" else [
            providers, "CPUExecutionProvider"]
    else:
        chain = list(providers)
    primary = chain[0]
    start = time.perf_counter()
    try:
        session = ort.InferenceSession(source, options, providers=chain)
    except Exception as exc:
        raise fail(f"ONNX Runtime cannot load {what} on {short_provider(primary)}: "
                   f"{first_line(exc)}", rules.VALIDATION) from exc
    elapsed = time.perf_counter() - start
    if primary not in session.get_providers():
        raise ProviderUnavailableError(fail(
            f"{primary} could not be initialized (ONNX Runtime fell back to "
            f"{', '.join(session.get_providers())}); check the GPU, CUDA and cuDNN install",
            rules.VALIDATION).diagnostic)
    return session, elapsed


def check_session(loaded: LoadedModel, source: str | bytes, provider: str,
                  config: dict[str, str] | None = None, fuse: bool = True
                  ) -> tuple[Any, float]:
    """A session a check builds for one run of ``loaded`` (or of a probe derived from it,
    ``source``): its worker threads sleep instead of spinning, and a large model's weights
    are not prepacked (see ``make_session`` and ``LARGE_MODEL_BYTES``)."""
    return make_session(source, provider, config, fuse=fuse, prepack=not loaded.large,
                        spin=False)


def run_session(session: Any, feeds: dict[str, np.ndarray],
                output_names: list[str] | None = None) -> tuple[list[np.ndarray], float]:
    """The outputs and the run time; an ORT failure becomes a one-line error."""
    start = time.perf_counter()
    try:
        outputs = session.run(output_names, feeds)
    except Exception as exc:
        raise fail(f"ONNX Runtime failed to run the model: {first_line(exc)}",
                   rules.VALIDATION) from exc
    return outputs, time.perf_counter() - start


# ---- feeds -----------------------------------------------------------------------------------

def to_feed(value: Any) -> np.ndarray:
    """A tensor or array as the C-contiguous numpy array ORT takes, dtype kept.

    The one conversion of inputs for every session: bfloat16 goes through ml_dtypes (numpy
    has no bfloat16), and torch is never imported for numpy inputs.
    """
    if hasattr(value, "detach"):  # a torch tensor
        import torch

        t = value.detach().cpu().resolve_conj().resolve_neg().contiguous()
        if t.dtype == torch.bfloat16:
            import ml_dtypes

            return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return t.numpy()
    array = np.asarray(value)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)
