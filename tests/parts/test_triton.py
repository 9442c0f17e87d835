"""Triton model repositories: every config parses as Triton's own ModelConfig, and the
ensemble, executed by following the configs (not our manifest) in ONNX Runtime, gives
torch's result."""

from __future__ import annotations

from pathlib import Path

import models
import numpy as np
import onnxruntime as ort
import pytest
import torch
from google.protobuf import text_format
from torch import nn

import onnx_modular as om
from onnx_modular.cli import main

pytest.importorskip("tritonclient")  # in the test extra; its protobufs define the configs
from onnx_modular.parts.triton import (
    DEFAULT_MAX_BATCH_SIZE,
    TritonBatchingWarning,
    load_repository,
    model_config_pb2,
)

pb = model_config_pb2()

#: Triton's data types -> ONNX Runtime's type strings
ORT_TYPES = {"TYPE_FP32": "tensor(float)", "TYPE_FP16": "tensor(float16)",
             "TYPE_INT64": "tensor(int64)", "TYPE_INT32": "tensor(int32)",
             "TYPE_BOOL": "tensor(bool)", "TYPE_FP64": "tensor(double)"}
NUMPY_TYPES = {"TYPE_FP32": np.float32, "TYPE_INT64": np.int64, "TYPE_BOOL": np.bool_,
               "TYPE_INT32": np.int32, "TYPE_FP16": np.float16, "TYPE_FP64": np.float64}


def read_config(directory: Path):
    """``config.pbtxt`` parsed into tritonclient's ``inference.ModelConfig``."""
    return text_format.Parse((directory / "config.pbtxt").read_text(), pb.ModelConfig())


def dims_fit(dims, shape) -> bool:
    return len(dims) == len(shape) and all(d in (-1, s) for d, s in zip(dims, shape))


def run_ensemble(repo: Path, ensemble: str, feeds: dict[str, np.ndarray]
                 ) -> dict[str, np.ndarray]:
    """Execute the ensemble as Triton would: a step runs once all its inputs exist; each
    step's model is found, typed and wired from the configs alone."""
    config = read_config(repo / ensemble)
    assert config.platform == "ensemble"
    batch = config.max_batch_size > 0  # then dims leave the batch dimension out

    def fits(dims, shape) -> bool:
        return dims_fit(dims, shape[1:] if batch else shape) and (
            not batch or shape[0] <= config.max_batch_size)

    tensors: dict[str, np.ndarray] = {}
    for entry in config.input:
        value = feeds[entry.name]
        assert value.dtype == NUMPY_TYPES[pb.DataType.Name(entry.data_type)]
        assert fits(entry.dims, value.shape)
        tensors[entry.name] = value
    pending = list(config.ensemble_scheduling.step)
    while pending:
        ready = [s for s in pending if all(v in tensors for v in s.input_map.values())]
        assert ready, f"steps wait on tensors nobody makes: {[s.model_name for s in pending]}"
        step = ready[0]
        pending.remove(step)
        model_dir = repo / step.model_name
        model_config = read_config(model_dir)
        assert model_config.name == step.model_name
        assert model_config.backend == "onnxruntime"
        assert model_config.max_batch_size == config.max_batch_size
        assert model_config.HasField("dynamic_batching") == batch
        versions = sorted(int(p.name) for p in model_dir.iterdir() if p.name.isdigit())
        version = step.model_version if step.model_version > 0 else versions[-1]
        file = model_dir / str(version) / (model_config.default_model_filename or "model.onnx")
        session = ort.InferenceSession(str(file), providers=["CPUExecutionProvider"])
        declared_in = {e.name: e for e in model_config.input}
        assert {i.name for i in session.get_inputs()} == set(declared_in)
        for i in session.get_inputs():
            assert ORT_TYPES[pb.DataType.Name(declared_in[i.name].data_type)] == i.type
        feed = {}
        for model_input, tensor in step.input_map.items():
            entry = declared_in[model_input]
            assert fits(entry.dims, tensors[tensor].shape)
            feed[model_input] = tensors[tensor]
        names = [e.name for e in model_config.output]
        results = dict(zip(names, session.run(names, feed)))
        for entry in model_config.output:
            assert fits(entry.dims, results[entry.name].shape)
            assert results[entry.name].dtype == NUMPY_TYPES[pb.DataType.Name(entry.data_type)]
        for model_output, tensor in step.output_map.items():
            assert tensor not in tensors, f"two producers of '{tensor}'"
            tensors[tensor] = results[model_output]
    return {e.name: tensors[e.name] for e in config.output}


