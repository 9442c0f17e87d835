"""Naming the call to extract: a call id or module path, exactly or by its tail; the paired
record where one call was recorded twice; an unknown or ambiguous name is one line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from onnx_modular.check.extract.choose import find_call
from onnx_modular.leaves.errors import OnnxModularError

CALLS = [SimpleNamespace(call_id=c, module_path=p) for c, p in [
    ("model", "model"), ("model.h.1.attn", "model.h.1.attn"), ("model.h.1.mlp", "model.h.1.mlp"),
    ("model.h.1.mlp", "model.h.1.mlp"), ("model.h.2.mlp", "model.h.2.mlp"),
    ("model.head:1", "model.head")]]


def test_a_call_is_found_exactly_by_its_module_path_or_by_its_tail() -> None:
    assert find_call(CALLS, "model.h.1.attn") == 1
    assert find_call(CALLS, "model.head") == 5  # the module path of a numbered call
    assert find_call(CALLS, "h.2.mlp") == 4  # the tail
    assert find_call(CALLS, "model.h.1.mlp") == 2
    assert find_call(CALLS, "model.h.1.mlp", paired={3}) == 3  # the one with a counterpart


def test_an_ambiguous_or_unknown_name_is_one_line() -> None:
    with pytest.raises(OnnxModularError, match="'mlp' is ambiguous: model.h.1.mlp, "
                       "model.h.2.mlp"):
        find_call(CALLS, "mlp")
    with pytest.raises(OnnxModularError, match="did you mean model.h.1.attn"):
        find_call(CALLS, "model.h.1.atn")
    with pytest.raises(OnnxModularError, match="no module call 'zzz'") as error:
        find_call(CALLS, "zzz")
    assert "did you mean" not in str(error.value)
