"""Canonical function prototypes: structurally equal module calls share one function on every
architecture (CNNs, diffusion transformers, dynamic shapes, ignored outputs), and every
function of a class beyond the first says why it stayed apart.

The number of distinct bodies is computed here independently of the exporter: each function
is keyed with the keys of the functions it calls expanded in place (names ignored), so two
functions with one key would be one prototype missed.
"""

from __future__ import annotations

import collections
import hashlib

import models
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

import onnx_modular as om
from onnx_modular.leaves.metadata import DIFFERS_FROM, NO_MODULE

# ---- CNN blocks written as torchvision writes them -------------------------------------------


def conv_bn(cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class Fire(nn.Module):
    def __init__(self, cin: int, squeeze: int, expand: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(cin, squeeze, 1)
        self.expand1x1 = nn.Conv2d(squeeze, expand, 1)
        self.expand3x3 = nn.Conv2d(squeeze, expand, 3, padding=1)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.squeeze(x))
        return torch.cat([self.act(self.expand1x1(x)), self.act(self.expand3x3(x))], 1)


class SqueezeNet(nn.Module):
    """Four Fire modules at two resolutions (SqueezeNet's layout, small)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, 2, 1)
        self.features = nn.Sequential(Fire(16, 4, 8), Fire(16, 4, 8), nn.MaxPool2d(2),
                                      Fire(16, 4, 8), Fire(16, 4, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(self.stem(x)).mean((2, 3))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class ResNet(nn.Module):
    """Three stages of two BasicBlocks; stages 2 and 3 start with a strided downsample."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = conv_bn(3, 8)
        self.layer1 = nn.Sequential(BasicBlock(8, 8), BasicBlock(8, 8))
        self.layer2 = nn.Sequential(BasicBlock(8, 16, 2), BasicBlock(16, 16))
        self.layer3 = nn.Sequential(BasicBlock(16, 32, 2), BasicBlock(32, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer3(self.layer2(self.layer1(self.stem(x)))).mean((2, 3))


class DenseLayer(nn.Module):
    def __init__(self, cin: int, growth: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(cin)
        self.conv = nn.Conv2d(cin, growth, 3, padding=1, bias=False)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        return self.conv(torch.relu(self.norm(torch.cat(features, 1))))


class DenseNet(nn.Module):
    def __init__(self, layers: int = 4, growth: int = 4) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.layers = nn.ModuleList(DenseLayer(8 + i * growth, growth) for i in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [self.stem(x)]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, 1).mean((2, 3))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int = 4) -> None:
        super().__init__()
        hidden = cin * expand
        self.use_residual = stride == 1 and cin == cout
        self.conv = nn.Sequential(conv_bn(cin, hidden, 1), conv_bn(hidden, hidden, 3, stride,
                                                                    groups=hidden),
                                  nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return x + y if self.use_residual else y


class MobileNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(conv_bn(3, 8, 3, 2), InvertedResidual(8, 8, 1),
                                      InvertedResidual(8, 8, 1), InvertedResidual(8, 16, 2),
                                      InvertedResidual(16, 16, 1), InvertedResidual(16, 16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x).mean((2, 3))


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.pwconv2(self.act(self.pwconv1(self.norm(y)))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 4, 4)
        self.stage1 = nn.Sequential(ConvNeXtBlock(16), ConvNeXtBlock(16))
        self.down = nn.Conv2d(16, 32, 2, 2)
        self.stage2 = nn.Sequential(ConvNeXtBlock(32), ConvNeXtBlock(32), ConvNeXtBlock(32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stage2(self.down(self.stage1(self.stem(x)))).mean((2, 3))


CNNS = {"squeezenet": SqueezeNet, "resnet": ResNet, "densenet": DenseNet,
        "mobilenet": MobileNet, "convnext": ConvNeXt}


# ---- the independent count --------------------------------------------------------------------

def _attribute_key(attr: onnx.AttributeProto) -> object:
    if attr.ref_attr_name:  # a parametrized body: the value is the call's
        return ("ref", attr.ref_attr_name)
    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, onnx.TensorProto):
        return hashlib.sha1(value.SerializeToString()).hexdigest()
    if isinstance(value, bytes):
        return value
    return repr(value)


def expanded_keys(proto: onnx.ModelProto) -> dict[tuple[str, str], str]:
    """Function -> a key of its body with every call replaced by the callee's key."""
    functions = {(f.domain, f.name): f for f in proto.functions}
    keys: dict[tuple[str, str], str] = {}

    def key(identifier: tuple[str, str]) -> str:
        if identifier not in keys:
            function = functions[identifier]
            token = {name: f"in{i}" for i, name in enumerate(function.input)}
            parts = []
            for k, node in enumerate(function.node):
                callee = (node.domain, node.op_type)
                op = key(callee) if callee in functions else f"{node.domain}::{node.op_type}"
                attrs = sorted((a.name, _attribute_key(a)) for a in node.attribute)
                parts.append((op, [token.get(i, "?") for i in node.input], attrs))
                for j, out in enumerate(node.output):
                    token[out] = f"n{k}.{j}"
            parts.append([token.get(o, "?") for o in function.output])
            keys[identifier] = hashlib.sha1(repr(parts).encode()).hexdigest()
        return keys[identifier]

    for identifier in functions:
        key(identifier)
    return keys


def check_prototypes(result: om.ExportResult) -> None:
    """No two functions of one class are one prototype; every extra function of a class
    says why it stayed apart."""
    proto = result.model_proto
    keys = expanded_keys(proto)
    classes = {(f.domain, f.name): f.doc_string for f in proto.functions}
    twins = [names for names in _groups(keys, classes).values() if len(names) > 1]
    assert not twins, f"functions with equal bodies: {twins}"
    seen: set[tuple[str, str]] = set()
    for function in proto.functions:
        meta = {p.key: p.value for p in function.metadata_props}
        cls = (function.domain, function.doc_string)
        assert (DIFFERS_FROM in meta) == (cls in seen), function.name
        seen.add(cls)
        assert function.name != NO_MODULE


def assert_bodies_name_no_call(result: om.ExportResult) -> None:
    """No string inside a function (names, metadata, attributes) names the module path of a
    call of it: a shared body must read the same for every call."""
    paths_of: dict[str, set[str]] = collections.defaultdict(set)
    for call_id, name in result.report.function_of_call.items():
        paths_of[name].add(call_id.split("@")[0].split("#")[0])
    for function in result.model_proto.functions:
        strings = [function.name, *function.input, *function.output]
        for node in function.node:
            strings += [node.name, *node.input, *node.output]
            strings += [p.value for p in node.metadata_props if "stack_trace" not in p.key]
            strings += [a.s.decode() for a in node.attribute if a.s]
        strings += [p.value for p in function.metadata_props]
        for path in paths_of[function.name]:
            named = [text for text in strings if path and _names(text, path)]
            assert not named, f"{function.name} names its call '{path}': {named[:3]}"


def _names(text: str, path: str) -> bool:
    """Does ``text`` hold ``path`` as a whole dotted path (not a part of a longer name)?"""
    start = text.find(path)
    while start != -1:
        end = start + len(path)
        before = text[start - 1] if start else " "
        after = text[end] if end < len(text) else " "
        if not (before.isalnum() or before in "._") and not (after.isalnum() or after == "_"):
            return True
        start = text.find(path, start + 1)
    return False


def _groups(keys: dict[tuple[str, str], str],
            classes: dict[tuple[str, str], str]) -> dict[tuple[str, str], list[str]]:
    groups: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for identifier, key in keys.items():
        groups[(classes[identifier], key)].append(identifier[1])
    return groups


def calls_of(result: om.ExportResult, cls: str) -> collections.Counter[str]:
    """Function name -> number of calls, for calls of one class."""
    return collections.Counter(
        name for call, name in result.report.function_of_call.items()
        if any(f.name == name and f.doc_string.endswith("." + cls)
               for f in result.model.functions.values()))


# ---- tests ------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", list(CNNS))
def test_cnn_blocks_share_prototypes(name: str) -> None:
    torch.manual_seed(0)
    model = CNNS[name]().eval()
    args = (torch.randn(1, 3, 32, 32),)
    result = om.export(model, args)
    check_prototypes(result)
    assert_bodies_name_no_call(result)
    assert om.validate(model, args, result, providers="cpu").ok
    flat = om.export(model, args, functions="none")
    assert not flat.model.functions
    assert om.validate(model, args, flat, providers="cpu").ok


@pytest.mark.slow
def test_fire_modules_at_two_resolutions_are_one_function() -> None:
    torch.manual_seed(0)
    result = om.export(SqueezeNet().eval(), (torch.randn(1, 3, 32, 32),))
    assert calls_of(result, "Fire") == {"Fire": 4}


@pytest.mark.slow
def test_resnet_blocks_share_by_structure_and_the_rest_is_explained() -> None:
    torch.manual_seed(0)
    result = om.export(ResNet().eval(), (torch.randn(1, 3, 32, 32),))
    # plain blocks of every stage share one function; the two strided ones another
    assert calls_of(result, "BasicBlock") == {"BasicBlock": 4, "BasicBlock_1": 2}
    why = {f.name: f.differs_from for f in result.functions}
    assert why["BasicBlock_1"].startswith("BasicBlock: ")
    assert "Sequential" in why["BasicBlock_1"]  # the downsample branch


class Attention(nn.Module):
    """torchvision's ViT encoder block: MultiheadAttention, batch size read from the input."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.self_attention = nn.MultiheadAttention(dim, 2, batch_first=True)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln_1(x)
        x = x + self.self_attention(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class ViT(nn.Module):
    def __init__(self, layers: int = 4, dim: int = 16) -> None:
        super().__init__()
        self.proj = nn.Linear(12, dim)
        self.layers = nn.Sequential(*(Attention(dim) for _ in range(layers)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(self.proj(x))


@pytest.mark.slow
def test_dynamic_batch_and_sequence_keep_one_block_function() -> None:
    from onnx_modular.examples import TinyGPT, tiny_gpt_inputs

    torch.manual_seed(0)
    batch, seq = torch.export.Dim("batch", min=1, max=16), torch.export.Dim("seq", min=2,
                                                                            max=16)
    vit = ViT().eval()
    x = torch.randn(2, 6, 12)
    result = om.export(vit, (x,), dynamic_shapes=({0: batch, 1: seq},))
    check_prototypes(result)
    assert calls_of(result, "Attention") == {"Attention_module": 4}  # not the ONNX op
    other = (torch.randn(3, 5, 12),)  # another batch and length than exported with
    assert om.validate(vit, other, result, providers="cpu").ok
    gpt = TinyGPT().eval()
    ids = tiny_gpt_inputs()
    result = om.export(gpt, ids, dynamic_shapes=({0: batch, 1: seq},))
    check_prototypes(result)
    assert calls_of(result, "Block") == {"Block": len(gpt.blocks)}
    assert not any(NO_MODULE in str(n.target) for n in result.graph_module.graph.nodes)


class TwoOut(nn.Module):
    """Two outputs cut from one computation, as Flux's single blocks return them."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.a(x)
        return torch.tanh(h[:, :8]) + c, h[:, 8:] * 2


class IgnoresLast(nn.Module):
    """The caller ignores the second output of the last block (Flux's single blocks)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(TwoOut() for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = torch.sin(x)  # computed: a constant here would sit inside block 0's body
        for i, block in enumerate(self.blocks):
            x, side = block(x, c)
            if i < len(self.blocks) - 1:
                c = side
        return x


@pytest.mark.slow
def test_an_ignored_output_does_not_split_the_prototype() -> None:
    torch.manual_seed(0)
    model, args = IgnoresLast().eval(), (torch.randn(2, 8),)
    result = om.export(model, args)
    check_prototypes(result)
    assert calls_of(result, "TwoOut") == {"TwoOut": 4}
    assert om.validate(model, args, result, providers="cpu").ok


class TwoViews(nn.Module):
    """A sum, and the input cut into 8-wide heads: the second output's Reshape holds the
    input's width."""

    def __init__(self, static: bool) -> None:
        super().__init__()
        self.static = static

    def forward(self, x: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.static:
            return x.sum(-1) * 2, x.view(x.size(0), x.size(1), x.size(2) // 8, 8)
        return x.sum(-1) * 2, x.reshape(m.size(0), m.size(1), -1, 8)


class NarrowAndWide(nn.Module):
    """The wide call ignores its heads: its pruned body is a part of the narrow one's."""

    def __init__(self, static: bool) -> None:
        super().__init__()
        self.narrow, self.wide = TwoViews(static), TwoViews(static)

    def forward(self, x: torch.Tensor, y: torch.Tensor, m: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        p, heads = self.narrow(x, m)
        q, _ = self.wide(y, m)
        return p + q, heads


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [False, True])
def test_a_fuller_body_made_for_other_shapes_is_not_shared(dynamic: bool) -> None:
    """The ignored outputs' nodes of a shared fuller body still run: made for a 32-wide input
    (``Reshape`` to 4 heads of 8), they failed in ONNX Runtime on the 64-wide call, at every
    size. Bodies made for other input shapes stay apart."""
    torch.manual_seed(0)
    model = NarrowAndWide(static=not dynamic).eval()

    def inputs(b: int, s: int) -> tuple[torch.Tensor, ...]:
        return torch.randn(b, s, 32), torch.randn(b, s, 64), torch.randn(b, s)

    args = inputs(3, 5)
    dims = {0: torch.export.Dim("b", min=1, max=16), 1: torch.export.Dim("s", min=2, max=32)}
    result = om.export(model, args, dynamic_shapes=(dims,) * 3 if dynamic else None)
    assert calls_of(result, "TwoViews") == {"TwoViews": 1, "TwoViews_1": 1}
    session = ort_session(result.model_proto)
    for size in ([(3, 5), (1, 2), (4, 9)] if dynamic else [(3, 5)]):
        feeds = inputs(*size)
        expected = model(*feeds)
        got = session.run(None, {i.name: t.numpy() for i, t in zip(session.get_inputs(), feeds)})
        for e, g in zip(expected, got, strict=True):
            assert float(abs(e.numpy() - g).max()) < 1e-4
    assert om.validate(model, args, result, providers="cpu").ok


class CondScale(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda t: t * self.scale, lambda t: t - self.scale, (x,))


class TwoScales(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = CondScale(2.0), CondScale(3.0)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.a(x), self.b(x)


@pytest.mark.slow
def test_instances_differing_in_a_branchs_scalar_compute_their_own() -> None:
    """The scale lives in the If branches, which parametrizing does not reach: the two
    instances were one function and ``b`` computed with 2.0 (|diff| 1.0), on either branch."""
    model, x = TwoScales().eval(), torch.ones(2, 4)
    result = om.export(model, (x,))
    assert calls_of(result, "CondScale") == {"CondScale": 1, "CondScale_1": 1}
    session = ort_session(result.model_proto)
    for sample in (x, -x):
        got = session.run(None, {session.get_inputs()[0].name: sample.numpy()})
        # torch's own answer written out: eager torch.cond compiles, and torch 2.15's
        # compile refuses a float closed over by a branch (SymFloat operands)
        expected = [sample * s if sample.sum() > 0 else sample - s for s in (2.0, 3.0)]
        for e, g in zip(expected, got, strict=True):
            assert float(abs(e.numpy() - g).max()) == 0.0


def ort_session(proto: onnx.ModelProto):
    import onnxruntime

    return onnxruntime.InferenceSession(proto.SerializeToString(),
                                        providers=["CPUExecutionProvider"])


class Branchy(nn.Module):
    def __init__(self, bad: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.bad = bad

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if self.bad and y.sum() > 0:  # data-dependent control flow
            return y * 2
        return y


class Eigh(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.eigh(x)[0]


class Blocks(nn.Module):
    def __init__(self, last: nn.Module) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Identity(), nn.Identity(), last])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_export_failure_names_the_module_and_the_users_line() -> None:
    with pytest.raises(om.OnnxModularError, match=r"OM0201.*\[module 'blocks\.2', "
                       r".*test_prototypes\.py:\d+\]"):
        om.export(Blocks(Branchy(True)), (torch.randn(2, 4),))


def test_translation_failure_after_decomposition_names_the_module() -> None:
    with pytest.raises(om.OnnxModularError, match=r"_linalg_eigh.*\[module 'blocks\.2', "
                       r"node '_linalg_eigh', .*test_prototypes\.py:\d+\]"):
        om.export(Blocks(Eigh()), (torch.randn(4, 4),))


@pytest.mark.slow
def test_transformer_bodies_name_no_call_and_inline_back_to_absolute_labels() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=3, n_embd=16, n_head=2, vocab_size=50, n_positions=16,
                        use_cache=False, attn_implementation="eager")
    model = GPT2LMHeadModel(config).eval()
    args = (torch.randint(0, 50, (1, 6)),)
    result = om.export(model, args)
    assert_bodies_name_no_call(result)
    block = next(f for f in result.model.functions.values() if f.name == "GPT2Block")
    assert "ln_1.weight" in [v.name for v in block.inputs]
    # the flat model (every body inlined) labels each copy with its own call
    flat = om.export(model, args, functions="none").model_proto
    scopes = [p.value for n in flat.graph.node for p in n.metadata_props
              if p.key == "pkg.torch.onnx.name_scopes"]
    for layer in range(3):
        assert any(f"'transformer.h.{layer}.attn'" in s for s in scopes), layer
    assert not any("'ln_1'" in s or "'attn'" in s for s in scopes)  # no relative path left


# ---- diffusion models (diffusers, tiny configs, random weights) -------------------------------

def _flux() -> tuple[nn.Module, tuple]:
    from diffusers import FluxTransformer2DModel

    inner = FluxTransformer2DModel(
        patch_size=1, in_channels=8, num_layers=1, num_single_layers=4, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=16, pooled_projection_dim=16,
        guidance_embeds=False, axes_dims_rope=(2, 2, 4)).eval()

    class Flux(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.transformer = inner

        def forward(self, hidden, enc, pooled, t, img_ids, txt_ids):  # type: ignore[no-untyped-def]
            return self.transformer(hidden_states=hidden, encoder_hidden_states=enc,
                                    pooled_projections=pooled, timestep=t, img_ids=img_ids,
                                    txt_ids=txt_ids, return_dict=False)[0]

    return Flux().eval(), (torch.randn(1, 16, 8), torch.randn(1, 4, 16), torch.randn(1, 16),
                           torch.tensor([0.5]), torch.zeros(16, 3), torch.zeros(4, 3))


def _dit() -> tuple[nn.Module, tuple]:
    from diffusers import DiTTransformer2DModel

    inner = DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
        num_layers=3, sample_size=8, patch_size=2, num_embeds_ada_norm=10).eval()

    class DiT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.transformer = inner

        def forward(self, hidden, t, labels):  # type: ignore[no-untyped-def]
            return self.transformer(hidden, timestep=t, class_labels=labels,
                                    return_dict=False)[0]

    return DiT().eval(), (torch.randn(1, 4, 8, 8), torch.tensor([3]), torch.tensor([1]))


def _unet() -> tuple[nn.Module, tuple]:
    from diffusers import UNet2DConditionModel

    inner = UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(8, 16), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16,
        attention_head_dim=2, norm_num_groups=4).eval()

    class UNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.unet = inner

        def forward(self, sample, t, enc):  # type: ignore[no-untyped-def]
            return self.unet(sample, t, encoder_hidden_states=enc, return_dict=False)[0]

    return UNet().eval(), (torch.randn(1, 4, 8, 8), torch.tensor([3]), torch.randn(1, 4, 16))


def _vae() -> tuple[nn.Module, tuple]:
    from diffusers import AutoencoderKL

    inner = AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=(8, 16),
                          down_block_types=("DownEncoderBlock2D",) * 2,
                          up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4,
                          norm_num_groups=4, layers_per_block=1).eval()

    class VAE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.vae = inner

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.vae(x, sample_posterior=False, return_dict=False)[0]

    return VAE().eval(), (torch.randn(1, 3, 16, 16),)


DIFFUSION = {"flux": _flux, "sd3": models.sd3, "dit": _dit, "unet2d_condition": _unet,
             "autoencoder_kl": _vae}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(DIFFUSION))
def test_diffusion_models_share_prototypes(name: str) -> None:
    pytest.importorskip("diffusers")
    torch.manual_seed(0)
    model, args = DIFFUSION[name]()
    result = om.export(model, args)
    check_prototypes(result)
    assert_bodies_name_no_call(result)
    assert om.validate(model, args, result, providers="cpu").ok


@pytest.mark.slow
def test_flux_single_blocks_are_one_function() -> None:
    pytest.importorskip("diffusers")
    torch.manual_seed(0)
    model, args = _flux()
    result = om.export(model, args)
    assert calls_of(result, "FluxSingleTransformerBlock") == {"FluxSingleTransformerBlock": 4}


# ---- real torchvision / timm models (installed in the torch 2.14 CI job) ----------------------

TORCHVISION = ["squeezenet1_0", "resnet18", "mobilenet_v3_small", "densenet121"]


@pytest.mark.slow
@pytest.mark.parametrize("name", TORCHVISION)
def test_torchvision_models_share_prototypes(name: str) -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    args = (torch.randn(1, 3, 64, 64),)
    result = om.export(model, args)
    check_prototypes(result)
    assert om.validate(model, args, result, providers="cpu").ok


@pytest.mark.slow
def test_timm_vit_blocks_share_one_function_under_a_dynamic_batch() -> None:
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32,
                              depth=4).eval()
    args = (torch.randn(2, 3, 32, 32),)
    result = om.export(model, args,
                       dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=8)},))
    check_prototypes(result)
    assert calls_of(result, "Block") == {"Block": 4}
    assert om.validate(model, (torch.randn(3, 3, 32, 32),), result, providers="cpu").ok


@pytest.mark.slow
def test_inspect_shows_why_functions_of_a_class_stayed_apart(tmp_path) -> None:
    from onnx_modular.cli import main

    torch.manual_seed(0)
    om.export(ResNet().eval(), (torch.randn(1, 3, 32, 32),)).save(tmp_path / "r.onnx")
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["inspect", str(tmp_path / "r.onnx")]) == 0
    text = buffer.getvalue()
    assert "differs from" in text and "BasicBlock: " in text


