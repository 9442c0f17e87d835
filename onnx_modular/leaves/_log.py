"""The package's logger, ``logging.getLogger("onnx_modular")``.

Each stage (capture, translation, Modularize, emission, saving, validation) and each pass
logs what it did and how long it took at DEBUG, as onnx_ir logs its passes. Silent unless
the application configures logging; ``--verbose`` on the command line shows it on stderr.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from typing import TextIO

LOGGER = logging.getLogger("onnx_modular")
LOGGER.addHandler(logging.NullHandler())


@contextlib.contextmanager
def timed(what: str, logger: logging.Logger = LOGGER) -> Iterator[dict[str, object]]:
    """Log ``what`` and its duration at DEBUG when it ends; the yielded dict's items (what
    the step found or made) are appended. A step that raises logs that it failed."""
    if not logger.isEnabledFor(logging.DEBUG):
        yield {}
        return
    details: dict[str, object] = {}
    start = time.perf_counter()
    try:
        yield details
    except BaseException as e:
        logger.debug("%s failed after %.3f s: %s", what, time.perf_counter() - start,
                     type(e).__name__)
        raise
    found = "".join(f", {key}={value}" for key, value in details.items())
    logger.debug("%s: %.3f s%s", what, time.perf_counter() - start, found)


def show_on(stream: TextIO | None = None, level: int = logging.DEBUG) -> logging.Handler:
    """Send the package's log to ``stream`` (stderr); returns the handler, so a caller can
    remove it again."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    LOGGER.addHandler(handler)
    LOGGER.setLevel(level)
    return handler


@contextlib.contextmanager
def shown_on(stream: TextIO | None = None, level: int = logging.DEBUG) -> Iterator[None]:
    """:func:`show_on` while inside, as ``--verbose`` does for one command: the logger's
    handlers and level are as they were afterwards (a notebook calling ``main`` twice gets
    each line once, and no handler bound to a stream since closed)."""
    before = LOGGER.level
    handler = show_on(stream, level)
    try:
        yield
    finally:
        LOGGER.removeHandler(handler)
        LOGGER.setLevel(before)
