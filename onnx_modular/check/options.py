"""What a check against torch is asked to do, built once at its entry point and passed whole.

:class:`Tolerances` (the user's ``rtol``/``atol``, checked), :class:`ProviderPlan` (the
execution providers to run on, and whether the user chose them) and :class:`CheckOptions`
(both, and when to localize). Frozen: nothing downstream changes what was asked; what a run
found (a provider skipped, say) is returned, never written into these.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from onnx_modular.check.numerics import check_tolerances
from onnx_modular.leaves import runtime

__all__ = ["CheckOptions", "ProviderPlan", "Tolerances"]


@dataclasses.dataclass(frozen=True)
class Tolerances:
    """User tolerances for floating values (None: the per-dtype defaults); ``computed_in``:
    float16/bfloat16 where the torch model computes in it (its float outputs are judged at
    least at that type's defaults: :func:`~onnx_modular.check.numerics.computes_in`)."""

    rtol: float | None = None
    atol: float | None = None
    computed_in: str | None = None

    @classmethod
    def checked(cls, rtol: float | None, atol: float | None) -> Tolerances:
        """The tolerances, once :func:`~onnx_modular.check.numerics.check_tolerances` has
        accepted them (None or finite numbers >= 0)."""
        check_tolerances(rtol, atol)
        return cls(rtol, atol)


@dataclasses.dataclass(frozen=True)
class ProviderPlan:
    """The execution providers to check on, in order.

    ``defaulted``: the user left them to the default (every available one of CUDA and
    CPU), so one that cannot start is skipped with its reason; one the user asked for that
    cannot start is an error, never a silent CPU-only check. ``unavailable``: default
    providers this onnxruntime lacks, each with why (skipped before anything runs).
    """

    providers: tuple[str, ...]
    defaulted: bool
    unavailable: Mapping[str, str] = dataclasses.field(
        default_factory=lambda: MappingProxyType({}))

    @classmethod
    def resolve(cls, providers: str | Sequence[str] | None) -> ProviderPlan:
        """``providers`` as given to ``validate`` (None, short or full names)."""
        chosen = tuple(runtime.resolve_providers(providers))
        unavailable = runtime.unavailable_defaults(chosen) if providers is None else {}
        return cls(chosen, providers is None, MappingProxyType(dict(unavailable)))


@dataclasses.dataclass(frozen=True)
class CheckOptions:
    """Everything a validation is asked: tolerances, providers, and when to localize
    (``"auto"``: on a mismatch; True: always; False: never)."""

    tolerances: Tolerances
    plan: ProviderPlan
    localize: bool | str = "auto"

    @classmethod
    def of(cls, *, providers: str | Sequence[str] | None = None, rtol: float | None = None,
           atol: float | None = None, localize: bool | str = "auto") -> CheckOptions:
        """The options of one ``validate`` call, checked (tolerances first, then the
        providers, as ``validate`` has always checked them)."""
        tolerances = Tolerances.checked(rtol, atol)
        return cls(tolerances, ProviderPlan.resolve(providers), localize)

    @property
    def always_localize(self) -> bool:
        return self.localize is True

    def computing_in(self, dtype: str | None) -> CheckOptions:
        """These options for a torch model computing in ``dtype`` (float16/bfloat16)."""
        return dataclasses.replace(
            self, tolerances=dataclasses.replace(self.tolerances, computed_in=dtype))
