"""The hook in the released Optimum (optimum-onnx 0.1.0), which exports with dynamo=False.

Optimum pins transformers < 4.58, so it lives in its own environment (the ``optimum`` extra;
``.ci/run`` makes one): elsewhere these tests skip. Models are tiny, built from configs and
saved with ``save_pretrained``; nothing is downloaded.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import onnx
import pytest
import torch

pytest.importorskip("optimum.exporters.onnx", reason=(
    "the released optimum-onnx is an optional test dependency with its own transformers: "
    "pip install -e '.[optimum]' in a separate venv (.ci/run does)"))
transformers = pytest.importorskip("transformers")

import onnx_modular as om  # noqa: E402

LAYERS = 3


def _save(tmp_path: Path, name: str) -> Path:
    torch.manual_seed(0)
    t = transformers
    if name == "gpt2":
        model = t.GPT2LMHeadModel(t.GPT2Config(n_layer=LAYERS, n_embd=32, n_head=4,
                                               vocab_size=128, n_positions=64))
    elif name == "llama":
        model = t.LlamaForCausalLM(t.LlamaConfig(
            num_hidden_layers=LAYERS, hidden_size=32, intermediate_size=64,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
            max_position_embeddings=64))
    else:
        model = t.BertModel(t.BertConfig(num_hidden_layers=LAYERS, hidden_size=32,
                                         intermediate_size=64, num_attention_heads=4,
                                         vocab_size=128, max_position_embeddings=64))
    if model.generation_config is not None:
        model.generation_config.pad_token_id = 0
    directory = tmp_path / name
    model.eval().save_pretrained(directory)
    return directory


def _calls(path: Path, function: str) -> tuple[int, int]:
    """(functions named ``function`` or ``function_N``, their call sites) in the file."""
    model = onnx.load(str(path), load_external_data=False)
    names = {f.name for f in model.functions
             if f.name == function or f.name.startswith(function + "_")}
    nodes = [*model.graph.node, *(n for f in model.functions for n in f.node)]
    return len(names), sum(n.op_type in names for n in nodes)


@pytest.mark.parametrize(("name", "layer"), [("gpt2", "GPT2Block"),
                                             ("llama", "LlamaDecoderLayer")])
def test_main_export_with_past_is_hierarchical_validated_and_generates_like_torch(
        tmp_path, name, layer) -> None:
    from optimum.exporters.onnx import main_export
    from optimum.onnxruntime import ORTModelForCausalLM

    source = _save(tmp_path, name)
    out = tmp_path / "onnx"
    with om.hook() as session:  # main_export validates against torch itself (raises if not)
        main_export(str(source), out, task="text-generation-with-past")
    assert [e.hierarchical for e in session.exports] == [True], [str(e) for e in session.exports]
    assert _calls(out / "model.onnx", layer) == (1, LAYERS)  # one function per layer class

    torch_model = transformers.AutoModelForCausalLM.from_pretrained(source).eval()
    ort_model = ORTModelForCausalLM.from_pretrained(out)
    prompt = torch.tensor([[5, 17, 42, 7]])
    expected = torch_model.generate(prompt, max_new_tokens=8, do_sample=False)
    assert torch.equal(ort_model.generate(prompt, max_new_tokens=8, do_sample=False), expected)


def test_feature_extraction_without_past_is_hierarchical(tmp_path) -> None:
    from optimum.exporters.onnx import main_export

    source = _save(tmp_path, "bert")
    with om.hook() as session:
        main_export(str(source), tmp_path / "onnx", task="feature-extraction")
    assert session.exports[-1].hierarchical
    assert _calls(tmp_path / "onnx" / "model.onnx", "BertLayer") == (1, LAYERS)


def test_the_launcher_runs_optimum_cli_unchanged(tmp_path) -> None:
    source = _save(tmp_path, "llama")
    out = tmp_path / "cli"
    done = subprocess.run(
        [sys.executable, "-m", "onnx_modular", "hook", "--", "optimum-cli", "export", "onnx",
         "--model", str(source), "--task", "text-generation-with-past", str(out)],
        capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "hierarchical" in done.stderr
    assert _calls(out / "model.onnx", "LlamaDecoderLayer") == (1, LAYERS)


def test_ort_model_export_true_is_hierarchical_and_generates_like_torch(tmp_path) -> None:
    from optimum.onnxruntime import ORTModelForCausalLM

    source = _save(tmp_path, "gpt2")
    with om.hook() as session:
        ort_model = ORTModelForCausalLM.from_pretrained(source, export=True)
    assert [e.hierarchical for e in session.exports] == [True]
    assert _calls(Path(session.exports[0].path), "GPT2Block") == (1, LAYERS)
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(source).eval()
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    expected = torch_model.generate(prompt, max_new_tokens=6, do_sample=False)
    assert torch.equal(ort_model.generate(prompt, max_new_tokens=6, do_sample=False), expected)


def test_ortquantizer_in_a_hook_quantizes_and_keeps_the_layers(tmp_path) -> None:
    """sentence-transformers' export_dynamic_quantized_onnx_model path: ORTQuantizer builds
    ONNX Runtime's quantizer class itself; in a hook the file is quantized and outlined."""
    from optimum.exporters.onnx import main_export
    from optimum.onnxruntime import ORTQuantizer
    from optimum.onnxruntime.configuration import AutoQuantizationConfig

    source = _save(tmp_path, "bert")
    with om.hook() as session:
        main_export(str(source), tmp_path / "onnx", task="feature-extraction")
        quantizer = ORTQuantizer.from_pretrained(tmp_path / "onnx")
        quantizer.quantize(AutoQuantizationConfig.avx512_vnni(is_static=False),
                           save_dir=tmp_path / "q")
    path = tmp_path / "q" / "model_quantized.onnx"
    assert [r.hierarchical for r in session.rewrites] == [True], session.rewrites
    assert _calls(path, "BertLayer")[1] == LAYERS
    flat = onnx.inliner.inline_local_functions(onnx.load(str(path)))
    assert sum(n.op_type == "MatMulInteger" for n in flat.graph.node) > 0
