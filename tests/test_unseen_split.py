"""Acc/CPU split and pipeline stages on architectures the other split tests do not use.

OPT, GPT-NeoX, Falcon, DeBERTa-v2, ViT, CLIP vision, Mixtral (``batched_mm`` experts) and a
conv net with dict outputs, from tiny random configs (nothing downloaded); plus the defects
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
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.utils._pytree as pytree
from test_stages import used_weight_bytes
from torch import nn

import onnx_modular as om
from onnx_modular.diagnostics import OnnxModularError
from onnx_modular.metadata import fx_name
from onnx_modular.support.operator_support import node_op_names

DENY = ["aten.softmax", "aten._softmax", "aten.gelu", "aten.native_layer_norm"]

# ---- models ----------------------------------------------------------------------------------


class HF(nn.Module):
    """A transformers model called with one tensor keyword; returns its output dict."""

    def __init__(self, model: nn.Module, key: str = "input_ids", **kwargs: object) -> None:
        super().__init__()
        self.model, self.key, self.kwargs = model, key, kwargs

    def forward(self, x: torch.Tensor) -> object:
        return self.model(**{self.key: x}, return_dict=True, **self.kwargs)


def _ids() -> tuple[torch.Tensor]:
    return (torch.randint(0, 99, (2, 8), generator=torch.Generator().manual_seed(0)),)


def _pixels() -> tuple[torch.Tensor]:
    return (torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)),)


def opt(layers: int = 1) -> tuple[nn.Module, tuple]:
    from transformers import OPTConfig, OPTModel

    torch.manual_seed(0)
    cfg = OPTConfig(num_hidden_layers=layers, hidden_size=32, ffn_dim=64, num_attention_heads=4,
                    vocab_size=99, max_position_embeddings=64, word_embed_proj_dim=32,
                    use_cache=False, attn_implementation="eager")
    return HF(OPTModel(cfg).eval(), use_cache=False).eval(), _ids()


def neox(layers: int = 1) -> tuple[nn.Module, tuple]:
    from transformers import GPTNeoXConfig, GPTNeoXModel

    torch.manual_seed(0)
    cfg = GPTNeoXConfig(num_hidden_layers=layers, hidden_size=32, intermediate_size=64,
                        num_attention_heads=4, vocab_size=99, max_position_embeddings=64,
                        use_cache=False, attn_implementation="eager")
    return HF(GPTNeoXModel(cfg).eval(), use_cache=False).eval(), _ids()


def falcon(layers: int = 1) -> tuple[nn.Module, tuple]:
    from transformers import FalconConfig, FalconModel

    torch.manual_seed(0)
    cfg = FalconConfig(num_hidden_layers=layers, hidden_size=32, num_attention_heads=4,
                       vocab_size=99, use_cache=False, attn_implementation="eager",
                       new_decoder_architecture=False, multi_query=True, alibi=False)
    return HF(FalconModel(cfg).eval(), use_cache=False).eval(), _ids()


def deberta_v2(layers: int = 1) -> tuple[nn.Module, tuple]:
    from transformers import DebertaV2Config, DebertaV2Model

    torch.manual_seed(0)
    cfg = DebertaV2Config(num_hidden_layers=layers, hidden_size=32, intermediate_size=64,
                          num_attention_heads=4, vocab_size=99, max_position_embeddings=64,
                          relative_attention=True, position_buckets=16,
                          pos_att_type=["p2c", "c2p"])
    return HF(DebertaV2Model(cfg).eval()).eval(), _ids()


def _vision(config: str, model: str, layers: int) -> tuple[nn.Module, tuple]:
    """A tiny vision transformer (32x32 images, patches of 8) called with pixel_values."""
    import transformers

    torch.manual_seed(0)
    cfg = getattr(transformers, config)(num_hidden_layers=layers, hidden_size=32,
                                        intermediate_size=64, num_attention_heads=4,
                                        image_size=32, patch_size=8,
                                        attn_implementation="eager")
    return HF(getattr(transformers, model)(cfg).eval(), "pixel_values").eval(), _pixels()


def vit(layers: int = 1) -> tuple[nn.Module, tuple]:
    return _vision("ViTConfig", "ViTModel", layers)


def clip_vision(layers: int = 1) -> tuple[nn.Module, tuple]:
    return _vision("CLIPVisionConfig", "CLIPVisionModel", layers)


def mixtral(layers: int = 1) -> tuple[nn.Module, tuple]:
    from transformers import MixtralConfig, MixtralModel

    torch.manual_seed(0)
    cfg = MixtralConfig(num_hidden_layers=layers, hidden_size=32, intermediate_size=64,
                        num_attention_heads=4, num_key_value_heads=2, vocab_size=99,
                        num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
                        use_cache=False, attn_implementation="eager",
                        experts_implementation="batched_mm")
    return HF(MixtralModel(cfg).eval(), use_cache=False).eval(), _ids()


class ConvNet(nn.Module):
    """Conv/BN/GELU residual blocks and a dict output (softmax probabilities, features)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.GELU())
            for _ in range(3))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.stem(x)
        for block in self.blocks:
            x = x + block(x)
        feat = self.pool(x).flatten(1)
        return {"probs": self.head(feat).softmax(-1), "feat": feat}


