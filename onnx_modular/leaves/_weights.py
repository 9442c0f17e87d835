"""Weights that write themselves at disk speed.

Folding ``Transpose(weight)`` of every Linear leaves numpy views in C-incontiguous order,
which ``ndarray.tofile`` writes element by element (~80 MB/s); making each contiguous with
numpy first runs at ~500 MB/s on a transpose. torch's copy kernels transpose at 1.2-1.5 GB/s
on this machine's two cores, so the weight is copied by torch, once, as it is written.
"""

from __future__ import annotations

import sys
import threading
import warnings
from typing import BinaryIO

import numpy as np
import onnx_ir as ir
import torch

#: ``warnings.catch_warnings`` is not thread-safe, and weights are written by two threads.
_WARNINGS = threading.Lock()


class StridedTensor(ir.Tensor):
    """A weight over a non-contiguous array, written as one contiguous block (and serialized
    like any ``ir.Tensor``)."""

    def tofile(self, file: BinaryIO) -> None:
        array = self.numpy()
        if (sys.byteorder != "little" or array.dtype.byteorder == ">"
                or self.dtype.bitwidth != 8 * array.itemsize):  # packed sub-byte types
            super().tofile(file)
            return
        file.write(memoryview(contiguous_array(array).reshape(-1).view(np.uint8)))


def contiguous_array(array: np.ndarray) -> np.ndarray:
    """``array`` in C order: itself when it is, else one copy, by torch where the element
    size allows (its bytes are copied as integers of that size, so bfloat16 and float8
    arrays of ml_dtypes, which torch cannot take, go the same way)."""
    if array.flags.c_contiguous:
        return array
    if array.itemsize not in (1, 2, 4, 8) or array.dtype.hasobject:
        return np.ascontiguousarray(array)
    as_ints = array.view(np.dtype(f"i{array.itemsize}"))
    try:
        with _WARNINGS, warnings.catch_warnings():  # read-only arrays: torch only reads them
            warnings.simplefilter("ignore", UserWarning)
            source = torch.from_numpy(as_ints)
    except ValueError:  # negative strides (a flipped view)
        return np.ascontiguousarray(array)
    return source.contiguous().numpy().view(array.dtype)
