"""``om.outline``: the hierarchy back in a flat torch.onnx export, and in that file after the
tools users run next (ORT's quantizers and optimizers, fp16, slimmers, the version converter).

Every case checks what the user relies on: the outlined file computes what its input did in
ONNX Runtime, holds the same operators (a quantized model stays quantized), and has one
function per layer class.
"""

from __future__ import annotations

import collections
import importlib.util
import logging
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx.inliner
import onnxruntime as ort
import pytest
import torch

import onnx_modular as om
from onnx_modular.diagnostics import OnnxModularError
from onnx_modular.lower.translate import quiet_torch_onnx
from tests import models
from tests.ort_offline import optimize_offline

#: every test here exports or runs a model (seconds): the slow layer
pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.slow]


def flat_export(model: torch.nn.Module, args: tuple, path: Path) -> Path:
    with quiet_torch_onnx(), torch.no_grad():
        torch.onnx.export(model, args, dynamo=True).save(str(path))
    return path


def run(model: str | Path | onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"]).run(
        None, feeds)


def feeds_for(path: Path, args: tuple) -> dict[str, np.ndarray]:
    names = [i.name for i in onnx.load(str(path), load_external_data=False).graph.input]
    return {n: a.numpy() for n, a in zip(names, args)}


def op_counts(proto: onnx.ModelProto) -> collections.Counter[str]:
    flat = onnx.inliner.inline_local_functions(proto) if proto.functions else proto
    return collections.Counter(f"{n.domain}::{n.op_type}" for n in flat.graph.node)


def functions_of(result: om.ExportResult, suffix: str) -> list[om.api.export.FunctionInfo]:
    return [f for f in result.functions if f.module_type.endswith(suffix)]


def check_faithful(source: Path, result: om.ExportResult, feeds: dict[str, np.ndarray]) -> None:
    """Same operators (inlined), same outputs in ORT (to 1e-6), functions present."""
    proto = result.model_proto
    assert result.functions
    assert op_counts(proto) == op_counts(onnx.load(str(source)))
    for want, got in zip(run(source, feeds), run(proto, feeds), strict=True):
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   atol=1e-6, rtol=0)


# ---- a small stack ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def stack_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    args = (torch.randn(2, 8),)
    path = flat_export(models.trained(models.Stack(3)).eval(), args,
                       tmp_path_factory.mktemp("stack") / "flat.onnx")
    return path, feeds_for(path, args)


def test_a_flat_export_outlines_to_one_function_per_class(stack_file: tuple) -> None:
    path, feeds = stack_file
    result = om.outline(path)
    check_faithful(path, result, feeds)
    blocks = functions_of(result, ".Block")
    assert len(blocks) == 1 and blocks[0].calls == ("layers.0", "layers.1", "layers.2")
    assert len(functions_of(result, ".Linear")) == 1
    calls = [n for n in result.model_proto.graph.node if n.domain == blocks[0].domain]
    assert [dict((p.key, p.value) for p in n.metadata_props)["onnx_modular.module_path"]
            for n in calls] == ["layers.0", "layers.1", "layers.2"]


def test_functions_selects_like_export(stack_file: tuple) -> None:
    path, feeds = stack_file
    result = om.outline(path, functions=["Block"])
    check_faithful(path, result, feeds)
    assert [f.module_type.rsplit(".", 1)[-1] for f in result.functions] == ["Block"]


def test_a_selection_matching_no_call_warns(stack_file: tuple) -> None:
    path, _ = stack_file
    result = om.outline(path, functions=["NoSuchBlock"])
    assert not result.functions
    assert any(d.level == om.Level.WARNING and "NoSuchBlock" in d.message
               for d in result.diagnostics)


def test_quantize_dynamic_stays_quantized_and_outlined(stack_file: tuple, tmp_path: Path
                                                       ) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    path, feeds = stack_file
    quantized = tmp_path / "int8.onnx"
    quantize_dynamic(str(path), str(quantized), weight_type=QuantType.QInt8)
    result = om.outline(quantized)
    check_faithful(quantized, result, feeds)
    assert op_counts(result.model_proto)["::MatMulInteger"] == 3
    assert len(functions_of(result, ".Block")) == 1


def test_a_model_without_labels_is_one_clear_error(stack_file: tuple) -> None:
    path, _ = stack_file
    bare = onnx.load(str(path))
    for node in bare.graph.node:
        del node.metadata_props[:]
    with pytest.raises(OnnxModularError, match="carries module labels.*reference="):
        om.outline(bare)


