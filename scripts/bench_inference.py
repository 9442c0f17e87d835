"""Inference on ONNX Runtime: the hierarchical file against torch.onnx's flat one, per
execution provider (CPU here; CUDA where onnxruntime-gpu and a GPU are present).

For each model, static and dynamic (batch, sequence) shapes: both files' outputs against
torch eager (at the example's size, and at another size for the dynamic files), then the
run time of one inference, interleaved rounds, median; the ratio hierarchical / flat.
ORT inlines every local function at load and optimizes the result, so equal graphs after
its optimization (``bench_ort_parity.py``) should run at equal speed: this says whether they do.

The two halves run apart, so the files can be made where torch is and timed where the GPU is:

    python scripts/bench_inference.py                        # export, check, time (CPU)
    python scripts/bench_inference.py --save DIR             # export + torch's outputs
    python scripts/bench_inference.py --load DIR --providers cuda,cpu   # onnxruntime only
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
MODELS = ["gpt2", "llama", "bert", "vit", "gpt2_wide"]
#: Largest |ONNX Runtime - torch| accepted, per provider (CUDA may use TF32 in MatMul).
TOLERANCE = {"CPUExecutionProvider": 1e-4, "CUDAExecutionProvider": 5e-3}


def _build(name: str, layers: int) -> tuple[object, tuple]:
    """Weights perturbed as in a trained model: with a config's zero biases torch.onnx's
    optimizer drops each Gemm's bias, which a function body cannot (its bias is an input),
    and GPT-2 on CUDA then runs 1.07-1.14x slower for that alone."""
    import torch

    from tests import models

    if name != "gpt2_wide":
        model, inputs = getattr(models, name)(layers)
        return models.trained(model), inputs
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, n_embd=160, n_head=8, vocab_size=512,
                        n_positions=128, use_cache=False, attn_implementation="eager")
    return models.trained(GPT2Model(config).eval()), (torch.randint(0, 512, (2, 32)),)


def _other_size(inputs: tuple) -> tuple:
    """The example's inputs at another batch (and sequence) size, same value ranges."""
    import torch

    first = inputs[0]
    if first.dtype.is_floating_point:
        return (torch.randn(3, *first.shape[1:]),)
    return (torch.randint(0, int(first.max()) + 1, (3, first.shape[1] + 3)),)


def _eager(model: object, inputs: tuple) -> list[np.ndarray]:
    import torch

    from onnx_modular.leaves._compat import tree_leaves

    with torch.no_grad():
        out = model(*inputs)
    return [t.numpy() for t in tree_leaves(out) if isinstance(t, torch.Tensor)]


def save(directory: Path, names: list[str], layers: int) -> None:
    """Export each model twice (om.export, torch.onnx flat), static and dynamic, and store
    the inputs and torch's outputs beside the files."""
    import logging
    import warnings

    import torch

    import onnx_modular as om
    from onnx_modular.lower.translate import quiet_torch_onnx

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from bench_ort_parity import _dynamic_shapes

    directory.mkdir(parents=True, exist_ok=True)
    cases = []
    for name in names:
        model, inputs = _build(name, layers)
        for dynamic in (False, True):
            case = f"{name}_{'dynamic' if dynamic else 'static'}"
            shapes = _dynamic_shapes(inputs) if dynamic else None
            om.export(model, inputs, dynamic_shapes=shapes).save(directory / f"{case}_hier.onnx")
            with quiet_torch_onnx(), torch.no_grad():
                torch.onnx.export(model, inputs, dynamic_shapes=shapes,
                                  dynamo=True).save(str(directory / f"{case}_flat.onnx"))
            sizes = [inputs, _other_size(inputs)] if dynamic else [inputs]
            for i, feed in enumerate(sizes):
                np.savez(directory / f"{case}_{i}.npz",
                         **{f"in{k}": t.numpy() for k, t in enumerate(feed)},
                         **{f"out{k}": a for k, a in enumerate(_eager(model, feed))})
            cases.append({"case": case, "sizes": len(sizes)})
            print(f"saved {case}", flush=True)
    (directory / "cases.json").write_text(json.dumps(cases, indent=1))