def check_repository(repo: Path, ensemble: str, parts: list[str]) -> dict[str, object]:
    """Every model directory: a config Triton parses, a version folder, a model file."""
    configs = {p.name: read_config(p) for p in repo.iterdir()
               if p.is_dir() and not p.name.startswith(".")}
    assert sorted(configs) == sorted([ensemble, *parts])
    for name, config in configs.items():
        assert config.name == name and (repo / name / "1").is_dir()
        if name != ensemble:
            assert (repo / name / "1" / "model.onnx").is_file()
    steps = [s.model_name for s in configs[ensemble].ensemble_scheduling.step]
    assert steps == parts
    return configs


@pytest.fixture(scope="module")
def llama_4_stages():
    model, args = models.llama(layers=4)
    return model, args, om.split_stages(model, args, num_stages=4)


@pytest.mark.slow
def test_llama_stages_repository_runs_from_its_configs(llama_4_stages, tmp_path) -> None:
    model, args, stages = llama_4_stages
    repo = stages.save_triton(tmp_path / "repo", name="llama", gpus=[0, 1, 2, 3],
                              external_data=True)
    parts = [f"llama_stage_{i}" for i in range(4)]
    assert repo.models == parts and repo.ensemble == "llama"
    configs = check_repository(tmp_path / "repo", "llama", parts)
    for i, name in enumerate(parts):
        (group,) = configs[name].instance_group
        assert pb.ModelInstanceGroup.Kind.Name(group.kind) == "KIND_GPU"
        assert list(group.gpus) == [i] and group.count == 1  # a stage per GPU
        assert list((tmp_path / "repo" / name / "1").glob("model.onnx.*.data"))
    ensemble = configs["llama"]
    wired = {v for s in ensemble.ensemble_scheduling.step for v in s.input_map.values()}
    made = {v for s in ensemble.ensemble_scheduling.step for v in s.output_map.values()}
    assert wired <= made | {e.name for e in ensemble.input}  # every tensor is wired
    assert {e.name for e in ensemble.output} <= made
    outputs = run_ensemble(tmp_path / "repo", "llama", {"input_ids": args[0].numpy()})
    (got,) = outputs.values()
    np.testing.assert_allclose(got, model(*args).detach().numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_acc_regions_get_auto_and_cpu_regions_cpu_instances(tmp_path) -> None:
    model, args = models.gpt2(layers=2)
    split = om.split(model, args, support=om.OperatorSupport(deny=["onnx::Softmax"]))
    repo = split.save_triton(tmp_path / "repo", name="gpt2", instances=2)
    configs = repo.configs()
    kinds = {name: pb.ModelInstanceGroup.Kind.Name(c.instance_group[0].kind)
             for name, c in configs.items() if name != "gpt2"}
    assert kinds == {"gpt2_run_on_acc_0": "KIND_AUTO", "gpt2_run_on_cpu_1": "KIND_CPU",
                     "gpt2_run_on_acc_2": "KIND_AUTO", "gpt2_run_on_cpu_3": "KIND_CPU",
                     "gpt2_run_on_acc_4": "KIND_AUTO"}
    assert all(c.instance_group[0].count == 2 for n, c in configs.items() if n != "gpt2")
    assert not list((tmp_path / "repo" / "gpt2_run_on_acc_0" / "1").glob("*.data"))
    check_repository(tmp_path / "repo", "gpt2", repo.models)
    (got,) = run_ensemble(tmp_path / "repo", "gpt2", {"input_ids": args[0].numpy()}).values()
    np.testing.assert_allclose(got, model(*args).detach().numpy(), rtol=1e-4, atol=1e-4)
    # written again: the directories are replaced whole, nothing stale or temporary is left
    split.save_triton(tmp_path / "repo", name="gpt2")
    assert not [p for p in (tmp_path / "repo").iterdir() if p.name.startswith(".")]


def test_config_text_is_checked_by_the_proto() -> None:
    from onnx_modular.parts.triton import parse_config

    assert parse_config('name: "m"\nbackend: "onnxruntime"\n').backend == "onnxruntime"
    with pytest.raises(text_format.ParseError):
        parse_config('name: "m"\nbackend: "onnxruntime"\ninstance_groups { count: 1 }\n')


class EchoInput(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, torch.relu(x) * 2


def test_what_an_ensemble_cannot_express_fails_before_writing(tmp_path) -> None:
    split = om.split(EchoInput(), (torch.randn(2, 3),), support={"deny": ["aten.sin"]})
    with pytest.raises(om.OnnxModularError, match="model input returned as is"):
        split.save_triton(tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


def test_missing_tritonclient_is_one_clear_error(monkeypatch) -> None:
    import importlib

    from onnx_modular.parts import triton

    real = importlib.import_module

    def no_triton(name: str, *a, **k):
        if name.startswith("tritonclient"):
            raise ModuleNotFoundError(f"No module named '{name}'", name="tritonclient")
        return real(name, *a, **k)

    triton.model_config_pb2.cache_clear()
    monkeypatch.setattr(importlib, "import_module", no_triton)
    try:
        with pytest.raises(om.OnnxModularError, match="pip install tritonclient"):
            triton.model_config_pb2()
    finally:
        monkeypatch.undo()
        triton.model_config_pb2.cache_clear()


@pytest.mark.slow
def test_cli_writes_the_repository(tmp_path, capsys) -> None:
    file = tmp_path / "m.py"
    file.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(models.__file__).parent)!r})\n"
        "import models\n"
        "def model():\n    return models.gpt2(layers=2)[0]\n"
        "def inputs():\n    return models.gpt2(layers=2)[1]\n")
    repo = tmp_path / "repo"
    for bad in (["--triton", ""], ["--triton-kind", "cpu"], ["--triton", str(file)]):
        try:
            code = main(["split", f"{file}:model", "--inputs", f"{file}:inputs",
                         "--num-stages", "2", "-o", str(tmp_path / "stages"), *bad])
        except SystemExit as e:  # a usage error, as argparse's own
            code = e.code
        assert code == 2, bad
        assert not (tmp_path / "stages").exists()
    capsys.readouterr()
    assert main(["split", f"{file}:model", "--inputs", f"{file}:inputs", "--num-stages", "2",
                 "-o", str(tmp_path / "stages"), "--triton", str(repo),
                 "--triton-kind", "cpu"]) == 0
    text = capsys.readouterr().out
    assert f"tritonserver --model-repository {repo}" in text
    configs = check_repository(repo, "model", ["model_stage_0", "model_stage_1"])
    assert {pb.ModelInstanceGroup.Kind.Name(c.instance_group[0].kind)
            for c in configs.values() if c.instance_group} == {"KIND_CPU"}
    _, args = models.gpt2(layers=2)
    model, _ = models.gpt2(layers=2)
    (got,) = run_ensemble(repo, "model", {"input_ids": args[0].numpy()}).values()
    np.testing.assert_allclose(got, model(*args).detach().numpy(), rtol=1e-4, atol=1e-4)