def test_a_file_a_tool_broke_is_named_as_the_cause(stack_file: tuple) -> None:
    """A converter that wrote a float16 value where float32 is read: the error blamed the
    example inputs, which outlining has none of."""
    path, _ = stack_file
    broken = onnx.load(str(path))
    gemm = next(n for n in broken.graph.node if n.op_type == "Gemm")
    cast = onnx.helper.make_node("Cast", [gemm.input[0]], ["as_half"],
                                 to=onnx.TensorProto.FLOAT16)
    cast.metadata_props.extend(gemm.metadata_props)
    gemm.input[0] = "as_half"
    broken.graph.node.insert(list(broken.graph.node).index(gemm), cast)
    with pytest.raises(OnnxModularError) as e:
        om.outline(broken)
    message = str(e.value)
    assert "the outlined" in message and "the tool that wrote it may have broken it" in message
    assert "example inputs" not in message


def test_reference_gives_back_labels_a_tool_dropped(stack_file: tuple) -> None:
    """onnxsim, onnxslim, the version converter and ORT's optimized-model file drop every
    node's metadata but keep tensor names: the file the tool read lends its labels."""
    path, feeds = stack_file
    converted = onnx.version_converter.convert_version(onnx.load(str(path)), 21)
    assert not any(n.metadata_props for n in converted.graph.node)
    result = om.outline(converted, reference=path)
    assert len(functions_of(result, ".Block")) == 1
    for want, got in zip(run(path, feeds), run(result.model_proto, feeds), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


def test_a_hierarchical_file_is_inlined_then_outlined_again(tmp_path: Path) -> None:
    model, args = models.trained(models.Stack(3)).eval(), (torch.randn(2, 8),)
    exported = om.export(model, args)
    path = tmp_path / "hier.onnx"
    exported.save(path)
    result = om.outline(path)
    assert [f.calls for f in result.functions] == [f.calls for f in exported.functions]
    feeds = feeds_for(path, args)
    np.testing.assert_allclose(run(result.model_proto, feeds)[0], run(path, feeds)[0],
                               atol=1e-6, rtol=0)


class _Leaky(torch.nn.Module):
    def __init__(self, eps: float, slope: float) -> None:
        super().__init__()
        self.ln, self.fc, self.slope = torch.nn.LayerNorm(8, eps=eps), torch.nn.Linear(8, 8), slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.nn.functional.leaky_relu(self.fc(self.ln(x)), self.slope)


def test_layers_apart_only_in_float_scalars_outline_to_one_function_as_export(
        tmp_path: Path) -> None:
    """om.export makes layers that differ in LayerNorm eps and a slope one function with
    attributes; outlining the same model's flat file made three."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(_Leaky(e, s) for e, s in
                                  [(1e-5, 0.01), (1e-6, 0.2), (1e-3, 0.1)])).eval()
    args = (torch.randn(2, 8),)
    path = tmp_path / "flat.onnx"
    om.export(model, args, functions="none").save(path)
    result = om.outline(path)
    assert {f.name: len(f.calls) for f in result.functions if f.name.startswith("_Leaky")} \
        == {"_Leaky": 3}
    feeds = feeds_for(path, args)
    np.testing.assert_allclose(run(result.model_proto, feeds)[0], run(path, feeds)[0],
                               atol=1e-6, rtol=0)


@pytest.mark.slow
def test_a_dynamic_flat_file_outlines_to_self_contained_layers(tmp_path: Path) -> None:
    """Outlined as it was, a size torch.export computes once at the root entered every
    layer as an input (StableLM's attention: 2 size inputs); each body computes it from
    its own activations' shapes, as om.export's do."""
    from onnx_modular.check.inspect import input_kinds

    model, args = models.gpt2(2)
    dims = ({0: torch.export.Dim("batch", min=1, max=32),
             1: torch.export.Dim("seq", min=2, max=32)},)
    path = tmp_path / "flat.onnx"
    om.export(model, args, functions="none", dynamic_shapes=dims).save(path)
    result = om.outline(path)
    kinds = input_kinds(result.model_proto)
    assert kinds["GPT2Block"].count("activation") == 2
    assert not [f for f, k in kinds.items() if "size" in k or "unused" in k]
    for ids in (args[0], torch.randint(0, 99, (3, 5))):
        feeds = {"input_ids": ids.numpy()}
        np.testing.assert_allclose(run(result.model_proto, feeds)[0], run(path, feeds)[0],
                                   atol=1e-6, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2", "roberta"])
def test_what_torch_onnx_shares_between_layers_leaves_the_first_one(name: str,
                                                                   tmp_path: Path) -> None:
    """torch.onnx's CSE keeps one copy of what every layer computes from its caller's
    values (Qwen2's ``Unsqueeze`` of the rotary cos and sin) in layer 0, which returned it
    to the later layers: the first layer was a function of its own (Qwen2, RoBERTa,
    NeoX, Phi3 under dynamic shapes). It is the caller's now: one layer function."""
    arch = models.ARCHITECTURES[name]
    model, args = arch(layers=3)
    dims = ({0: torch.export.Dim("batch", min=1, max=32),
             1: torch.export.Dim("seq", min=2, max=32)}, *(None for _ in args[1:]))
    path = tmp_path / "flat.onnx"
    with quiet_torch_onnx(), torch.no_grad():
        torch.onnx.export(model, args, dynamic_shapes=dims, dynamo=True).save(str(path))
    result = om.outline(path)
    layers = [f for f in result.functions if f.module_type.endswith(arch.layer)]
    assert [len(f.calls) for f in layers] == [3]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    for batch, seq in ((2, 8), (3, 5)):
        feeds = {names[0]: torch.randint(0, 99, (batch, seq)).numpy()}
        feeds.update({n: t.numpy() for n, t in zip(names[1:], args[1:])})
        np.testing.assert_allclose(run(result.model_proto, feeds)[0],
                                   session.run(None, feeds)[0], atol=1e-6, rtol=0)


@pytest.mark.slow
def test_sizes_computed_for_a_later_call_leave_no_dead_nodes(tmp_path: Path) -> None:
    """torch.onnx's dynamic RoBERTa shares one shape across layers: a size the caller
    computed for a later layer, which then computed it in its own body, stayed in the
    encoder's body as nodes nobody read."""
    model, args = models.ARCHITECTURES["roberta"](layers=2)
    dims = tuple({0: torch.export.Dim("batch", max=32), 1: torch.export.Dim("seq", max=32)}
                 for _ in args)
    path = tmp_path / "flat.onnx"
    with quiet_torch_onnx(), torch.no_grad():
        torch.onnx.export(model, args, dynamic_shapes=dims, dynamo=True).save(str(path))
    proto = om.outline(path).model_proto

    def dead(graph: onnx.GraphProto | onnx.FunctionProto) -> list[str]:
        read = {name for node in graph.node for name in node.input}
        read |= {o.name if isinstance(o, onnx.ValueInfoProto) else o for o in graph.output}
        return [n.op_type for n in graph.node if not read.intersection(n.output)]

    assert dead(proto.graph) == dead(onnx.load(str(path)).graph)  # the file's own, kept
    assert not {f.name: dead(f) for f in proto.functions if dead(f)}
    for ids in (args[0], torch.randint(0, 99, (3, 5))):
        feeds = {i.name: (ids if n == 0 else torch.ones_like(ids)).numpy()
                 for n, i in enumerate(proto.graph.input)}
        np.testing.assert_allclose(run(proto, feeds)[0], run(path, feeds)[0],
                                   atol=1e-6, rtol=0)


def test_dangling_calls_are_refused_naming_the_call(tmp_path: Path) -> None:
    """onnx.version_converter drops every function and leaves the calls: check_model
    passes, ORT refuses. outline, inspect, validate and compare say so in one line."""
    model, args = models.Stack(2).eval(), (torch.randn(2, 8),)
    converted = onnx.version_converter.convert_version(om.export(model, args).model_proto, 21)
    assert not converted.functions
    path = tmp_path / "dangling.onnx"
    onnx.save(converted, path)
    with pytest.raises(OnnxModularError, match=r"calls a function it does not define: "
                       r"'layers\.0'.*version_converter"):
        om.outline(path)
    with pytest.raises(OnnxModularError, match="calls a function it does not define"):
        om.compare(path, path)
    with pytest.raises(OnnxModularError, match="calls a function it does not define"):
        om.validate(model, args, path)
    cli = subprocess.run([sys.executable, "-m", "onnx_modular", "inspect", str(path)],
                         capture_output=True, text=True, check=False)
    assert cli.returncode == 2 and "Traceback" not in cli.stderr
    assert "calls a function it does not define: 'layers.0'" in cli.stderr


# ---- real architectures after real tools ----------------------------------------------------

def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


class _Reader:
    def __init__(self, feeds: dict[str, np.ndarray]) -> None:
        self.items = iter([feeds])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.items, None)


def _quantize_dynamic(src: Path, dst: Path, feeds: dict) -> Path | None:
    from onnxruntime.quantization import QuantType, quantize_dynamic
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
    return None


def _quantize_static(form: str) -> Callable[[Path, Path, dict], Path | None]:
    def quantize(src: Path, dst: Path, feeds: dict) -> Path | None:
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static
        reader = type("Reader", (_Reader, CalibrationDataReader), {})(feeds)
        quantize_static(str(src), str(dst), reader, quant_format=getattr(QuantFormat, form))
        return None
    return quantize


def _transformers_optimizer(src: Path, dst: Path, feeds: dict) -> Path | None:
    from onnxruntime.transformers import optimizer
    optimizer.optimize_model(str(src), model_type="bert", num_heads=4,
                             hidden_size=32).save_model_to_file(str(dst))
    return src  # where it runs ORT's own optimization first, node metadata is gone


def _fp16_ort(src: Path, dst: Path, feeds: dict) -> Path | None:
    from onnxruntime.transformers.float16 import convert_float_to_float16
    onnx.save(convert_float_to_float16(onnx.load(str(src)), keep_io_types=True), str(dst))
    return None


def _fp16_onnxconverter(src: Path, dst: Path, feeds: dict) -> Path | None:
    from onnxconverter_common import float16
    onnx.save(float16.convert_float_to_float16(onnx.load(str(src)), keep_io_types=True),
              str(dst))
    return None


def _onnxslim(src: Path, dst: Path, feeds: dict) -> Path | None:
    import onnxslim
    onnx.save(onnxslim.slim(onnx.load(str(src))), str(dst))
    return src


def _onnxsim(src: Path, dst: Path, feeds: dict) -> Path | None:
    import onnxsim
    onnx.save(onnxsim.simplify(onnx.load(str(src)))[0], str(dst))
    return src


def _version_converter(src: Path, dst: Path, feeds: dict) -> Path | None:
    onnx.save(onnx.version_converter.convert_version(onnx.load(str(src)), 21), str(dst))
    return src


def _ort_offline(src: Path, dst: Path, feeds: dict) -> Path | None:
    optimize_offline(src, dst)
    return src


#: tool -> (run it: returns the reference its output needs, or None; what must be installed)
TOOLS: dict[str, tuple[Callable[[Path, Path, dict], Path | None], str | None]] = {
    "quantize_dynamic": (_quantize_dynamic, None),
    "quantize_static_qdq": (_quantize_static("QDQ"), None),
    "quantize_static_qoperator": (_quantize_static("QOperator"), None),
    "transformers_optimizer": (_transformers_optimizer, None),
    "fp16_onnxruntime": (_fp16_ort, None),
    "fp16_onnxconverter_common": (_fp16_onnxconverter, "onnxconverter_common"),
    "onnxslim": (_onnxslim, "onnxslim"),
    "onnxsim": (_onnxsim, "onnxsim"),
    "version_converter_21": (_version_converter, None),
    "ort_offline_extended": (_ort_offline, None),
}
#: (layer class, how many layers, tools whose fusions make the first or last layer differ)
ARCHITECTURES = {
    "gpt2": ("GPT2Block", 4, {"transformers_optimizer", "ort_offline_extended"}),
    "llama": ("LlamaDecoderLayer", 4, {"transformers_optimizer"}),
    "bert": ("BertLayer", 4, {"fp16_onnxruntime", "fp16_onnxconverter_common",
                              "quantize_static_qdq"}),
}
#: ONNX Runtime cannot type QLinearConcat (Llama's rotary cat, quantized) inside a local
#: function: the calls holding it stay inlined, with a warning
KEPT_FLAT = {("llama", "quantize_static_qoperator"): "QLinearConcat"}


@pytest.fixture(scope="module")
def flat_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    folder = tmp_path_factory.mktemp("flat")
    files = {}
    for name, (_, layers, _) in ARCHITECTURES.items():
        model, args = getattr(models, name)(layers)
        path = flat_export(model, args, folder / f"{name}.onnx")
        files[name] = (path, feeds_for(path, args))
    return files


@pytest.mark.parametrize("tool", list(TOOLS))
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_after_each_tool_the_layers_share_a_function(arch: str, tool: str, flat_files: dict,
                                                     tmp_path: Path) -> None:
    run_tool, needs = TOOLS[tool]
    if needs is not None and not _has(needs):
        pytest.skip(f"{needs} is not installed")
    layer, layers, edge_layers_differ = ARCHITECTURES[arch]
    source, feeds = flat_files[arch]
    out = tmp_path / f"{tool}.onnx"
    logging.disable(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = run_tool(source, out, feeds)
    logging.disable(logging.NOTSET)
    result = om.outline(out, reference=reference)
    check_faithful(out, result, feeds)
    found = functions_of(result, layer)
    if (arch, tool) in KEPT_FLAT:
        assert not found
        assert any(d.level == om.Level.WARNING and KEPT_FLAT[arch, tool] in d.message
                   for d in result.diagnostics)
        return
    assert sum(len(f.calls) for f in found) == layers
    if tool in edge_layers_differ:  # the tool fused across the first or last layer's edge
        assert len(found) <= 2 and max(len(f.calls) for f in found) >= layers - 1, \
            [(f.calls, f.differs_from) for f in found]
        assert all(f.differs_from for f in found[1:])
    else:
        assert len(found) == 1, [(f.calls, f.differs_from) for f in found]


def test_a_flat_gpt2_outlines_to_the_functions_om_export_makes(flat_files: dict) -> None:
    model, args = models.gpt2(4)
    exported = om.export(model, args)
    outlined = om.outline(flat_files["gpt2"][0])
    assert [(f.name, f.calls) for f in outlined.functions] == \
        [(f.name, f.calls) for f in exported.functions]


def test_the_command_line_writes_the_outlined_file(flat_files: dict, tmp_path: Path) -> None:
    source, feeds = flat_files["gpt2"]
    converted = tmp_path / "opset21.onnx"
    _version_converter(source, converted, feeds)
    out = tmp_path / "out.onnx"
    cli = [sys.executable, "-m", "onnx_modular", "outline", str(converted), "-o", str(out)]
    refused = subprocess.run(cli, capture_output=True, text=True, check=False)
    assert refused.returncode == 2 and "--reference" in refused.stderr
    assert not out.exists()
    done = subprocess.run([*cli, "--reference", str(source)], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "functions" in done.stdout
    inspected = subprocess.run([sys.executable, "-m", "onnx_modular", "inspect", str(out)],
                               capture_output=True, text=True, check=False)
    assert "GPT2Block" in inspected.stdout


def test_external_data_is_read_and_written(flat_files: dict, tmp_path: Path) -> None:
    source, feeds = flat_files["gpt2"]
    external = tmp_path / "in" / "model.onnx"
    external.parent.mkdir()
    onnx.save(onnx.load(str(source)), str(external), save_as_external_data=True,
              location="model.data", size_threshold=0)
    result = om.outline(external)
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    result.save(out, external_data_threshold=0)
    assert (out.parent / "model.onnx.data").exists() or any(out.parent.glob("*.data"))
    np.testing.assert_allclose(run(out, feeds)[0], run(source, feeds)[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("tool", ["onnxslim", "onnxsim"])
def test_a_hierarchical_file_a_slimmer_stripped_of_labels_outlines_again(tool: str,
                                                                         tmp_path: Path) -> None:
    """onnxslim and onnxsim keep the functions but strip the call labels (onnxslim: the
    functions' too): the call names and the functions' classes are enough to restore them."""
    if not _has(tool):
        pytest.skip(f"{tool} is not installed")
    model, args = models.gpt2(2)
    exported = om.export(model, args)
    source, out = tmp_path / "hier.onnx", tmp_path / "slim.onnx"
    exported.save(source)
    TOOLS[tool][0](source, out, {})
    assert not any(p.key.startswith("onnx_modular.") for n in onnx.load(str(out)).graph.node
                   for p in n.metadata_props)
    result = om.outline(out)
    assert [(f.name, f.calls) for f in result.functions] == \
        [(f.name, f.calls) for f in exported.functions]
    feeds = feeds_for(source, args)
    np.testing.assert_allclose(run(result.model_proto, feeds)[0], run(out, feeds)[0],
                               atol=1e-6, rtol=0)
