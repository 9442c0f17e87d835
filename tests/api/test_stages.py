"""Pipeline stages end to end: markers, split points, callbacks, stage models, runner, CLI."""

from __future__ import annotations

import json

import models
import onnx
import pytest
import torch
from models import Marked, Tied, used_weight_bytes
from torch import nn

import onnx_modular as om
from onnx_modular.cli import main
from onnx_modular.cli.loading import load_model


def weight_bytes(model: nn.Module) -> int:
    """Parameters and buffers, each tied tensor once."""
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


def stage_bytes(result: om.StagesResult) -> int:
    """The program's weights each stage reads, as cut (its optimized model may fold them)."""
    return sum(sum(weights.values()) for weights in result.parameters_of().values())


def extra_copies(manifest: dict) -> int:
    return sum(e["bytes"] * (len(e["stages"]) - 1)
               for e in manifest["shared_parameters"].values())


def run_saved(result: om.StagesResult, directory, args: tuple) -> tuple[dict, object]:
    """Save, check every stage model, and chain the stages in ONNX Runtime."""
    result.save(directory)
    manifest = json.loads((directory / "manifest.json").read_text())
    for entry in manifest["regions"]:
        onnx.checker.check_model(onnx.load(str(directory / entry["file"])))
    return manifest, om.SplitRunner(directory).run(*args)


# ---- hand-written models -----------------------------------------------------------------------

def test_markers_make_stages_and_the_chain_reproduces_torch(tmp_path, assert_close) -> None:
    model, args = Marked().eval(), models.x8()
    expected = model(*args)
    result = om.split_stages(model, args)
    assert [s.name for s in result.stages] == ["stage_0", "stage_1", "stage_2"]
    assert result.how == "markers"
    assert all(s.kind == "stage" and s.node_names for s in result.stages)
    assert result.stages[0].outputs and result.stages[1].inputs  # values cross the borders
    assert_close(result.graph_module(*args), expected, 0)
    manifest, got = run_saved(result, tmp_path, args)
    assert_close(got, expected)
    assert manifest["kind"] == "stages" and manifest["split_by"] == "markers"
    assert [r["kind"] for r in manifest["regions"]] == ["stage"] * 3
    # each Linear's weight and bias live in the one stage that uses it; `unused` nowhere
    assert [r["parameters"] for r in manifest["regions"]] == [2, 2, 2]
    assert manifest["shared_parameters"] == {}
    assert stage_bytes(result) == weight_bytes(model) - weight_bytes(model.unused)


@pytest.mark.slow
def test_split_points_beginning_and_end(tmp_path, assert_close) -> None:
    model, args = models.Stack(4).eval(), models.x8()
    expected = model(*args)
    begin = om.split_stages(model, args, {"layers.1": "beginning", "layers.3": "beginning"})
    end = om.split_stages(model, args, split_points={"layers.0": "end", "layers.2": "end"})
    assert len(begin.stages) == len(end.stages) == 3
    assert [s.node_names for s in begin.stages] == [s.node_names for s in end.stages]
    manifest, got = run_saved(begin, tmp_path, args)
    assert_close(got, expected)
    # two layers in the middle stage, their weights there only
    assert [r["parameters"] for r in manifest["regions"]] == [4, 8, 4]
    assert stage_bytes(begin) == weight_bytes(model)
    # a cut at the very start makes no empty stage
    assert len(om.split_stages(model, args, {"layers.0": "beginning"}).stages) == 1


@pytest.mark.slow
def test_markers_and_split_points_cut_together() -> None:
    model, args = Marked().eval(), models.x8()
    result = om.split_stages(model, args, {"a": "end", "c": "end"})
    # markers before b and c; the cut after a coincides with the first, the one after c is new
    assert [s.node_names for s in result.stages] == [
        ("linear",), ("linear_1", "relu"), ("linear_2",), ("add",)]
    assert result.how == "markers+split_points"


def test_tied_parameter_is_copied_into_each_stage_and_recorded(tmp_path, assert_close) -> None:
    model = Tied().eval()
    args = (torch.randint(0, 16, (2, 5), generator=torch.Generator().manual_seed(0)),)
    expected = model(*args)
    result = om.split_stages(model, args, {"body": "beginning", "head": "beginning"})
    assert len(result.stages) == 3
    manifest, got = run_saved(result, tmp_path, args)
    assert_close(got, expected)
    shared = manifest["shared_parameters"]
    [name] = shared  # export names the tied tensor by one of its two paths
    assert name in ("embed.weight", "head.weight")
    assert shared[name] == {"stages": ["stage_0", "stage_2"], "bytes": 16 * 8 * 4,
                                      "handling": "copied"}
    # stage weights add up to the model's plus exactly the documented copy
    assert stage_bytes(result) == weight_bytes(model) + extra_copies(manifest) > \
        weight_bytes(model)
    assert sum(r["parameter_bytes"] for r in manifest["regions"]) == stage_bytes(result)


@pytest.mark.slow
def test_callback_with_split_module_semantics(tmp_path, assert_close) -> None:
    model, args = models.Stack(3).eval(), models.x8()
    expected = model(*args)

    def by_layer(node: torch.fx.Node) -> int:
        paths = [v[0] for v in (node.meta.get("nn_module_stack") or {}).values()
                 if v[0].count(".") == 1]
        return 7 - int(paths[0].split(".")[1]) if paths else 7  # ids run backwards

    program = torch.export.export(model, args)
    for source in (model, program):
        result = om.split_by(source, by_layer, args=args)
        assert len(result.stages) == 3 and result.how == "callback"
        assert_close(result.graph_module(*args), expected, 0)
    manifest, got = run_saved(result, tmp_path, args)
    assert_close(got, expected)
    assert [r["parameters"] for r in manifest["regions"]] == [4, 4, 4]
    assert stage_bytes(result) == weight_bytes(model)


