"""An ExportedProgram given to an entry point is left as it was: a second call on it (export,
split, stages) sees the same dynamic program, so its models keep the symbolic batch dim.

The program's fake tensors share one ShapeEnv with every program derived from it
(decomposition included): a guard any step adds there (``int()`` of a symbolic size) pins
the user's dynamic dims to the example sizes for good.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import models
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch._guards import detect_fake_mode

import onnx_modular as om
from onnx_modular.leaves._compat import tensor_version

pytestmark = pytest.mark.slow  # whole models: the full suite, not the inner loop

EXAMPLE_BATCH = 2  # models.token_ids
OTHER_BATCH = 5


@pytest.fixture(scope="module")
def dynamic_gpt2() -> tuple[torch.nn.Module, torch.export.ExportedProgram]:
    model, args = models.gpt2(layers=2)
    assert args[0].shape[0] == EXAMPLE_BATCH
    batch = torch.export.Dim("batch", min=1, max=16)
    program = torch.export.export(model, args, dynamic_shapes=({0: batch},), strict=False)
    return model, program


def program_state(program: torch.export.ExportedProgram) -> dict[str, Any]:
    """What a caller can observe of a program: graph, constraints, fake values, ShapeEnv."""
    vals = [n.meta.get("val") for n in program.graph.nodes]
    shape_env = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)]).shape_env
    return {"graph": str(program.graph), "range_constraints": str(program.range_constraints),
            "vals": [str(v) for v in vals],
            "replacements": dict(shape_env.replacements),
            "var_to_range": dict(shape_env.var_to_range), "guards": len(shape_env.guards),
            "state": {k: (v.data_ptr(), tensor_version(v)) for k, v in program.state_dict.items()}}


def _exported(program: torch.export.ExportedProgram, out: Path) -> list[onnx.ModelProto]:
    result = om.export(program)
    result.save(out / "model.onnx")
    return [result.model_proto]


def _run_export(out: Path, ids: torch.Tensor) -> np.ndarray:
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: ids.numpy()})[0]


def _parts(make: Callable[[torch.export.ExportedProgram], Any]
           ) -> Callable[[torch.export.ExportedProgram, Path], list[onnx.ModelProto]]:
    def build(program: torch.export.ExportedProgram, out: Path) -> list[onnx.ModelProto]:
        result = make(program)
        result.save(out)
        return list(result.region_protos().values())
    return build


def _run_parts(out: Path, ids: torch.Tensor) -> np.ndarray:
    return om.SplitRunner(out).run(ids).detach().numpy()


ENTRIES = {
    "export": (_exported, _run_export),
    "split": (_parts(lambda p: om.split(p, support={"deny": ["aten.tanh"]})), _run_parts),
    "split_stages": (_parts(lambda p: om.split_stages(p, num_stages=2)), _run_parts),
}


@pytest.mark.parametrize("entry", ENTRIES)
def test_twice_on_one_dynamic_program(entry: str, dynamic_gpt2, tmp_path: Path) -> None:
    """Each call leaves the program unchanged and its models take another batch size."""
    model, program = dynamic_gpt2
    build, run = ENTRIES[entry]
    ids = torch.randint(0, 99, (OTHER_BATCH, 8), generator=torch.Generator().manual_seed(1))
    expected = model(ids).detach().numpy()
    before = program_state(program)
    for attempt in range(2):
        out = tmp_path / str(attempt)
        out.mkdir()
        protos = build(program, out)
        assert program_state(program) == before, f"call {attempt + 1} changed the program"
        first = protos[0].graph.input[0].type.tensor_type.shape.dim[0]
        assert first.dim_param and not first.dim_param.isdigit(), (attempt, first)
        if entry != "export":
            assert len(protos) >= 2, [p.graph.name for p in protos]
        outputs = [d for p in protos for o in p.graph.output
                   for d in o.type.tensor_type.shape.dim[:1]]
        assert all(d.dim_value != EXAMPLE_BATCH for d in outputs), (attempt, outputs)
        np.testing.assert_allclose(run(out, ids), expected, rtol=1e-4, atol=1e-4)
