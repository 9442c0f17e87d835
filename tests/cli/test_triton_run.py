"""``triton-run`` with an endpoint it cannot use: one line on stderr, a non-zero exit, and
no traceback (not even tritonclient's, as its half-built client is collected)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

import onnx_modular as om

pytest.importorskip("tritonclient.http")


@pytest.mark.slow  # a CLI process per endpoint
@pytest.mark.parametrize("endpoint", ["127.0.0.1:99999", "host", "nosuchhost.invalid:8000",
                                      "127.0.0.1:1"])
def test_a_bad_endpoint_is_one_line_without_traceback(endpoint, tmp_path) -> None:
    stages = om.split_stages(nn.Sequential(nn.Linear(3, 4), nn.ReLU()), (torch.randn(2, 3),),
                             num_stages=1)
    repo = stages.save_triton(tmp_path / "repo")
    runner = om.TritonRunner(repo.path, "127.0.0.1:1")
    np.savez(tmp_path / "in.npz", **{runner.inputs[0]: np.ones((2, 3), np.float32)})
    done = subprocess.run([sys.executable, "-m", "onnx_modular", "triton-run", str(repo.path),
                           str(tmp_path / "in.npz"), "--endpoint", endpoint],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and endpoint in lines[0], lines
    assert "not served" not in lines[0]
