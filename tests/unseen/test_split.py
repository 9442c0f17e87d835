"""Acc/CPU split and pipeline stages on architectures the other split tests do not use.

OPT, GPT-NeoX, Falcon, DeBERTa-v2, ViT, CLIP vision, Mixtral (``batched_mm`` experts) and a
conv net with dict outputs, from the registry (models.py), whole outputs; plus the defects
these runs found (regressions): keyword inputs in another order, a model input returned as
is, ``om.split`` under ``om.hook()``, opsets below 18, and translation failures.

Left out: the T5 encoder (torch.onnx's decomposition fails on a ``view`` of a transposed
tensor) and Mixtral with its default ``grouped_mm`` experts (no ONNX translation for
``transformers.grouped_mm_fallback``); with ``experts_implementation="eager"`` torch.export
fails on a data-dependent guard.
"""

from __future__ import annotations

import itertools
import json

import models
import pytest
import torch
from models import used_weight_bytes
from torch import nn

import onnx_modular as om
from onnx_modular.leaves.metadata import fx_name
from onnx_modular.support.operator_support import node_op_names

pytestmark = pytest.mark.slow  # whole models: the full suite, not the inner loop

DENY = ["aten.softmax", "aten._softmax", "aten.gelu", "aten.native_layer_norm"]

# ---- models ----------------------------------------------------------------------------------

ARCHS = ["opt", "gpt_neox", "falcon", "deberta_v2", "vit", "clip_vision", "mixtral", "convnet"]


def build(arch: str, layers: int = 1) -> tuple[nn.Module, tuple]:
    """A registry model with its whole output (a dict); transformers ones with ``layers``."""
    if "transformers" in models.ARCHITECTURES[arch].tags:
        return models.ARCHITECTURES[arch](layers=layers, full_output=True)
    return models.ARCHITECTURES[arch]()


# ---- helpers ---------------------------------------------------------------------------------


def check_regions(result: om.SplitResult, denied: set[str]) -> None:
    """Alternating, non-empty regions; no denied FX op in an acc region or its ONNX model."""
    regions = result.regions
    assert any(r.is_acc for r in regions) and any(not r.is_acc for r in regions)
    for a, b in itertools.pairwise(regions):
        assert a.is_acc != b.is_acc
    fx = {n.name: n for n in result.program.module().graph.nodes}
    for r in regions:
        assert r.node_names, f"{r.name} is empty"
        if r.is_acc:
            assert not [n for n in r.node_names if denied & set(node_op_names(fx[n]))]
    for rg in result.region_graphs():
        assert rg.model.graph.num_nodes() > 0, f"{rg.name} has no ONNX node"
        if not rg.is_acc:
            continue
        calls = {(f.domain, f.name) for f in rg.model.functions.values()}
        for g in [rg.model.graph, *(f.graph for f in rg.model.functions.values())]:
            for node in g:
                if (node.domain, node.op_type) in calls:
                    continue
                origin = fx_name(node)
                if origin in fx:
                    assert not denied & set(node_op_names(fx[origin])), \
                        f"{rg.name} holds {origin} ({node.op_type})"


