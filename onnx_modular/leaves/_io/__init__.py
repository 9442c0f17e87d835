"""Atomic file writes: a reader sees the old file (or set of files) or the new one, never a
part of one or a mix of two; a failure leaves nothing behind, and neither does a writer
killed mid-way, once the next save into the same place has run.

Temporary files are named ``.<target>.om<pid>-<random>.tmp`` beside the target: a later save
removes those of processes that are gone. Folders replaced as a set (parts directories,
Triton repositories, extracted repros) go through :mod:`onnx_modular.leaves._io.folders`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import onnx
import onnx_ir as ir

from onnx_modular.diagnostics import Diagnostic, Rule, to_sarif
from onnx_modular.leaves._compat import ir_save_external
from onnx_modular.leaves._log import timed
from onnx_modular.leaves.errors import fail, rules

TWO_GB = 2 * 1024**3
_TEMP = re.compile(r"^\.(?P<target>.+)\.om(?P<pid>\d+)-[0-9a-z_]+\.tmp$")


def pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_temporaries(directory: Path, target_name: str) -> None:
    """Remove temporaries that writers of ``target_name`` left when they were killed."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        match = _TEMP.match(entry.name)
        if match is None or match["target"] != target_name or pid_alive(int(match["pid"])):
            continue
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)


def check_writable(path: str | os.PathLike[str]) -> Path:
    """The target as a Path; one clear error for a path that cannot be written."""
    if not str(path):
        raise fail("cannot write '': the output path is empty")
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    try:
        if target.is_dir():
            raise fail(f"cannot write '{target}': it is a directory; give a file name")
        if directory.exists() and not directory.is_dir():
            raise fail(f"cannot write '{target}': '{directory}' is a file, not a directory")
        if not directory.is_dir():
            raise fail(f"cannot write '{target}': directory '{directory}' does not exist")
    except OSError as e:  # a name too long for the file system (ENAMETOOLONG), ...
        raise fail(f"cannot write '{str(target)[:80]}': {e.strerror or e}") from e
    if not os.access(directory, os.W_OK):
        raise fail(f"cannot write '{target}': directory '{directory}' is not writable")
    return target


def inside_folder(folder: Path, name: object, where: str, *,
                  links_within: tuple[Path, ...] | None = None,
                  rule: Rule = rules.BAD_INPUT) -> Path:
    """``folder/name``, refused unless ``name`` is a plain file name inside ``folder`` (no
    ``..``, no absolute path, no subfolder) and the file is no symbolic link (or, given
    ``links_within``, one resolving into ``folder`` or one of those): a file a manifest or
    an index names must not pull in one from elsewhere (parts directories, checkpoint
    shards)."""
    if not isinstance(name, str) or Path(name).name != name or name in ("", ".", "..") \
            or "\\" in name:
        raise fail(f"{where}: file {name!r} is not a plain file name inside the directory",
                   rule)
    file = folder / name
    if file.is_symlink():
        target = file.resolve()
        if links_within is None or not any(
                target.is_relative_to(d.resolve()) for d in (folder, *links_within)):
            raise fail(f"{where}: file '{name}' is a symbolic link"
                       + (f" out of the directory (to '{target}')" if links_within is not None
                          else "") + "; only files inside the directory are read", rule)
    return file


def file_stamp(path: Path, *, follow_symlinks: bool = True) -> list[int]:
    """A file as it is now: its size and modification time in ns (a rename keeps both), to
    tell later whether it was replaced or edited since. ``OSError`` when it is gone."""
    info = os.stat(path, follow_symlinks=follow_symlinks)
    return [info.st_size, info.st_mtime_ns]


def temp_name(target: Path, tag: str = "") -> str:
    """A writer's temporary beside ``target`` (:func:`clean_stale_temporaries` knows it);
    ``tag`` (lowercase letters) starts its random part: ``old`` names a backup that
    :mod:`onnx_modular.leaves._io.folders` recovers before the temporaries are cleaned."""
    return f".{target.name}.om{os.getpid()}-{tag}{secrets.token_hex(4)}.tmp"


