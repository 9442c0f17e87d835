"""SplitRunner on a tiny two-or-three-part directory; ordered_kwargs; one-line refusals."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from torch.utils import _pytree

import onnx_modular as om
from onnx_modular.parts.runner import SplitRunner, ordered_kwargs


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, *, bias: torch.Tensor, scale: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.sin(self.fc(x)) + bias
        return self.fc(h) * scale, h


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    torch.manual_seed(0)
    model = _Tiny().eval()
    x, bias, scale = torch.randn(2, 4), torch.randn(4), torch.randn(4)
    result = om.split(model, (x,), kwargs={"bias": bias, "scale": scale},
                      support=["aten.linear", "aten.mul"])
    directory = tmp_path_factory.mktemp("parts")
    result.save(directory)
    with torch.no_grad():
        expected = model(x, bias=bias, scale=scale)
    return directory, (x, bias, scale), expected


def test_the_parts_chained_give_the_models_outputs_in_its_structure(saved) -> None:
    directory, (x, bias, scale), expected = saved
    runner = SplitRunner(directory, acc_providers="cpu")
    assert len(runner.parts) >= 2
    got = runner.run(x, bias=bias, scale=scale)
    assert isinstance(got, tuple) and len(got) == 2
    assert all(isinstance(g, torch.Tensor) for g in got)  # torch in, torch out
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-5)
    numpy_out = runner(x.numpy(), bias=bias.numpy(), scale=scale.numpy())
    assert isinstance(numpy_out[0], np.ndarray)  # numpy in, numpy out


def test_keywords_in_another_order_are_not_swapped(saved) -> None:
    directory, (x, bias, scale), expected = saved
    got = SplitRunner(directory, acc_providers="cpu").run(x, scale=scale, bias=bias)
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=1e-5)


def test_sessions_are_made_once_per_part_on_its_providers(saved) -> None:
    directory, _, _ = saved
    runner = SplitRunner(directory, acc_providers="cpu")
    part = runner.parts[0]
    assert runner.session(part) is runner.session(part)
    cpu = next((p for p in runner.parts if p.get("kind") == "cpu"), None)
    assert cpu is None or runner.providers_of(cpu) == ["CPUExecutionProvider"]
    assert runner.acc_providers == ["CPUExecutionProvider"]


def test_wrong_inputs_are_one_line_errors(saved) -> None:
    directory, (x, bias, scale), _ = saved
    runner = SplitRunner(directory, acc_providers="cpu")
    cases = [((x,), {}, "takes 3 tensor input"),
             ((x,), {"bias": bias, "shift": scale}, "captured with keyword input"),
             ((x, bias, scale, x), {}, "takes 3 tensor input")]
    for args, kwargs, words in cases:
        with pytest.raises(om.OnnxModularError, match=words) as info:
            runner.run(*args, **kwargs)
        assert "\n" not in str(info.value)
    with pytest.raises(om.OnnxModularError, match="failed in ONNX Runtime") as info:
        runner.run(x[:, :3], bias=bias, scale=scale)  # a shape no part takes
    assert "\n" not in str(info.value) and "OM0401" in str(info.value)


def _copy(saved, tmp_path):
    directory = tmp_path / "copy"
    shutil.copytree(saved[0], directory)
    manifest = json.loads((directory / "manifest.json").read_text())
    return directory, manifest


def _rewrite(directory, manifest) -> None:
    (directory / "manifest.json").write_text(json.dumps(manifest))


def test_a_missing_part_file_is_named(saved, tmp_path) -> None:
    directory, manifest = _copy(saved, tmp_path)
    (directory / manifest["regions"][0]["file"]).unlink()
    with pytest.raises(om.OnnxModularError, match="is missing its file"):
        SplitRunner(directory, acc_providers="cpu").run(*saved[1][:1], bias=saved[1][1],
                                                        scale=saved[1][2])


def test_a_part_from_another_save_is_refused(saved, tmp_path) -> None:
    directory, manifest = _copy(saved, tmp_path)
    manifest["set_id"] = "another-save"
    _rewrite(directory, manifest)
    runner = SplitRunner(directory, acc_providers="cpu")
    with pytest.raises(om.OnnxModularError, match="belongs to another save"):
        runner.session(runner.parts[0])


def test_an_output_or_input_no_part_produces_is_a_validation_error(saved, tmp_path) -> None:
    directory, manifest = _copy(saved, tmp_path)
    manifest["outputs"][0]["name"] = "nowhere"
    _rewrite(directory, manifest)
    x, bias, scale = saved[1]
    with pytest.raises(om.OnnxModularError, match="no part produces the model output "
                       "'nowhere'"):
        SplitRunner(directory, acc_providers="cpu").run(x, bias=bias, scale=scale)
    directory, manifest = _copy(saved, tmp_path / "b")
    manifest["inputs"][0]["name"] = "renamed"
    _rewrite(directory, manifest)
    with pytest.raises(om.OnnxModularError, match="reads 'x', which no earlier part"):
        SplitRunner(directory, acc_providers="cpu").run(x, bias=bias, scale=scale)


def test_without_a_spec_outputs_are_flat(saved, tmp_path) -> None:
    directory, manifest = _copy(saved, tmp_path)
    manifest.pop("out_spec", None)
    manifest.pop("in_spec", None)
    _rewrite(directory, manifest)
    x, bias, scale = saved[1]
    got = SplitRunner(directory, acc_providers="cpu").run(x, bias=bias, scale=scale)
    assert isinstance(got, tuple) and len(got) == 2


@pytest.mark.parametrize("in_spec", [None, "not a tree spec"])
def test_keywords_are_ordered_by_name_where_the_manifest_has_no_usable_spec(
        saved, tmp_path, in_spec) -> None:
    directory, manifest = _copy(saved, tmp_path)
    manifest["in_spec"] = in_spec
    _rewrite(directory, manifest)
    x, bias, scale = saved[1]
    got = SplitRunner(directory, acc_providers="cpu").run(x, scale=scale, bias=bias)
    torch.testing.assert_close(got[0], saved[2][0], rtol=0, atol=1e-5)


def test_the_inputs_names_order_keywords_over_an_edited_spec(saved, tmp_path) -> None:
    """An ``in_spec`` whose keywords were swapped by hand fed each tensor to the other
    input (|diff| 6.6): the manifest's input names, the files' own, decide."""
    directory, manifest = _copy(saved, tmp_path)
    x, bias, scale = saved[1]
    swapped = _pytree.tree_flatten(((x,), {"scale": scale, "bias": bias}))[1]
    manifest["in_spec"] = _pytree.treespec_dumps(swapped)
    _rewrite(directory, manifest)
    got = SplitRunner(directory, acc_providers="cpu").run(x, bias=bias, scale=scale)
    torch.testing.assert_close(got[0], saved[2][0], rtol=0, atol=1e-5)


def test_keywords_that_neither_spec_nor_names_order_are_refused(saved, tmp_path) -> None:
    directory, manifest = _copy(saved, tmp_path)
    manifest["in_spec"] = "not a tree spec"
    manifest["inputs"][1]["name"], manifest["inputs"][2]["name"] = "b0", "s0"
    _rewrite(directory, manifest)
    x, bias, scale = saved[1]
    with pytest.raises(om.OnnxModularError, match="keyword inputs cannot be ordered: pass "
                       "scale, bias positionally"):
        SplitRunner(directory, acc_providers="cpu").run(x, scale=scale, bias=bias)


# ---- ordered_kwargs ---------------------------------------------------------------------------

def _spec(kwargs: dict) -> object:
    return _pytree.tree_flatten(((torch.ones(1),), kwargs))[1]


def test_ordered_kwargs_follows_the_captured_order() -> None:
    spec = _spec({"a": 1, "b": 2})
    assert list(ordered_kwargs({"b": 2, "a": 1}, spec)) == ["a", "b"]


def test_ordered_kwargs_keeps_the_callers_order_without_a_usable_spec() -> None:
    kwargs = {"b": 2, "a": 1}
    assert ordered_kwargs(kwargs, None) is kwargs
    assert ordered_kwargs({}, _spec({"a": 1})) == {}
    flat_spec = _pytree.tree_flatten([torch.ones(1)])[1]  # not (args, kwargs)
    assert list(ordered_kwargs(kwargs, flat_spec)) == ["b", "a"]
    assert list(ordered_kwargs(kwargs, object())) == ["b", "a"]  # not a spec at all


def test_ordered_kwargs_refuses_other_names_in_one_line() -> None:
    with pytest.raises(om.OnnxModularError) as info:
        ordered_kwargs({"a": 1, "c": 3}, _spec({"a": 1, "b": 2}))
    assert str(info.value) == ("error: OM0501 bad-input: the model was captured with keyword "
                               "input(s) a, b; got a, c")
    with pytest.raises(om.OnnxModularError, match="keyword input\\(s\\) none; got a"):
        ordered_kwargs({"a": 1}, _spec({}))


@pytest.mark.parametrize("outputs", ["none", "one twice"])
def test_a_manifest_listing_other_outputs_than_its_structure_is_refused(saved, tmp_path,
                                                                       outputs) -> None:
    """Found by the fuzz test: an emptied ``outputs`` list ran and answered ``()``."""
    directory, (x, bias, scale), _ = saved
    copy = tmp_path / "parts"
    shutil.copytree(directory, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    first = manifest["outputs"][0]
    manifest["outputs"] = [] if outputs == "none" else [*manifest["outputs"], first]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(om.OnnxModularError, match=r"lists [03] model output\(s\)") as e:
        SplitRunner(copy, acc_providers="cpu").run(x, bias=bias, scale=scale)
    assert "\n" not in str(e.value)


def test_a_model_returning_none_beside_its_tensors_runs_from_its_parts(tmp_path) -> None:
    """None is a leaf of the output structure but no ONNX output: the parts still run."""

    class WithNone(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
            return torch.relu(self.fc(x)), None

    torch.manual_seed(0)
    model, x = WithNone().eval(), torch.randn(2, 4)
    om.split_stages(model, (x,), num_stages=1).save(tmp_path / "p")
    got = SplitRunner(tmp_path / "p", acc_providers="cpu").run(x)
    torch.testing.assert_close(got, model(x)[0], rtol=0, atol=1e-5)
    assert om.validate(model, (x,), tmp_path / "p", providers="cpu").ok


class PassesThrough(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.sin(self.fc(x)), x, y


@pytest.mark.slow
def test_an_input_returned_as_is_is_the_callers_values_after_the_call(tmp_path) -> None:
    """Such an output read the memory of the caller's tensor (or of this run's contiguous
    copy of it) without holding it: freed temporaries gave 1e5..1e28 in place of ``x``."""
    import gc

    torch.manual_seed(0)
    model = PassesThrough().eval()
    x, y = torch.randn(3, 8), torch.randn(3, 8)
    om.split(model, (x, y), support={"deny": ["aten.sin"]}).save(tmp_path / "parts")
    runner = SplitRunner(tmp_path / "parts", acc_providers="cpu")
    for first in (x.clone(), torch.randn(8, 3).t(), x.clone()[:, :]):  # the 2nd: a copy fed
        expected = first.clone()
        out = runner.run(first, y.clone())
        del first
        gc.collect()
        _ = [torch.full((3, 8), 7.0) for _ in range(50)]  # take the freed memory
        assert torch.equal(out[1], expected) and torch.equal(out[2], y)
    kept = torch.randn(8, 3).t()  # alive, not contiguous: the runner feeds a copy
    out = runner.run(kept, y)
    _ = [torch.full((3, 8), 7.0) for _ in range(50)]
    assert torch.equal(out[1], kept)
    out = runner.run(x, y)
    x.zero_()  # the output is the value, not a view of the caller's tensor
    assert not torch.equal(out[1], x)
