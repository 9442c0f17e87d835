"""Which module call to extract: the one a user names, by call id or module path, exactly
or by its tail; an unknown or ambiguous name is one line (with the closest names)."""

from __future__ import annotations

from onnx_modular.check.recorder import TorchCall
from onnx_modular.leaves.errors import fail, rules


def find_call(calls: list[TorchCall], wanted: str, paired: set[int] | None = None) -> int:
    """The torch call a user names: a call id or module path, exactly or by its tail
    (``h.17.attn`` for ``model.h.17.attn``); an unknown or ambiguous name is an error.

    ``paired``: calls with an ONNX counterpart, preferred where one call was recorded twice
    (a modularized program runs each call's GraphModule inside a wrapper of the same id).
    """
    def pick(found: list[int]) -> int:
        return next((i for i in found if paired is None or i in paired), found[0])

    for rule in (lambda c: c.call_id == wanted, lambda c: c.module_path == wanted):
        found = [i for i, c in enumerate(calls) if rule(c)]
        if found:
            return pick(found)
    tail = [i for i, c in enumerate(calls) if c.call_id.endswith("." + wanted)]
    if len({calls[i].call_id for i in tail}) == 1:
        return pick(tail)
    if tail:
        names = ", ".join(dict.fromkeys(calls[i].call_id for i in tail[:8]))
        raise fail(f"call '{wanted}' is ambiguous: {names}; give the full call id",
                   rules.VALIDATION)
    import difflib

    close = difflib.get_close_matches(wanted, list(dict.fromkeys(c.call_id for c in calls)),
                                      n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise fail(f"no module call '{wanted}' in the torch model{hint}", rules.VALIDATION)
