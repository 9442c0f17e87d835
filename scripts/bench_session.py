"""What drives ONNX Runtime's session creation on hierarchical models: GPT-2 (24 layers) as
flat and hierarchical exports, and the hierarchical one with one thing taken away at a time
(node metadata, value_info inside functions, nesting levels), interleaved, best of N.

    python scripts/bench_session.py [--layers 24] [--repeat 7]
"""

from __future__ import annotations

import argparse
import time
import warnings

import onnx
import onnxruntime as ort
import torch

import onnx_modular as om

warnings.filterwarnings("ignore")


def gpt2(layers: int) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, n_embd=64, n_head=4, vocab_size=99, n_positions=64,
                        use_cache=False, attn_implementation="eager")
    return GPT2Model(config).eval(), (torch.randint(0, 99, (1, 16)),)


def copy(proto: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    return out


def without_metadata(proto: onnx.ModelProto) -> onnx.ModelProto:
    out = copy(proto)
    for node in [*out.graph.node, *(n for f in out.functions for n in f.node)]:
        del node.metadata_props[:]
    for function in out.functions:
        del function.metadata_props[:]
    return out


def without_function_value_info(proto: onnx.ModelProto) -> onnx.ModelProto:
    out = copy(proto)
    for function in out.functions:
        del function.value_info[:]
    return out


def creation_seconds(data: bytes, feeds: dict) -> float:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    start = time.perf_counter()
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    seconds = time.perf_counter() - start
    session.run(None, feeds)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    model, inputs = gpt2(args.layers)
    hierarchical = om.export(model, inputs).model_proto
    variants = {
        "flat (om.export functions='none')": om.export(model, inputs,
                                                       functions="none").model_proto,
        "hierarchical (all levels)": hierarchical,
        "  without node metadata": without_metadata(hierarchical),
        "  without value_info in functions": without_function_value_info(hierarchical),
        "  without both": without_function_value_info(without_metadata(hierarchical)),
        "one level (functions=['GPT2Block'])": om.export(model, inputs,
                                                         functions=["GPT2Block"]).model_proto,
    }
    data = {name: proto.SerializeToString() for name, proto in variants.items()}
    feeds = {"input_ids": inputs[0].numpy()}
    best = dict.fromkeys(data, float("inf"))
    for blob in data.values():  # warm-up
        creation_seconds(blob, feeds)
    for _ in range(args.repeat):
        for name, blob in data.items():
            best[name] = min(best[name], creation_seconds(blob, feeds))
    flat = best["flat (om.export functions='none')"]
    print(f"ORT session creation, GPT-2 x{args.layers}, best of {args.repeat} interleaved")
    for name, seconds in best.items():
        print(f"{name:38s} {seconds * 1000:7.1f} ms  {seconds / flat:5.2f}x flat")


if __name__ == "__main__":
    main()