def dynamic_batch(model, args, **split):
    """``split_stages`` of ``model`` exported with its first input's batch dimension
    dynamic."""
    batch = torch.export.Dim("batch", max=64)
    program = torch.export.export(model, args, dynamic_shapes=({0: batch},), strict=False)
    return om.split_stages(program, **split)


@pytest.mark.slow
def test_dynamic_batch_parts_are_batched_with_the_cut_tensors_rewritten(tmp_path) -> None:
    """Llama's stages pass the batch size (0-d) and the rotary tables ([1, seq, d]) across
    the cut: the first is taken from a batched input, the second passed repeated along the
    batch; every tensor of every part then has the batch first. The parts stay as they
    were for everything else (SplitRunner's files)."""
    model, args = models.llama(layers=2)
    stages = dynamic_batch(model, args, num_stages=2)
    before = [g.model.graph for g in stages.region_graphs()]
    shapes = [([str(v.shape) for v in g.inputs], [str(v.shape) for v in g.outputs], len(g))
              for g in before]
    with pytest.warns(TritonBatchingWarning, match="cannot prove"):
        unstated = stages.save_triton(tmp_path / "unstated", name="llama")
    assert unstated.max_batch_size == 0  # the causal mask indexes by row position
    repo = stages.save_triton(tmp_path / "repo", name="llama", batch_dim="batch")
    assert repo.max_batch_size == DEFAULT_MAX_BATCH_SIZE
    assert repo.note.startswith("batched along") and "Concat" in repo.note
    assert shapes == [([str(v.shape) for v in g.inputs], [str(v.shape) for v in g.outputs],
                       len(g)) for g in before]  # undone
    configs = repo.configs()
    stage_1 = configs["llama_stage_1"]
    assert any(e.name.endswith("__om_rows") for e in stage_1.input)  # a shared table
    assert not any(list(e.dims) == [] for e in stage_1.input)  # the batch size is gone
    ids = torch.randint(0, 99, (5, 8), generator=torch.Generator().manual_seed(1))
    (got,) = run_ensemble(tmp_path / "repo", "llama", {"input_ids": ids.numpy()}).values()
    np.testing.assert_allclose(got, model(ids).detach().numpy(), rtol=1e-4, atol=1e-4)
    stages.save(tmp_path / "parts")  # the parts as they were, run at another batch size
    ids = ids[:3]
    np.testing.assert_allclose(om.SplitRunner(tmp_path / "parts").run(ids).numpy(),
                               model(ids).detach().numpy(), rtol=1e-4, atol=1e-4)