# ---- issue 32: dedupe misses of unseen models ---------------------------------------------


class _Step(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.a(x) + self.b(h) + 0.5 * h)


class _Loop(nn.Module):
    """``h = zeros; for _ in range(5): h = self.step(x, h)``."""

    def __init__(self, zeros: str) -> None:
        super().__init__()
        self.step, self.zeros = _Step(), zeros

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros_like(x) if self.zeros == "like" else torch.zeros(x.shape[0], 8)
        for _ in range(5):
            h = self.step(x, h)
        return h


@pytest.mark.slow
@pytest.mark.parametrize("zeros", ["like", "sized"])
def test_a_module_called_in_a_loop_from_a_zero_state_is_one_function(zeros: str) -> None:
    torch.manual_seed(0)
    model, args = _Loop(zeros).eval(), (torch.randn(2, 8),)
    result = om.export(model, args)
    assert calls_of(result, "_Step") == {"_Step": 5}
    check_prototypes(result)
    assert om.validate(model, args, result, providers="cpu").ok


class _HyperLayer(nn.Module):
    def __init__(self, eps: float, slope: float) -> None:
        super().__init__()
        self.ln, self.fc, self.slope = nn.LayerNorm(8, eps=eps), nn.Linear(8, 8), slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.leaky_relu(self.fc(self.ln(x)), self.slope)


