"""The hook in the released Optimum (optimum-onnx 0.1.0), which exports with dynamo=False.

Optimum pins transformers < 4.58, so it lives in its own environment (the ``optimum`` extra;
``.ci/run`` makes one): elsewhere these tests skip. Models are tiny, built from configs and
saved with ``save_pretrained``; nothing is downloaded.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

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
    elif name == "t5":
        model = t.T5ForConditionalGeneration(t.T5Config(
            d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=2, num_decoder_layers=2,
            vocab_size=100, decoder_start_token_id=0))
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


# ---- Optimum's merge of the decoders without and with past (seq2seq) -----------------------

def _merged_feeds(session: ort.InferenceSession, use_cache: bool) -> dict[str, np.ndarray]:
    """Inputs of a merged T5 decoder: one new token after 3 past ones, or 4 tokens without."""
    rng = np.random.default_rng(0)
    sizes = {"batch_size": 2, "encoder_sequence_length": 5,
             "decoder_sequence_length": 1 if use_cache else 4, "past_decoder_sequence_length": 3}
    feeds = {}
    for i in session.get_inputs():
        shape = [d if isinstance(d, int) else sizes[d] for d in i.shape]
        if i.name == "use_cache_branch":
            feeds[i.name] = np.array([use_cache])
        elif i.name == "input_ids":
            feeds[i.name] = rng.integers(0, 100, shape, dtype=np.int64)
        elif i.type == "tensor(int64)":
            feeds[i.name] = np.ones(shape, dtype=np.int64)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def test_seq2seq_with_past_merges_the_decoders_hierarchically_and_like_the_flat_pipeline(
        tmp_path) -> None:
    """Optimum's default post-processing merges decoder_model.onnx and
    decoder_with_past_model.onnx into one If model; in a hook it carries their functions."""
    from optimum.exporters.onnx import main_export

    source = _save(tmp_path, "t5")
    main_export(str(source), tmp_path / "flat", task="text2text-generation-with-past")
    with om.hook() as session:  # main_export validates both branches against torch
        main_export(str(source), tmp_path / "hier", task="text2text-generation-with-past")
    path = tmp_path / "hier" / "decoder_model_merged.onnx"
    assert [(Path(r.path).name, r.hierarchical) for r in session.rewrites] == [
        ("decoder_model_merged.onnx", True)], session.rewrites
    merged = onnx.load(str(path))
    onnx.checker.check_model(merged, full_check=True)  # every call resolves
    names = {f.name for f in merged.functions}
    assert {"T5Block", "T5LayerFF", "Embedding"} <= names
    branches = {a.name: {n.op_type for n in a.g.node} for a in merged.graph.node[0].attribute}
    assert "T5Stack" in branches["else_branch"]  # the decoder without past
    stacks = {n for n in branches["then_branch"] & names if n.startswith("T5Stack")}
    assert len(stacks) == 1 and stacks != {"T5Stack"}  # with past: its own body, renamed

    hier = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    flat = ort.InferenceSession(str(tmp_path / "flat" / "decoder_model_merged.onnx"),
                                providers=["CPUExecutionProvider"])
    outputs = [o.name for o in flat.get_outputs()]
    assert [o.name for o in hier.get_outputs()] == outputs
    for use_cache in (False, True):
        feeds = _merged_feeds(flat, use_cache)
        for name, got, want in zip(outputs, hier.run(None, feeds), flat.run(None, feeds)):
            assert got.shape == want.shape, (use_cache, name)
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=f"{use_cache} {name}")


def _decoder(inner: str, name: str) -> onnx.ModelProto:
    """y = Outer(x), Outer(x) = Inner(x) + Leaf(x), Inner(x) = ``inner``(x): two such
    decoders hold functions of one name with different bodies and callers that differ only
    in what they call (nested)."""
    def function(fname: str, nodes: list[onnx.NodeProto]) -> onnx.FunctionProto:
        return helper.make_function("m", fname, ["a"], ["b"], nodes,
                                    [helper.make_opsetid("", 18), helper.make_opsetid("m", 1)])

    functions = [function("Leaf", [helper.make_node("Identity", ["a"], ["b"])]),
                 function("Inner", [helper.make_node(inner, ["a"], ["b"])]),
                 function("Outer", [helper.make_node("Inner", ["a"], ["i"], domain="m"),
                                    helper.make_node("Leaf", ["a"], ["l"], domain="m"),
                                    helper.make_node("Add", ["i", "l"], ["b"])])]
    graph = helper.make_graph(
        [helper.make_node("Outer", ["x"], ["y"], domain="m", name=name)], name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
    return helper.make_model(graph, functions=functions, ir_version=10, opset_imports=[
        helper.make_opsetid("", 18), helper.make_opsetid("m", 1)])


def _run_branches(path: Path) -> tuple[np.ndarray, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.array([-2.0, -0.5, 0.0, 1.5], dtype=np.float32)
    return tuple(session.run(None, {"x": x, "use_cache_branch": np.array([b])})[0]
                 for b in (False, True))


def test_merge_renames_differing_functions_and_their_callers_and_shares_the_rest(
        tmp_path) -> None:
    from optimum.onnx import merge_decoders

    with om.hook() as session:
        merge_decoders(_decoder("Relu", "no_past"), _decoder("Neg", "with_past"),
                       save_path=tmp_path / "merged.onnx")
    merged = onnx.load(str(tmp_path / "merged.onnx"))
    onnx.checker.check_model(merged, full_check=True)
    assert sorted(f.name for f in merged.functions) == [
        "Inner", "Inner_1", "Leaf", "Outer", "Outer_1"]  # one Leaf: the same body
    bodies = {f.name: [n.op_type for n in f.node] for f in merged.functions}
    assert bodies["Outer_1"] == ["Inner_1", "Leaf", "Add"]  # its nested call renamed too
    assert [r.hierarchical for r in session.rewrites] == [True]
    x = np.array([-2.0, -0.5, 0.0, 1.5], dtype=np.float32)
    no_past, with_past = _run_branches(tmp_path / "merged.onnx")
    np.testing.assert_array_equal(no_past, np.maximum(x, 0) + x)
    np.testing.assert_array_equal(with_past, -x + x)


@pytest.mark.parametrize("step", ["carried_functions", "check_merged"])
def test_merge_that_cannot_carry_the_functions_is_flat_with_a_warning(
        tmp_path, monkeypatch, step) -> None:
    """Carrying fails (the decoders are inlined before the merge) or the merged model with
    its functions does not check (it is inlined): a flat, correct file and a warning."""
    from optimum.onnx import merge_decoders

    from onnx_modular.api import hook_tools

    def broken(*args: object) -> None:
        raise RuntimeError("no way")

    monkeypatch.setattr(hook_tools, step, broken)
    with om.hook() as session, pytest.warns(om.HookWarning, match="merged decoder.*no way"):
        merge_decoders(_decoder("Relu", "no_past"), _decoder("Neg", "with_past"),
                       save_path=tmp_path / "merged.onnx")
    merged = onnx.load(str(tmp_path / "merged.onnx"))
    assert not merged.functions and [r.hierarchical for r in session.rewrites] == [False]
    onnx.checker.check_model(merged, full_check=True)
    x = np.array([-2.0, -0.5, 0.0, 1.5], dtype=np.float32)
    no_past, with_past = _run_branches(tmp_path / "merged.onnx")
    np.testing.assert_array_equal(no_past, np.maximum(x, 0) + x)
    np.testing.assert_array_equal(with_past, -x + x)


def test_merge_outside_a_hook_is_optimums_own(tmp_path) -> None:
    from optimum.onnx import merge_decoders

    with om.hook():
        pass  # installed and removed again
    with warnings.catch_warnings():
        warnings.simplefilter("error", om.HookWarning)
        merge_decoders(_decoder("Relu", "no_past"), _decoder("Neg", "with_past"),
                       save_path=tmp_path / "merged.onnx")
    assert not onnx.load(str(tmp_path / "merged.onnx")).functions  # as Optimum writes it


# ---- sentence-transformers' quantized ONNX export ---------------------------------------------

def _sentence_transformer(root: Path) -> Path:
    """A tiny BERT sentence encoder (its own word-piece vocabulary), saved as
    sentence-transformers saves one."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers import models as st_models

    torch.manual_seed(0)
    bert = root / "bert"
    bert.mkdir(parents=True)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(60))]
    (bert / "vocab.txt").write_text("\n".join(words) + "\n")
    transformers.BertTokenizer(str(bert / "vocab.txt")).save_pretrained(bert)
    transformers.BertModel(transformers.BertConfig(
        num_hidden_layers=LAYERS, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        vocab_size=len(words), max_position_embeddings=64)).eval().save_pretrained(bert)
    word = st_models.Transformer(str(bert))
    pooling = st_models.Pooling(word.get_word_embedding_dimension())
    SentenceTransformer(modules=[word, pooling]).save(str(root / "st"))
    return root / "st"