# ---- the new architectures -------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_deny_split_runs_on_unseen_architecture(arch: str, tmp_path, ort_outputs,
                                                assert_close) -> None:
    model, args = build(arch)
    with torch.no_grad():
        expected = model(*args)
    result = om.split(model, args, support={"deny": DENY})
    check_regions(result, set(DENY))
    result.save(tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert [r["name"] for r in manifest["regions"]] == [r.name for r in result.regions]
    assert_close(om.SplitRunner(tmp_path).run(*args), expected)
    result.save_single(tmp_path / "single.onnx")
    assert_close(ort_outputs(tmp_path / "single.onnx", args), expected)


def test_ort_cpu_support_gives_one_acc_region_on_conv_net() -> None:
    model, args = models.convnet()
    result = om.split(model, args, support="ort:CPUExecutionProvider")
    assert [r.is_acc for r in result.regions] == [True]


def test_min_acc_size_and_max_acc_splits_on_conv_net() -> None:
    model, args = models.convnet()
    # softmax and GELU on CPU: acc regions of conv/BN/add between them
    small = om.split(model, args, support={"deny": DENY}, min_acc_module_size=1)
    sizes = [len(r.node_names) for r in small.regions if r.is_acc]
    merged = om.split(model, args, support={"deny": DENY}, min_acc_module_size=max(sizes) + 1)
    assert [r.is_acc for r in merged.regions] == [False]
    with pytest.raises(om.OnnxModularError, match=rf"needs {len(small.regions)} regions.*"
                       r"max_acc_splits=2"):
        om.split(model, args, support={"deny": DENY}, max_acc_splits=2)


STAGE_CASES = {  # name -> split points, stage count
    "falcon": ({"model.h.1": "beginning"}, 2),
    "deberta_v2": ({"model.encoder.layer.1": "beginning"}, 2),
    "convnet": ({"blocks.1": "beginning", "head": "beginning"}, 3),
}


@pytest.mark.parametrize("arch", list(STAGE_CASES))
def test_stages_on_unseen_architecture(arch: str, tmp_path, assert_close) -> None:
    points, count = STAGE_CASES[arch]
    model, args = build(arch, layers=2)
    with torch.no_grad():
        expected = model(*args)
    result = om.split_stages(model, args, split_points=points)
    assert len(result.stages) == count
    result.save(tmp_path)
    assert_close(om.SplitRunner(tmp_path).run(*args), expected)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    copies = sum(e["bytes"] * (len(e["stages"]) - 1)
                 for e in manifest["shared_parameters"].values())
    stage_bytes = sum(r["parameter_bytes"] for r in manifest["regions"])
    assert stage_bytes - copies == used_weight_bytes(result.program)
    if arch == "deberta_v2":  # every layer reads the relative position embeddings
        assert manifest["shared_parameters"]["model.encoder.rel_embeddings.weight"]["stages"] \
            == ["stage_0", "stage_1"]


def test_split_point_errors_name_the_module() -> None:
    model, args = models.convnet()
    with pytest.raises(om.OnnxModularError, match=r"'blocks\.9' names no module.*'blocks\.2'"):
        om.split_stages(model, args, split_points={"blocks.9": "beginning"})
    model.unused = nn.Linear(2, 2)
    with pytest.raises(om.OnnxModularError, match=r"'unused': the module never runs"):
        om.split_stages(model, args, split_points={"unused": "end"})


# ---- defects found on the way (regressions) ----------------------------------------------------


class Keywords(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, *, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (self.fc(x) * a).softmax(-1) - b


def test_runner_matches_keyword_inputs_by_name(tmp_path, assert_close) -> None:
    """run(x, b=, a=) used to bind b to a's input (inputs matched by position): wrong output."""
    model = Keywords().eval()
    x, a, b = torch.randn(2, 4), torch.randn(4), torch.randn(4) * 10
    result = om.split(model, (x,), kwargs={"a": a, "b": b}, support={"deny": DENY})
    result.save(tmp_path)
    runner = om.SplitRunner(tmp_path)
    assert_close(runner.run(x, b=b, a=a), model(x, a=a, b=b))
    with pytest.raises(om.OnnxModularError, match="keyword input.*a, b; got a, c"):
        runner.run(x, a=a, c=b)


class PassThrough(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, self.fc(x).softmax(-1)


def test_model_input_returned_as_output(tmp_path, ort_outputs, assert_close) -> None:
    """Used to fail in save(): "model output 'x' is not computed by any region"."""
    model = PassThrough().eval()
    args = (torch.randn(2, 4),)
    result = om.split(model, args, support={"deny": DENY})
    result.save(tmp_path)
    assert_close(om.SplitRunner(tmp_path).run(*args), model(*args))
    result.save_single(tmp_path / "single.onnx")
    assert_close(ort_outputs(tmp_path / "single.onnx", args), model(*args))


class TwoLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.nn.functional.layer_norm(self.a(x), (4,)).softmax(-1))


def test_split_under_hook_is_unaffected(tmp_path, assert_close) -> None:
    """Under om.hook() torch.onnx.export returns outlined models; the split used it and wrote
    region models ONNX Runtime refused ("the graph is not acyclic")."""
    model, args = TwoLinear().eval(), (torch.randn(2, 4),)
    with om.hook(functions="all"):
        result = om.split(model, args, support={"deny": DENY})
        result.save(tmp_path)
    assert [r.is_acc for r in result.regions] == [True, False, True]
    assert_close(om.SplitRunner(tmp_path).run(*args), model(*args))


def test_opset_below_18_is_refused() -> None:
    """At opset 17 torch.onnx drops each node's FX origin: every ONNX node, the denied
    Softmax included, silently landed in the first acc region."""
    model, args = TwoLinear().eval(), (torch.randn(2, 4),)
    with pytest.raises(om.OnnxModularError,
                       match="opset 17 is below 18, the lowest a split model.*>= 18"):
        om.split(model, args, support={"deny": DENY}, opset=17)
    result = om.split(model, args, support={"deny": DENY}, opset=18)
    check_regions(result, set(DENY))


@torch.library.custom_op("om_unseen_split::mystery", mutates_args=())
def _mystery(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@_mystery.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class Mystery(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.om_unseen_split.mystery(x.relu()).softmax(-1)


def test_translation_failure_names_node_and_cause() -> None:
    """Used to say only "Failed to convert the exported program ... This is step 3/3" (with
    terminal colour codes), naming neither the node nor the reason."""
    with pytest.raises(om.OnnxModularError) as info:
        om.split(Mystery(), (torch.randn(2, 4),), support={"deny": DENY})
    message = str(info.value)
    assert "\x1b" not in message and "\n" not in message
    assert "node 'mystery'" in message and "No ONNX function found" in message