class _Hyper(nn.Module):
    def __init__(self, config: list[tuple[float, float]]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_HyperLayer(eps, slope) for eps, slope in config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.slow
@pytest.mark.parametrize("config", [
    [(1e-5, 0.01), (1e-5, 0.1), (1e-1, 0.2), (1e-3, 0.3)],  # two share an eps
    [(1e-5, 0.01), (1e-1, 0.1), (1e-5, 0.01), (1e-1, 0.3)],  # layers 0 and 2 alike
    [(1e-5, 0.01), (1e-4, 0.1), (1e-1, 0.2), (1e-3, 0.3)],  # all differ
])
def test_per_layer_float_hyperparameters_are_one_function_whichever_repeat(config) -> None:
    torch.manual_seed(0)
    model, args = _Hyper(config).eval(), (torch.randn(2, 8) * 3,)
    result = om.export(model, args)
    assert calls_of(result, "_HyperLayer") == {"_HyperLayer": 4}
    assert calls_of(result, "LayerNorm") == {"LayerNorm": 4}
    assert om.validate(model, args, result, providers="cpu").ok


def _unet2d(layers_per_block: int = 1) -> tuple[nn.Module, tuple]:
    from diffusers import UNet2DModel

    inner = UNet2DModel(sample_size=16, in_channels=3, out_channels=3,
                        layers_per_block=layers_per_block,
                        block_out_channels=(16, 32), norm_num_groups=4,
                        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                        up_block_types=("AttnUpBlock2D", "UpBlock2D")).eval()

    class UNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.unet = inner

        def forward(self, x, t):  # type: ignore[no-untyped-def]
            return self.unet(x, t, return_dict=False)[0]

    return UNet().eval(), (torch.randn(1, 3, 16, 16), torch.tensor([10]))


def _vq() -> tuple[nn.Module, tuple]:
    from diffusers import VQModel

    inner = VQModel(in_channels=3, out_channels=3, block_out_channels=(16, 32),
                    layers_per_block=1, down_block_types=("DownEncoderBlock2D",) * 2,
                    up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4,
                    norm_num_groups=4, num_vq_embeddings=16, vq_embed_dim=4).eval()

    class VQ(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.vq = inner

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.vq(x, return_dict=False)[0]

    return VQ().eval(), (torch.randn(1, 3, 16, 16),)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["unet2d", "vq"])
def test_group_norm_weights_enter_as_inputs_one_function_per_shape(name: str) -> None:
    """A GroupNorm's 16-element weight and bias baked into its body made every call its own
    function (UNet2DModel: 12 functions for 21 calls, VQModel: 10 for 24)."""
    pytest.importorskip("diffusers")
    torch.manual_seed(0)
    model, args = {"unet2d": _unet2d, "vq": _vq}[name]()
    trained = models.trained(model)
    shapes: set[tuple[int, ...]] = set()
    hooks = [m.register_forward_hook(lambda _m, a, _o: shapes.add(tuple(a[0].shape)))
             for m in trained.modules() if isinstance(m, nn.GroupNorm)]
    with torch.no_grad():
        trained(*args)
    for hook in hooks:
        hook.remove()
    result = om.export(trained, args)
    assert len(calls_of(result, "GroupNorm")) == len(shapes)
    check_prototypes(result)
    assert om.validate(trained, args, result, providers="cpu").ok


@pytest.mark.slow
def test_a_caller_reading_a_block_internal_height_takes_it_from_the_blocks_output() -> None:
    """torch.export read the attention's height from the shortcut conv inside the
    ResnetBlock2D before it (``sym_size(conv2d_8, 2)``): that call returned the conv's
    output for its shape alone, and got a function of its own (3 functions, 2 bodies)."""
    pytest.importorskip("diffusers")
    torch.manual_seed(0)
    model, _ = _unet2d(layers_per_block=2)
    x, t = torch.randn(2, 3, 16, 16), torch.tensor([10, 500])
    batch = torch.export.Dim("batch", min=1, max=16)
    h8, w8 = torch.export.Dim("h8", min=1, max=8), torch.export.Dim("w8", min=1, max=8)
    trained = models.trained(model)
    result = om.export(trained, (x, t), functions=["ResnetBlock2D"],
                       dynamic_shapes=({0: batch, 2: 8 * h8, 3: 8 * w8}, {0: batch}))
    assert sorted(calls_of(result, "ResnetBlock2D").values()) == [5, 7]  # shortcut or not
    assert all(len(f.outputs) == 1 for f in result.model.functions.values())
    session = ort.InferenceSession(result.model_proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    for sample, steps in ((x, t), (torch.randn(3, 3, 24, 40), torch.tensor([1, 20, 900]))):
        (got,) = session.run(None, {"x": sample.numpy(), "t": steps.numpy()})
        with torch.no_grad():
            np.testing.assert_allclose(got, trained(sample, steps).numpy(), atol=1e-4)


@pytest.mark.slow
def test_a_size_the_root_computes_from_the_input_is_taken_from_a_blocks_own_shape() -> None:
    """torch.export computed the attention's ``h' * w'`` at the root from the sample's
    height and width (``((h - 1)//2 + 1) * ...``), which no block below the downsampler
    sees: AttnDownBlock2D, Attention, the mid and up blocks each took 3 size inputs. By its
    value it is the product of two dimensions of the block's own activation."""
    from onnx_modular.check.inspect import input_kinds

    pytest.importorskip("diffusers")
    torch.manual_seed(0)
    model, _ = _unet2d()
    trained = models.trained(model)
    x, t = torch.randn(2, 3, 16, 16), torch.tensor([10, 500])
    result = om.export(trained, (x, t), dynamic_shapes=(
        {0: "batch", 2: "h", 3: "w"}, {0: "batch"}))
    assert not {f: k for f, k in input_kinds(result.model_proto).items() if "size" in k}
    session = ort.InferenceSession(result.model_proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    for sample, steps in ((x, t), (torch.randn(1, 3, 12, 20), torch.tensor([7]))):
        (got,) = session.run(None, {"x": sample.numpy(), "t": steps.numpy()})
        with torch.no_grad():
            np.testing.assert_allclose(got, trained(sample, steps).numpy(), atol=1e-4)


class HalfScaled(nn.Module):
    def __init__(self, a: float) -> None:
        super().__init__()
        self.a = a

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.a + torch.sigmoid(x) * 0.5


@pytest.mark.parametrize("scales", [(0.5, 0.7), (0.7, 0.5), (0.5, 0.7, 0.5)])
def test_a_layer_scale_equal_to_a_literal_of_the_body_stays_its_own(scales) -> None:
    """Layer 0's ``a`` (0.5) equals the body's literal 0.5: the translation shares one
    Constant, and the merged function gave the next layer's 0.7 to both products, silently
    (|diff| 0.15 against torch)."""
    model = nn.Sequential(*(HalfScaled(a) for a in scales)).eval()
    x = torch.randn(3, 4)
    result = om.export(model, (x,))
    assert calls_of(result, "HalfScaled") == {"HalfScaled": len(scales)}
    session = ort_session(result.model_proto)
    for sample in (x, 3 * torch.randn(3, 4)):
        (got,) = session.run(None, {session.get_inputs()[0].name: sample.numpy()})
        assert float(abs(model(sample).detach().numpy() - got).max()) < 1e-5
