"""Export + save at scale, side by side: om.export vs torch.onnx.export(dynamo=True), a Llama
of the given size (random weights), external data; the disk's own speed (dd) as the floor.

Each side runs in a fresh process (peak RSS is per process); figures are printed as ratios.

    python scripts/bench_scale.py                         # small: fits CI's machine
    python scripts/bench_scale.py --hidden 2048 --layers 22 --intermediate 5632 \\
        --heads 32 --kv-heads 4 --vocab 32000             # TinyLlama's shape, 1.1 B params
    python scripts/bench_scale.py --memory ...            # peak RSS of validate and split
    python scripts/bench_scale.py --beyond-ram            # Llama-2-7B's shape, 27 GB fp32,
        # from a synthetic safetensors checkpoint: om.export/om.validate with weights=
        # (--layers/--hidden/... shrink it; --compare-layers shrinks the 1.1 B side by side)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def build(args: argparse.Namespace, device: str = "cpu"):  # type: ignore[no-untyped-def]
    """The Llama of the size flags with random weights; on ``meta``: without any."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=args.hidden, num_hidden_layers=args.layers,
                         intermediate_size=args.intermediate, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
                         use_cache=False, attn_implementation="eager",
                         tie_word_embeddings=False)
    with torch.device(device):
        model = LlamaForCausalLM(config).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, (torch.randint(0, args.vocab, (1, 16)),)


def private_peak_sampler() -> dict[str, int]:
    """Peak private (anonymous) memory, sampled every 20 ms from /proc (Linux): unlike
    RSS it leaves out pages mapped from files, which the kernel can drop and read again
    (ORT maps a large model's external weights instead of copying them)."""
    import threading

    peak = {"private": 0}

    def sample() -> None:
        while True:
            with open("/proc/self/status") as status:
                for line in status:
                    if line.startswith("RssAnon:"):
                        peak["private"] = max(peak["private"], int(line.split()[1]) * 1024)
            time.sleep(0.02)

    if os.path.exists("/proc/self/status"):
        threading.Thread(target=sample, daemon=True).start()
    return peak


def child(side: str, args: argparse.Namespace, out: Path) -> None:
    """One side in this process: build, export, save; print JSON figures."""
    import torch

    if side in ("weights", "materialized", "validate-weights"):
        checkpoint_child(side, args, out)
        return

    model, inputs = build(args)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    private = private_peak_sampler()
    start = time.perf_counter()
    if side in ("validate", "split"):
        import onnx_modular as om

        if side == "validate":
            report = om.validate(model, inputs, args.model, providers="cpu", localize=True)
            assert report.ok, report.summary()
        else:
            om.split_stages(model, inputs, num_stages=2).save(out / "parts")
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(json.dumps({"seconds": time.perf_counter() - start, "peak_rss": peak,
                          "peak_private": private["private"], "weights": weights}))
        return
    if side == "ours":
        import onnx_modular as om

        result = om.export(model, inputs)
        exported = time.perf_counter()
        result.save(out / "model.onnx", external_data_threshold=0)
        saved_once = time.perf_counter()
        # the same save again once the first is deleted: its page cache is freed, so the
        # second save writes into memory the machine has touched (see prefault_memory)
        for name in os.listdir(out):
            (out / name).unlink()
        again = time.perf_counter()
        result.save(out / "model.onnx", external_data_threshold=0)
        resave_s = time.perf_counter() - again
    else:
        program = torch.onnx.export(model, inputs, dynamo=True, optimize=True, verbose=False)
        exported = time.perf_counter()
        program.save(str(out / "model.onnx"), external_data=True)
    saved = time.perf_counter() if side != "ours" else saved_once
    written = sum(p.stat().st_size for p in out.iterdir())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"export_s": exported - start, "save_s": saved - exported,
                      "resave_s": resave_s if side == "ours" else None,
                      "bytes": written, "peak_rss": peak, "weights": weights}))


