"""Inside ``om.hook``, ONNX Runtime's quantizers and transformers optimizer given a
hierarchical file write what the flat pipeline writes, outlined again (issue 31, item 2)."""

from __future__ import annotations

import collections
import contextlib
import subprocess
import sys
import textwrap
from pathlib import Path

import models
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

import onnx_modular as om
from onnx_modular.api import hook_tools


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([Block() for _ in range(3)])
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


X = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(0))


class Reader(CalibrationDataReader):
    def __init__(self) -> None:
        self.batches = iter([{"x": np.random.default_rng(i).standard_normal(
            (2, 5, 16), dtype=np.float32)} for i in range(4)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.batches, None)


def _ops(path: Path) -> tuple[int, collections.Counter[str]]:
    """(local functions, op counts of the inlined model)."""
    model = onnx.load(str(path))
    flat = onnx.inliner.inline_local_functions(model)
    return len(model.functions), collections.Counter(n.op_type for n in flat.graph.node)


def _run(path: Path, feed: dict[str, np.ndarray]) -> np.ndarray:
    options = ort.SessionOptions()  # ORT's own fusions fail on some files its optimizer wrote
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, feed)[0]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, Path]:
    """The hierarchical (hooked) and the flat export of one model."""
    folder = tmp_path_factory.mktemp("stack")
    torch.manual_seed(0)
    model = Stack().eval()
    with om.hook():
        torch.onnx.export(model, (X,), folder / "hier.onnx", dynamo=True, verbose=False)
    torch.onnx.export(model, (X,), folder / "flat.onnx", dynamo=True, verbose=False)
    assert onnx.load(str(folder / "hier.onnx")).functions
    return folder / "hier.onnx", folder / "flat.onnx"


def _same_as_flat_pipeline(hier: Path, flat: Path, feed: dict[str, np.ndarray]) -> None:
    functions, ops = _ops(hier)
    flat_functions, flat_ops = _ops(flat)
    assert functions > 0 and flat_functions == 0
    # om keeps small constants in the bodies (Constant nodes) where torch.onnx makes them
    # initializers: data, not ops (ORT's basic level folds them alike)
    assert ops - collections.Counter(Constant=ops["Constant"]) == \
        flat_ops - collections.Counter(Constant=flat_ops["Constant"])
    np.testing.assert_allclose(_run(hier, feed), _run(flat, feed), rtol=0, atol=1e-6)


@pytest.mark.slow
def test_quantize_dynamic_in_a_hook_quantizes_like_the_flat_pipeline(exported, tmp_path
                                                                    ) -> None:
    hier, flat = exported
    with om.hook() as session:
        quantize_dynamic(hier, tmp_path / "hier.int8.onnx", weight_type=QuantType.QInt8)
    quantize_dynamic(flat, tmp_path / "flat.int8.onnx", weight_type=QuantType.QInt8)
    _same_as_flat_pipeline(tmp_path / "hier.int8.onnx", tmp_path / "flat.int8.onnx",
                           {"x": X.numpy()})
    assert _ops(tmp_path / "hier.int8.onnx")[1]["MatMulInteger"] == 7
    assert [r.hierarchical for r in session.rewrites] == [True]


@pytest.mark.slow
def test_quantize_static_qdq_in_a_hook_calibrates_and_quantizes_like_the_flat_pipeline(
        exported, tmp_path) -> None:
    hier, flat = exported
    with om.hook():
        quantize_static(hier, tmp_path / "hier.qdq.onnx", Reader(), quant_format=QuantFormat.QDQ)
    quantize_static(flat, tmp_path / "flat.qdq.onnx", Reader(), quant_format=QuantFormat.QDQ)
    _same_as_flat_pipeline(tmp_path / "hier.qdq.onnx", tmp_path / "flat.qdq.onnx",
                           {"x": X.numpy()})
    assert _ops(tmp_path / "hier.qdq.onnx")[1]["QuantizeLinear"] > 0


