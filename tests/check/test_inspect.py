"""inspect on a tiny hierarchical model: function stats, the call tree, the summary, loading."""

from __future__ import annotations

import onnx
import pytest
import torch
from onnx import helper

import onnx_modular as om
from onnx_modular.check.inspect import (
    _kinds_text,
    call_tree,
    function_stats,
    function_table,
    input_kinds,
    load_onnx,
    summary,
)
from onnx_modular.leaves.metadata import DIFFERS_FROM


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class _Two(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([_Block(), _Block(), _Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    torch.manual_seed(0)
    return om.export(_Two().eval(), (torch.randn(2, 4),)).model_proto


def _text(tree) -> str:
    from rich.console import Console

    console = Console(record=True, width=200, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(tree)
    return console.export_text()


def test_function_stats_counts_body_nodes_and_calls_anywhere(model) -> None:
    stats = {s.name: s for s in function_stats(model)}
    assert stats["_Block"].calls == 3 and stats["Linear"].calls == 1  # Linear inside _Block
    for s in stats.values():
        body = next(f for f in model.functions if f.name == s.name)
        assert s.nodes == len(body.node) and s.domain == body.domain and s.differs_from == ""


def test_summary_adds_up(model) -> None:
    s = summary(model)
    assert s == {"main_graph_nodes": len(model.graph.node), "functions": len(model.functions),
                 "function_nodes": sum(len(f.node) for f in model.functions),
                 "calls": 4, "initializers": len(model.graph.initializer)}


def test_the_call_tree_expands_a_body_once_and_rolls_up_the_repeats(model) -> None:
    text = _text(call_tree(model))
    assert "layers.0: _Block" in text and "fc: Linear" in text
    assert "layers.1 ... layers.2: _Block x2" in text and "body shown above" in text
    assert text.count("fc: Linear") == 1


def test_the_call_tree_stops_at_max_children(model) -> None:
    text = _text(call_tree(model, max_children=1))
    assert "layers.0: _Block" in text and "..." in text and "x2" not in text


def _explained(model: onnx.ModelProto, why: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    proto.CopyFrom(model)
    helper.set_metadata_props(proto.functions[0], {DIFFERS_FROM: why})
    return proto


def test_differences_get_a_column_only_when_a_function_has_one(model) -> None:
    table = _text(function_table(_explained(model, "Linear: a Relu more")))
    assert "differs from" in table and "Linear: a Relu more" in table
    assert "differs from" not in _text(function_table(model))


def test_the_graph_name_is_text_not_markup(model) -> None:
    proto = onnx.ModelProto()
    proto.CopyFrom(model)
    proto.graph.name = "[red]g[/red]"
    assert _text(call_tree(proto)).startswith("[red]g[/red]")


def test_the_differs_from_text_is_text_not_markup(model) -> None:
    why = "[bold]other[/bold]: [/x] a Relu more"
    assert why in _text(function_table(_explained(model, why)))


def test_load_onnx_reads_a_file_and_refuses_others_in_one_line(tmp_path, model) -> None:
    good = tmp_path / "m.onnx"
    onnx.save(model, str(good))
    assert load_onnx(good).graph.name == model.graph.name
    (tmp_path / "empty.onnx").write_bytes(b"")
    (tmp_path / "junk.onnx").write_bytes(b"\xff\xff\xff\xff")
    cases = [(tmp_path, "is a directory"), (tmp_path / "none.onnx", "no such ONNX file"),
             (tmp_path / "empty.onnx", "holds no ONNX graph"),
             (tmp_path / "junk.onnx", "is not a readable ONNX model")]
    for path, words in cases:
        with pytest.raises(om.OnnxModularError, match=words) as info:
            load_onnx(path)
        assert "\n" not in str(info.value) and "OM0501" in str(info.value)


def test_a_slice_of_a_weight_by_a_size_is_data_a_slice_of_a_shape_is_a_size() -> None:
    """Position ids cut from a buffer to the sequence length (``position_ids[:, :seq]``,
    BERT-like embeddings) enter an Embedding as data; the sequence length itself, sliced
    from a Shape, is a size."""
    lookup = helper.make_function("pkg", "Lookup", ["table", "ids"], ["out"],
                                  [helper.make_node("Gather", ["table", "ids"], ["out"])],
                                  [helper.make_opsetid("", 18)])
    fill = helper.make_function("pkg", "Fill", ["n"], ["out"],
                                [helper.make_node("ConstantOfShape", ["n"], ["out"])],
                                [helper.make_opsetid("", 18)])
    one, zero = (helper.make_tensor(n, onnx.TensorProto.INT64, [1], [v])
                 for n, v in (("one", 1), ("zero", 0)))
    nodes = [
        helper.make_node("Constant", [], ["c1"], value=one),
        helper.make_node("Constant", [], ["c0"], value=zero),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "c0", "c1"], ["seq"]),
        helper.make_node("Slice", ["pos", "c0", "seq", "c0"], ["ids"]),
        helper.make_node("Lookup", ["table", "ids"], ["looked"], domain="pkg"),
        helper.make_node("Fill", ["seq"], ["filled"], domain="pkg"),
    ]
    graph = helper.make_graph(
        nodes, "main", [helper.make_tensor_value_info("x", onnx.TensorProto.INT64, [3])],
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None)
         for n in ("looked", "filled")],
        [helper.make_tensor("pos", onnx.TensorProto.INT64, [8], list(range(8))),
         helper.make_tensor("table", onnx.TensorProto.FLOAT, [8, 2], [0.0] * 16)])
    proto = helper.make_model(graph, functions=[lookup, fill], opset_imports=[
        helper.make_opsetid("", 18), helper.make_opsetid("pkg", 1)])
    assert input_kinds(proto) == {"Lookup": ["weight", "activation"], "Fill": ["size"]}


class _Branches(torch.nn.Module):
    """Weights read only inside ``torch.cond``'s branches (If subgraphs of the body)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Parameter(torch.randn(4)), torch.nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda t: t * self.a, lambda t: t + self.b, (x,))


@pytest.mark.slow  # over the inner loop's session budget
def test_an_input_read_only_in_a_branch_is_read_and_unused_is_not_pluralized() -> None:
    class Two(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(_Branches() for _ in range(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layers[1](self.layers[0](x))

    torch.manual_seed(0)
    proto = om.export(Two().eval(), (torch.randn(2, 4),), functions=[_Branches]).model_proto
    assert input_kinds(proto) == {"_Branches": ["activation", "weight", "weight"]}
    assert _kinds_text(["activation", "unused", "unused"]) == "1 activation, 2 unused"
