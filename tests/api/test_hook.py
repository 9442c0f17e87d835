"""The pre-export hook: unchanged torch.onnx.export calls return the hierarchical model."""

from __future__ import annotations

import warnings
from pathlib import Path

import models
import onnx
import pytest
import torch

import onnx_modular as om
from onnx_modular.lower.translate import quiet_torch_onnx

pytestmark = pytest.mark.slow  # whole models: the full suite, not the inner loop


def _export(model, args, path=None):
    with quiet_torch_onnx():
        return torch.onnx.export(model, args, path, dynamo=True)


def test_hook_makes_torch_onnx_export_hierarchical(tmp_path, ort_outputs, assert_close) -> None:
    model, args = models.Stack(3).eval(), models.x8()
    path = tmp_path / "hooked.onnx"
    with om.hook(functions="all"):
        program = _export(model, args, str(path))
    names = [f.name for f in program.model.functions.values()]
    assert names.count("Block") == 1
    saved = onnx.load(str(path))
    assert {f.name for f in saved.functions} == set(names)
    onnx.checker.check_model(saved, full_check=True)
    assert_close(ort_outputs(path, args)[0], model(*args), 1e-5)
    # Outside the hook, torch.onnx is untouched: flat again.
    assert len(_export(model, args).model.functions) == 0


def test_hooks_nest_and_the_innermost_settings_apply() -> None:
    model, args = models.Stack(2).eval(), models.x8()
    with om.hook(functions="all"):
        with om.hook(functions=["Block"]):
            inner = _export(model, args)
        outer = _export(model, args)
    assert {f.name for f in inner.model.functions.values()} == {"Block"}
    assert {"Block", "LayerNorm", "Linear"} <= {f.name for f in outer.model.functions.values()}
    assert len(_export(model, args).model.functions) == 0


def test_om_export_inside_a_hook_is_not_hooked() -> None:
    """om.export translates through torch.onnx too; the hook's settings must not leak in."""
    model, args = models.Stack(2).eval(), models.x8()
    with om.hook(functions="none"):
        result = om.export(model, args)
    assert {"Block", "LayerNorm", "Linear"} <= set(result.function_names)
    assert sum(n.op_type == "Block" for n in result.model.graph) == 2


def test_hook_leaves_opsets_below_18_flat() -> None:
    model, args = models.Stack(1).eval(), models.x8()
    with om.hook(), quiet_torch_onnx(), pytest.warns(UserWarning, match="stays flat"):
        program = torch.onnx.export(model, args, dynamo=True, opset_version=17)
    assert len(program.model.functions) == 0


# ---- per-thread hooks -----------------------------------------------------------------------

def _function_names(program) -> set[str]:
    return {f.name for f in program.model.functions.values()}


def test_a_thread_without_a_hook_gets_plain_torch_onnx() -> None:
    """One thread inside a hook, one outside, exporting at the same time."""
    import threading

    model, args = models.Stack(2).eval(), models.x8()
    inside, entered, results = threading.Event(), threading.Event(), {}

    def hooked() -> None:
        with om.hook(functions="all"):
            entered.set()
            inside.wait(60)
            results["hooked"] = _function_names(_export(model, args))

    def plain() -> None:
        entered.wait(60)
        results["plain"] = _function_names(_export(model, args))
        inside.set()

    threads = [threading.Thread(target=hooked), threading.Thread(target=plain)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert results["plain"] == set()
    assert {"Block", "LayerNorm", "Linear"} <= results["hooked"]


def test_two_hooked_threads_keep_their_own_settings_and_exit_out_of_order() -> None:
    import threading

    model, args = models.Stack(2).eval(), models.x8()
    a_in, b_in, a_out, results = (threading.Event(), threading.Event(), threading.Event(), {})

    def thread_a() -> None:
        with om.hook(functions="all"):
            a_in.set()
            b_in.wait(60)
            results["a"] = _function_names(_export(model, args))
        a_out.set()  # A leaves first, while B is still inside its hook

    def thread_b() -> None:
        with om.hook(functions=["Block"]):
            b_in.set()
            a_in.wait(60)
            a_out.wait(300)
            results["b"] = _function_names(_export(model, args))

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert {"Block", "LayerNorm", "Linear"} <= results["a"]
    assert results["b"] == {"Block"}
    assert _function_names(_export(model, args)) == set()  # all closed: torch.onnx restored


def test_out_of_order_exit_in_one_thread_removes_that_hook_only() -> None:
    model, args = models.Stack(2).eval(), models.x8()
    outer, inner = om.hook(functions="all"), om.hook(functions=["Block"])
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)  # the outer one leaves first
    assert _function_names(_export(model, args)) == {"Block"}
    inner.__exit__(None, None, None)
    assert _function_names(_export(model, args)) == set()