def _os_error(target: Path, error: OSError) -> Exception:
    if error.errno == errno.ENOSPC:
        return fail(f"cannot write '{target}': no space left on the device (no partial "
                    "file was left)")
    return fail(f"cannot write '{target}': {error.strerror or error}")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` on success only."""
    target = check_writable(path)
    directory = target.parent if str(target.parent) else Path(".")
    clean_stale_temporaries(directory, target.name)
    tmp_path = directory / temp_name(target)
    try:  # a file system that takes no file (/proc, read-only): the user's path is named
        fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # umask applies
    except OSError as e:
        raise _os_error(target, e) from e
    try:
        os.close(fd)
        yield tmp_path
        keep_mode(target, tmp_path)
        os.replace(tmp_path, target)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        if isinstance(e, OSError) and not isinstance(e, FileNotFoundError | PermissionError):
            raise _os_error(target, e) from e
        raise


def keep_mode(target: Path, new: Path) -> None:
    """A file written over ``target`` keeps its permissions (a 0600 model stays 0600)."""
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        return  # a new file: the umask decides
    with contextlib.suppress(OSError):
        os.chmod(new, mode)


@contextlib.contextmanager
def directory_lock(directory: Path) -> Iterator[None]:
    """Writers that publish into ``directory`` one at a time (an advisory lock on the
    folder itself: no lock file is left behind); a no-op where the OS has no flock."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def write_sarif(diagnostics: list[Diagnostic], path: str) -> None:
    """The diagnostics as a SARIF 2.1.0 log, written atomically (here, not in diagnostics,
    so the leaves import one way: _io -> errors -> diagnostics)."""
    atomic_write_text(path, json.dumps(to_sarif(diagnostics), indent=2))


def encode_varint(value: int) -> bytes:
    """A protobuf varint."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(number: int) -> bytes:  # a length-delimited field's key
    return encode_varint(number << 3 | 2)


_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = 7, 5, 9


def proto_without_initializers(model: ir.Model) -> onnx.ModelProto:
    """``model``'s proto without its graph's initializers (and so without copying a weight);
    the model is left as it was."""
    graph = model.graph
    values = list(graph.initializers.values())
    for value in values:
        graph.initializers.pop(str(value.name))
    try:
        return ir.serde.serialize_model(model)
    finally:
        for value in values:
            graph.initializers[str(value.name)] = value


def write_inline(model: ir.Model, file: BinaryIO) -> None:
    """``model`` with its weights inside, written one weight at a time.

    Serializing the whole model first holds every weight twice more (the proto, then its
    bytes). Protobuf merges a message field that appears twice, so the file is the model
    without initializers followed by a second ``graph`` field holding only them, each
    written as its header and then its bytes straight from the tensor. ``onnx.load`` and
    ONNX Runtime read the very model ``ir.save`` writes.
    """
    graph = model.graph
    values = list(graph.initializers.values())
    if not values or any(v.const_value is None or v.const_value.dtype == ir.DataType.STRING
                         for v in values):
        file.write(ir.serde.serialize_model(model).SerializeToString())
        return
    head = proto_without_initializers(model).SerializeToString()
    # ir.save also describes the initializers that are not graph inputs in value_info
    inputs = {v.name for v in graph.inputs}
    described = onnx.GraphProto()
    for value in values:
        if value.name not in inputs and value.name and (
                value.shape is not None or value.type is not None or value.metadata_props
                or value.doc_string):
            ir.serde.serialize_value_into(described.value_info.add(), value)
    value_info = described.SerializeToString()
    headers: list[bytes] = []
    total = len(value_info)
    for value in values:
        tensor = value.const_value
        assert tensor is not None
        proto = onnx.TensorProto(name=value.name, data_type=tensor.dtype.value,
                                 dims=[int(d) for d in tensor.shape])
        if tensor.doc_string:
            proto.doc_string = tensor.doc_string
        for key, text in tensor.metadata_props.items():
            proto.metadata_props.add(key=key, value=text)
        header = proto.SerializeToString() + _key(_TENSOR_RAW_DATA) + \
            encode_varint(tensor.nbytes)
        headers.append(header)
        size = len(header) + tensor.nbytes
        total += len(_key(_GRAPH_INITIALIZER)) + len(encode_varint(size)) + size
    file.write(head)
    file.write(_key(_MODEL_GRAPH) + encode_varint(total) + value_info)
    for value, header in zip(values, headers, strict=True):
        tensor = value.const_value
        assert tensor is not None
        size = len(header) + tensor.nbytes
        file.write(_key(_GRAPH_INITIALIZER) + encode_varint(size) + header)
        file.flush()
        tensor.tofile(file)


def _initializer_bytes(model: ir.Model) -> int:
    return sum(v.const_value.nbytes for v in model.graph.initializers.values()
               if v.const_value is not None)


def external_data_files(path: Path) -> set[str]:
    """The data files an ONNX file on disk refers to (none when it cannot be read)."""
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception:
        return set()
    names = set()
    for init in proto.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            names.update(e.value for e in init.external_data if e.key == "location")
    return names


def save_model(model: ir.Model, path: str | os.PathLike[str], *,
               external_data_threshold: int = TWO_GB) -> None:
    """Atomic save; weights go to a data file beside the model above the threshold.

    The data file has a name of its own per save (``<name>.<random>.data``), written before
    the model that names it: two saves to one path never pair one's model with the other's
    weights, and a reader holding the old model never reads new weights. Once the new model
    is in place, every data file of the target that it does not name is removed (the
    previous save's, and those of writers that lost a race to the same path or were
    killed), under a lock on the folder so that no writer's data is taken before its model
    names it. A file written over another keeps its permissions.
    """
    target = check_writable(path)
    directory = target.parent if str(target.parent) else Path(".")
    if _initializer_bytes(model) <= external_data_threshold:
        with timed(f"write {target}"), atomic_path(target) as tmp, open(tmp, "wb") as file:
            write_inline(model, file)
        with directory_lock(directory):  # an earlier save's data file is nobody's now
            _remove_unnamed_data(directory, target, "")
        return
    data_name = f"{target.name}.{secrets.token_hex(4)}.data"
    clean_stale_temporaries(directory, target.name)
    staging = directory / temp_name(target)
    try:
        staging.mkdir()
        staged = staging / target.name
        with timed(f"write {target} (weights in a data file)"):
            ir_save_external(model, staged, data_name)
        # weights too small to go apart stay inline: then the data file is nobody's
        apart = data_name in external_data_files(staged)
        keep_mode(target, staging / data_name)
        # one writer at a time publishes: what no model names then is nobody's
        with directory_lock(directory):
            if apart:
                os.replace(staging / data_name, directory / data_name)
            try:
                with atomic_path(target) as tmp:
                    os.replace(staged, tmp)
            except BaseException:
                with contextlib.suppress(OSError):
                    (directory / data_name).unlink()
                raise
            _remove_unnamed_data(directory, target, data_name, {data_name} if apart else set())
    except OSError as e:
        raise _os_error(target, e) from e
    finally:
        with contextlib.suppress(OSError):
            for leftover in staging.iterdir():
                leftover.unlink()
            staging.rmdir()


def _remove_unnamed_data(directory: Path, target: Path, ours: str,
                         named: set[str] | None = None) -> None:
    """Data files of ``target`` (``<name>.<id>.data``) that the model now in place does not
    name (``named``, when the caller knows it; else read from the model): the previous
    save's, and those of writers that lost a race or were killed."""
    pattern = re.compile(rf"^{re.escape(target.name)}\.[0-9a-f]{{8}}\.data$")
    try:
        found = [e.path for e in os.scandir(directory)
                 if pattern.match(e.name) and e.name != ours]
    except OSError:
        return
    if not found:
        return  # the model is not read (a large one inline takes a while)
    if named is None:
        named = external_data_files(target)
    for path in found:
        if os.path.basename(path) not in named:
            with contextlib.suppress(OSError):
                os.unlink(path)
