"""Weights that write themselves at disk speed.

Folding ``Transpose(weight)`` of every Linear leaves numpy views in C-incontiguous order,
which ``ndarray.tofile`` writes element by element (~80 MB/s); making each contiguous with
numpy first runs at ~500 MB/s on a transpose. torch's copy kernels transpose at 1.2-1.5 GB/s
on this machine's two cores, so the weight is copied by torch, once, as it is written.
"""

from __future__ import annotations

import sys
import warnings
from typing import BinaryIO

import numpy as np
import onnx_ir as ir
import torch


class StridedTensor(ir.Tensor):
    """A weight over a non-contiguous array, written as one contiguous block (and serialized
    like any ``ir.Tensor``)."""

    def tofile(self, file: BinaryIO) -> None:
        if sys.byteorder != "little":
            super().tofile(file)
            return
        array = contiguous_array(self.numpy())
        file.write(memoryview(array.reshape(-1).view(np.uint8)))


def contiguous_array(array: np.ndarray) -> np.ndarray:
    """``array`` in C order: itself when it is, else one copy, by torch where it can."""
    if array.flags.c_contiguous:
        return array
    try:
        with warnings.catch_warnings():  # a read-only array: torch only reads it here
            warnings.simplefilter("ignore", UserWarning)
            source = torch.from_numpy(array)
    except (TypeError, ValueError):  # a dtype torch lacks, or a non-native byte order
        return np.ascontiguousarray(array)
    return source.contiguous().numpy()
