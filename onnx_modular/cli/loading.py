"""Resolve the command line's MODEL and INPUTS specs into Python objects.

A spec is ``package.module:attr`` or ``path/to/file.py:attr``. MODEL yields an ``nn.Module``
(or a zero-argument callable returning one); INPUTS yields a tuple of tensors, one tensor,
or ``(args, kwargs)``. ``--input 1x8:int64`` builds random inputs instead.

Resolving a spec imports the user's Python and runs it (module-level code, a factory): only
MODEL and INPUTS specs are resolved, and only with the directory the spec names (the current
one for ``pkg.mod:attr``) on ``sys.path`` for that import.

Every failure is a one-line ``fail(..., rules.BAD_INPUT)`` that keeps the user's exception
as its cause, so ``--debug`` shows the user's own frames.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from onnx_modular.leaves._util import check_allocation
from onnx_modular.leaves.errors import fail, rules
from onnx_modular.leaves.runtime import first_line as runtime_line


def load_object(spec: str) -> Any:
    """``module:attr`` or ``file.py:attr`` -> the attribute (dotted attrs allowed)."""
    if ":" not in spec:
        raise fail(f"'{spec}' is not of the form package.module:attr or file.py:attr",
                   rules.BAD_INPUT)
    where, _, attr = spec.rpartition(":")
    if where.endswith(".py") or os.sep in where or "/" in where:
        module = _import_file(where)
    else:
        try:
            with _on_path(os.getcwd()):
                module = importlib.import_module(where)
        except Exception as e:  # an import can fail in any way; say which module and why
            raise fail(f"cannot import module '{where}': {type(e).__name__}: {e}",
                       rules.BAD_INPUT) from e
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise fail(f"'{where}' has no attribute '{attr}'", rules.BAD_INPUT)
        obj = getattr(obj, part)
    return obj


def _import_file(path: str) -> Any:
    """Import a user's file by path, once per version of it (see the comment below)."""
    file = Path(path)
    if not file.is_file():
        raise fail(f"no such file: '{path}'", rules.BAD_INPUT)
    resolved = file.resolve()
    stamp = (str(resolved), resolved.stat().st_mtime_ns)
    name = f"_onnx_modular_user_{file.stem}"
    # MODEL and INPUTS from one (unchanged) file import it once, so a model built at import
    # time is not built twice; another file with the same stem gets its own name instead of
    # replacing the first in sys.modules.
    suffix = 0
    while (loaded := sys.modules.get(name)) is not None:
        if getattr(loaded, "__onnx_modular_stamp__", None) == stamp:
            return loaded
        suffix += 1
        name = f"_onnx_modular_user_{file.stem}_{suffix}"
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise fail(f"cannot import '{path}' as a Python file", rules.BAD_INPUT)
    module = importlib.util.module_from_spec(spec)
    module.__onnx_modular_stamp__ = stamp  # type: ignore[attr-defined]
    sys.modules[name] = module
    try:
        with _on_path(str(resolved.parent)):
            spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(name, None)
        raise fail(f"cannot import '{path}': {type(e).__name__}: {e}", rules.BAD_INPUT) from e
    return module


@contextlib.contextmanager
def _on_path(entry: str) -> Iterator[None]:
    """``entry`` first on ``sys.path`` while a user's spec is imported, and only then.

    The package's own imports never search the current directory (see
    :mod:`onnx_modular.leaves._safepath`); a spec ``pkg.mod:attr`` is looked up there first, under
    ``python -m onnx_modular`` and the ``onnx-modular`` script alike, and a file's folder
    is searched for the modules the file imports.
    """
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        # remove our entry, not whatever is first now: the user's code may edit sys.path
        with contextlib.suppress(ValueError):
            sys.path.remove(entry)


def load_model(spec: str) -> torch.nn.Module:
    """MODEL -> an ``nn.Module`` in eval mode (a class or factory is called with no args):
    export and validation compare inference, not training, behaviour."""
    obj = load_object(spec)
    if not isinstance(obj, torch.nn.Module) and callable(obj):  # a class or a factory
        try:
            obj = obj()
        except Exception as e:
            raise fail(f"calling '{spec}' to build the model failed: "
                       f"{type(e).__name__}: {e}", rules.BAD_INPUT) from e
    if not isinstance(obj, torch.nn.Module):
        raise fail(f"'{spec}' is a {type(obj).__name__}, not an nn.Module", rules.BAD_INPUT)
    return obj.eval()


