"""FX -> ONNX, once, with torch.onnx's exporter (no optimization yet).

Every ONNX node it produces records the FX node it came from in ``pkg.torch.onnx.fx_node``;
the outliner relies on that, and the optimizer would drop it, so optimization comes later.

``torch.onnx.export`` rebuilds its table of torchlib translations on every call (about 0.4 s,
a sixth of a 48-layer export); we build it once per opset and hand it to the exporter's entry
point, falling back to the public call where that entry point is not there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import logging
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import onnx_ir as ir
import torch

from onnx_modular.diagnostics import DiagnosticContext, rules

FX_NODE_KEY = "pkg.torch.onnx.fx_node"
# torchlib's opset: below it torch.onnx converts the model down, dropping node metadata.
MIN_HIERARCHICAL_OPSET = 18


@dataclasses.dataclass
class Translation:
    model: ir.Model
    program: torch.export.ExportedProgram  # the decomposed program the model came from


def fx_name(node: ir.Node) -> str | None:
    """The FX node name an ONNX node was translated from (``%name : ...``)."""
    text = node.metadata_props.get(FX_NODE_KEY)
    if not text or not text.startswith("%"):
        return None
    return text[1:].split(" ", 1)[0]


@contextlib.contextmanager
def quiet_torch_onnx() -> Iterator[None]:
    """torch.onnx prints progress and warns about torchvision; keep the user's terminal clean."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _exporter() -> tuple[Callable[..., Any], Callable[[int], Any]] | None:
    """torch.onnx's export entry point as it is now (before any hook) and a registry maker."""
    try:
        from torch.onnx._internal.exporter import _core, _registration
    except ImportError:
        return None
    return _core.export, _registration.ONNXRegistry.from_torchlib


_EXPORTER = _exporter()  # captured at import: an active om.hook() must not apply to us


@functools.lru_cache(maxsize=4)
def _registry(opset: int) -> Any:
    """torchlib's translation table for ``opset``; the exporter only reads it."""
    assert _EXPORTER is not None
    return _EXPORTER[1](opset_version=opset)


def _torch_onnx(program: torch.export.ExportedProgram, opset: int | None) -> Any:
    if _EXPORTER is None:
        return torch.onnx.export(program, dynamo=True, optimize=False, opset_version=opset,
                                 verbose=False)
    from torch.onnx import _constants
    from torch.onnx._internal.exporter import _constants as exporter_constants

    opset = _constants.ONNX_DEFAULT_OPSET if opset is None else opset
    # Below torchlib's own opset torch.onnx translates at its opset and converts down.
    registry = _registry(max(opset, exporter_constants.TORCHLIB_OPSET))
    return _EXPORTER[0](program, registry=registry, optimize=False, opset_version=opset,
                        verbose=False)


def translate(program: torch.export.ExportedProgram, *, opset: int | None = None,
              ctx: DiagnosticContext | None = None) -> Translation:
    ctx = ctx if ctx is not None else DiagnosticContext()
    try:
        with quiet_torch_onnx():
            onnx_program = _torch_onnx(program, opset)
    except Exception as e:
        first = str(e).strip().splitlines()
        detail = next((line for line in reversed(first) if line.strip()), type(e).__name__)
        raise ctx.error(rules.TRANSLATION, reason=(
            f"torch.onnx could not translate the program: {detail}")) from e
    assert onnx_program.exported_program is not None
    return Translation(onnx_program.model, onnx_program.exported_program)
