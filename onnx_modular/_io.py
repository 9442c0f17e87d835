"""Atomic file writes: a failure never leaves a partial file behind."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import onnx_ir as ir

TWO_GB = 2 * 1024**3


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` on success only."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise FileNotFoundError(f"cannot write '{target}': directory '{directory}' does not exist")
    if not os.access(directory, os.W_OK):
        raise PermissionError(f"cannot write '{target}': directory '{directory}' is not writable")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    tmp_path = Path(tmp)
    # mkstemp makes the file private (0600); the result should read like any file the user
    # writes (0644 under the usual umask), as torch.onnx's own files do.
    os.chmod(tmp_path, 0o666 & ~_umask())
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def _initializer_bytes(model: ir.Model) -> int:
    return sum(v.const_value.nbytes for v in model.graph.initializers.values()
               if v.const_value is not None)


def save_model(model: ir.Model, path: str | os.PathLike[str], *,
               external_data_threshold: int = TWO_GB) -> None:
    """Atomic save: a failure leaves neither the model nor its data file behind."""
    target = Path(path)
    if _initializer_bytes(model) <= external_data_threshold:
        with atomic_path(target) as tmp:
            ir.save(model, tmp)
        return
    data_name = f"{target.name}.data"
    # The data file's name is recorded inside the model, so write both in a private folder
    # beside the target and move the data first, the model last.
    with atomic_path(target) as tmp, tempfile.TemporaryDirectory(
            dir=tmp.parent, prefix=".om-") as folder:
        staged = Path(folder) / target.name
        ir.save(model, staged, external_data=data_name)
        os.replace(Path(folder) / data_name, target.parent / data_name)
        os.replace(staged, tmp)
