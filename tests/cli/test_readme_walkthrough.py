"""Regressions found by following README.md top to bottom as a new user (CLI, hook, loading)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import onnx_modular as om
from onnx_modular import OnnxModularError
from onnx_modular.cli import build_parser, main
from onnx_modular.cli.loading import load_object
from onnx_modular.support.operator_support import load_support_file

SMALL = """
import torch

class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))
"""


@pytest.fixture
def small_py(tmp_path: Path) -> str:
    file = tmp_path / "small_model.py"
    file.write_text(SMALL)
    return f"{file}:Small"


def test_debug_is_accepted_after_the_subcommand(tmp_path: Path) -> None:
    parser = build_parser()
    assert parser.parse_args(["inspect", "m.onnx", "--debug"]).debug is True
    assert parser.parse_args(["--debug", "inspect", "m.onnx"]).debug is True
    assert parser.parse_args(["inspect", "m.onnx"]).debug is False
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"garbage\n")
    assert main(["inspect", str(bad)]) == 2
    with pytest.raises(OnnxModularError):  # --debug at the end: the traceback, not one line
        main(["inspect", str(bad), "--debug"])


def test_help_description_has_no_rst_markup() -> None:
    assert "``" not in (build_parser().description or "")


def test_export_report_without_validate_is_a_usage_error(tmp_path: Path, capsys) -> None:
    out = tmp_path / "m.onnx"
    rc = main(["export", "onnx_modular.examples:tiny_gpt", "--input", "1x8:int64",
               "-o", str(out), "--report", str(tmp_path / "r.json")])
    assert rc == 2 and not out.exists()
    assert "--validate" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["export", "validate"])
def test_bad_report_suffix_fails_before_the_work(tmp_path: Path, capsys, command: str) -> None:
    out = tmp_path / "m.onnx"
    argv = ["export", "no_such_pkg:Net", "--input", "1x8", "-o", str(out), "--validate"] \
        if command == "export" else ["validate", "no_such_pkg:Net", "--input", "1x8", str(out)]
    # the model does not even import: a failing check before loading proves the order
    assert main([*argv, "--report", str(tmp_path / "r.txt")]) == 2
    assert "use a .json, .md or .html" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_unavailable_provider_fails_before_the_export(tmp_path: Path, capsys) -> None:
    out = tmp_path / "m.onnx"
    rc = main(["export", "no_such_pkg:Net", "--input", "1x8", "-o", str(out), "--validate",
               "--providers", "no_such_ep"])
    assert rc == 2 and not out.exists()
    assert "execution provider 'no_such_ep' is not available" in capsys.readouterr().err


def test_functions_matching_nothing_warn_on_stderr(tmp_path: Path, capsys,
                                                   small_py: str) -> None:
    out = tmp_path / "m.onnx"
    assert main(["export", small_py, "--input", "2x8", "-o", str(out),
                 "--functions", "NoSuchBlock"]) == 0
    err = capsys.readouterr().err
    assert "OM0204" in err and "NoSuchBlock" in err
    assert out.exists()


def test_markers_without_markers_is_a_usage_error(tmp_path: Path, capsys,
                                                  small_py: str) -> None:
    out = tmp_path / "stages"
    assert main(["split", small_py, "--input", "2x8", "--markers", "-o", str(out)]) == 2
    assert "pipe_split" in capsys.readouterr().err
    assert not out.exists()


def test_acc_ops_json_with_a_non_list_is_a_user_error(tmp_path: Path) -> None:
    ops = tmp_path / "ops.json"
    ops.write_text(json.dumps({"allow": 3}))
    with pytest.raises(OnnxModularError, match="expected a list of op names"):
        load_support_file(ops)
    with pytest.raises(OnnxModularError, match="expected a list of op names"):
        om.OperatorSupport(deny=5)  # type: ignore[arg-type]


def test_hook_rejects_a_bad_selection_at_the_with() -> None:
    from torch.onnx._internal.exporter import _core

    original = _core.export
    with pytest.raises(OnnxModularError, match="functions="), om.hook(functions=3):
        pytest.fail("the hook was entered")
    assert _core.export is original


def test_file_spec_is_imported_once_and_same_stems_do_not_clash(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    (one / "spec_model.py").write_text("VALUE = 'one'\nclass Net: pass\n")
    (two / "spec_model.py").write_text("VALUE = 'two'\n")
    first = load_object(f"{one / 'spec_model.py'}:Net")
    assert load_object(f"{one / 'spec_model.py'}:Net") is first  # not executed again
    assert load_object(f"{two / 'spec_model.py'}:VALUE") == "two"
    assert sys.modules[first.__module__].VALUE == "one"  # not replaced by the second file


def test_file_that_edits_sys_path_keeps_its_entry(tmp_path: Path) -> None:
    marker = str(tmp_path / "added_by_user")
    (tmp_path / "edits_path.py").write_text(
        f"import sys\nsys.path.insert(0, {marker!r})\nX = 1\n")
    before = list(sys.path)
    try:
        assert load_object(f"{tmp_path / 'edits_path.py'}:X") == 1
        assert sys.path[0] == marker and str(tmp_path) not in sys.path[1:len(before) + 1]
    finally:
        sys.path[:] = before


@pytest.mark.slow
def test_readme_split_support_forms_on_tiny_model() -> None:
    """Every support form the README lists; ort:CUDA without CUDA is one clear error."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 8))
    args = (torch.randn(2, 8),)
    for support in (om.OperatorSupport(deny=["aten.gelu"]),
                    lambda node: "gelu" not in str(node.target),
                    ["aten.linear", "aten.addmm", "aten.t", "aten.permute"]):
        parts = om.split(model, args, support=support)
        assert any(not r.is_acc for r in parts.regions)
    from onnx_modular.leaves.runtime import available_providers

    if "CUDAExecutionProvider" not in available_providers():
        with pytest.raises(OnnxModularError, match="CUDAExecutionProvider"):
            om.split(model, args, support="ort:CUDAExecutionProvider")