def load_inputs(spec: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """INPUTS -> ``(args, kwargs)``; a callable is called, so inputs can be built lazily."""
    obj = load_object(spec)
    if callable(obj) and not isinstance(obj, torch.Tensor):
        try:
            obj = obj()
        except Exception as e:
            raise fail(f"calling '{spec}' to build the inputs failed: "
                       f"{type(e).__name__}: {e}", rules.BAD_INPUT) from e
    return normalize_inputs(obj, spec)


def normalize_inputs(obj: Any, what: str = "inputs") -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Every form INPUTS may take (tensor, tuple, list, dict, ``(args, kwargs)``) -> one."""
    if isinstance(obj, torch.Tensor):
        return (obj,), {}
    if (isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], (tuple, list))
            and isinstance(obj[1], dict)):
        return tuple(obj[0]), dict(obj[1])
    if isinstance(obj, (tuple, list)):
        return tuple(obj), {}
    if isinstance(obj, dict):
        return (), dict(obj)
    raise fail(f"{what} gave a {type(obj).__name__}; expected a tensor, a tuple of "
               "tensors, or (args, kwargs)", rules.BAD_INPUT)


_DTYPES = {
    "float32": torch.float32, "float": torch.float32, "float16": torch.float16,
    "half": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
    "int64": torch.int64, "long": torch.int64, "int32": torch.int32, "int": torch.int32,
    "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}


def random_input(spec: str, seed: int = 0) -> torch.Tensor:
    """``1x8:int64`` -> a seeded random tensor; integers lie in [0, 100)."""
    shape_text, _, dtype_text = spec.partition(":")
    dtype = _DTYPES.get(dtype_text or "float32")
    if dtype is None:
        raise fail(f"unknown dtype '{dtype_text}' in --input '{spec}' "
                   f"(one of {', '.join(sorted(_DTYPES))})", rules.BAD_INPUT)
    try:
        shape = [int(d) for d in shape_text.lower().split("x")] if shape_text else []
    except ValueError as e:
        raise fail(f"bad shape '{shape_text}' in --input '{spec}' (e.g. 1x8)",
                   rules.BAD_INPUT) from e
    if any(d < 0 for d in shape):
        raise fail(f"bad shape '{shape_text}' in --input '{spec}': dimensions must be >= 0",
                   rules.BAD_INPUT)
    if 0 in shape:
        raise fail(f"bad shape '{shape_text}' in --input '{spec}': a size-0 dimension makes "
                   "an empty input (torch.export fixes it at 0, so the model would take only "
                   "empty tensors); use sizes >= 1", rules.BAD_INPUT)
    check_allocation(shape, torch.empty((), dtype=dtype).element_size(), f"--input '{spec}'")
    generator = torch.Generator().manual_seed(seed)
    try:
        if dtype == torch.bool:
            return torch.randint(0, 2, shape, generator=generator).bool()
        if dtype.is_floating_point:
            return torch.randn(shape, generator=generator).to(dtype)
        return torch.randint(0, 100, shape, generator=generator, dtype=dtype)
    except (RuntimeError, MemoryError) as e:  # the allocation failed
        raise fail(f"cannot make --input '{spec}': {runtime_line(e)}", rules.BAD_INPUT) from e


def resolve_inputs(inputs: str | None, random_specs: list[str] | None,
                   ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``--inputs`` or ``--input`` (exactly one of them) -> ``(args, kwargs)``."""
    if inputs and random_specs:
        raise fail("give either --inputs or --input, not both", rules.BAD_INPUT)
    if inputs:
        return load_inputs(inputs)
    if random_specs:
        return tuple(random_input(s, seed=i) for i, s in enumerate(random_specs)), {}
    raise fail("no inputs: give --inputs SPEC or one --input SHAPE:DTYPE per input",
               rules.BAD_INPUT)
