"""scripts/time_shapes.py's tile budgets without a GPU (`--sample-tiles`, `--launch-tiles`, and
profile_tasks.py's GN_PROFILE_SAMPLE_TILES / GN_PROFILE_LAUNCH_TILES through the same function): the plans
the next GPU session's experiments ask for, and the refusal of a budget below 1."""

from __future__ import annotations

import pytest
from script_loader import load_script

from gn_module import profiles, schedule

ts = load_script("time_shapes")


@pytest.fixture(autouse=True)
def _restore_budgets(monkeypatch):
    # set_tile_budgets rebinds / updates the module's globals: put them back after each test
    monkeypatch.setattr(schedule, "MAX_TILES_PER_SAMPLE", schedule.MAX_TILES_PER_SAMPLE)
    monkeypatch.setattr(schedule, "MAX_TILES_PER_LAUNCH", dict(schedule.MAX_TILES_PER_LAUNCH))


def h200_teams(
    shape: tuple[int, ...], direction: str = "fwd"
) -> tuple[schedule.TaskTiling, schedule.TaskTeams]:
    n, c, h, w = shape
    t = schedule.task_tiling(c, 32, h * w, 2, direction, batch=n)
    assert t is not None
    slots = schedule.task_slots(t, schedule.task_smem_budget(profiles.get_profile("H200")))
    return t, schedule.choose_teams(t, 264, slots)


def test_a_sample_budget_of_1024_gives_one_team_that_keeps_every_chunk(capsys) -> None:
    t, tm = h200_teams((1, 512, 256, 256))
    assert (t.tiles_per_task, t.chunks_per_tile, tm.overflow_chunks) == (64, 16, 10)  # the default
    ts.set_tile_budgets(1024, None)
    assert "tile budget per sample: 1024" in capsys.readouterr().out
    t, tm = h200_teams((1, 512, 256, 256))
    assert (t.tasks, t.tiles_per_task, t.chunks_per_tile) == (4, 256, 4)
    assert (tm.team_size, tm.teams, tm.rounds, tm.chunks_per_member, tm.overflow_chunks) == (256, 1, 4, 4, 0)
    # the backward's slots hold 3 chunk pairs on the H200: one of a member's 4 is read again
    _, bwd = h200_teams((1, 512, 256, 256), "bwd")
    assert (bwd.team_size, bwd.rounds, bwd.chunks_per_member, bwd.overflow_chunks) == (256, 4, 4, 1)


def test_a_launch_budget_of_8192_sets_both_directions() -> None:
    ts.set_tile_budgets(None, 8192)
    assert schedule.MAX_TILES_PER_LAUNCH == {"fwd": 8192, "bwd": 8192}
    assert schedule.MAX_TILES_PER_SAMPLE == 256  # untouched
    t, tm = h200_teams((32, 128, 256, 256))
    assert (t.tiles_per_task, t.chunks_per_tile) == (256, 4)
    assert (tm.team_size, tm.teams, tm.rounds, tm.overflow_chunks) == (256, 1, 32, 0)


@pytest.mark.parametrize("budgets", [(0, None), (None, 0), (-4, 8192)])
def test_a_budget_below_one_is_refused_before_anything_changes(budgets) -> None:
    with pytest.raises(SystemExit, match="must be >= 1"):
        ts.set_tile_budgets(*budgets)
    assert schedule.MAX_TILES_PER_SAMPLE == 256
    assert schedule.MAX_TILES_PER_LAUNCH == {"fwd": 2048, "bwd": 4096}