def checkpoint_child(side: str, args: argparse.Namespace, out: Path) -> None:
    """``weights``: om.export of the model built on meta, its weights from the checkpoint
    ``args.checkpoint``, then the save; ``materialized``: the same with random weights in
    memory; ``validate-weights``: om.validate of ``args.model`` against the meta model on
    the checkpoint. Each prints its time and peak private memory (``RssAnon``) as JSON."""
    import onnx_modular as om

    model, inputs = build(args, "cpu" if side == "materialized" else "meta")
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    private = private_peak_sampler()
    checkpoint = args.checkpoint if side != "materialized" else None
    start = time.perf_counter()
    if side == "validate-weights":
        report = om.validate(model, inputs, args.model, providers="cpu", weights=checkpoint)
        print(json.dumps({"seconds": time.perf_counter() - start, "ok": report.ok,
                          "summary": report.summary().splitlines()[-1],
                          "peak_private": private["private"], "weights": weights}))
        return
    result = om.export(model, inputs, weights=checkpoint)
    exported = time.perf_counter()
    result.save(out / "model.onnx", external_data_threshold=0)
    saved = time.perf_counter()
    print(json.dumps({"export_s": exported - start, "save_s": saved - exported,
                      "bytes": sum(p.stat().st_size for p in out.iterdir()),
                      "peak_private": private["private"], "weights": weights}))


def write_checkpoint(args: argparse.Namespace, directory: Path) -> int:
    """A synthetic checkpoint of the model's shape in the Hugging Face layout: a shard per
    decoder layer (and one for the rest) and ``model.safetensors.index.json``; each shard is
    made, written and let go before the next, so it is never held whole. Returns its bytes.
    Weights ~N(0, 0.02), norms 1: a forward pass stays finite through every layer."""
    import torch
    from safetensors.torch import save_file

    model, _ = build(args, "meta")
    groups: dict[str, list[str]] = {}
    for name in model.state_dict():
        layer = name.split(".")[2] if name.startswith("model.layers.") else "rest"
        groups.setdefault(layer, []).append(name)
    shapes = {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}
    del model
    directory.mkdir()
    generator = torch.Generator().manual_seed(0)
    weight_map, total = {}, 0
    for k, names in enumerate(groups.values()):
        file = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        shard = {}
        for name in names:
            shape, dtype = shapes[name]
            shard[name] = torch.ones(shape, dtype=dtype) if name.endswith("norm.weight") \
                else torch.randn(shape, generator=generator, dtype=dtype).mul_(0.02)
            total += shard[name].numel() * shard[name].element_size()
        save_file(shard, str(directory / file))
        del shard
        weight_map.update(dict.fromkeys(names, file))
    (directory / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    return total


def dd_speed(directory: Path, size: int) -> float:
    """Bytes per second this disk writes (dd, fdatasync at the end)."""
    target = directory / "dd.bin"
    block = 64 * 2**20
    count = max(1, size // block)
    start = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={target}", f"bs={block}", f"count={count}",
                    "conv=fdatasync"], check=True, capture_output=True)
    seconds = time.perf_counter() - start
    target.unlink()
    return count * block / seconds


def prefault_memory() -> None:
    """Touch most of the machine's memory once, in a process that then exits.

    On a virtual machine the host may back guest memory lazily: the first use of a page
    faults into the host. A 4.4 GB save from a process holding 5 GB first took 12.5 s,
    then 2.4 s, and 1.3 s after this (plain writes, no onnx_modular): without it, whichever
    side writes first pays the host, not its own code.
    """
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    code = f"import numpy as np; a = np.ones({int(total * 0.6)}, np.uint8); a[::4096].sum()"
    subprocess.run([sys.executable, "-c", code], check=True)


