"""_log: the package logger says what each stage and pass did and how long it took."""

from __future__ import annotations

import logging
import re

import pytest
import torch

import onnx_modular as om
from onnx_modular.cli import main
from onnx_modular.leaves import _log


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


@pytest.mark.slow  # an export: the full suite, not the inner loop
def test_each_stage_and_pass_logs_its_duration_at_debug(caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    with caplog.at_level(logging.DEBUG, logger="onnx_modular"):
        om.export(_Block(), (torch.randn(2, 4),))
    messages = [r.getMessage() for r in caplog.records if r.name == "onnx_modular"]
    for step in ("capture (torch.export)", "translate (torch.onnx, unoptimized)",
                 "pass Modularize", "emit pass Outline", "emit pass Verify", "emit"):
        line = next((m for m in messages if m.startswith(f"{step}:")), None)
        assert line is not None, (step, messages)
        assert re.match(rf"{re.escape(step)}: \d+\.\d{{3}} s", line)
    assert any(m.startswith("emit:") and "functions=" in m for m in messages)


@pytest.mark.slow
def test_silent_unless_asked(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="onnx_modular"):
        om.export(_Block(), (torch.randn(2, 4),))
    assert not [r for r in caplog.records if r.name.startswith("onnx_modular")]


def test_a_failing_step_logs_that_it_failed(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="onnx_modular"), \
            pytest.raises(ValueError), _log.timed("a step"):
        raise ValueError("no")
    assert re.match(r"a step failed after \d+\.\d{3} s: ValueError",
                    caplog.records[-1].getMessage())


@pytest.mark.slow
def test_verbose_on_the_command_line(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    handlers, level = list(_log.LOGGER.handlers), _log.LOGGER.level
    for run in range(2):
        assert main(["export", "onnx_modular.examples:tiny_gpt", "--inputs",
                     "onnx_modular.examples:tiny_gpt_inputs", "-o",
                     str(tmp_path / f"m{run}.onnx"), "--verbose"]) == 0
        err = capsys.readouterr().err
        assert err.count("onnx_modular DEBUG pass Modularize:") == 1  # once, the 2nd time too
        assert "onnx_modular DEBUG emit pass Outline:" in err
    # the command line puts the logger back as it found it
    assert _log.LOGGER.handlers == handlers and _log.LOGGER.level == level
