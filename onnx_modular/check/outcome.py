"""What a check measured: each output on each execution provider.

Shared by ``validate`` (against torch) and ``compare-io`` (against saved outputs), so
neither report imports the other.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from onnx_modular.check.numerics import ValueCheck

__all__ = ["OutputCheck", "ProviderResult"]


@dataclasses.dataclass
class OutputCheck(ValueCheck):
    """One model output on one provider against torch: a value check, named and shaped."""

    name: str = ""
    shape: list[int] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, name: str, shape: list[int], check: ValueCheck) -> OutputCheck:
        return cls(check.dtype, check.rtol, check.atol, check.diff, name, shape)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": self.shape, "dtype": self.dtype,
                "rtol": self.rtol, "atol": self.atol, **self.diff.to_dict()}


@dataclasses.dataclass
class ProviderResult:
    """Every output on one execution provider, with session-creation and run time."""

    provider: str
    outputs: list[OutputCheck]
    session_s: float
    run_s: float

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    def to_dict(self) -> dict[str, Any]:
        return {"provider": self.provider, "ok": self.ok, "session_s": self.session_s,
                "run_s": self.run_s, "outputs": [o.to_dict() for o in self.outputs]}