@pytest.mark.slow
def test_quantizer_classes_as_optimum_ortquantizer_drives_them(exported, tmp_path) -> None:
    """ORTQuantizer (sentence-transformers' export_dynamic_quantized_onnx_model) loads the
    file, builds ORT's quantizer class itself and saves its model."""
    from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer
    from onnxruntime.quantization.quant_utils import QuantizationMode
    from onnxruntime.quantization.registry import IntegerOpsRegistry

    def ortquantizer(source: Path, target: Path) -> None:
        quantizer = ONNXQuantizer(onnx.load(str(source)), False, False,
                                  QuantizationMode.IntegerOps, False, QuantType.QInt8,
                                  QuantType.QUInt8, None, [], [], list(IntegerOpsRegistry),
                                  {"MatMulConstBOnly": True})
        quantizer.quantize_model()
        quantizer.model.save_model_to_file(str(target), True)  # with external data

    hier, flat = exported
    with om.hook():
        ortquantizer(hier, tmp_path / "hier.onnx")
    ortquantizer(flat, tmp_path / "flat.onnx")
    _same_as_flat_pipeline(tmp_path / "hier.onnx", tmp_path / "flat.onnx", {"x": X.numpy()})
    written = sorted(p.name for p in tmp_path.iterdir())  # data files as the tool writes them
    assert [n for n in written if n.startswith("hier")] == [
        n.replace("flat", "hier") for n in written if n.startswith("flat")]


@pytest.mark.slow
def test_a_save_killed_midway_never_pairs_the_model_with_other_weights(tmp_path,
                                                                       monkeypatch) -> None:
    """The outlined model and its weights are published so that, stopped between the
    steps, the model names a data file that is not there (an error on load), never the
    tool's data file with other contents."""
    from onnxruntime.quantization import quantize_dynamic

    from onnx_modular.api import hook_tools

    def killed(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(hook_tools, "_point_data_at", killed)
    torch.manual_seed(0)  # int8 weights over ORT's 1 KB threshold: written apart
    wide = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(3)]).eval()
    hier, target = tmp_path / "wide.onnx", tmp_path / "int8.onnx"
    with om.hook():
        torch.onnx.export(wide, (torch.randn(2, 64),), hier, dynamo=True, verbose=False)
    with om.hook(), pytest.raises(KeyboardInterrupt):
        quantize_dynamic(str(hier), str(target), weight_type=QuantType.QInt8,
                         use_external_data_format=True)
    with pytest.raises(Exception, match="(?i)no such file|not exist|doesn't exist|open"):
        ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])


@pytest.mark.slow
@pytest.mark.parametrize("opt_level", [None, 0])
@pytest.mark.parametrize("source", ["torch.onnx", "om.export"])
def test_transformers_optimizer_in_a_hook_fuses_like_the_flat_pipeline(tmp_path, opt_level,
                                                                      source: str) -> None:
    """From om.export's saved file (a weight folded, ``val_2``), the optimizer's default level
    failed to load what ORT wrote: the inlined copy kept its weights in a data file, and
    ORT's file, in another folder, still named it for the weights it left unchanged."""
    from onnxruntime.transformers import optimizer

    model, args = models.bert(2)
    if source == "om.export":
        om.export(model, args).save(tmp_path / "hier.onnx")
    with om.hook() as session:
        if source == "torch.onnx":
            torch.onnx.export(model, args, tmp_path / "hier.onnx", dynamo=True, verbose=False)
        optimizer.optimize_model(str(tmp_path / "hier.onnx"), model_type="bert", num_heads=4,
                                 hidden_size=32, opt_level=opt_level
                                 ).save_model_to_file(str(tmp_path / "hier.opt.onnx"))
    torch.onnx.export(model, args, tmp_path / "flat.onnx", dynamo=True, verbose=False)
    optimizer.optimize_model(str(tmp_path / "flat.onnx"), model_type="bert", num_heads=4,
                             hidden_size=32, opt_level=opt_level
                             ).save_model_to_file(str(tmp_path / "flat.opt.onnx"))
    _same_as_flat_pipeline(tmp_path / "hier.opt.onnx", tmp_path / "flat.opt.onnx",
                           {"input_ids": args[0].numpy()})
    assert _ops(tmp_path / "hier.opt.onnx")[1]["SkipLayerNormalization"] == 4
    assert [r.hierarchical for r in session.rewrites] == [True]


