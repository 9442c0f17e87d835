"""Balanced stages: num_stages / max_stage_bytes cut between the calls of the repeated block
list, balance weight bytes (tied weights counted where copied), respect the budget, say the
plan before the work, and chain to torch's result."""

from __future__ import annotations

import itertools
import re

import models
import numpy as np
import pytest
import torch
from models import Tied
from torch import nn

import onnx_modular as om
from onnx_modular.cli import main
from onnx_modular.leaves.errors import rules
from onnx_modular.passes.balance import plan_units


def actual_bytes(result: om.StagesResult) -> list[int]:
    """Weight bytes each stage model reads, from the cut models (not from the plan)."""
    return [sum(w.values()) for w in result.parameters_of().values()]


def best_max(program: torch.export.ExportedProgram, k: int) -> int:
    """Brute force: the smallest largest stage over every way to cut the units in k."""
    _, units = plan_units(program)

    def size(group) -> int:
        seen: dict[str, int] = {}
        for u in group:
            seen.update(u.weights)
        return sum(seen.values())

    best = None
    for cuts in itertools.combinations(range(1, len(units)), k - 1):
        bounds = [0, *cuts, len(units)]
        worst = max(size(units[a:b]) for a, b in itertools.pairwise(bounds))
        best = worst if best is None else min(best, worst)
    assert best is not None
    return best


@pytest.fixture(scope="module")
def gpt2_6():
    model, args = models.gpt2(layers=6)
    return model, args, om.capture(model, args)