# ---- dynamo=False calls under the hook ---------------------------------------------------------

class GapInputs(torch.nn.Module):
    """Keyword inputs with a gap in the signature (``past`` not given), as Optimum calls GPT-2."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([models.Block(8) for _ in range(2)])

    def forward(self, x, past=None, mask=None, scale=None):
        for block in self.blocks:
            x = block(x)
        return x * mask + scale


def _legacy_export(model, args, f, **kwargs):
    """Not quieted: the hook's warnings must reach the test."""
    return torch.onnx.export(model, args, f, dynamo=False, **kwargs)


def test_dynamo_false_call_is_exported_hierarchically_with_its_interface(
        tmp_path, ort_outputs, assert_close) -> None:
    model = GapInputs().eval()
    inputs = {"scale": torch.randn(3, 8), "mask": torch.rand(3, 8) + 0.5,
              "x": torch.randn(3, 8)}  # a dict in the call's order, not forward's
    path = tmp_path / "legacy.onnx"
    with om.hook() as session:
        _legacy_export(model, (inputs,), str(path), input_names=["x", "mask", "scale"],
                       output_names=["y"], dynamic_axes={"x": {0: "batch"},
                                                         "mask": {0: "batch"},
                                                         "scale": {0: "batch"}, "y": [0]})
    assert session.exports[-1].hierarchical and session.exports[-1].path == str(path)
    saved = onnx.load(str(path))
    assert [i.name for i in saved.graph.input] == ["x", "mask", "scale"]
    assert [o.name for o in saved.graph.output] == ["y"]
    assert "Block" in {f.name for f in saved.functions}
    assert saved.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # dynamic batch
    other = {k: torch.randn(5, 8) + 1 for k in ("x", "mask", "scale")}  # another batch size
    got = ort_outputs(path, (other["x"], other["mask"], other["scale"]))[0]
    assert_close(got, model(**other), 1e-5)


def test_dynamo_false_call_keeps_an_axis_dynamic_whose_example_size_is_one(
        tmp_path, ort_outputs, assert_close) -> None:
    """torch.export would fix a dynamic axis whose example is 1; the TorchScript call named
    it dynamic (a decoder step of one token, a batch of one)."""
    model = GapInputs().eval()
    inputs = {"x": torch.randn(1, 8), "mask": torch.rand(1, 8), "scale": torch.randn(1, 8)}
    path = tmp_path / "one.onnx"
    with om.hook() as session:
        _legacy_export(model, (inputs,), str(path), input_names=["x", "mask", "scale"],
                       dynamic_axes={name: {0: "batch"} for name in inputs})
    assert session.exports[-1].hierarchical
    assert onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    other = {k: torch.randn(4, 8) for k in ("x", "mask", "scale")}
    got = ort_outputs(path, (other["x"], other["mask"], other["scale"]))[0]
    assert_close(got, model(**other), 1e-5)


def test_dynamo_false_call_with_a_dict_as_args(tmp_path, ort_outputs, assert_close) -> None:
    """Olive passes its dummy inputs as a dict, not a tuple ending in one."""
    model = GapInputs().eval()
    inputs = {"x": torch.randn(2, 8), "mask": torch.rand(2, 8), "scale": torch.randn(2, 8)}
    path = tmp_path / "dict.onnx"
    with om.hook() as session:
        _legacy_export(model, inputs, str(path), input_names=["x", "mask", "scale"])
    assert session.exports[-1].hierarchical
    got = ort_outputs(path, (inputs["x"], inputs["mask"], inputs["scale"]))[0]
    assert_close(got, model(**inputs), 1e-5)