@pytest.mark.slow
def test_the_optimizer_in_a_hook_fuses_a_llamas_skip_norms_like_the_flat_pipeline(tmp_path
                                                                                ) -> None:
    """The inlined bodies' ``Constant(value_ints)`` made ORT's symbolic shape inference fail
    (it reads ``value`` only): no ``SkipSimplifiedLayerNormalization`` was fused, silently."""
    from onnxruntime.transformers import optimizer

    model, args = models.llama(2)
    files = {}
    for kind in ("hier", "flat"):
        with om.hook() if kind == "hier" else contextlib.nullcontext():
            torch.onnx.export(model, args, tmp_path / f"{kind}.onnx", dynamo=True,
                              verbose=False)
            optimizer.optimize_model(str(tmp_path / f"{kind}.onnx"), model_type="gpt2",
                                     num_heads=4, hidden_size=32, opt_level=0
                                     ).save_model_to_file(str(tmp_path / f"{kind}.opt.onnx"))
        files[kind] = tmp_path / f"{kind}.opt.onnx"
    _same_as_flat_pipeline(files["hier"], files["flat"], {"input_ids": args[0].numpy()})
    assert _ops(files["hier"])[1]["SkipSimplifiedLayerNormalization"] == 4


@pytest.mark.slow
def test_a_result_that_cannot_be_outlined_is_flat_and_quantized_with_a_warning(
        exported, tmp_path, monkeypatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no labels")

    monkeypatch.setattr(hook_tools, "outline", refuse)
    with om.hook() as session, pytest.warns(om.HookWarning, match="stays flat"):
        quantize_dynamic(exported[0], tmp_path / "q.onnx", weight_type=QuantType.QInt8)
    functions, ops = _ops(tmp_path / "q.onnx")
    assert functions == 0 and ops["MatMulInteger"] == 7
    assert session.rewrites[0].flat_reason is not None
    assert hook_tools.MARK not in {p.key for p in onnx.load(str(tmp_path / "q.onnx"))
                                   .metadata_props}


def test_outside_a_hook_the_tools_are_orts_own() -> None:
    from onnxruntime.quantization.base_quantizer import BaseQuantizer
    from onnxruntime.quantization.onnx_model import ONNXModel

    before = (BaseQuantizer.__init__, ONNXModel.save_model_to_file)
    with om.hook():
        assert BaseQuantizer.__init__ is not before[0]
    assert (BaseQuantizer.__init__, ONNXModel.save_model_to_file) == before


@pytest.mark.slow
def test_the_launcher_runs_a_script_that_exports_and_quantizes(tmp_path) -> None:
    script = tmp_path / "pipeline.py"
    script.write_text(textwrap.dedent(f"""
        import sys, torch
        from onnxruntime.quantization import quantize_dynamic, QuantType
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_hook_tools import Stack, X
        torch.manual_seed(0)
        torch.onnx.export(Stack().eval(), (X,), "model.onnx", dynamo=True, verbose=False)
        quantize_dynamic("model.onnx", "model.int8.onnx", weight_type=QuantType.QInt8)
        """))
    done = subprocess.run([sys.executable, "-m", "onnx_modular", "hook", "--", str(script)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    functions, ops = _ops(tmp_path / "model.int8.onnx")
    assert functions > 0 and ops["MatMulInteger"] == 7 and ops["DynamicQuantizeLinear"] == 7
    assert "1 file(s) a tool rewrote (quantized, optimized, merged)" in done.stderr
    assert "model.int8.onnx: hierarchical" in done.stderr
