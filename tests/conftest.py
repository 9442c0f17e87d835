"""Shared test set-up and fixtures: ``ort_outputs`` runs a model in ONNX Runtime (CPU),
``assert_close`` compares outputs within an absolute tolerance.

The test models live in ``models.py`` (the registry).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
warnings.filterwarnings("ignore", category=FutureWarning)
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: ORT (float32) against torch eager on the small test models.
TOL = 1e-4


def _array(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _leaves(tree: Any) -> list[Any]:
    """Tensors and arrays of a pytree of tuples, lists and mappings (model output classes
    included) in order; None is no leaf."""
    if tree is None:
        return []
    if isinstance(tree, Mapping):
        return [leaf for value in tree.values() for leaf in _leaves(value)]
    if isinstance(tree, (list, tuple)):
        return [leaf for value in tree for leaf in _leaves(value)]
    return [tree]


def run_ort(model: Any, args: Any = ()) -> list[np.ndarray]:
    """Outputs of ``model`` (a ModelProto, a path, or anything with ``.model_proto``) on
    ONNX Runtime's CPU provider. ``args``: a pytree of tensors fed to the inputs in order, or a
    mapping of input name to tensor."""
    model = getattr(model, "model_proto", model)
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else os.fspath(model)
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    if isinstance(args, Mapping):
        feeds = {name: _array(value) for name, value in args.items()}
    else:
        inputs, values = session.get_inputs(), _leaves(args)
        assert len(values) == len(inputs), \
            f"{len(values)} value(s) for inputs {[i.name for i in inputs]}"
        feeds = {i.name: _array(v) for i, v in zip(inputs, values)}
    return session.run(None, feeds)


def check_close(actual: Any, expected: Any, tol: float = TOL) -> None:
    """``actual`` matches ``expected`` leaf by leaf: same number of leaves (pytrees are
    flattened: ORT's flat output list matches a nested or dict output), each of the same shape
    and dtype with ``|actual - expected| <= tol`` everywhere (absolute; ``tol=0``: equal).
    A tuple or list expected needs a tuple or list; two mappings need the same keys."""
    if isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)), f"expected a sequence, got {type(actual)}"
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        keys = [k for k, v in expected.items() if v is not None]
        assert [k for k, v in actual.items() if v is not None] == keys
    got, want = _leaves(actual), _leaves(expected)
    assert len(got) == len(want), f"{len(got)} output(s), expected {len(want)}"
    for i, (g, e) in enumerate(zip(got, want)):
        torch.testing.assert_close(torch.as_tensor(_array(g)), torch.as_tensor(_array(e)),
                                   rtol=0, atol=tol, msg=lambda m, i=i: f"output {i}: {m}")


@pytest.fixture(scope="session")
def ort_outputs() -> Callable[..., list[np.ndarray]]:
    """``ort_outputs(model_or_proto_or_path, args)``: see :func:`run_ort`."""
    return run_ort


@pytest.fixture(scope="session")
def assert_close() -> Callable[..., None]:
    """``assert_close(actual, expected, tol=TOL)``: see :func:`check_close`."""
    return check_close


@pytest.fixture
def prepacked(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Records ``prepack`` of every ORT session the package makes, in order."""
    from onnx_modular.leaves import runtime

    seen: list[bool] = []
    real = runtime.make_session

    def spy(*a: Any, prepack: bool = True, **kw: Any) -> Any:
        seen.append(prepack)
        return real(*a, prepack=prepack, **kw)

    monkeypatch.setattr(runtime, "make_session", spy)
    return seen


# ---- the inner loop's budget -----------------------------------------------------------------
# `pytest -m "not slow"` is the inner loop. CPU time (not wall time: this machine is shared)
# is measured per test (set-up and call) and for the whole session; a test that is not marked
# slow and goes over its budget fails, naming the budget, so it moves to `slow` instead of
# slowing everyone's loop. OM_TEST_BUDGET sets the per-test budget; 0 turns the checks off
# (a profiler, a debugger).

#: CPU seconds a test outside `slow` may take, set-up and call together.
TEST_CPU_BUDGET = float(os.environ.get("OM_TEST_BUDGET", "2.5"))
#: CPU seconds the whole `-m "not slow"` session may take (imports and collection included).
SESSION_CPU_BUDGET = 60.0


def _budget_on(config: pytest.Config) -> bool:
    return TEST_CPU_BUDGET > 0 and config.option.markexpr == "not slow"


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    item.stash[_SPENT] = 0.0
    start = _cpu_seconds()
    yield
    item.stash[_SPENT] += _cpu_seconds() - start


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    start = _cpu_seconds()
    yield
    item.stash[_SPENT] = item.stash.get(_SPENT, 0.0) + _cpu_seconds() - start


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    spent = item.stash.get(_SPENT, 0.0)
    if (report.when == "call" and report.passed and _budget_on(item.config)
            and item.get_closest_marker("slow") is None and spent > TEST_CPU_BUDGET):
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} took {spent:.1f} s of CPU, over the inner loop's "
                           f"budget of {TEST_CPU_BUDGET} s per test: mark it slow")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    spent = _cpu_seconds()  # since the process started: imports and collection count too
    if _budget_on(session.config) and session.testscollected and spent > SESSION_CPU_BUDGET:
        session.config.get_terminal_writer().line(
            f"the inner loop took {spent:.0f} s of CPU, over its budget of "
            f"{SESSION_CPU_BUDGET:.0f} s: mark the slowest tests slow", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_SPENT = pytest.StashKey[float]()