def _quantized_by_sentence_transformers(root: Path, hooked: bool) -> onnx.ModelProto:
    from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model

    directory = _sentence_transformer(root)
    with om.hook() if hooked else warnings.catch_warnings():
        model = SentenceTransformer(str(directory), backend="onnx")  # exports through Optimum
        export_dynamic_quantized_onnx_model(model, "avx512_vnni", str(directory))
    (path,) = directory.rglob("model_qint8_avx512_vnni.onnx")
    return onnx.load(str(path))


def test_sentence_transformers_quantized_export_in_a_hook_is_quantized_and_hierarchical(
        tmp_path) -> None:
    """The red team's case: under the hook ``model_qint8_avx512_vnni.onnx`` was the fp32
    model bit for bit. Now it holds the flat pipeline's quantized ops, and its layers."""
    pytest.importorskip("sentence_transformers")
    hooked = _quantized_by_sentence_transformers(tmp_path / "hook", hooked=True)
    flat = _quantized_by_sentence_transformers(tmp_path / "flat", hooked=False)

    def quantized(model: onnx.ModelProto) -> int:
        inlined = onnx.inliner.inline_local_functions(model) if model.functions else model
        return sum(n.op_type in ("MatMulInteger", "DynamicQuantizeLinear")
                   for n in inlined.graph.node)

    assert not flat.functions and quantized(flat) > 0
    assert quantized(hooked) == quantized(flat)
    names = {f.name for f in hooked.functions}
    assert "BertLayer" in names
