"""Imported first by the package: an older torch is refused in one line (see
:func:`onnx_modular.leaves._version.check_torch`) before any module imports torch."""

from onnx_modular.leaves._version import check_torch

check_torch()
