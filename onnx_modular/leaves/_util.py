"""Small helpers shared by several stages."""

from __future__ import annotations

import contextlib
import gc
import math
import os
import re
from collections.abc import Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while many small objects are built and kept.

    Full collections scan the whole heap (the model included) again and again, which makes
    graph building superlinear; nothing built here is garbage until the end.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def common_prefix(a: Sequence[T], b: Sequence[T]) -> tuple[T, ...]:
    """The longest shared start of two chains of module calls."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return tuple(a[:n])


def class_identifier(type_name: str, default: str = "Module") -> str:
    """``pkg.mod.GPT2Block`` -> ``GPT2Block``, made a valid identifier (function and
    GraphModule class names)."""
    return re.sub(r"\W", "_", type_name.rsplit(".", 1)[-1]) or default


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}


def parse_bytes(text: str) -> int:
    """``"2GB"`` -> 2_000_000_000, ``"1.5GiB"`` -> 1_610_612_736, ``"4096"`` -> 4096
    (SI units are powers of 1000, ``KiB``/``MiB``/``GiB`` powers of 1024)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"'{text}' is not a size; expected e.g. 2GB, 512MiB or 1e9")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if not math.isfinite(value) or value >= 2**63:
        raise ValueError(f"'{text}' is too large a size")
    return int(value)


def format_bytes(n: int) -> str:
    """1_234_567 -> ``"1.23 MB"`` (SI, as sizes on disk are shown)."""
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def memory_bytes() -> int | None:
    """This machine's physical memory (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_allocation(shape: Sequence[int], itemsize: int, what: str) -> None:
    """One line, before allocating, for a tensor that cannot fit: a typo such as
    ``100000x100000`` would otherwise fail deep inside torch or numpy, or be killed."""
    from onnx_modular.leaves.errors import fail

    if any(d < 0 for d in shape):
        raise fail(f"{what}: shape {list(shape)} has a negative dimension")
    nbytes = math.prod(shape) * itemsize
    limit = memory_bytes()
    if limit is not None and nbytes > limit:
        raise fail(f"{what}: shape {list(shape)} needs {nbytes / 2**30:,.1f} GiB, more than "
                   f"this machine's {limit / 2**30:,.1f} GiB of memory")
