"""The hook in the released Optimum: which files come out hierarchical, with how many functions.

Run in an environment with the ``optimum`` extra (``pip install -e '.[optimum]'``; it pins
its own transformers). Builds tiny models from configs (nothing downloaded), exports each
with ``optimum.exporters.onnx.main_export`` inside ``om.hook()`` (Optimum validates each file
against torch itself) and prints one row per written file. Encoder-decoder models are
exported with ``no_post_process=True`` (``--no-post-process``): Optimum's merge of the two
decoder files into one builds a new model without the local functions.

    python scripts/hook_pipelines.py [NAME ...]
"""

from __future__ import annotations

import re
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

import onnx
import torch
import transformers as t

import onnx_modular as om


def _tiny() -> dict[str, tuple[str, object]]:
    small = {"vocab_size": 128, "max_position_embeddings": 64}
    return {
        "gpt2": ("text-generation-with-past", t.GPT2LMHeadModel(t.GPT2Config(
            n_layer=4, n_embd=32, n_head=4, vocab_size=128, n_positions=64))),
        "llama": ("text-generation-with-past", t.LlamaForCausalLM(t.LlamaConfig(
            num_hidden_layers=4, hidden_size=32, intermediate_size=64, num_attention_heads=4,
            num_key_value_heads=2, **small))),
        "llama-no-past": ("text-generation", t.LlamaForCausalLM(t.LlamaConfig(
            num_hidden_layers=4, hidden_size=32, intermediate_size=64, num_attention_heads=4,
            num_key_value_heads=2, **small))),
        "bert": ("feature-extraction", t.BertModel(t.BertConfig(
            num_hidden_layers=4, hidden_size=32, intermediate_size=64, num_attention_heads=4,
            **small))),
        "vit": ("image-classification", t.ViTForImageClassification(t.ViTConfig(
            num_hidden_layers=4, hidden_size=32, intermediate_size=64, num_attention_heads=4,
            image_size=32, patch_size=8))),
        "t5": ("text2text-generation-with-past", t.T5ForConditionalGeneration(t.T5Config(
            num_layers=2, num_decoder_layers=2, d_model=32, d_ff=64, num_heads=4, d_kv=8,
            vocab_size=128, decoder_start_token_id=0))),
        "bart": ("text2text-generation-with-past", t.BartForConditionalGeneration(t.BartConfig(
            encoder_layers=2, decoder_layers=2, d_model=32, encoder_ffn_dim=64,
            decoder_ffn_dim=64, encoder_attention_heads=4, decoder_attention_heads=4,
            **small))),
        "whisper": ("automatic-speech-recognition-with-past",
                    t.WhisperForConditionalGeneration(t.WhisperConfig(
                        encoder_layers=2, decoder_layers=2, d_model=32, encoder_ffn_dim=64,
                        decoder_ffn_dim=64, encoder_attention_heads=4,
                        decoder_attention_heads=4, num_mel_bins=16, max_source_positions=1500,
                        max_target_positions=32, vocab_size=128, pad_token_id=0,
                        bos_token_id=1, eos_token_id=2, decoder_start_token_id=3,
                        suppress_tokens=[], begin_suppress_tokens=[]))),
    }


def _split_classes(names: list[str]) -> str:
    """``T5Block x2`` for a class whose calls needed more than one function body."""
    counts = Counter(re.sub(r"_\d+$", "", name) for name in names)
    return ", ".join(f"{c} x{n}" for c, n in sorted(counts.items()) if n > 1)


def main(names: list[str]) -> None:
    from optimum.exporters.onnx import main_export

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    models = _tiny()
    print(f"{'model':14} {'task':40} {'file':32} {'result':12} functions  seconds  "
          "classes with more than one function")
    for name in names or list(models):
        task, model = models[name]
        with tempfile.TemporaryDirectory() as tmp:
            model.eval().save_pretrained(Path(tmp) / "src")
            start = time.perf_counter()
            try:
                # Optimum's merge of the two decoders drops local functions: keep them apart
                separate = "2" in task or "speech" in task
                with om.hook() as session:
                    main_export(str(Path(tmp) / "src"), Path(tmp) / "out", task=task,
                                no_post_process=separate)
            except Exception as e:  # Optimum's own failure (or its validation's)
                print(f"{name:14} {task:40} {'-':32} failed: {type(e).__name__}: "
                      f"{str(e).splitlines()[0][:120]}")
                continue
            seconds = time.perf_counter() - start
            for record in session.exports:
                path = Path(record.path or "?")
                names = ([f.name for f in onnx.load(str(path), load_external_data=False).functions]
                         if path.is_file() else list(record.functions))
                functions, split = len(names), _split_classes(names)
                result = "hierarchical" if record.hierarchical else "flat"
                print(f"{name:14} {task:40} {path.name:32} {result:12} {functions:9}  "
                      f"{seconds:7.1f}  {split or '-'}"
                      + (f"  ({record.flat_reason})" if record.flat_reason else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