class BatchMean(nn.Module):
    """Each row plus the batch's mean row: the mean crosses the cut without a batch dim."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = (x * 2).mean(0)
        om.pipe_split()
        return torch.relu(x) + mean


@pytest.mark.slow
def test_a_cut_tensor_that_depends_on_the_request_keeps_the_parts_unbatched(tmp_path) -> None:
    stages = dynamic_batch(BatchMean(), (torch.randn(4, 3),))
    with pytest.warns(TritonBatchingWarning, match="depends on the request"):
        assert stages.save_triton(tmp_path / "repo").max_batch_size == 0
    with pytest.raises(om.OnnxModularError, match="depends on the request"):
        stages.save_triton(tmp_path / "repo", max_batch_size=4)


def rows_alone_match_stacked(repo: Path, ensemble: str, x: np.ndarray) -> float:
    """The largest difference between the rows of one stacked run of the written parts
    (in ONNX Runtime, as the configs wire them) and each row run alone."""
    (stacked,) = run_ensemble(repo, ensemble, {"x": x}).values()
    alone = np.concatenate([next(iter(run_ensemble(repo, ensemble, {"x": x[i:i + 1]})
                                      .values())) for i in range(len(x))])
    return float(np.abs(stacked - alone).max())


class RowMixing(nn.Module):
    """``x - x.mean(0)``: every row minus the mean of the batch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) - x.mean(0)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["sequence-first encoder", "x - x.mean(0)"])