def convnet(layers: int = 1) -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return ConvNet().eval(), (torch.randn(2, 3, 16, 16, generator=g),)


ARCHS: dict[str, Callable[..., tuple[nn.Module, tuple]]] = {
    "opt": opt, "gpt_neox": neox, "falcon": falcon, "deberta_v2": deberta_v2, "vit": vit,
    "clip_vision": clip_vision, "mixtral": mixtral, "convnet": convnet,
}

# ---- helpers ---------------------------------------------------------------------------------


def tensors(tree: object) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def close(got: object, expected: object, tol: float = 1e-4) -> None:
    """Same pytree structure (dicts, model output classes as dicts) and values within tol."""
    exp = tensors(expected)
    got_leaves = [x for x in pytree.tree_leaves(got) if x is not None]
    assert len(got_leaves) == len(exp)
    for g, e in zip(got_leaves, exp):
        torch.testing.assert_close(torch.as_tensor(np.asarray(g)), e.detach(), rtol=tol,
                                   atol=tol)


def check_regions(result: om.SplitResult, denied: set[str]) -> None:
    """Alternating, non-empty regions; no denied FX op in an acc region or its ONNX model."""
    regions = result.regions
    assert any(r.is_acc for r in regions) and any(not r.is_acc for r in regions)
    for a, b in itertools.pairwise(regions):
        assert a.is_acc != b.is_acc
    fx = {n.name: n for n in result._source.graph.nodes}
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


def single_outputs(path: object, args: tuple) -> list[np.ndarray]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: a.numpy() for i, a in zip(sess.get_inputs(), tensors(args))})


# ---- the new architectures -------------------------------------------------------------------