def test_dynamo_false_call_to_a_bytes_buffer(ort_outputs, assert_close, tmp_path) -> None:
    import io

    model, args = models.Stack(2).eval(), models.x8()
    buffer = io.BytesIO()
    with om.hook():
        _legacy_export(model, args, buffer)
    saved = onnx.load_from_string(buffer.getvalue())
    assert "Block" in {f.name for f in saved.functions}
    path = tmp_path / "b.onnx"
    onnx.save(saved, str(path))
    assert_close(ort_outputs(path, args)[0], model(*args), 1e-5)


@pytest.mark.parametrize(("option", "value", "named"), [
    ("operator_export_type", torch.onnx.OperatorExportTypes.ONNX_FALLTHROUGH,
     "operator_export_type"),
    ("training", torch.onnx.TrainingMode.TRAINING, "training"),
    ("custom_opsets", {"custom": 1}, "custom_opsets"),
])
def test_torchscript_only_options_stay_flat_with_a_warning_naming_them(
        tmp_path, option, value, named) -> None:
    model, args = models.Stack(1).eval(), models.x8()
    path = tmp_path / "flat.onnx"
    with om.hook() as session, pytest.warns(om.HookWarning, match=named):
        _legacy_export(model, args, str(path), **{option: value})
    assert not onnx.load(str(path)).functions
    assert session.exports[-1].flat_reason is not None
    with om.hook(strict=True), pytest.raises(om.OnnxModularError, match=named):
        _legacy_export(model, args, str(tmp_path / "strict.onnx"), **{option: value})
    assert not (tmp_path / "strict.onnx").exists()


def test_a_dynamo_false_call_below_opset_18_warns_it_stays_flat(tmp_path) -> None:
    """The warning is raised while torch.onnx runs quietly: it must still reach the caller."""
    model, args = models.Stack(1).eval(), models.x8()
    with om.hook() as session, pytest.warns(om.HookWarning, match="opset 17"):
        _legacy_export(model, args, str(tmp_path / "o17.onnx"), opset_version=17,
                       input_names=["x"])
    _legacy_export(model, args, str(tmp_path / "t17.onnx"), opset_version=17, input_names=["x"])
    saved = onnx.load(str(tmp_path / "o17.onnx"))
    assert not saved.functions
    assert session.exports[-1].flat_reason is not None
    # what the TorchScript exporter writes, not the dynamo exporter's flat model
    torchscript = onnx.load(str(tmp_path / "t17.onnx"))
    assert [o.name for o in saved.graph.output] == [o.name for o in torchscript.graph.output]


def test_a_script_module_stays_flat_with_a_warning(tmp_path) -> None:
    scripted = torch.jit.script(models.Stack(1).eval())
    with om.hook(), pytest.warns(om.HookWarning, match="TorchScript"):
        _legacy_export(scripted, models.x8(), str(tmp_path / "s.onnx"))
    assert not onnx.load(str(tmp_path / "s.onnx")).functions


# ---- never silently flat or undone -----------------------------------------------------------

def test_functions_matching_nothing_warn_and_strict_raises() -> None:
    model, args = models.Stack(1).eval(), models.x8()
    with om.hook(functions=["NoSuchModule"]), pytest.warns(om.HookWarning,
                                                           match="NoSuchModule"):
        torch.onnx.export(model, args, dynamo=True)
    with om.hook(functions=["NoSuchModule"], strict=True), pytest.raises(
            om.OnnxModularError, match="NoSuchModule"):
        _export(model, args)


def test_optimize_after_the_hook_keeps_the_functions(ort_outputs, assert_close,
                                                     tmp_path) -> None:
    model, args = models.Stack(3).eval(), models.x8()
    with om.hook():
        program = _export(model, args)
    program.optimize()  # torch's own would inline every function
    assert "Block" in _function_names(program)
    program.save(str(tmp_path / "o.onnx"))
    assert_close(ort_outputs(tmp_path / "o.onnx", args)[0], model(*args), 1e-5)