def _session(path: Path, provider: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    providers = [provider] if provider == "CPUExecutionProvider" else [provider,
                                                                        "CPUExecutionProvider"]
    session = ort.InferenceSession(str(path), options, providers=providers)
    if session.get_providers()[0] != provider:
        raise RuntimeError(f"{path.name}: {provider} did not start "
                           f"(session runs on {session.get_providers()})")
    return session


def _feeds(session: ort.InferenceSession, data: np.lib.npyio.NpzFile) -> dict:
    return {i.name: data[f"in{k}"] for k, i in enumerate(session.get_inputs())}


def _max_diff(session: ort.InferenceSession, data: np.lib.npyio.NpzFile) -> float:
    got = session.run(None, _feeds(session, data))
    expected = [data[k] for k in sorted((k for k in data.files if k.startswith("out")),
                                        key=lambda k: int(k[3:]))]
    if len(got) != len(expected):
        raise RuntimeError(f"{len(got)} outputs, torch gave {len(expected)}")
    return max(float(np.max(np.abs(g.astype(np.float64) - e))) if g.size else 0.0
               for g, e in zip(got, expected))


def _per_run_seconds(session: ort.InferenceSession, feeds: dict, runs: int) -> float:
    start = time.perf_counter()
    for _ in range(runs):
        session.run(None, feeds)
    return (time.perf_counter() - start) / runs


def load(directory: Path, providers: list[str], rounds: int, runs: int) -> bool:
    """Check and time the saved files on each provider; False when any output is off."""
    cases = json.loads((directory / "cases.json").read_text())
    if "CUDAExecutionProvider" in providers and hasattr(ort, "preload_dlls"):
        ort.preload_dlls()  # CUDA and cuDNN from the nvidia-* wheels, where torch is not loaded
    ok = True
    print(f"onnxruntime {ort.__version__}, available: {ort.get_available_providers()}")
    print(f"{'case':>16} {'provider':>5} {'max |diff| hier':>15} {'flat':>9} "
          f"{'hier ms':>8} {'flat ms':>8} {'ratio':>6}")
    ratios: dict[str, list[float]] = {p: [] for p in providers}
    for entry in cases:
        case = entry["case"]
        data = [np.load(directory / f"{case}_{i}.npz") for i in range(entry["sizes"])]
        for provider in providers:
            hier = _session(directory / f"{case}_hier.onnx", provider)
            flat = _session(directory / f"{case}_flat.onnx", provider)
            diffs = [max(_max_diff(s, d) for d in data) for s in (hier, flat)]
            good = diffs[0] <= TOLERANCE[provider]
            ok = ok and good
            feeds = _feeds(hier, data[0]), _feeds(flat, data[0])
            for session, feed in zip((hier, flat), feeds):
                _per_run_seconds(session, feed, runs)  # warm-up
            times: tuple[list[float], list[float]] = ([], [])
            for _ in range(rounds):
                times[0].append(_per_run_seconds(hier, feeds[0], runs))
                times[1].append(_per_run_seconds(flat, feeds[1], runs))
            h, f = statistics.median(times[0]), statistics.median(times[1])
            ratios[provider].append(h / f)
            short = provider.removesuffix("ExecutionProvider")
            print(f"{case:>16} {short:>5} {diffs[0]:>15.2e} {diffs[1]:>9.2e} {h * 1e3:>8.3f} "
                  f"{f * 1e3:>8.3f} {h / f:>5.2f}x{'' if good else '  OUTPUTS DIFFER'}",
                  flush=True)
    for provider, values in ratios.items():
        if values:
            print(f"{provider}: median ratio {statistics.median(values):.2f}x over "
                  f"{len(values)} files (min {min(values):.2f}x, max {max(values):.2f}x)")
    print("all outputs match torch" if ok else "SOME OUTPUTS DIFFER FROM TORCH")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--providers", default="cpu", help="cpu,cuda")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--runs", type=int, default=20, help="inferences per timed round")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--save", type=Path, help="export into this folder, time nothing")
    where.add_argument("--load", type=Path, help="check and time the files saved here")
    args = parser.parse_args()
    providers = [PROVIDERS.get(p.strip().lower(), p.strip())
                 for p in args.providers.split(",")]
    if args.save:
        save(args.save, args.models, args.layers)
        return
    if args.load:
        sys.exit(0 if load(args.load, providers, args.rounds, args.runs) else 1)
    with tempfile.TemporaryDirectory() as tmp:
        save(Path(tmp), args.models, args.layers)
        sys.exit(0 if load(Path(tmp), providers, args.rounds, args.runs) else 1)


if __name__ == "__main__":
    main()
