"""``compare`` module by module: each call of b on a's inputs, its own error, the first bad one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import onnx_modular as om
from onnx_modular.lower.translate import quiet_torch_onnx
from tests import models

#: every test exports a model and runs ONNX Runtime sessions (seconds)
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore")]


def flat(model: torch.nn.Module, args: tuple, path: Path) -> Path:
    with quiet_torch_onnx(), torch.no_grad():
        torch.onnx.export(model, args, dynamo=True).save(str(path))
    return path


def changed(proto: onnx.ModelProto, weight: str, delta: float = 0.5) -> onnx.ModelProto:
    """A copy of ``proto`` with ``weight`` moved by ``delta`` (all of it: one row alone
    could be one a ReLU zeroes on these inputs)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for init in copy.graph.initializer:
        if init.name == weight:
            array = numpy_helper.to_array(init).copy()
            array += delta
            init.CopyFrom(numpy_helper.from_array(array, init.name))
            return copy
    raise AssertionError(f"no initializer {weight}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = models.trained(models.Stack(3)).eval()
    return flat(model, (torch.randn(2, 8),), tmp_path_factory.mktemp("stack") / "flat.onnx")


def test_a_changed_weight_names_its_layer_first(stack: Path) -> None:
    """Layer 1's weight moved: its Linear is the first call whose own error leaves
    tolerance; the layer before it is fine, and the layer after it is fine *on its own*
    (it only passes on what it received)."""
    outlined = om.outline(stack).model_proto
    rep = om.compare(outlined, changed(outlined, "layers.1.fc.weight"))
    assert not rep.equivalent and rep.first_mismatch == "layers.1.fc"
    rows = {r.call_id: r for r in rep.modules.rows}
    assert rows["layers.0.fc"].ok and rows["layers.0"].ok
    assert not rows["layers.1.fc"].ok and not rows["layers.1"].ok
    assert rows["layers.2.fc"].ok and rows["layers.2"].ok  # fed a's inputs: no drift
    assert "first diverging module: layers.1.fc" in rep.summary()
    assert rep.to_dict()["first_mismatch"] == "layers.1.fc"


def test_equal_models_have_every_module_ok(stack: Path) -> None:
    rep = om.compare(stack, om.outline(stack).model_proto)
    assert rep.equivalent and rep.first_mismatch is None
    assert rep.modules is not None and all(r.own is not None and r.own.max_abs == 0
                                           for r in rep.modules.rows)


def test_fp32_against_int8_shows_what_each_layer_adds(stack: Path, tmp_path: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantized = tmp_path / "int8.onnx"
    quantize_dynamic(str(stack), str(quantized), weight_type=QuantType.QInt8)
    rep = om.compare(stack, quantized)
    rows = {r.call_id: r for r in rep.modules.rows}
    assert {"layers.0.fc", "layers.1.fc", "layers.2.fc"} <= set(rows)
    for i in range(3):  # every quantized Linear adds an error of its own, the norms none
        assert rows[f"layers.{i}.fc"].own.max_abs > 0
        assert rows[f"layers.{i}.norm"].own.max_abs == 0
    assert rep.first_mismatch in (None, "layers.0.fc")


def test_fp16_calls_are_fed_a_fp32_models_values(tmp_path: Path) -> None:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model, args = models.llama(2)
    source = flat(model, args, tmp_path / "llama.onnx")
    half = convert_float_to_float16(onnx.load(str(source)), keep_io_types=True)
    rep = om.compare(source, half)
    compared = [r for r in rep.modules.rows if r.own is not None]
    assert len(compared) >= len(rep.modules.rows) - 2, [r.note for r in rep.modules.rows]
    assert any(r.call_id == "model.layers.1.mlp" for r in compared)


def test_models_without_labels_get_no_module_table(stack: Path) -> None:
    bare = onnx.load(str(stack))
    for node in bare.graph.node:
        del node.metadata_props[:]
    rep = om.compare(bare, bare)
    assert rep.equivalent and rep.modules is None and rep.first_mismatch is None


def test_the_command_line_prints_the_module_table(stack: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.onnx"
    onnx.save(changed(onnx.load(str(stack)), "layers.2.fc.weight"), str(other))
    report, overlay = tmp_path / "rep.json", tmp_path / "errors.json"
    cli = subprocess.run([sys.executable, "-m", "onnx_modular", "compare", str(stack),
                          str(other), "--report", str(report), "--node-data", str(overlay)],
                         capture_output=True, text=True, check=False)
    assert cli.returncode == 1, cli.stderr
    assert "first diverging module: layers.2.fc" in cli.stdout.replace("\n", " ")
    import json
    assert json.loads(report.read_text())["first_mismatch"] == "layers.2.fc"
    assert np.isfinite(json.loads(report.read_text())["modules"]["rows"][0]["own"]
                       ["max_abs_err"])
    # flat b: the nodes making a call's outputs carry its own error (log10), in Model
    # Explorer's node-data format; the changed layer is the reddest
    (graph,) = json.loads(overlay.read_text()).values()
    values = {name: v["value"] for name, v in graph["results"].items()}
    worst = max(values, key=values.get)
    node = next(n for n in onnx.load(str(other)).graph.node if n.name == worst)
    assert "layers.2" in dict((p.key, p.value) for p in node.metadata_props)[
        "pkg.torch.onnx.name_scopes"]


def test_node_data_of_a_hierarchical_file_sits_on_call_nodes(stack: Path) -> None:
    from onnx_modular.check.module_diff import node_data

    outlined = om.outline(stack).model_proto
    other = changed(outlined, "layers.1.fc.weight")
    rep = om.compare(outlined, other)
    data = node_data(other, rep.modules)
    block = next(v for k, v in data.items() if k.endswith("::Block"))
    assert set(block["results"]) >= {"fc", "norm"}  # the body's call nodes, by name
    main = next(v for k, v in data.items() if not k.startswith("[function]"))
    assert main["results"]["layers.1"]["value"] > main["results"]["layers.0"]["value"]


def test_renamed_edge_tensors_pair_only_where_unambiguous() -> None:
    """A tool renamed ``q``: it pairs with the one value of its kind left; with two left
    of one kind the order of first use (which a tool may change) decides nothing: not
    compared, rather than compared against the wrong tensor and passed."""
    import onnx_ir as ir

    from onnx_modular.check.module_diff import _pair

    def v(name: str, shape: list[int], dtype: ir.DataType = ir.DataType.FLOAT) -> ir.Value:
        return ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(shape))

    p, q, idx = v("p", [2, 3]), v("q", [2, 3]), v("ids", [2], ir.DataType.INT64)
    assert _pair([v("p", [2, 3]), v("q_renamed", [2, 3])], [p, q]) == [p, q]
    assert _pair([v("ids_renamed", [2], ir.DataType.INT64), v("p", [2, 3])],
                 [p, idx]) == [idx, p]
    assert _pair([v("x", [2, 3]), v("y", [2, 3])], [p, q]) is None  # two of a kind
    half = v("p_fp16", [2, 3], ir.DataType.FLOAT16)
    assert _pair([half], [p]) == [p]  # an fp16 model's value for an fp32 one's


class _Attn(torch.nn.Module):
    """Returns its child's output and a value of its own made before the child runs: the
    call and its child end on the same node."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = torch.softmax(x, -1)
        return self.proj(w), w


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.attn, self.fc = _Attn(), torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, w = self.attn(x)
        return self.fc(y) + w


def test_a_child_ending_with_its_parent_is_named_before_it(tmp_path: Path) -> None:
    """``attn.proj``'s weight changed: compare named ``attn`` (listed first, as the two
    calls end on one node) where validate named ``attn.proj``."""
    model, x = _Block().eval(), torch.randn(2, 8)
    om.export(model, (x,)).save(tmp_path / "a.onnx")
    bad = onnx.load(str(tmp_path / "a.onnx"))
    weight = next(t for t in bad.graph.initializer if t.name == "attn.proj.weight")
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * 1.5, weight.name))
    onnx.save(bad, tmp_path / "b.onnx")
    report = om.compare(tmp_path / "a.onnx", tmp_path / "b.onnx", inputs=[x.numpy()])
    assert report.first_mismatch == "attn.proj"
    calls = [row["call_id"] for row in report.to_dict()["modules"]["rows"]]
    assert calls.index("attn.proj") < calls.index("attn")
    validation = om.validate(model, (x,), tmp_path / "b.onnx", localize=True)
    assert validation.first_mismatch == validation.first_own_mismatch == "attn.proj"