def test_verify_and_report_cover_the_hierarchical_model(tmp_path) -> None:
    model, args = models.Stack(2).eval(), models.x8()
    with om.hook() as session, quiet_torch_onnx():
        torch.onnx.export(model, args, dynamo=True, verify=True, report=True,
                          artifacts_dir=str(tmp_path))
    record = session.exports[-1]
    assert record.hierarchical and record.verification
    assert all(abs_diff < 1e-4 for _, abs_diff, _ in record.verification)
    reports = list(tmp_path.glob("*.md"))
    assert len(reports) == 1, reports  # torch's report of the flat model is not left
    text = reports[0].read_text()
    assert "| Block |" in text and "Verification" in text


def test_launcher_runs_a_script_with_its_exports_hooked(tmp_path) -> None:
    import subprocess
    import sys

    script = tmp_path / "pipeline.py"
    out = tmp_path / "model.onnx"
    script.write_text(
        "import sys, torch\n"
        f"sys.path.insert(0, {str(Path(__file__).parents[1])!r})\n"
        "import models\n"
        "torch.onnx.export(models.Stack(2).eval(), models.x8(), sys.argv[1], dynamo=False)\n"
        "sys.exit(3)\n")
    done = subprocess.run([sys.executable, "-m", "onnx_modular", "hook", "--functions",
                           "Block", "--", str(script), str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 3, done.stderr  # the program's own exit status
    assert {f.name for f in onnx.load(str(out)).functions} == {"Block"}
    assert "hierarchical" in done.stderr


def test_launcher_refuses_a_program_that_is_not_python(tmp_path) -> None:
    from onnx_modular.cli import main

    assert main(["hook", "--", "no-such-program-here"]) == 2
    assert main(["hook", "--", "ls"]) == 2  # a binary: the hook could not act in it


# ---- dynamo=False calls: what the TorchScript exporter writes (issue 30) ---------------------

class WithDropout(torch.nn.Module):
    """Two blocks around a Dropout, whose train mode would randomize every run."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.drop, self.second = models.Block(8), torch.nn.Dropout(0.5), \
            models.Block(8)

    def forward(self, x):
        return self.second(self.drop(self.first(x)))


def _unoptimized_ort(path, x):
    """ORT without graph optimizations, which would drop an active Dropout on its own."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


def test_dynamo_false_exports_a_train_mode_model_in_eval_as_torchscript_does(
        tmp_path, assert_close) -> None:
    """training=EVAL (the default) exports eval behaviour and puts each module's mode back."""
    model, x = WithDropout().train(), torch.randn(4, 8)
    model.second.eval()  # mixed modes: each comes back as it was
    expected = WithDropout.forward(model.eval(), x).detach()
    model.train()
    model.second.eval()
    with om.hook() as session:
        _legacy_export(model, (x,), str(tmp_path / "hooked.onnx"))
    assert session.exports[-1].hierarchical
    assert model.training and model.first.training and not model.second.training
    _legacy_export(model, (x,), str(tmp_path / "torchscript.onnx"))  # (all train after it)
    for name in ("hooked", "torchscript"):
        assert_close(_unoptimized_ort(tmp_path / f"{name}.onnx", x), expected, 1e-5)


def test_dynamo_false_puts_the_mode_back_when_the_export_raises(tmp_path) -> None:
    class EvalFails(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = models.Block(8)

        def forward(self, x):
            if not self.training:
                raise RuntimeError("eval is not supported")
            return self.block(x)

    model = EvalFails().train()
    with om.hook(strict=True), pytest.raises(Exception, match="eval is not supported"):
        _legacy_export(model, (torch.randn(2, 8),), str(tmp_path / "e.onnx"))
    assert model.training


def test_dynamo_false_preserve_of_a_train_mode_model_stays_flat(tmp_path) -> None:
    """training=PRESERVE of a model in train mode exports the training graph: TorchScript's."""
    model = WithDropout().eval()
    model.drop.train()
    with om.hook() as session, pytest.warns(om.HookWarning, match="PRESERVE"):
        _legacy_export(model, (torch.randn(4, 8),), str(tmp_path / "p.onnx"),
                       training=torch.onnx.TrainingMode.PRESERVE)
    assert session.exports[-1].flat_reason is not None
    assert not model.training and model.drop.training


def test_dynamo_false_without_params_lists_the_weights_as_torchscript_does(
        tmp_path, assert_close) -> None:
    """export_params=False: weights are inputs (after the call's, in TorchScript's order and
    names), without initializers; the model checks and runs on weights fed to it."""
    import onnxruntime as ort

    model, x = models.Stack(2).eval(), torch.randn(2, 8)
    options = {"export_params": False, "input_names": ["x"]}
    with om.hook() as session:
        _legacy_export(model, (x,), str(tmp_path / "hooked.onnx"), **options)
    _legacy_export(model, (x,), str(tmp_path / "torchscript.onnx"), **options)
    assert session.exports[-1].hierarchical
    hooked, torchscript = (onnx.load(str(tmp_path / f"{n}.onnx")) for n in ("hooked",
                                                                           "torchscript"))
    assert not hooked.graph.initializer and hooked.functions
    names = [i.name for i in hooked.graph.input]
    assert names == [i.name for i in torchscript.graph.input]
    onnx.checker.check_model(hooked, full_check=True)
    weights = dict(model.state_dict())
    feeds = {"x": x.numpy(), **{n: weights[n].numpy() for n in names[1:]}}
    session = ort.InferenceSession(str(tmp_path / "hooked.onnx"),
                                   providers=["CPUExecutionProvider"])
    assert_close(session.run(None, feeds)[0], model(x), 1e-5)


@pytest.mark.parametrize("export_params", [True, False])
def test_dynamo_false_keep_initializers_as_inputs_lists_each_weight(
        tmp_path, export_params) -> None:
    """Every weight is an input of its own (its data too with export_params): equal weights
    the hook would merge (two LayerNorms at their initial values) mean it stays flat."""
    x, options = torch.randn(2, 8), {"input_names": ["x"], "keep_initializers_as_inputs": True,
                                     "export_params": export_params}
    for model, hierarchical in ((models.Stack(2).eval(), False),
                                (torch.nn.Sequential(models.Block(8), torch.nn.Linear(8, 8)),
                                 True)):
        with om.hook() as session, warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            _legacy_export(model, (x,), str(tmp_path / "k.onnx"), **options)
        assert session.exports[-1].hierarchical == hierarchical
        assert hierarchical or any("merged" in str(w.message) for w in seen)
        _legacy_export(model, (x,), str(tmp_path / "t.onnx"), **options)
        hooked, torchscript = (onnx.load(str(tmp_path / f"{n}.onnx")) for n in "kt")
        assert [i.name for i in hooked.graph.input] == [i.name for i in torchscript.graph.input]
        assert {i.name for i in hooked.graph.initializer} == (
            {i.name for i in hooked.graph.input[1:]} if export_params else set())


class UnusedArgument(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = models.Block(8)

    def forward(self, x, unused, y):
        return self.block(x) + y


@pytest.mark.parametrize("input_names", [None, ["x", "u", "y"]])
def test_dynamo_false_drops_an_unused_argument_as_torchscript_does(
        tmp_path, input_names) -> None:
    model, args = UnusedArgument().eval(), tuple(torch.randn(2, 8) for _ in range(3))
    with om.hook() as session:
        _legacy_export(model, args, str(tmp_path / "h.onnx"), input_names=input_names)
    _legacy_export(model, args, str(tmp_path / "t.onnx"), input_names=input_names)
    assert session.exports[-1].hierarchical
    hooked = [i.name for i in onnx.load(str(tmp_path / "h.onnx")).graph.input]
    assert len(hooked) == len(onnx.load(str(tmp_path / "t.onnx")).graph.input) == 2
    if input_names:
        assert hooked == [i.name for i in onnx.load(str(tmp_path / "t.onnx")).graph.input]


def test_a_dynamo_true_export_to_a_path_records_the_path(tmp_path) -> None:
    model, args = models.Stack(2).eval(), models.x8()
    path = tmp_path / "d.onnx"
    with om.hook() as session:
        _export(model, args, str(path))
        _export(model, args)  # no file: in memory
    assert [e.path for e in session.exports] == [str(path), None]
    assert str(session.exports[0]).startswith(str(path))