@pytest.mark.parametrize("arch", list(ARCHS))
def test_deny_split_runs_on_unseen_architecture(arch: str, tmp_path) -> None:
    model, args = ARCHS[arch]()
    with torch.no_grad():
        expected = model(*args)
    result = om.split(model, args, support={"deny": DENY})
    check_regions(result, set(DENY))
    result.save(tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert [r["name"] for r in manifest["regions"]] == [r.name for r in result.regions]
    close(om.SplitRunner(tmp_path).run(*args), expected)
    result.save_single(tmp_path / "single.onnx")
    close(single_outputs(tmp_path / "single.onnx", args), expected)


def test_ort_cpu_support_gives_one_acc_region_on_conv_net() -> None:
    model, args = convnet()
    result = om.split(model, args, support="ort:CPUExecutionProvider")
    assert [r.is_acc for r in result.regions] == [True]


def test_min_acc_size_and_max_acc_splits_on_conv_net() -> None:
    model, args = convnet()
    # softmax and GELU on CPU: acc regions of conv/BN/add between them
    small = om.split(model, args, support={"deny": DENY}, min_acc_module_size=1)
    sizes = [len(r.node_names) for r in small.regions if r.is_acc]
    merged = om.split(model, args, support={"deny": DENY}, min_acc_module_size=max(sizes) + 1)
    assert [r.is_acc for r in merged.regions] == [False]
    with pytest.raises(OnnxModularError, match=rf"needs {len(small.regions)} regions.*"
                       r"max_acc_splits=2"):
        om.split(model, args, support={"deny": DENY}, max_acc_splits=2)


STAGE_CASES = {
    "falcon": (falcon, {"model.h.1": "beginning"}, 2),
    "deberta_v2": (deberta_v2, {"model.encoder.layer.1": "beginning"}, 2),
    "convnet": (convnet, {"blocks.1": "beginning", "head": "beginning"}, 3),
}


@pytest.mark.parametrize("arch", list(STAGE_CASES))
def test_stages_on_unseen_architecture(arch: str, tmp_path) -> None:
    build, points, count = STAGE_CASES[arch]
    model, args = build(2)
    with torch.no_grad():
        expected = model(*args)
    result = om.split_stages(model, args, split_points=points)
    assert len(result.stages) == count
    result.save(tmp_path)
    close(om.SplitRunner(tmp_path).run(*args), expected)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    copies = sum(e["bytes"] * (len(e["stages"]) - 1)
                 for e in manifest["shared_parameters"].values())
    stage_bytes = sum(r["parameter_bytes"] for r in manifest["regions"])
    assert stage_bytes - copies == used_weight_bytes(result.program)
    if arch == "deberta_v2":  # every layer reads the relative position embeddings
        assert manifest["shared_parameters"]["model.encoder.rel_embeddings.weight"]["stages"] \
            == ["stage_0", "stage_1"]


def test_split_point_errors_name_the_module() -> None:
    model, args = convnet()
    with pytest.raises(OnnxModularError, match=r"'blocks\.9' names no module.*'blocks\.2'"):
        om.split_stages(model, args, split_points={"blocks.9": "beginning"})
    model.unused = nn.Linear(2, 2)
    with pytest.raises(OnnxModularError, match=r"'unused': the module never runs"):
        om.split_stages(model, args, split_points={"unused": "end"})


# ---- defects found on the way (regressions) ----------------------------------------------------


class Keywords(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, *, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (self.fc(x) * a).softmax(-1) - b


def test_runner_matches_keyword_inputs_by_name(tmp_path) -> None:
    """run(x, b=, a=) used to bind b to a's input (inputs matched by position): wrong output."""
    model = Keywords().eval()
    x, a, b = torch.randn(2, 4), torch.randn(4), torch.randn(4) * 10
    result = om.split(model, (x,), kwargs={"a": a, "b": b}, support={"deny": DENY})
    result.save(tmp_path)
    runner = om.SplitRunner(tmp_path)
    close(runner.run(x, b=b, a=a), model(x, a=a, b=b))
    with pytest.raises(OnnxModularError, match="keyword input.*a, b; got a, c"):
        runner.run(x, a=a, c=b)


class PassThrough(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, self.fc(x).softmax(-1)


def test_model_input_returned_as_output(tmp_path) -> None:
    """Used to fail in save(): "model output 'x' is not computed by any region"."""
    model = PassThrough().eval()
    args = (torch.randn(2, 4),)
    result = om.split(model, args, support={"deny": DENY})
    result.save(tmp_path)
    close(om.SplitRunner(tmp_path).run(*args), model(*args))
    result.save_single(tmp_path / "single.onnx")
    close(single_outputs(tmp_path / "single.onnx", args), model(*args))


class TwoLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.nn.functional.layer_norm(self.a(x), (4,)).softmax(-1))


def test_split_under_hook_is_unaffected(tmp_path) -> None:
    """Under om.hook() torch.onnx.export returns outlined models; the split used it and wrote
    region models ONNX Runtime refused ("the graph is not acyclic")."""
    model, args = TwoLinear().eval(), (torch.randn(2, 4),)
    with om.hook(functions="all"):
        result = om.split(model, args, support={"deny": DENY})
        result.save(tmp_path)
    assert [r.is_acc for r in result.regions] == [True, False, True]
    close(om.SplitRunner(tmp_path).run(*args), model(*args))


def test_opset_below_18_is_refused() -> None:
    """At opset 17 torch.onnx drops each node's FX origin: every ONNX node, the denied
    Softmax included, silently landed in the first acc region."""
    model, args = TwoLinear().eval(), (torch.randn(2, 4),)
    with pytest.raises(OnnxModularError,
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
    with pytest.raises(OnnxModularError) as info:
        om.split(Mystery(), (torch.randn(2, 4),), support={"deny": DENY})
    message = str(info.value)
    assert "\x1b" not in message and "\n" not in message
    assert "node 'mystery'" in message and "No ONNX function found" in message
