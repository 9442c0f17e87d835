"""``weights=``: a model built on the meta device, its weights mapped from a checkpoint.

The export must be the very file the materialized model gives (graph and weight bytes), for
every form of checkpoint; a checkpoint that does not fit the model is one line naming the
parameter, before anything is written; validation, localization and split work the same.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file, save_model

import onnx_modular as om
from onnx_modular.cli import main
from onnx_modular.diagnostics import OnnxModularError
from tests import models

pytestmark = pytest.mark.slow  # whole models: the full suite, not the inner loop


def tied_llama(layers: int = 2) -> tuple[torch.nn.Module, tuple]:
    """A causal LM whose output projection is its embedding (saved once, as lm_head)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(num_hidden_layers=layers, hidden_size=32, num_attention_heads=4,
                      intermediate_size=64, vocab_size=99, max_position_embeddings=64,
                      num_key_value_heads=2, use_cache=False, tie_word_embeddings=True,
                      attn_implementation="eager")
    return models.HF(LlamaForCausalLM(cfg).eval()).eval(), models.token_ids()


def bf16_llama() -> tuple[torch.nn.Module, tuple]:
    model, args = models.llama()
    return model.to(torch.bfloat16), args


BUILDERS: dict[str, Callable[[], tuple[torch.nn.Module, tuple]]] = {
    "gpt2": models.gpt2, "llama": models.llama, "tied": tied_llama, "bf16": bf16_llama}


def on_meta(build: Callable[[], tuple[torch.nn.Module, tuple]]) -> torch.nn.Module:
    with torch.device("meta"):
        model, _ = build()
    return model


def write_shards(model: torch.nn.Module, directory: Path) -> Path:
    """The Hugging Face layout: two shards and model.safetensors.index.json."""
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    names = sorted({k for k in state if not k.endswith("lm_head.weight")} or state)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    directory.mkdir()
    weight_map = {}
    for file, keys in halves.items():
        save_file({k: state[k] for k in keys}, str(directory / file))
        weight_map.update(dict.fromkeys(keys, file))
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory


def checkpoint(form: str, model: torch.nn.Module, tmp_path: Path) -> object:
    if form == "file":
        save_model(model, str(tmp_path / "model.safetensors"))  # a tied weight saved once
        return tmp_path / "model.safetensors"
    if form == "shards":
        return write_shards(model, tmp_path / "shards")
    return dict(model.state_dict())


@pytest.mark.parametrize(("name", "form"), [
    ("gpt2", "file"), ("llama", "shards"), ("tied", "file"), ("tied", "shards"),
    ("llama", "dict"), ("bf16", "file")])
def test_weights_export_is_the_materialized_export(name: str, form: str,
                                                   tmp_path: Path) -> None:
    real, args = BUILDERS[name]()
    expected = om.export(real, args)
    meta = on_meta(BUILDERS[name])
    got = om.export(meta, args, weights=checkpoint(form, real, tmp_path))
    assert got.model_proto.SerializeToString() == expected.model_proto.SerializeToString()
    expected.save(tmp_path / "a.onnx")
    got.save(tmp_path / "b.onnx")
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    # the user's model is left as it was: on the meta device
    assert {p.device.type for p in meta.parameters()} == {"meta"}


def test_weights_streamed_into_external_data_are_the_same_bytes(tmp_path: Path) -> None:
    real, args = tied_llama()
    om.export(real, args).save(tmp_path / "a.onnx", external_data_threshold=0)
    om.export(on_meta(tied_llama), args, weights=checkpoint("file", real, tmp_path)).save(
        tmp_path / "b.onnx", external_data_threshold=0)
    [a], [b] = sorted(tmp_path.glob("a.onnx.*.data")), sorted(tmp_path.glob("b.onnx.*.data"))
    assert a.read_bytes() == b.read_bytes() and a.stat().st_size > 0


def _one_line(excinfo: pytest.ExceptionInfo[OnnxModularError]) -> str:
    message = excinfo.value.diagnostic.message
    assert "\n" not in message
    return message


def test_a_checkpoint_that_does_not_fit_is_one_line_naming_the_parameter() -> None:
    real, args = models.llama()
    meta = on_meta(models.llama)
    state = dict(real.state_dict())
    key = "model.layers.1.mlp.up_proj.weight"
    for broken, words in [
        ({k: v for k, v in state.items() if k != key}, [key, "is not in checkpoint"]),
        ({**state, key: state[key][:-1]}, [key, "float32 [63, 32]", "float32 [64, 32]"]),
        ({**state, key: state[key].half()}, [key, "float16", "float32",
                                              "build the model in torch.float16"]),
    ]:
        with pytest.raises(OnnxModularError) as excinfo:
            om.export(meta, args, weights=broken)
        message = _one_line(excinfo)
        assert all(w in message for w in words), message
        assert excinfo.value.diagnostic.rule.id == "OM0502"


def test_unreadable_checkpoints_fail_in_one_line(tmp_path: Path) -> None:
    real, args = models.llama()
    meta = on_meta(models.llama)
    (tmp_path / "empty").mkdir()
    (tmp_path / "junk.safetensors").write_bytes(b"not a checkpoint")
    for weights, words in [(tmp_path / "nowhere.safetensors", "does not exist"),
                           (tmp_path / "empty", "model.safetensors.index.json"),
                           (tmp_path / "junk.safetensors", "as safetensors"),
                           (42, "weights= takes")]:
        with pytest.raises(OnnxModularError) as excinfo:
            om.export(meta, args, weights=weights)
        assert words in _one_line(excinfo)
    program = torch.export.export(real, args)
    with pytest.raises(OnnxModularError) as excinfo:
        om.export(program, weights=dict(real.state_dict()))
    assert "nn.Module" in _one_line(excinfo)