def test_a_model_that_mixes_along_its_first_dimension_is_not_batched(case, tmp_path) -> None:
    """A dynamic first dimension that is not a batch (attention runs across a sequence-
    first encoder's; the mean crosses the batch): max_batch_size 0 with a note naming the
    op (and module), kept in the ensemble's config; asking to batch is one line."""
    if case == "x - x.mean(0)":
        model, x, op, module = RowMixing(), torch.randn(4, 3), "ReduceMean", None
        stages, first = dynamic_batch(model, (x,)), "batch"
    else:
        first = "seq"
        model = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0).eval()
        x, op, module = torch.randn(5, 3, 16), "MatMul", "'self_attn' (MultiheadAttention)"
        program = torch.export.export(model, (x,), strict=False,
                                      dynamic_shapes=({0: torch.export.Dim("seq", max=64)},))
        stages = om.split_stages(program, num_stages=1)
    with pytest.warns(TritonBatchingWarning, match=op):
        repo = stages.save_triton(tmp_path / "repo")
    assert repo.max_batch_size == 0
    assert repo.note.startswith("not batched (max_batch_size 0): ") and op in repo.note
    assert module is None or module in repo.note
    assert load_repository(tmp_path / "repo").note == repo.note  # in the ensemble's config
    name = stages.onnx_model.graph.inputs[0].name
    (got,) = run_ensemble(tmp_path / "repo", "model", {name: x.numpy()}).values()
    np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-4, atol=1e-4)
    for asked in ({"max_batch_size": 4}, {"batch_dim": first}):
        with pytest.raises(om.OnnxModularError) as error:
            stages.save_triton(tmp_path / "asked", **asked)
        assert "\n" not in str(error.value) and op in str(error.value)
        assert not (tmp_path / "asked").exists()
    if case == "sequence-first encoder":  # a name the program's Dims do not have
        with pytest.raises(om.OnnxModularError, match=r"are seq; none is named 'batch'"):
            stages.save_triton(tmp_path / "asked", batch_dim="batch")


class ConvMLP(nn.Module):
    """A conv net and an MLP head over a batch: every op keeps rows apart."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                  nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * 4 * 4, 8), nn.GELU(),
                                  nn.LayerNorm(8), nn.Linear(8, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        om.pipe_split()
        return self.head(h).softmax(-1)


@pytest.mark.slow
def test_a_batch_model_is_batched_and_stacked_rows_equal_rows_alone(tmp_path) -> None:
    model = ConvMLP().eval()
    x = torch.randn(3, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    stages = dynamic_batch(model, (x,))
    repo = stages.save_triton(tmp_path / "repo")
    assert repo.max_batch_size == DEFAULT_MAX_BATCH_SIZE and repo.note == ""
    assert len(repo.models) == 2
    big = torch.randn(6, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    assert rows_alone_match_stacked(tmp_path / "repo", "model", big.numpy()) < 1e-5
    (got,) = run_ensemble(tmp_path / "repo", "model", {"x": big.numpy()}).values()
    np.testing.assert_allclose(got, model(big).detach().numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # over the inner loop's session budget
def test_batch_dim_names_the_dim_it_was_given_for_not_the_first_axis(tmp_path) -> None:
    """``Dim("batch")`` at axis 1 of a sequence-first model: batch_dim="batch" took the
    first input's first axis (the sequence: torch.export renames both ``s<N>``), trusted what
    it could not follow, and Triton mixed requests along the sequence (23 of 24 answers
    wrong under concurrent requests)."""
    model = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0).eval()
    dims = {0: torch.export.Dim("seq", max=64), 1: torch.export.Dim("batch", max=64)}
    program = torch.export.export(model, (torch.randn(5, 3, 16),), strict=False,
                                  dynamic_shapes=(dims,))
    stages = om.split_stages(program, num_stages=1)
    with pytest.raises(om.OnnxModularError, match=r"has shape \['seq', 'batch', 16\], "
                       "without the batch dimension 'batch' first"):
        stages.save_triton(tmp_path / "repo", batch_dim="batch")
    assert not (tmp_path / "repo").exists()


class ScaledTotal(nn.Module):
    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x * scale).sum(), x * 2


def test_a_scalar_model_input_of_an_unbatched_set_is_refused_before_writing(tmp_path) -> None:
    """A 0-d model input or output was written as ``dims [1]`` reshaped to ``[]``, which
    Triton refuses in a model without batching: the repository did not load."""
    program = torch.export.export(ScaledTotal(), (torch.randn(3, 4), torch.tensor(2.0)),
                                  strict=False)
    stages = om.split_stages(program, num_stages=1)
    with pytest.raises(om.OnnxModularError, match="0-d model input or output"):
        stages.save_triton(tmp_path / "repo")
    assert not (tmp_path / "repo").exists()
