"""Fuzzing: every command-line argument and every file the package reads gives a result or
one OnnxModularError line, never a traceback.

Bounded (max_examples, no deadline, derandomized, no example database) so the suite stays
fast and repeatable; raise FUZZ_SCALE to search longer.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from torch import nn

import onnx_modular as om
from onnx_modular.cli import build_parser, common, main
from onnx_modular.cli.loading import random_input
from onnx_modular.cli.split import parse_split_points
from onnx_modular.leaves import _util, runtime
from onnx_modular.parts.manifest import load_manifest
from onnx_modular.support.operator_support import load_support_file

SCALE = float(os.environ.get("FUZZ_SCALE", "1"))


def fuzz(examples: int) -> Any:
    return settings(max_examples=max(1, int(examples * SCALE)), deadline=None, database=None,
                    derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow, HealthCheck.data_too_large])


def one_line(error: om.OnnxModularError) -> None:
    text = str(error)
    assert text and "\n" not in text and "Traceback" not in text
    event("one-line error")  # --hypothesis-show-statistics: how often each outcome came


@pytest.fixture(autouse=True)
def small_memory(monkeypatch) -> None:
    """Random shapes may be large: everything above 64 MiB is 'more than this machine'."""
    monkeypatch.setattr(_util, "memory_bytes", lambda: 64 * 2**20)


# ---- command-line arguments ------------------------------------------------------------------

DTYPES = ["float32", "float", "float16", "half", "bfloat16", "float64", "int64", "long", "int32",
          "int", "int8", "uint8", "bool", "int128", "", "complex64", "FLOAT32"]
dims = st.one_of(st.integers(-3, 12), st.integers(0, 10**12), st.text("0123456789-+ e", max_size=6))
shape_specs = st.builds(
    lambda ds, sep, dtype, colon: sep.join(str(d) for d in ds) + (f":{dtype}" if colon else ""),
    st.lists(dims, max_size=6), st.sampled_from(["x", "X", "*", ",", "x "]),
    st.sampled_from(DTYPES), st.booleans())
input_specs = st.one_of(shape_specs, st.text(max_size=30),
                        st.text("0123456789x:-intfloa", max_size=20))


@pytest.mark.slow
@fuzz(300)
@given(input_specs)
def test_input_specs(spec: str) -> None:
    try:
        t = random_input(spec)
    except om.OnnxModularError as e:
        one_line(e)
        return
    assert isinstance(t, torch.Tensor) and t.numel() * t.element_size() <= 64 * 2**20
    assert 0 not in t.shape


points = st.lists(st.tuples(st.text(st.characters(blacklist_characters=",:"), max_size=8),
                            st.sampled_from(["", ":beginning", ":end", ":middle", "::", ":"])),
                  max_size=5).map(lambda items: ",".join(p + w for p, w in items))


@fuzz(300)
@given(st.one_of(points, st.text(max_size=40)))
def test_split_points(text: str) -> None:
    try:
        parsed = parse_split_points(text)
    except om.OnnxModularError as e:
        one_line(e)
        return
    assert parsed and all(w in ("beginning", "end") and p for p, w in parsed.items())


providers = st.lists(st.sampled_from(["cpu", "CPU", "cuda", "gpu", "trt", "tensorrt", " ",
                                      "CPUExecutionProvider", "Foo", "", "ExecutionProvider",
                                      "cpu ", "\u00e9"]), max_size=4).map(",".join)


@fuzz(200)
@given(st.one_of(providers, st.text(max_size=30)))
def test_providers(text: str) -> None:
    try:
        chosen = common.providers(text)
    except om.OnnxModularError as e:
        one_line(e)
        return
    assert chosen is None or (chosen and all(p.endswith("ExecutionProvider") for p in chosen))


FLAGS = ["export", "split", "validate", "compare", "inspect", "--input", "--inputs", "-o",
         "--output", "--flat", "--functions", "--opset", "--providers", "--rtol", "--atol",
         "--acc-ops", "--acc-ep", "--split-points", "--markers", "--min-acc-size",
         "--max-acc-splits", "--report", "--sarif", "--debug", "--validate", "--json",
         "--no-dedupe", "--preview"]
VALUES = ["2x8", "nan", "-1", "0", "1e-3", "inf", "m.onnx", "", "cpu", "a:b", "7", "x", "--",
          "-5", "h.1:end"]
argvs = st.lists(st.one_of(st.sampled_from(FLAGS), st.sampled_from(VALUES),
                           st.text(max_size=8)), max_size=10)


@pytest.mark.slow
@fuzz(300)
@given(argv=argvs)
def test_argument_parsing(argv: list[str], capsys) -> None:
    """Parsing alone (nothing is imported or run): a namespace, or exit 2 with one line."""
    if {"-h", "--help"} & set(argv):
        return
    try:
        build_parser().parse_args(argv)
    except SystemExit as e:
        assert e.code == 2
        err = capsys.readouterr().err
        assert len([ln for ln in err.splitlines() if ln.strip()]) == 1, err
    else:
        capsys.readouterr()


@pytest.mark.slow
@fuzz(150)
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode),
                 st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text()),
                              lambda c: st.one_of(st.lists(c), st.dictionaries(st.text(), c)),
                              max_leaves=10).map(lambda v: json.dumps(v).encode())))
def test_op_lists(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "ops.txt"
    path.write_bytes(data)
    try:
        support = load_support_file(path)
    except om.OnnxModularError as e:
        one_line(e)
        return
    assert isinstance(support, om.OperatorSupport)


# ---- parts directories -----------------------------------------------------------------------

class Chain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.sin(self.a(x)))


X = torch.randn(2, 4)


def _chain() -> Chain:
    torch.manual_seed(0)
    return Chain().eval()


with torch.no_grad():
    EXPECTED = _chain()(X)


@pytest.fixture(scope="module")
def parts_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fuzz") / "parts"
    om.split(_chain(), (X,), support={"deny": ["aten.sin"]}).save(out)
    return out


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False),
              st.text(max_size=6), st.sampled_from(["../x.onnx", "/etc/passwd", "acc",
                                                    "cpu", "stage", "input", "x"])),
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=5), c,
                                                                 max_size=3)),
    max_leaves=6)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            found += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _paths(v, (*prefix, i))
    return found


def _replace(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _replace(value[path[0]], path[1:], new)
    return copy


def _run(directory: Path) -> None:
    """Load and run the parts: torch's numbers, or one line. A changed manifest that still
    loads must compute what the model computes: never other numbers, silently."""
    try:
        runner = om.SplitRunner(directory, acc_providers="cpu")
        out = runner.run(X)
    except om.OnnxModularError as e:
        one_line(e)
        return
    torch.testing.assert_close(torch.as_tensor(np.asarray(out[0] if isinstance(
        out, (list, tuple)) else out)), EXPECTED, rtol=0, atol=1e-5)
    event("parts ran")


@pytest.mark.slow
@fuzz(200)
@given(data=st.data())
def test_manifest_mutations(parts_dir: Path, tmp_path: Path, data: st.DataObject) -> None:
    work = tmp_path / "parts"
    if not work.exists():
        shutil.copytree(parts_dir, work)
    manifest = json.loads((parts_dir / "manifest.json").read_text())
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(_paths(manifest)))
        if path and data.draw(st.booleans()) and isinstance(
                parent := _get(manifest, path[:-1]), dict):
            parent = dict(parent)
            parent.pop(path[-1])
            manifest = _replace(manifest, path[:-1], parent)
        else:
            manifest = _replace(manifest, path, data.draw(json_values))
    (work / "manifest.json").write_text(json.dumps(manifest))
    _run(work)


def _get(value: Any, path: tuple) -> Any:
    for key in path:
        value = value[key]
    return value


@pytest.mark.slow
@fuzz(150)
@given(data=st.data())
def test_manifest_bytes(parts_dir: Path, tmp_path: Path, data: st.DataObject) -> None:
    work = tmp_path / "parts"
    if not work.exists():
        shutil.copytree(parts_dir, work)
    text = (parts_dir / "manifest.json").read_bytes()
    choice = data.draw(st.sampled_from(["truncate", "flip", "random"]))
    if choice == "truncate":
        blob = text[:data.draw(st.integers(0, len(text)))]
    elif choice == "flip":
        i = data.draw(st.integers(0, len(text) - 1))
        blob = text[:i] + bytes([data.draw(st.integers(0, 255))]) + text[i + 1:]
    else:
        blob = data.draw(st.binary(max_size=300))
    (work / "manifest.json").write_bytes(blob)
    try:
        load_manifest(work)
    except om.OnnxModularError as e:
        one_line(e)
        return
    _run(work)


# ---- ONNX files ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model_bytes() -> bytes:
    torch.manual_seed(0)
    return om.export(Chain().eval(), (X,)).model_proto.SerializeToString()


def _inspect_and_load(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(path)]) in (0, 2)
    assert main(["inspect", str(path), "--json"]) in (0, 2)
    captured = capsys.readouterr()
    errors = [ln for ln in captured.err.splitlines() if ln.strip()]
    assert len(errors) <= 2 and "Traceback" not in captured.err
    try:
        runtime.load_model(path)
    except om.OnnxModularError as e:
        one_line(e)
    else:
        event("model loaded")


@pytest.mark.slow
@fuzz(200)
@given(data=st.data())
def test_onnx_bytes(model_bytes: bytes, tmp_path: Path, capsys, data: st.DataObject) -> None:
    choice = data.draw(st.sampled_from(["truncate", "flip", "random"]))
    if choice == "truncate":
        blob = model_bytes[:data.draw(st.integers(0, len(model_bytes)))]
    elif choice == "flip":
        blob = bytearray(model_bytes)
        for _ in range(data.draw(st.integers(1, 4))):
            blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
        blob = bytes(blob)
    else:
        blob = data.draw(st.binary(max_size=400))
    path = tmp_path / "m.onnx"
    path.write_bytes(blob)
    _inspect_and_load(path, capsys)


names = st.one_of(st.text(max_size=12), st.text("ab[]/=:. \n\x1b", max_size=12))


@pytest.mark.slow
@fuzz(150)
@given(graph=names, node=names, path=names, function=names, domain=names)
def test_onnx_names(tmp_path: Path, capsys, graph: str, node: str, path: str, function: str,
                    domain: str) -> None:
    """Names and metadata from a file are shown as text, never read as markup."""
    body = helper.make_function(domain or "d", function or "f", ["x"], ["y"],
                                [helper.make_node("Identity", ["x"], ["y"], name=node)],
                                [helper.make_opsetid("", 18)])
    call = helper.make_node(function or "f", ["x"], ["y"], name=node, domain=domain or "d")
    entry = call.metadata_props.add()
    entry.key, entry.value = "onnx_modular.module_path", path
    model = helper.make_model(
        helper.make_graph([call], graph,
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]),
        functions=[body], opset_imports=[helper.make_opsetid("", 18),
                                         helper.make_opsetid(domain or "d", 1)])
    file = tmp_path / "named.onnx"
    onnx.save(model, file)
    assert main(["inspect", str(file)]) == 0
    out = capsys.readouterr().out
    if path.isascii() and path.isprintable() and path.strip():
        assert path.strip() in out
    assert main(["compare", str(file), str(file)]) in (0, 2)  # 2: a name ORT refuses
    err = capsys.readouterr().err
    assert len([ln for ln in err.splitlines() if ln.strip()]) <= 1, err
