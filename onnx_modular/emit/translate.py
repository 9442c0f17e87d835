"""FX -> ONNX, once, with the public ``torch.onnx.export`` (no optimization yet).

Every ONNX node it produces records the FX node it came from in ``pkg.torch.onnx.fx_node``;
the outliner relies on that, and the optimizer would drop it, so optimization comes later.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import warnings
from collections.abc import Iterator

import onnx_ir as ir
import torch

from onnx_modular.diagnostics import DiagnosticContext, rules

FX_NODE_KEY = "pkg.torch.onnx.fx_node"


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


def translate(program: torch.export.ExportedProgram, *, opset: int | None = None,
              ctx: DiagnosticContext | None = None) -> Translation:
    ctx = ctx if ctx is not None else DiagnosticContext()
    try:
        with quiet_torch_onnx():
            onnx_program = torch.onnx.export(program, dynamo=True, optimize=False,
                                             opset_version=opset, verbose=False)
    except Exception as e:
        first = str(e).strip().splitlines()
        detail = next((line for line in reversed(first) if line.strip()), type(e).__name__)
        raise ctx.error(rules.TRANSLATION, reason=(
            f"torch.onnx could not translate the program: {detail}")) from e
    assert onnx_program.exported_program is not None
    return Translation(onnx_program.model, onnx_program.exported_program)
