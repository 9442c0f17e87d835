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
Everything comes from the localization's evidence (:class:`~onnx_modular.check.judge.
Evidence`): no re-export and, for the first mismatch, no second torch run.

One job per module: ``choose`` (which call), ``cut`` (the call as a standalone model),
``values`` (its inputs and expected outputs, torch's where torch had them), ``folder``
(where a repro may go, and the marker), ``record`` (:class:`Extraction`, the
:class:`Target` record, the README and the command), ``repro`` (:func:`extract`: the files
written through the staged-folder transaction).
"""

from onnx_modular.check.extract.choose import find_call
from onnx_modular.check.extract.folder import (
    EXPECTED,
    INPUTS,
    MARKER,
    MARKER_FORMAT,
    MODULE,
    README,
    check_directory,
)
from onnx_modular.check.extract.record import Extraction, Port, Target
from onnx_modular.check.extract.repro import extract

__all__ = ["EXPECTED", "INPUTS", "MARKER", "MARKER_FORMAT", "MODULE", "README", "Extraction",
           "Port", "Target", "check_directory", "extract", "find_call"]
