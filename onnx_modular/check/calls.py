"""One record of a module call, however a check met it (torch's run, the ONNX probe, an
error table): the call's identity is one :class:`~onnx_modular.leaves.metadata.CallInfo`, and each
record adds what it saw of the call."""

from __future__ import annotations

import dataclasses

from onnx_modular.leaves.metadata import CallInfo

__all__ = ["CallRecord"]


@dataclasses.dataclass
class CallRecord:
    """A module call by its :class:`CallInfo`, read through as ``call_id``, ``module_path``
    and ``module_type`` (the names reports and the JSON format use)."""

    call: CallInfo

    @property
    def call_id(self) -> str:
        return self.call.call_id

    @property
    def module_path(self) -> str:
        return self.call.module_path

    @property
    def module_type(self) -> str:
        return self.call.module_type
