"""Repositories written by ``save_triton``, served by a real Triton Inference Server.

One server (explicit model control, 127.0.0.1, a free port) serves one repository into
which every test model is saved under its own name, exactly as written; each test loads
the ensembles it calls. Skipped where the server (``nvidia-pytriton``) or the onnxruntime
backend (``../shared/triton``) is missing.
"""

from __future__ import annotations

import models
import numpy as np
import pytest
import torch
import triton_server

import onnx_modular as om
from onnx_modular.cli import main
from onnx_modular.parts.triton import DEFAULT_MAX_BATCH_SIZE, TritonBatchingWarning
from onnx_modular.parts.triton_runner import request_inputs as request

pytestmark = [pytest.mark.slow,  # a real server: the full suite, not the inner loop
              pytest.mark.skipif(triton_server.missing() is not None,
                                 reason=str(triton_server.missing()))]

TOL = 1e-4


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A running server over an (initially empty) repository."""
    root = tmp_path_factory.mktemp("triton")
    backends = triton_server.backend_dir(root / "backends")
    repo = root / "repo"
    repo.mkdir()
    with triton_server.running(repo, backends, root / "server.log") as running:
        running.repo = repo
        running.root = root
        yield running


@pytest.fixture(scope="module")
def saved(server):
    """Ensemble name -> (model, args, parts), every one saved into the server's repository:
    2 and 4 stages of GPT-2 and Llama (4 blocks each) and GPT-2's acc/CPU regions."""
    out = {}
    for family, build in (("gpt2", models.gpt2), ("llama", models.llama)):
        model, args = build(layers=4)
        program = om.capture(model, args)
        for n in (2, 4):
            out[f"{family}_{n}st"] = model, args, om.split_stages(program, num_stages=n)
        if family == "gpt2":
            out["gpt2_split"] = model, args, om.split(
                program, support=om.OperatorSupport(deny=["onnx::Softmax"]))
    for name, (_, _, parts) in out.items():
        parts.save_triton(server.repo, name=name)
    return out


def outputs(result) -> dict[str, np.ndarray]:
    return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}


