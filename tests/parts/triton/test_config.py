"""The configs of one set: a part's on the onnxruntime backend (batched dims without the
batch, the instance kind, the set's parameters), the ensemble pinning every step to the
set's version; each written as text and read back as Triton's own ModelConfig."""

from __future__ import annotations

from types import SimpleNamespace

import onnx_ir as ir
import pytest
from google.protobuf import text_format

from onnx_modular.leaves.errors import OnnxModularError

pytest.importorskip("tritonclient")
from onnx_modular.parts.triton.config import (
    BATCHING_KEY,
    ENSEMBLE_KEY,
    SET_ID_KEY,
    SetStamp,
    config_parameter,
    ensemble_config,
    model_config_pb2,
    parse_config,
    part_config,
)
from onnx_modular.parts.triton.options import TritonOptions, checked


def value(name: str, *dims: int | str) -> ir.Value:
    return ir.Value(name=name, type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(dims))


def part(name: str, inputs: list[ir.Value], outputs: list[ir.Value], acc: bool = True):
    graph = SimpleNamespace(inputs=inputs, outputs=outputs)
    return SimpleNamespace(name=name, is_acc=acc, model=SimpleNamespace(graph=graph))


X, H, Y = value("x", "s0", 4), value("h", "s0", 8), value("y", "s0", 2)
STAMP = SetStamp(version=3, set_id="abcd", note="batched on the caller's word")


def test_a_part_config_reads_back_as_written() -> None:
    pb = model_config_pb2()
    options = checked(TritonOptions(name="m", kind="gpu", max_batch_size=8, instances=2,
                                    max_queue_delay_us=100), ["stage_0"])
    config = part_config("m_stage_0", part("stage_0", [X], [H]), options, STAMP, [1])
    again = parse_config(text_format.MessageToString(config))
    assert again == config and again.backend == "onnxruntime"
    assert list(again.input[0].dims) == [4]  # batched: the batch dimension is Triton's
    (group,) = again.instance_group
    assert (group.count, group.kind, list(group.gpus)) == (
        2, pb.ModelInstanceGroup.Kind.Value("KIND_GPU"), [1])
    assert again.dynamic_batching.max_queue_delay_microseconds == 100
    assert config_parameter(again, SET_ID_KEY) == "abcd"
    assert config_parameter(again, ENSEMBLE_KEY) == "m"


def test_a_cpu_region_is_kind_cpu_and_unbatched_dims_are_whole() -> None:
    pb = model_config_pb2()
    options = TritonOptions(max_batch_size=0)
    config = part_config("m_cpu_0", part("cpu_0", [X], [H], acc=False), options, STAMP)
    assert config.instance_group[0].kind == pb.ModelInstanceGroup.Kind.Value("KIND_CPU")
    assert list(config.input[0].dims) == [-1, 4] and not config.HasField("dynamic_batching")


def test_the_ensemble_pins_the_sets_version_and_keeps_the_note() -> None:
    steps = [("m_stage_0", part("stage_0", [X], [H])), ("m_stage_1", part("stage_1", [H], [Y]))]
    graph = SimpleNamespace(inputs=[X], outputs=[Y])
    config = ensemble_config(graph, steps, TritonOptions(name="m", max_batch_size=4), STAMP)
    assert config.platform == "ensemble" and config.name == "m"
    assert [(s.model_name, s.model_version) for s in config.ensemble_scheduling.step] == [
        ("m_stage_0", 3), ("m_stage_1", 3)]
    assert dict(config.ensemble_scheduling.step[1].input_map) == {"h": "h"}
    assert config_parameter(config, BATCHING_KEY) == STAMP.note
    assert config_parameter(config, ENSEMBLE_KEY) is None  # parts name their ensemble
    returned = SimpleNamespace(inputs=[X], outputs=[X])
    with pytest.raises(OnnxModularError, match="model input returned as is"):
        ensemble_config(returned, steps, TritonOptions(name="m"), STAMP)


def test_a_per_row_scalar_is_batch_by_one_in_the_ensemble_and_reshaped_in_its_step() -> None:
    """Triton checks an ensemble tensor after its reshape against its step's before it:
    ``[batch]`` reshaped in both was ``[-1]`` against ``[-1, 1]``, and the ensemble did not
    load."""
    score = value("score", "s0")
    steps = [("m_stage_0", part("stage_0", [X], [score]))]
    options = TritonOptions(name="m", max_batch_size=4)
    ensemble = ensemble_config(SimpleNamespace(inputs=[X], outputs=[score]), steps, options,
                               STAMP)
    step = part_config("m_stage_0", steps[0][1], checked(options, ["stage_0"]), STAMP)
    assert list(ensemble.output[0].dims) == [1] and not ensemble.output[0].HasField("reshape")
    assert list(step.output[0].dims) == [1] and step.output[0].HasField("reshape")
    assert list(step.output[0].reshape.shape) == []
