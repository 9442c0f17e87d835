"""Support in the user's terms: ONNX op names in allow/deny lists, unmatched entries as
warnings that say where the op hides, previews that say why, and no denied op in any
accelerator model, function bodies included, whatever the optimizer rewrites."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from models import LastHidden
from models import token_ids as _ids
from torch import nn

import onnx_modular as om
from onnx_modular.cli import main
from onnx_modular.diagnostics import Level
from onnx_modular.leaves.errors import rules
from onnx_modular.support.operator_support import load_support_file


def gpt2(attn: str, layers: int = 2) -> nn.Module:
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=layers, n_embd=32, n_head=4, vocab_size=99, n_positions=64,
                     use_cache=False, attn_implementation=attn)
    return LastHidden(GPT2Model(cfg).eval()).eval()


def op_types(proto: onnx.ModelProto) -> dict[str, set[str]]:
    """Op type -> where ("graph" or the function's name), subgraphs and every body included;
    read from the saved protobuf, independently of the package's own helpers."""
    own = {(f.domain, f.name) for f in proto.functions}
    found: dict[str, set[str]] = {}

    def walk(nodes, where: str) -> None:
        for node in nodes:
            if (node.domain, node.op_type) not in own:
                found.setdefault(node.op_type, set()).add(where)
            for attr in node.attribute:
                for g in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    walk(g.node, where)

    walk(proto.graph.node, "graph")
    for f in proto.functions:
        walk(f.node, f.name)
    return found


def acc_op_types(directory: Path) -> dict[str, dict[str, set[str]]]:
    """Region name -> op types of every accelerator model written to ``directory``."""
    import json

    manifest = json.loads((directory / "manifest.json").read_text())
    return {r["name"]: op_types(onnx.load(str(directory / r["file"])))
            for r in manifest["regions"] if r["kind"] != "cpu"}


def warnings_of(result) -> list[str]:
    return [d.message for d in result.diagnostics if d.level == Level.WARNING]


# ---- GPT-2: the README's example, in both attention implementations --------------------------

@pytest.mark.slow
def test_aten_softmax_on_sdpa_gpt2_warns_where_softmax_hides() -> None:
    result = om.split(gpt2("sdpa"), _ids(), support=om.OperatorSupport(deny=["aten.softmax"]))
    # nothing is denied: the attention is one scaled_dot_product_attention node
    assert [r.is_acc for r in result.regions] == [True]
    (message,) = [m for m in warnings_of(result) if "aten.softmax" in m]
    assert message.startswith("aten.softmax matched no node; `Softmax` is emitted by 2 "
                              "`aten.scaled_dot_product_attention` nodes")
    assert "deny `onnx::Softmax` to keep it off the accelerator" in message


@pytest.mark.slow
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_onnx_softmax_keeps_softmax_off_the_accelerator(attn: str, tmp_path) -> None:
    model, args = gpt2(attn), _ids()
    result = om.split(model, args, support=om.OperatorSupport(deny=["onnx::Softmax"]))
    assert not warnings_of(result)
    kinds = [r.kind for r in result.regions]
    assert kinds == ["acc", "cpu", "acc", "cpu", "acc"]  # one CPU region per layer's softmax
    out = result.save(tmp_path / "parts")
    on_acc = acc_op_types(out)
    assert on_acc and all("Softmax" not in types for types in on_acc.values())
    assert any(types.keys() - {"Constant"} and any(w != "graph" for ws in types.values()
                                                  for w in ws) for types in on_acc.values()), \
        "acc regions hold module functions (bodies were checked too)"
    assert result.plan.reasons[(
        "aten.scaled_dot_product_attention.default" if attn == "sdpa" else "aten.softmax.int",
        False)] == "emits Softmax, denied by 'onnx::Softmax'"
    expected = model(*args)
    np.testing.assert_allclose(om.SplitRunner(out).run(*args), expected.detach().numpy(),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_aten_softmax_on_eager_gpt2_does_what_it_says(tmp_path) -> None:
    result = om.split(gpt2("eager"), _ids(), support=om.OperatorSupport(deny=["aten.softmax"]))
    assert not warnings_of(result)
    assert sum(not r.is_acc for r in result.regions) == 2
    assert all("Softmax" not in t for t in acc_op_types(result.save(tmp_path / "p")).values())


# ---- rewrites the optimizer would make on the accelerator ------------------------------------

class MinMax(nn.Module):
    """``maximum``/``minimum`` with constant bounds: the optimizer fuses them into a Clip."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.minimum(torch.maximum(self.fc(x), torch.tensor(-0.5)), torch.tensor(0.5))
        return self.fc2(y).clamp(-1, 1) * 2


@pytest.mark.slow
@pytest.mark.parametrize("deny", [["onnx::Clip"], ["aten.clamp"]])
def test_optimizer_never_brings_a_denied_op_back(deny: list[str], tmp_path) -> None:
    model, x = MinMax().eval(), torch.randn(2, 8)
    exported = om.export(model, (x,)).model_proto
    assert "Clip" in op_types(exported)  # what the optimizer does without a deny list
    result = om.split(model, (x,), support=om.OperatorSupport(deny=deny))
    out = result.save(tmp_path / "parts")
    assert all("Clip" not in types for types in acc_op_types(out).values())
    assert ("", "Clip") in result.forbidden_ops
    if deny == ["aten.clamp"]:  # clamp became Max/Min, which maximum/minimum also emit
        (warning,) = warnings_of(result)
        assert warning.startswith("aten.clamp keeps 1 node(s) off the accelerator, but on it "
                                  "`Max` is emitted by 1 `aten.maximum` node")
    else:
        (warning,) = warnings_of(result)
        assert "deny entry 'onnx::Clip' matched no node" in warning
    np.testing.assert_allclose(om.SplitRunner(out).run(x), model(x).detach().numpy(),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_a_denied_op_that_gets_through_is_a_clear_error(monkeypatch) -> None:
    """Should an emit step ever make a denied op, the final check of the acc models fails."""
    import onnxscript.optimizer

    from onnx_modular.emit import optimize as emit_optimize

    monkeypatch.setattr(emit_optimize, "optimize_ir_keeping_calls",
                        lambda model, avoid: onnxscript.optimizer.optimize_ir(model,
                                                                              inline=False))
    ctx = om.DiagnosticContext()
    with pytest.raises(om.OnnxModularError) as info:  # from the split itself, not a save
        om.split(MinMax().eval(), (torch.randn(2, 8),),
                 support=om.OperatorSupport(deny=["onnx::Clip"]), ctx=ctx)
    assert ctx.diagnostics[-1] is info.value.diagnostic  # recorded, with the region's scope
    assert ctx.diagnostics[-1].scope == "_run_on_acc_0"
    message = str(info.value)
    assert rules.DENIED_ON_ACC.id in message and "\n" not in message
    assert "'_run_on_acc_0' holds Clip (main graph)" in message
    assert "'onnx::Clip' is denied" in message


# ---- names, explanations, files --------------------------------------------------------------

def test_onnx_names_are_checked_and_explained() -> None:
    with pytest.raises(om.OnnxModularError, match=r"did you mean 'onnx::Softmax'"):
        om.OperatorSupport(deny=["onnx::SoftMax"])
    with pytest.raises(om.OnnxModularError, match="onnx::Softmax"):
        om.OperatorSupport(deny=["Softmax"])  # not an op name: the message shows both forms
    support = om.OperatorSupport(deny=["aten.gelu", "onnx::Softmax", "com.microsoft::Gelu"])
    assert support.needs_onnx
    assert [(e.name, e.kind) for e in support.entries] == [
        ("aten.gelu", "deny"), ("onnx::Softmax", "deny"), ("com.microsoft::Gelu", "deny")]
    assert [e.kind for e in (~support).entries] == ["allow"] * 3
    graph = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(4, 4))).graph
    node = next(n for n in graph.nodes if n.op == "call_module")
    with pytest.raises(om.OnnxModularError, match="reads the ONNX translation"):
        support.explain(node)


class Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.sigmoid(torch.relu(self.a(x))))


def test_allow_list_of_onnx_ops() -> None:
    model, x = Mixed().eval(), torch.randn(2, 8)
    result = om.split(model, (x,), support=om.OperatorSupport(
        allow=["onnx::Gemm", "onnx::Relu", "onnx::Softmax"]))
    assert [r.kind for r in result.regions] == ["acc", "cpu", "acc"]
    assert result.plan.reasons[("aten.sigmoid.default", False)] == \
        "emits Sigmoid, not in the allow list"
    assert result.plan.reasons[("aten.relu.default", True)] == \
        "emits only allowed ONNX ops (Relu)"
    notes = [d.message for d in result.diagnostics if d.rule == rules.SUPPORT_UNMATCHED]
    assert notes == ["allow entry 'onnx::Softmax' matched no node"]
    assert not warnings_of(result)  # an allow entry the model does not need is no warning
    torch.testing.assert_close(result.graph_module(x), model(x))


@pytest.mark.slow
def test_acc_ops_file_with_onnx_names_and_cli_preview(tmp_path, capsys) -> None:
    spec = tmp_path / "ops.txt"
    spec.write_text("# keep softmax off the NPU\n!onnx::Softmax\n!aten.softmax\n")
    support = load_support_file(spec)
    assert "deny[aten.softmax, onnx::Softmax]" in support.description
    model_py = tmp_path / "gpt.py"
    model_py.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parents[1])!r})\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_matching import gpt2\n"
        "from models import token_ids as _ids\n"
        "def model():\n    return gpt2('sdpa')\n"
        "def inputs():\n    return _ids()\n")
    out = tmp_path / "parts"
    rc = main(["split", f"{model_py}:model", "--inputs", f"{model_py}:inputs",
               "--acc-ops", str(spec), "--preview", "-o", str(out)])
    captured = capsys.readouterr()
    assert rc == 0
    assert ("aten.softmax matched no node; `Softmax` is emitted by 2 "
            "`aten.scaled_dot_product_attention` nodes, which the support keeps off the "
            "accelerator anyway") in captured.err
    assert "emits Softmax, denied by 'onnx::Softmax'" in captured.out
    assert "why" in captured.out and "not denied" in captured.out
    assert all("Softmax" not in t for t in acc_op_types(out).values())