def run_side(side: str, argv: list[str], directory: Path, keep: bool = False
             ) -> dict[str, float]:
    out = directory / side
    out.mkdir()
    # Popen, not run: an interrupted benchmark stops its child before removing its files
    proc = subprocess.Popen([sys.executable, __file__, "--child", side, "--out", str(out),
                             *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        stdout, stderr = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        sys.exit(f"{side} failed:\n{stderr[-3000:]}")
    if not keep:
        shutil.rmtree(out)
    return json.loads(stdout.strip().splitlines()[-1])


def memory(argv: list[str], directory: Path) -> None:
    """Peak RSS and private memory of om.validate (localize=True) of the saved export, and
    of split_stages into two stages + save, each in a fresh process, over the weights'
    bytes."""
    run_side("ours", argv, directory, keep=True)
    model = str(directory / "ours" / "model.onnx")
    for side, extra in (("validate", ["--model", model]), ("split", [])):
        r = run_side(side, [*argv, *extra], directory)
        print(f"  {side:9s} {r['seconds']:7.1f} s  peak RSS {r['peak_rss'] / 1e9:5.2f} GB "
              f"({r['peak_rss'] / r['weights']:.2f}x weights); private "
              f"{r['peak_private'] / 1e9:5.2f} GB ({r['peak_private'] / r['weights']:.2f}x)")


def timed_copy(source: Path, target: Path) -> float:
    """Seconds ``cp -r`` takes (no sync, like the export's save)."""
    start = time.perf_counter()
    subprocess.run(["cp", "-r", str(source), str(target)], check=True)
    seconds = time.perf_counter() - start
    shutil.rmtree(target)
    return seconds


#: Llama-2-7B's shape (6.7 B parameters: 27 GB in fp32) and TinyLlama's (1.1 B, 4.4 GB).
LLAMA2_7B = {"hidden": 4096, "layers": 32, "intermediate": 11008, "heads": 32,
             "kv_heads": 32, "vocab": 32000}
TINYLLAMA = {"hidden": 2048, "layers": 22, "intermediate": 5632, "heads": 32,
             "kv_heads": 4, "vocab": 32000}


def shape_argv(shape: dict[str, int]) -> list[str]:
    return [x for k, v in shape.items() for x in (f"--{k.replace('_', '-')}", str(v))]


def beyond_ram(args: argparse.Namespace, given: dict[str, int]) -> None:
    """Export and validate a model larger than memory from its checkpoint; then TinyLlama's
    shape exported with and without ``weights=``, side by side."""
    shape = {**LLAMA2_7B, **given}
    params = (shape["vocab"] * shape["hidden"] * 2 + shape["hidden"] + shape["layers"] * (
        shape["hidden"] * shape["hidden"] * 2
        + 2 * shape["hidden"] * shape["hidden"] // shape["heads"] * shape["kv_heads"]
        + 3 * shape["hidden"] * shape["intermediate"] + 2 * shape["hidden"]))
    size = params * 4
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    root = Path(args.dir or tempfile.gettempdir())
    free = shutil.disk_usage(root).free
    needed = 2 * size + 2 * 2**30  # checkpoint + its copy (cp), later checkpoint + export
    print(f"Llama {shape}: {params / 1e9:.2f} B parameters, {size / 1e9:.1f} GB fp32; "
          f"memory {memory / 1e9:.1f} GB; free disk in {root}: {free / 1e9:.1f} GB, "
          f"this run needs {needed / 1e9:.1f} GB", flush=True)
    if free < needed:
        sys.exit("not enough free disk: give --dir on a larger disk, or shrink the model")
    argv = shape_argv(shape)
    # a kill (not only Ctrl-C) unwinds too, so the files below are removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench_scale_") as tmp:
        directory = Path(tmp)
        checkpoint = directory / "checkpoint"
        start = time.perf_counter()
        written = write_checkpoint(args_for(shape), checkpoint)
        print(f"  checkpoint written shard by shard: {written / 1e9:.1f} GB in "
              f"{time.perf_counter() - start:.0f} s", flush=True)
        copy_s = timed_copy(checkpoint, directory / "copy")
        print(f"  cp -r of the checkpoint: {copy_s:.1f} s", flush=True)
        ours = run_side("weights", [*argv, "--checkpoint", str(checkpoint)], directory,
                        keep=True)
        total = ours["export_s"] + ours["save_s"]
        print(f"  om.export(weights=) {ours['export_s']:.1f} s + save {ours['save_s']:.1f} s"
              f" = {total:.1f} s, {total / copy_s:.2f}x cp; peak private (RssAnon) "
              f"{ours['peak_private'] / 1e9:.2f} GB ({ours['peak_private'] / size:.3f}x the "
              "weights)", flush=True)
        check = run_side("validate-weights", [*argv, "--checkpoint", str(checkpoint),
                                              "--model", str(directory / "weights" /
                                                             "model.onnx")], directory)
        print(f"  om.validate(weights=), whole model, torch and ORT each on mapped weights: "
              f"{check['seconds']:.1f} s, peak private {check['peak_private'] / 1e9:.2f} GB "
              f"({check['peak_private'] / size:.3f}x); {check['summary']}", flush=True)
        shutil.rmtree(directory / "weights")
        shutil.rmtree(checkpoint)
        small = {**TINYLLAMA, **({"layers": args.compare_layers} if args.compare_layers
                                 else {})}
        small_argv = shape_argv(small)
        write_checkpoint(args_for(small), checkpoint)
        rows = [("in memory", run_side("materialized", small_argv, directory)),
                ("weights=", run_side("weights", [*small_argv, "--checkpoint",
                                                  str(checkpoint)], directory))]
        print(f"  TinyLlama's shape ({small['layers']} layers, "
              f"{rows[0][1]['weights'] / 1e9:.1f} GB):")
        for name, r in rows:
            print(f"    {name:10s} export {r['export_s']:6.1f} s  save {r['save_s']:6.1f} s  "
                  f"peak private {r['peak_private'] / 1e9:5.2f} GB "
                  f"({r['peak_private'] / r['weights']:.2f}x the weights)")
    print(f"  files removed: {not directory.exists()}")


def args_for(shape: dict[str, int]) -> argparse.Namespace:
    return argparse.Namespace(**shape)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    small = {"hidden": 256, "layers": 4, "intermediate": 704, "heads": 8, "kv_heads": 4,
             "vocab": 4000}
    for key in small:  # None: not given (--beyond-ram fills Llama-2-7B's shape instead)
        parser.add_argument(f"--{key.replace('_', '-')}", type=int, default=None)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--memory", action="store_true",
                        help="peak RSS of validate and split_stages instead")
    parser.add_argument("--beyond-ram", action="store_true",
                        help="Llama-2-7B's shape from a synthetic 27 GB checkpoint: "
                        "om.export/om.validate with weights= (needs ~2x its size on disk)")
    parser.add_argument("--compare-layers", type=int, default=None,
                        help="with --beyond-ram: layers of the TinyLlama side by side")
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS,
                        choices=["ours", "torch", "validate", "split", "weights",
                                 "materialized", "validate-weights"])
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    given = {k: getattr(args, k) for k in small if getattr(args, k) is not None}
    if args.beyond_ram and not args.child:
        beyond_ram(args, given)
        return
    for key, value in small.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.child:
        child(args.child, args, Path(args.out))
        return
    argv = [a for a in sys.argv[1:] if a != "--memory"]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        directory = Path(tmp)
        if args.memory:
            memory(argv, directory)
            return
        prefault_memory()
        ours = run_side("ours", argv, directory)
        before = dd_speed(directory, int(ours["bytes"]))
        theirs = run_side("torch", argv, directory)
        after = dd_speed(directory, int(ours["bytes"]))
    # the disk's speed swings run to run on a shared machine: the faster dd is the floor
    disk = max(before, after)
    gb = ours["weights"] / 1e9
    print(f"Llama hidden {args.hidden}, {args.layers} layers: {gb:.2f} GB of fp32 weights; "
          f"disk (dd, fdatasync) {before / 1e6:.0f} and {after / 1e6:.0f} MB/s")
    for name, r in (("om.export", ours), ("torch.onnx", theirs)):
        print(f"  {name:11s} export {r['export_s']:7.1f} s  save {r['save_s']:7.1f} s "
              f"({r['bytes'] / r['save_s'] / 1e6:5.0f} MB/s)  peak RSS "
              f"{r['peak_rss'] / 1e9:5.2f} GB ({r['peak_rss'] / r['weights']:.2f}x weights)")
    total_ours = ours["export_s"] + ours["save_s"]
    total_theirs = theirs["export_s"] + theirs["save_s"]
    print(f"  om.export's save again, first one deleted: {ours['resave_s']:.1f} s "
          f"({ours['bytes'] / ours['resave_s'] / 1e6:.0f} MB/s), "
          f"{ours['resave_s'] / (ours['bytes'] / disk):.2f}x the disk's time")
    print(f"  save vs dd: {ours['save_s'] / (ours['bytes'] / disk):.2f}x the disk's time; "
          f"export+save ours/torch.onnx: {total_ours / total_theirs:.2f}x; "
          f"export alone: {ours['export_s'] / theirs['export_s']:.2f}x")


if __name__ == "__main__":
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    main()
