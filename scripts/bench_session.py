"""What drives ONNX Runtime's session creation on hierarchical models: GPT-2 (24 layers) as
torch.onnx's flat export and ours, the hierarchical file with one thing taken away at a
time (node metadata, value_info inside functions), with the hierarchy cut to fewer levels
(``functions=``), and inlined beforehand (its per-call constants left as Constant nodes, made
initializers one per call, or shared), interleaved, best of N; ratios to torch.onnx's flat
file.

ORT inlines local functions one nesting level per pass (GraphPartitioner::InlineFunctionsAOT),
resolving the whole graph after each (type inference re-runs every body still called), and
each call's Constant nodes become initializers of their own.

    python scripts/bench_session.py [--layers 24] [--repeat 7]
"""

from __future__ import annotations

import argparse
import time
import warnings

import onnx
import onnx.inliner
import onnx.numpy_helper
import onnxruntime as ort
import torch

import onnx_modular as om
from onnx_modular.lower.translate import quiet_torch_onnx

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


def inlined(proto: onnx.ModelProto) -> onnx.ModelProto:
    return onnx.inliner.inline_local_functions(copy(proto))


def shared_constants(proto: onnx.ModelProto, share: bool = True) -> onnx.ModelProto:
    """Constant nodes of the main graph as initializers, one per distinct value (what the
    flat file holds), or with ``share=False`` one per node (what ORT makes of each call's
    constants when it inlines)."""
    out = copy(proto)
    graph, first, rename, keep = out.graph, {}, {}, []
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute[0].name == "value":
            array = onnx.numpy_helper.to_array(node.attribute[0].t)
            key = (array.dtype.str, array.shape, array.tobytes())
            if share and key in first:
                rename[node.output[0]] = first[key]
            else:
                first[key] = node.output[0]
                graph.initializer.append(onnx.numpy_helper.from_array(array, node.output[0]))
            continue
        keep.append(node)
    for node in keep:
        for i, name in enumerate(node.input):
            node.input[i] = rename.get(name, name)
    del graph.node[:]
    graph.node.extend(keep)
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
    with quiet_torch_onnx(), torch.no_grad():
        flat = torch.onnx.export(model, inputs, dynamo=True).model_proto
    hierarchical = om.export(model, inputs).model_proto
    variants = {
        "torch.onnx flat": flat,
        "om.export functions='none' (flat)": om.export(model, inputs,
                                                       functions="none").model_proto,
        "hierarchical (functions='all')": hierarchical,
        "  without node metadata": without_metadata(hierarchical),
        "  without value_info in functions": without_function_value_info(hierarchical),
        "  inlined by onnx.inliner first": inlined(hierarchical),
        "  inlined, constants as initializers": shared_constants(inlined(hierarchical),
                                                                 share=False),
        "  inlined, constants shared": shared_constants(inlined(hierarchical)),
    }
    for functions in (["GPT2Block"], ["Conv1D"], ["GPT2Block", "GPT2Attention"],
                      ["GPT2Block", "GPT2Attention", "Conv1D"]):
        variants[f"functions={functions}"] = om.export(model, inputs,
                                                       functions=functions).model_proto
    data = {name: proto.SerializeToString() for name, proto in variants.items()}
    feeds = {"input_ids": inputs[0].numpy()}
    best = dict.fromkeys(data, float("inf"))
    for blob in data.values():  # warm-up
        creation_seconds(blob, feeds)
    for _ in range(args.repeat):
        for name, blob in data.items():
            best[name] = min(best[name], creation_seconds(blob, feeds))
    reference = best["torch.onnx flat"]
    print(f"ORT session creation, GPT-2 x{args.layers}, best of {args.repeat} interleaved")
    for name, seconds in best.items():
        proto = variants[name]
        nodes = len(proto.graph.node) + sum(len(f.node) for f in proto.functions)
        print(f"{name:52s} {seconds * 1000:7.1f} ms  {seconds / reference:5.2f}x  "
              f"({nodes} nodes in the file)")


if __name__ == "__main__":
    main()