def test_clear_errors() -> None:
    model, args = Marked().eval(), models.x8()
    with pytest.raises(om.OnnxModularError, match="'layers.9' names no module"):
        om.split_stages(model, args, {"layers.9": "beginning"})
    with pytest.raises(om.OnnxModularError, match="'unused': the module never runs"):
        om.split_stages(model, args, {"unused": "end"})
    with pytest.raises(om.OnnxModularError, match="'middle' is not one of beginning, end"):
        om.split_stages(model, args, {"a": "middle"})
    with pytest.raises(om.OnnxModularError, match=r"'unsued' names no module.*mean 'unused'"):
        om.split_stages(model, args, {"unsued": "beginning"})
    with pytest.raises(om.OnnxModularError, match="example inputs are needed"):
        om.split_by(model, lambda n: 0)
    program = torch.export.export(models.Stack(1), args)
    chain = [n.name for n in program.graph.nodes if n.op == "call_function"]
    alternate = {name: i % 2 for i, name in enumerate(chain)}  # 0 -> 1 -> 0 along a chain
    with pytest.raises(om.OnnxModularError, match="cycle"):
        om.split_by(program, lambda n: alternate[n.name])


# ---- transformers architectures ----------------------------------------------------------------

@pytest.fixture(scope="module")
def gpt2_split():
    model, args = models.gpt2(3)
    return model, args, om.split_stages(model, args, {"model.h.1": "beginning",
                                                      "model.h.2": "end"})


@pytest.fixture(scope="module")
def llama_split():
    model, args = models.llama(2)
    return model, args, om.split_stages(model, args, {"model.layers.1": "beginning"})


def check_transformer(model, args, result, directory, n_stages: int, layer: str,
                      assert_close) -> dict:
    assert len(result.stages) == n_stages
    expected = model(*args)
    manifest, got = run_saved(result, directory, args)
    assert_close(got, expected)
    assert stage_bytes(result) == used_weight_bytes(result.program) + extra_copies(manifest)
    # hierarchical inside: the decoder layer is one function, called where its stage runs it
    for graph in result.region_graphs():
        if any(n.startswith(layer) for n in (f.name for f in graph.model.functions.values())):
            break
    else:
        pytest.fail(f"no stage model holds a {layer} function")
    return manifest


@pytest.mark.slow
def test_gpt2_stages(gpt2_split, tmp_path, assert_close) -> None:
    model, args, result = gpt2_split
    manifest = check_transformer(model, args, result, tmp_path, 3, "GPT2Block", assert_close)
    assert manifest["shared_parameters"] == {}  # GPT2Model has no tied head
    assert stage_bytes(result) == weight_bytes(model)
    names = [set(g.model.graph.initializers) for g in result.region_graphs()]
    assert "model.wte.weight" in names[0] and "model.ln_f.weight" in names[2]
    assert any(n.startswith("model.h.1.") for n in names[1])
    assert not any(n.startswith("model.h.1.") for n in names[0] | names[2])
    with pytest.raises(om.OnnxModularError, match=r"'h\.1' names no module.*'model\.h\.1'"):
        om.split_stages(model, args, {"h.1": "beginning"})  # the wrapper's prefix missing


@pytest.mark.slow
def test_llama_stages(llama_split, tmp_path, assert_close) -> None:
    model, args, result = llama_split
    check_transformer(model, args, result, tmp_path, 2, "LlamaDecoderLayer", assert_close)
    unused = model.model.rotary_emb.original_inv_freq  # a buffer forward never reads
    assert stage_bytes(result) == weight_bytes(model) - unused.numel() * unused.element_size()


# ---- command line ------------------------------------------------------------------------------

@pytest.mark.slow
def test_cli_split_points_and_markers(tmp_path, assert_close) -> None:
    src = tmp_path / "net.py"
    src.write_text(
        "import torch\n"
        "import onnx_modular as om\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        torch.manual_seed(0)\n"
        "        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))\n"
        "    def forward(self, x):\n"
        "        x = self.layers[0](x)\n"
        "        om.pipe_split()\n"
        "        return self.layers[2](torch.relu(self.layers[1](x)))\n")
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    model = load_model(f"{src}:Net")
    expected = model(x)
    for flags, n_stages in ((["--split-points", "layers.2:beginning"], 3), (["--markers"], 2)):
        out = tmp_path / f"out{n_stages}"
        assert main(["split", f"{src}:Net", "--input", "2x8:float32", *flags,
                     "-o", str(out)]) == 0
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["kind"] == "stages" and len(manifest["regions"]) == n_stages
        assert_close(om.SplitRunner(out).run(x), expected)
    assert main(["split", f"{src}:Net", "--input", "2x8:float32", "--split-points",
                 "layers.7:beginning", "-o", str(tmp_path / "bad")]) == 2
    assert not (tmp_path / "bad").exists()


def test_a_model_with_markers_exports_whole() -> None:
    """pipe_split() markers cut stages; om.export of the same model ignores them."""
    model, args = models.Marked(8).eval(), (torch.randn(2, 8),)
    result = om.export(model, args)
    assert om.validate(model, args, result, providers="cpu").ok