def check_chain(result: om.StagesResult, model: nn.Module, args, tmp_path) -> None:
    out = result.save(tmp_path)
    expected = model(*args)
    np.testing.assert_allclose(om.SplitRunner(out).run(*args), expected.detach().numpy(),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("k", [2, 3, 4])
def test_num_stages_balances_and_cuts_only_between_blocks(gpt2_6, k: int, tmp_path) -> None:
    model, args, program = gpt2_6
    result = om.split_stages(program, num_stages=k)
    plan = result.stage_plan
    assert plan is not None and plan.blocks == "model.h"
    assert len(result.stages) == k == len(plan.stages)
    assert all(re.fullmatch(r"model\.h\.\d+", p) and w == "beginning"
               for p, w in plan.split_points.items())
    assert actual_bytes(result) == plan.stage_bytes  # the plan is what the models hold
    assert max(plan.stage_bytes) == best_max(program, k)  # no cut does better
    assert result.manifest()["split_by"] == f"num_stages={k}"
    notes = [d.message for d in result.diagnostics if d.rule == rules.STAGE_PLAN]
    assert notes[0].startswith(f"{k} stage(s) by num_stages={k}, cut between the blocks of "
                               "'model.h'")
    assert notes[1].startswith("stage_0: ") and "model.wte" in notes[1]
    if k == 3:
        check_chain(result, model, args, tmp_path)


@pytest.mark.slow
def test_max_stage_bytes_is_a_budget_with_the_fewest_stages(gpt2_6, tmp_path) -> None:
    model, args, program = gpt2_6
    block = sum(sum(u.weights.values()) for u in plan_units(program)[1]
                if u.label == "model.h.0")
    budget = 2 * block + block // 2  # two blocks fit, three do not
    plan = om.plan_stages(program, max_stage_bytes=budget)
    assert all(b <= budget for b in plan.stage_bytes)
    assert best_max(program, len(plan.stages) - 1) > budget  # one stage fewer cannot fit
    result = om.split_stages(model, args, max_stage_bytes=budget)
    assert actual_bytes(result) == result.stage_plan.stage_bytes == plan.stage_bytes
    assert all(b <= budget for b in actual_bytes(result))
    check_chain(result, model, args, tmp_path)
    both = om.plan_stages(program, num_stages=4, max_stage_bytes=budget)
    assert len(both.stages) == 4 and max(both.stage_bytes) <= budget


@pytest.mark.slow
def test_budget_that_cannot_be_met_names_the_largest_module(gpt2_6) -> None:
    _, _, program = gpt2_6
    with pytest.raises(om.OnnxModularError) as info:
        om.split_stages(program, max_stage_bytes=40_000)
    message = str(info.value)
    assert "\n" not in message and rules.SPLIT_POINT.id in message
    assert "largest indivisible part, module 'model.h.0' (50.82 kB)" in message
    with pytest.raises(om.OnnxModularError, match="at most 8 stage"):
        om.split_stages(program, num_stages=9)
    with pytest.raises(om.OnnxModularError, match="allow more stages"):
        om.split_stages(program, num_stages=2, max_stage_bytes=120_000)
    with pytest.raises(om.OnnxModularError, match="not both"):
        om.split_stages(program, split_points={"model.h.2": "beginning"}, num_stages=2)
    with pytest.raises(om.OnnxModularError, match="positive int"):
        om.split_stages(program, num_stages=0)


class BigEmbedding(Tied):
    """A tied vocabulary far larger than a block: the embedding is the indivisible part."""

    def __init__(self) -> None:
        super().__init__(vocab=512, dim=8)


@pytest.mark.slow
def test_tied_weights_count_in_every_stage_that_holds_a_copy(tmp_path) -> None:
    torch.manual_seed(0)
    model, ids = Tied(vocab=64, dim=8).eval(), torch.randint(0, 64, (2, 5))
    result = om.split_stages(model, (ids,), num_stages=2)
    plan = result.stage_plan
    assert plan.blocks == "body.layers"
    embed = 64 * 8 * 4
    assert actual_bytes(result) == plan.stage_bytes
    assert all(b >= embed for b in plan.stage_bytes)  # first (embed) and last (head) hold it
    assert len(result.manifest()["shared_parameters"]) == 1  # the tied weight, copied
    check_chain(result, model, (ids,), tmp_path)
    with pytest.raises(om.OnnxModularError) as info:
        om.split_stages(BigEmbedding().eval(), (ids,), max_stage_bytes=1000)
    assert "module 'embed' (16.38 kB), with the rest of [embed]" in str(info.value)


class Flat(nn.Module):
    """No repeated block list: cuts fall between the top-level modules."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


@pytest.mark.slow
def test_without_a_block_list_top_level_modules_are_the_units(tmp_path) -> None:
    model, x = Flat().eval(), torch.randn(2, 8)
    result = om.split_stages(model, (x,), num_stages=2)
    assert result.stage_plan.blocks is None
    assert [s.modules for s in result.stage_plan.stages] == ["a", "b, c"]  # 576 | 1632 B
    assert actual_bytes(result) == result.stage_plan.stage_bytes
    check_chain(result, model, (x,), tmp_path)


@pytest.mark.slow
def test_cli_prints_the_plan_before_writing(tmp_path, capsys) -> None:
    file = tmp_path / "m.py"
    file.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(models.__file__.rsplit('/', 1)[0])!r})\n"
        "import models\n"
        "def model():\n    return models.gpt2(layers=4)[0]\n"
        "def inputs():\n    return models.gpt2(layers=4)[1]\n")
    out = tmp_path / "stages"
    assert main(["split", f"{file}:model", "--inputs", f"{file}:inputs", "--num-stages", "2",
                 "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.index("2 stage(s) by num_stages=2") < text.index("written to")
    assert "stage_0: " in text and "model.h.0-1" in text
    assert main(["split", f"{file}:model", "--inputs", f"{file}:inputs",
                 "--max-stage-bytes", "10kB", "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "largest indivisible part, module 'model.h.0'" in err
    assert not (tmp_path / "x").exists()
    assert main(["split", f"{file}:model", "--inputs", f"{file}:inputs",
                 "--max-stage-bytes", "lots", "-o", str(tmp_path / "x")]) == 2
    assert "'lots' is not a size" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["split", f"{file}:model", "--inputs", f"{file}:inputs",
              "--num-stages", "2", "--markers", "-o", str(tmp_path / "x")])
    assert exc.value.code == 2
    assert "argument --markers: not allowed with" in capsys.readouterr().err


def test_parse_bytes() -> None:
    from onnx_modular.leaves._util import format_bytes, parse_bytes

    assert parse_bytes("2GB") == 2_000_000_000
    assert parse_bytes("1.5 GiB") == 1_610_612_736
    assert parse_bytes("4096") == 4096 and parse_bytes("1e9") == 10**9
    assert format_bytes(1_234_567) == "1.23 MB"
    with pytest.raises(ValueError):
        parse_bytes("2 GBs")


@pytest.mark.slow
def test_last_block_alone_and_the_tail_are_two_stages(gpt2_6, tmp_path) -> None:
    """Eight units in eight stages: 'model.h.5' is cut at its beginning and at its end, and
    both cuts are made (a dict of split points kept one: the plan said 8, 7 were written)."""
    model, args, program = gpt2_6
    result = om.split_stages(program, num_stages=8)
    plan = result.stage_plan
    assert plan.cuts[-2:] == [("model.h.5", "beginning"), ("model.h.5", "end")]
    assert len(result.stages) == len(plan.stages) == 8
    assert actual_bytes(result) == plan.stage_bytes
    check_chain(result, model, args, tmp_path)