def test_validate_runs_torch_on_the_mapped_checkpoint(tmp_path: Path) -> None:
    real, args = tied_llama()
    weights = checkpoint("shards", real, tmp_path)
    meta = on_meta(tied_llama)
    om.export(meta, args, weights=weights).save(tmp_path / "m.onnx")
    report = om.validate(meta, args, tmp_path / "m.onnx", providers="cpu", localize=True,
                         weights=weights)
    assert report.ok
    assert report.localization is not None and report.localization.kind != "none"
    # a checkpoint with other weights: the diverging output is found, and localized
    other, _ = tied_llama()
    with torch.no_grad():
        other.model.model.layers[1].mlp.down_proj.weight.mul_(1.5)
    with om.Validation(meta, args, tmp_path / "m.onnx", providers="cpu",
                       weights=dict(other.state_dict())) as validation:
        report = validation.run()
        assert not report.ok and report.first_mismatch == "model.model.layers.1.mlp.down_proj"
        extraction = validation.extract(tmp_path / "repro")
    assert extraction.call_id.startswith("model.model.layers.1")


def test_a_meta_model_without_its_checkpoint_fails_cleanly(tmp_path: Path) -> None:
    real, args = models.llama()
    om.export(real, args).save(tmp_path / "m.onnx")
    meta = on_meta(models.llama)
    with pytest.raises(OnnxModularError) as excinfo:
        om.validate(meta, args, tmp_path / "m.onnx", providers="cpu", weights={})
    assert "is not in checkpoint" in _one_line(excinfo)
    for run in (lambda: om.validate(meta, args, tmp_path / "m.onnx", providers="cpu"),
                lambda: om.export(meta, args), lambda: om.split_stages(meta, args, num_stages=2)):
        with pytest.raises(OnnxModularError) as excinfo:
            run()
        assert "on the meta device" in _one_line(excinfo) and "weights=" in _one_line(excinfo)


def _parts(directory: Path) -> dict[str, bytes]:
    """Each part's graph and weights, without the set id every save draws anew."""
    import onnx

    found = {}
    for path in sorted(directory.glob("*.onnx")):
        proto = onnx.load(str(path))
        del proto.metadata_props[:]
        found[path.name] = proto.SerializeToString()
    return found


def test_split_and_stages_take_weights(tmp_path: Path) -> None:
    real, args = models.llama(layers=4)
    weights = checkpoint("file", real, tmp_path)
    meta = on_meta(lambda: models.llama(layers=4))
    om.split_stages(real, args, num_stages=2).save(tmp_path / "a")
    om.split_stages(meta, args, num_stages=2, weights=weights).save(tmp_path / "b")
    assert _parts(tmp_path / "a") == _parts(tmp_path / "b") and len(_parts(tmp_path / "a")) == 2
    support = {"deny": ["aten.mul.Tensor"]}
    om.split(real, args, support=support).save(tmp_path / "c")
    om.split(meta, args, support=support, weights=weights).save(tmp_path / "d")
    assert _parts(tmp_path / "c") == _parts(tmp_path / "d")
    output = om.SplitRunner(tmp_path / "b").run(*args)  # the model's structure: one tensor
    torch.testing.assert_close(output, real(*args), rtol=1e-4, atol=1e-4)
    # a plan reads shapes only: the meta model needs no checkpoint for it
    assert str(om.plan_stages(meta, args, num_stages=2)) == \
        str(om.plan_stages(real, args, num_stages=2))


MODEL_FILE = """
import torch
from transformers import LlamaConfig, LlamaModel

CONFIG = LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                     intermediate_size=64, vocab_size=99, num_key_value_heads=2,
                     use_cache=False, attn_implementation="eager")

class Hidden(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = LlamaModel(CONFIG)

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).last_hidden_state

def real():
    torch.manual_seed(0)
    return Hidden().eval()

def meta():
    with torch.device("meta"):
        return Hidden().eval()

INPUTS = (torch.arange(8).reshape(1, 8),)
"""


def test_cli_export_and_validate_with_weights(tmp_path: Path, capsys) -> None:
    from onnx_modular.cli.loading import load_object

    spec = tmp_path / "big.py"
    spec.write_text(MODEL_FILE)
    real, inputs = load_object(f"{spec}:real"), load_object(f"{spec}:INPUTS")
    save_model(real(), str(tmp_path / "w.safetensors"))
    out = tmp_path / "m.onnx"
    assert main(["export", f"{spec}:meta", "--inputs", f"{spec}:INPUTS", "-o", str(out),
                 "--weights", str(tmp_path / "w.safetensors"), "--validate",
                 "--providers", "cpu"]) == 0
    reference = tmp_path / "r.onnx"
    om.export(real(), inputs).save(reference)
    assert out.read_bytes() == reference.read_bytes()
    capsys.readouterr()
    bad = tmp_path / "bad.onnx"
    save_file({"model.norm.weight": torch.ones(32)}, str(tmp_path / "partial.safetensors"))
    assert main(["export", f"{spec}:meta", "--inputs", f"{spec}:INPUTS", "-o", str(bad),
                 "--weights", str(tmp_path / "partial.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "is not in checkpoint" in err and "Traceback" not in err and not bad.exists()