def infer(client, ensemble: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return outputs(client.infer(ensemble, request(arrays)))


@pytest.mark.parametrize("ensemble", ["gpt2_2st", "gpt2_4st", "llama_2st", "llama_4st",
                                      "gpt2_split"])
def test_repository_loads_as_written_and_answers_like_torch(server, saved, ensemble) -> None:
    model, args, parts = saved[ensemble]
    client = server.client()
    client.load_model(ensemble)  # and, being an ensemble, every model it calls
    assert client.is_model_ready(ensemble)
    steps = client.get_model_config(ensemble)["ensemble_scheduling"]["step"]
    assert len(steps) == len([r for r in parts.region_graphs() if r.model.graph.outputs])
    for step in steps:  # KIND_AUTO became CPU instances on this host; CPU regions are CPU
        config = client.get_model_config(step["model_name"])
        assert [g["kind"] for g in config["instance_group"]] == ["KIND_CPU"]
        assert config["max_batch_size"] == 0  # a static export
    (got,) = infer(client, ensemble, {"input_ids": args[0].numpy()}).values()
    np.testing.assert_allclose(got, model(*args).detach().numpy(), rtol=TOL, atol=TOL)
    client.close()


def test_concurrent_requests_are_batched_by_the_server(server) -> None:
    """GPT-2 exported with a dynamic batch dimension, in 2 stages: max_batch_size > 0, the
    batch left out of dims, dynamic_batching on; concurrent requests of 1 to 3 rows run in
    fewer executions than requests, each answer equal to torch's for that request."""
    import tritonclient.http as http

    model, args = models.gpt2(layers=2)
    batch = torch.export.Dim("batch", max=64)
    program = torch.export.export(model, args, dynamic_shapes=({0: batch},), strict=False)
    stages = om.split_stages(program, num_stages=2)
    # a request waits up to 20 ms for others (with 0, only requests queued while an
    # instance is busy are batched: on a model this small, few)
    repo = stages.save_triton(server.repo, name="gpt2_batched", max_queue_delay_us=20_000,
                              batch_dim="batch")  # its mask indexes by row: not provable
    assert repo.max_batch_size == DEFAULT_MAX_BATCH_SIZE
    config = repo.configs()["gpt2_batched_stage_0"]
    assert config.HasField("dynamic_batching") and list(config.input[0].dims) == [8]
    client = http.InferenceServerClient(server.url, concurrency=16)
    client.load_model("gpt2_batched")
    requests = [torch.randint(0, 99, (1 + i % 3, 8), generator=torch.Generator().manual_seed(i))
                .numpy() for i in range(24)]
    # 16 in flight at a time (the client's greenlets, which run while get_result waits)
    pending = [client.async_infer("gpt2_batched", request({"input_ids": x})) for x in requests]
    results = [outputs(call.get_result()) for call in pending]
    for x, result in zip(requests, results):
        (got,) = result.values()
        np.testing.assert_allclose(got, model(torch.from_numpy(x)).detach().numpy(),
                                   rtol=TOL, atol=TOL)
    stats = {s["name"]: s for s in client.get_inference_statistics()["model_stats"]}
    for name in repo.models:
        assert stats[name]["inference_count"] == sum(len(x) for x in requests)
        assert stats[name]["execution_count"] < len(requests), stats[name]
    # the same parts unbatched: the batch size crosses the cut as a scalar (dims [1],
    # reshaped to []), and any batch size is taken
    stages.save_triton(server.repo, name="gpt2_unbatched", max_batch_size=0)
    client.load_model("gpt2_unbatched")
    (got,) = infer(client, "gpt2_unbatched", {"input_ids": requests[2]}).values()
    np.testing.assert_allclose(got, model(torch.from_numpy(requests[2])).detach().numpy(),
                               rtol=TOL, atol=TOL)
    client.close()


def test_two_servers_chain_the_stages_like_split_runner(server, saved, tmp_path) -> None:
    """Stage 0 on the shared server, stage 1 on a second one: the runner's outputs are
    SplitRunner's; a server holding another save's model is refused."""
    model, args, stages = saved["gpt2_2st"]
    stages.save(tmp_path / "parts")
    expected = om.SplitRunner(tmp_path / "parts").run(*args)
    server.client().load_model("gpt2_2st_stage_0")
    with triton_server.running(server.repo, server.root / "backends", tmp_path / "b.log",
                               models=["gpt2_2st_stage_1"]) as second:
        runner = om.TritonRunner(server.repo, name="gpt2_2st",
                                 endpoints={"stage_0": server.url, "stage_1": second.url})
        got = runner.run(*args)
        assert isinstance(got, torch.Tensor)
        np.testing.assert_array_equal(got.numpy(), expected.numpy())
        np.testing.assert_allclose(got.numpy(), model(*args).detach().numpy(),
                                   rtol=TOL, atol=TOL)
        runner.close()
        np.savez(tmp_path / "in.npz", input_ids=args[0].numpy())  # the same from the CLI
        assert main(["triton-run", str(server.repo), str(tmp_path / "in.npz"), "--name",
                     "gpt2_2st", "--endpoint", f"stage_0={server.url}", "--endpoint",
                     second.url, "-o", str(tmp_path / "out.npz")]) == 0
        with np.load(tmp_path / "out.npz") as written:
            np.testing.assert_array_equal(written[written.files[0]], expected.numpy())
        # saved again: the servers still hold the first save, which the runner refuses
        stages.save_triton(server.repo, name="gpt2_2st")
        stale = om.TritonRunner(server.repo, name="gpt2_2st",
                                endpoints={"stage_0": server.url, "*": second.url})
        with pytest.raises(om.OnnxModularError, match="another save"):
            stale.run(*args)
        stale.close()


class ConvHead(torch.nn.Module):
    """Conv, pool, flatten, linear, layer norm, softmax: a batch every op keeps apart."""

    def __init__(self) -> None:
        super().__init__()
        nn = torch.nn
        self.conv = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.LayerNorm(8),
                                  nn.Linear(8, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        om.pipe_split()
        return self.head(h).softmax(-1)


def test_a_proven_batch_is_batched_and_concurrent_requests_answer_like_torch(server) -> None:
    import tritonclient.http as http

    model = ConvHead().eval()
    x = torch.randn(2, 3, 8, 8)
    program = torch.export.export(model, (x,), strict=False,
                                  dynamic_shapes=({0: torch.export.Dim("batch", max=64)},))
    repo = om.split_stages(program).save_triton(server.repo, name="conv_batched",
                                                max_queue_delay_us=20_000)
    assert repo.max_batch_size == DEFAULT_MAX_BATCH_SIZE and repo.note == ""
    client = http.InferenceServerClient(server.url, concurrency=16)
    client.load_model("conv_batched")
    requests = [torch.randn(1 + i % 3, 3, 8, 8, generator=torch.Generator().manual_seed(i))
                .numpy() for i in range(24)]
    pending = [client.async_infer("conv_batched", request({"x": r})) for r in requests]
    for r, call in zip(requests, pending):
        (got,) = outputs(call.get_result()).values()
        np.testing.assert_allclose(got, model(torch.from_numpy(r)).detach().numpy(),
                                   rtol=TOL, atol=TOL)
    stats = {s["name"]: s for s in client.get_inference_statistics()["model_stats"]}
    for name in repo.models:
        assert stats[name]["execution_count"] < len(requests), stats[name]
    client.close()


def test_a_sequence_first_encoder_is_not_batched_and_answers_each_request(server) -> None:
    """Its dynamic first dimension is the sequence: attention runs across it, so the set is
    not batched; concurrent requests of different lengths (12 tokens too) each get torch's
    answer."""
    import tritonclient.http as http

    model = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0).eval()
    program = torch.export.export(model, (torch.randn(5, 3, 16),), strict=False,
                                  dynamic_shapes=({0: torch.export.Dim("seq", max=64)},))
    with pytest.warns(TritonBatchingWarning, match="MatMul"):
        repo = om.split_stages(program, num_stages=1).save_triton(server.repo, name="enc")
    assert repo.max_batch_size == 0 and "self_attn" in repo.note
    client = http.InferenceServerClient(server.url, concurrency=8)
    client.load_model("enc")
    assert client.get_model_config("enc_stage_0")["max_batch_size"] == 0
    requests = [torch.randn(3 + i, 3, 16, generator=torch.Generator().manual_seed(i)).numpy()
                for i in range(10)]  # 3 to 12 tokens
    pending = [client.async_infer("enc", request({"src": r})) for r in requests]
    for r, call in zip(requests, pending):
        (got,) = outputs(call.get_result()).values()
        np.testing.assert_allclose(got, model(torch.from_numpy(r)).detach().numpy(),
                                   rtol=TOL, atol=TOL)
    client.close()


class RowScores(torch.nn.Module):
    """A per-row scalar in (``weights``, ``[batch]``) and out (the sum, ``[batch]``)."""

    def forward(self, x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x * weights[:, None]).sum(-1), x.argmax(-1)


def test_per_row_scalars_load_and_answer_as_batch_by_one(server) -> None:
    """``[batch]`` tensors were ``dims: [1]`` reshaped to ``[]`` in the ensemble too, and
    Triton refused the ensemble (``[-1]`` against the step's ``[-1, 1]``). The ensemble
    takes and gives them as ``[batch, 1]``; its steps see ``[batch]``."""
    batch = torch.export.Dim("batch", max=64)
    x, w = torch.randn(3, 4), torch.randn(3)
    program = torch.export.export(RowScores(), (x, w), strict=False,
                                  dynamic_shapes=({0: batch}, {0: batch}))
    repo = om.split_stages(program).save_triton(server.repo, name="row_scores")
    assert repo.max_batch_size > 0
    client = server.client()
    client.load_model("row_scores")
    got = infer(client, "row_scores", {"x": x.numpy(), "weights": w.numpy()[:, None]})
    total, best = RowScores()(x, w)
    names = list(program.graph_signature.user_outputs)
    np.testing.assert_allclose(got[names[0]], total.numpy()[:, None], rtol=TOL, atol=TOL)
    np.testing.assert_array_equal(got[names[1]], best.numpy()[:, None])
    client.close()
