"""Serving the stages of a GPT-2 on a real Triton server (CPU): latency per request and
batched throughput, as written by ``save_triton`` and loaded without edits.

1. Latency: one request at a time (batch 2), the median and 90th percentile of ``--requests``
   after a warm-up: SplitRunner in this process (2 stages), the Triton ensemble of the 2- and
   4-stage repository on one server, and the 2 stages on two servers chained by
   TritonRunner (the border tensors go through the client).
2. Throughput: ``--concurrent`` requests of one row in flight at a time (``--requests``
   in all) on the 2-stage ensemble of a dynamic-batch export: unbatched
   (``max_batch_size=0``) vs batched (``max_batch_size=8``, with ``max_queue_delay_us`` 0 and
   ``--delay``), with the executions per stage the server counted.

Needs what the Triton tests need (``pip install --no-deps nvidia-pytriton==0.7.0``,
``tritonclient[http]``, ``../shared/triton``).
Usage: python scripts/bench_triton.py [--layers 8] [--dim 256] [--seq 64] [--requests 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import triton_server
from bench_validate import gpt2

import onnx_modular as om
from onnx_modular.parts.triton_runner import request_inputs as request

warnings.filterwarnings("ignore")


def latency(fn, n: int) -> tuple[float, float]:
    """Median and 90th percentile of ``n`` calls in ms, after 5 warm-up calls."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return statistics.median(times), times[int(0.9 * (len(times) - 1))]


def throughput(url: str, model: str, rows: list[np.ndarray], concurrent: int
               ) -> tuple[float, dict[str, int]]:
    """Requests per second with ``concurrent`` in flight, and executions per model."""
    import tritonclient.http as http

    client = http.InferenceServerClient(url, concurrency=concurrent, network_timeout=300)
    for x in rows[:concurrent]:  # warm-up
        client.infer(model, request({"input_ids": x}))
    time.sleep(0.5)  # the server counts an execution a moment after it answers
    before = {s["name"]: s["execution_count"]
              for s in client.get_inference_statistics()["model_stats"]}
    start = time.perf_counter()
    pending = [client.async_infer(model, request({"input_ids": x})) for x in rows]
    for call in pending:
        call.get_result()
    elapsed = time.perf_counter() - start
    after = {s["name"]: s["execution_count"]
             for s in client.get_inference_statistics()["model_stats"]}
    client.close()
    return len(rows) / elapsed, {k: after[k] - before.get(k, 0) for k in after
                                 if k.startswith(f"{model}_") and after[k] != before.get(k, 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrent", type=int, default=16)
    parser.add_argument("--delay", type=int, default=2000, help="max_queue_delay_us")
    opts = parser.parse_args()
    why = triton_server.missing()
    if why:
        sys.exit(why)
    model, args = gpt2(opts.layers, opts.dim, opts.seq)
    params = sum(p.numel() for p in model.parameters())
    print(f"GPT-2 (transformers), {opts.layers} layers, hidden {opts.dim}, seq {opts.seq}, "
          f"{params / 1e6:.1f} M parameters; CPU, {torch.get_num_threads()} torch threads")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        repo = root / "repo"
        stages = {}
        for n in (2, 4):
            stages[n] = om.split_stages(model, args, num_stages=n)
            stages[n].save_triton(repo, name=f"gpt2_{n}st")
        stages[2].save(root / "parts")
        batch_dim = torch.export.Dim("batch", max=64)
        program = torch.export.export(model, args, dynamic_shapes=({0: batch_dim},),
                                      strict=False)
        dynamic = om.split_stages(program, num_stages=2)
        dynamic.save_triton(repo, name="unbatched", max_batch_size=0)
        dynamic.save_triton(repo, name="batched")
        dynamic.save_triton(repo, name="batched_delay", max_queue_delay_us=opts.delay)
        backends = triton_server.backend_dir(root / "backends")
        ids = args[0].numpy()
        runner = om.SplitRunner(root / "parts")
        rows = [np.random.default_rng(i).integers(0, 128, (1, opts.seq)) for i in
                range(opts.requests)]
        with triton_server.running(repo, backends, root / "a.log", models=[
                "gpt2_2st", "gpt2_4st", "unbatched", "batched", "batched_delay"]) as a, \
                triton_server.running(repo, backends, root / "b.log",
                                      models=["gpt2_2st_stage_1"]) as b:
            client = a.client()
            print("\nLatency per request (batch 2), ms: median / p90")
            rows_out = [
                ("SplitRunner, 2 stages (in process)", lambda: runner.run(ids)),
                ("Triton ensemble, 2 stages", lambda: client.infer(
                    "gpt2_2st", request({"input_ids": ids}))),
                ("Triton ensemble, 4 stages", lambda: client.infer(
                    "gpt2_4st", request({"input_ids": ids}))),
            ]
            chain = om.TritonRunner(repo, name="gpt2_2st",
                                    endpoints={"stage_0": a.url, "stage_1": b.url})
            rows_out.append(("TritonRunner, 2 stages on 2 servers", lambda: chain.run(ids)))
            for label, fn in rows_out:
                median, p90 = latency(fn, opts.requests)
                print(f"  {label:40s} {median:7.2f} / {p90:7.2f}")
            chain.close()
            client.close()
            print(f"\nThroughput, {opts.requests} requests of 1 row, {opts.concurrent} in "
                  "flight (2 stages, dynamic-batch export)")
            for label, name in (("unbatched (max_batch_size 0)", "unbatched"),
                                ("batched (8), max_queue_delay 0", "batched"),
                                (f"batched (8), max_queue_delay {opts.delay} us",
                                 "batched_delay")):
                rate, executions = throughput(a.url, name, rows, opts.concurrent)
                print(f"  {label:40s} {rate:7.1f} requests/s; executions per stage "
                      f"{sorted(executions.values())}")


if __name__ == "__main__":
    main()
