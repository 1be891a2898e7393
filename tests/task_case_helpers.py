"""What the CPU tests of the task cases share (forward: tests/test_plugin_tasks.py, backward:
tests/test_plugin_tasks_bwd.py): a direction's cases resolved as the plugin resolves them, with the
model standing for this GPU (an H200); the plan a case's ratio is about, recomputed from its shape; the
checks every case's geometry passes; and the stand-ins the runner's tests put for gn_module's kernels."""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from script_loader import load_script

from gn_module import profiles, schedule
from gn_module.schedule import TaskPlan, TaskTiling
from pytest_gn import tasks
from pytest_gn.cases import DEFAULT_SHAPES, CaseSpec, CaseUnavailable, GnCase, Ratio, specs_from_marker

ROOT = Path(__file__).resolve().parents[1]
BUILTIN = tuple(p.name for p in profiles.BUILTIN_PROFILES)
NUMBERS = {name: i for i, name in enumerate(BUILTIN)}
#: Stands for this GPU (ops.task_plan's slots and occupancy) in the CPU tests: an H200.
THIS_GPU = "H200"

#: What every (C, G) pair with every cell is resolved in: the geometries, in this GPU's scopes and two
#: profiles' (one with less shared memory, one with fewer blocks).
GEOMETRIES = ("even", "partial", "batch")
CELL_SCOPES = ("capped", "natural", "RTX3090", "Thor")


@dataclass(frozen=True)
class Direction:
    """One direction's task cases as the tests resolve them and recompute their plans."""

    name: str  # "fwd" or "bwd"
    registers: schedule.KernelResources  # what ptxas gives the kernel whose residency the model takes
    schedule: int  # the plan a case's ratio is about: 1 (the one-pass forward), 2 (the backward)
    resolver: Callable[..., GnCase]  # tasks.resolve_task or tasks_bwd.resolve_task_bwd

    def model_of(self, name: str) -> tasks.TaskModel:
        profile = profiles.get_profile(name)
        return lambda t: schedule.task_model(profile, self.registers, t)

    def resolve(self, spec: CaseSpec, run_on: str | None = None) -> GnCase:
        """The case as the plugin resolves it: a profile's with its modelled slots and residency (on a
        GPU `run_on`, when given), this GPU's (an H200 here) under the case's cap."""
        run = self.model_of(run_on) if run_on else None
        if spec.profile is not None:
            return self.resolver(spec, self.model_of(spec.profile), emulated=True, run_model=run)
        return self.resolver(spec, self.model_of(THIS_GPU), cap=capped_at(spec))

    def scope_plan(self, case: GnCase) -> TaskPlan:
        """The plan the case's ratio is about, recomputed from its shape with the model."""
        spec, t = case.spec, tiling_of(case)
        if spec.profile is not None:
            slots, residency = self.model_of(spec.profile)(t)
            return schedule.make_task_plan(t, self.schedule, slots, residency, residency)
        slots, residency = self.model_of(THIS_GPU)(t)
        return schedule.make_task_plan(t, self.schedule, slots, residency, capped_at(spec))

    def assert_unavailable_where_the_kernels_cannot_run(self) -> None:
        """A window the task kernels do not cover, and a GPU where not one chunk fits, have no case."""
        spec = CaseSpec(self.name, Ratio(1, 1), "fp16", "silu", 4096, 1, arch="tasks")  # 512 vectors per row
        with pytest.raises(CaseUnavailable, match="do not cover"):
            self.resolve(spec)
        tiny = profiles.limits_for("Tiny", (8, 6), 4, smem_per_sm=16 * 1024)
        spec = CaseSpec(self.name, Ratio(1, 1), "fp16", "silu", arch="tasks")
        with pytest.raises(CaseUnavailable, match="cannot run"):
            self.resolver(spec, lambda t: schedule.task_model(tiny, self.registers, t))


def tiling_of(case: GnCase) -> TaskTiling:
    """The task tiling of the case's shape and direction."""
    (n, c, *spatial), spec = case.shape, case.spec
    t = schedule.task_tiling(c, spec.groups, math.prod(spatial), spec.itemsize, spec.direction, batch=n)
    assert t is not None
    return t


def capped_at(spec: CaseSpec) -> int | None:
    """The cap this GPU's case of the spec runs under: its own (capped), none (natural)."""
    return spec.cap if spec.variant == "capped" else None


def kind_of(spec: CaseSpec) -> str:
    """A task spec's kind: "fwd", "bwd" (the two-launch backward) or "bwd1" (the one-launch backward)."""
    return spec.task_kind


def scope_of(spec: CaseSpec) -> str:
    return spec.profile or spec.variant


def scopes(specs: Iterable[CaseSpec]) -> list[str]:
    """The scopes of the specs' cases under 2**31 elements: this GPU's (capped, natural), then profiles."""
    found = {scope_of(s) for s in specs if not s.big}
    return sorted(found, key=lambda s: (s not in ("capped", "natural"), s))


def sweep_specs(kind: str) -> list[CaseSpec]:
    """The kind's task cases (`kind_of`) `pytest --gn-arch-sweep --gn-arch tasks` collects for the
    built-in profiles (every kind's cells in one rotation: the forward's, the backward's, the one-launch
    backward's)."""
    marker = {"over_2_31": True}
    every = specs_from_marker(marker, profiles=BUILTIN, profile_numbers=NUMBERS, archs=("tasks",))
    return [s for s in every if kind_of(s) == kind]


def default_specs(kind: str) -> list[CaseSpec]:
    """The kind's task specs of a test with an empty marker under --gn-arch tasks (every kind's cells
    in one rotation), after checking their ids: 48 (4 ratios x 3 dtypes x 2 acts, capped and natural),
    all different."""
    specs = [s for s in specs_from_marker({}, archs=("tasks",)) if kind_of(s) == kind]
    ids = [s.id for s in specs]
    assert len(ids) == len(set(ids)) == 48
    return specs


def in_scope(specs: Iterable[CaseSpec], scope: str) -> list[CaseSpec]:
    """The scope's specs of cases under 2**31 elements."""
    return [s for s in specs if scope_of(s) == scope and not s.big]


def assert_every_scope_has_24_cases_of_every_kind(specs: list[CaseSpec]) -> None:
    """The sweep's specs of a direction: in every scope (this GPU's capped and natural ones and every
    built-in profile) 24 cases under 2**31 elements, of every (C, G) pair and geometry; one over it."""
    kinds = {(c, g, geo) for c, g in DEFAULT_SHAPES for geo in GEOMETRIES}
    for scope in scopes(specs):
        mine = in_scope(specs, scope)
        assert len(mine) == 24, scope
        assert {(s.channels, s.groups, s.geometry) for s in mine} == kinds, scope
    assert len(specs) == 24 * (2 + len(BUILTIN)) + 1 == 337


def every_cell(kind: str, scope: str, geometry: str) -> list[CaseSpec]:
    """The scope's silu specs of the kind (`kind_of`) and geometry for every (C, G) pair with every cell,
    not only the rotation's."""
    profile = scope if scope not in ("capped", "natural") else None
    direction = "fwd" if kind == "fwd" else "bwd"
    marker = {"rotate": False, "geometries": (geometry,), "acts": ("silu",), "directions": (direction,)}
    specs = specs_from_marker(marker, profiles=(profile,) if profile else (), archs=("tasks",))
    mine = [s for s in specs if scope_of(s) == scope and kind_of(s) == kind]
    assert len(mine) == 4 * 3 * len(DEFAULT_SHAPES)
    return mine


def assert_geometry(case: GnCase, t: TaskTiling, p: TaskPlan) -> None:
    """The case's shape (tiling `t`, the scope's plan `p`) has its geometry: a partial last tile and
    chunk, or whole tiles; two or more samples and teams of several rounds (batch), or few samples; at
    most MAX_ELEMENTS elements; the grid and the cap of its scope."""
    spec = case.spec
    n, rows = t.batch, t.rows
    if spec.geometry == "partial":
        assert rows % t.rows_per_tile and rows % t.chunk_rows and t.tiles_per_task >= 2, spec.id
    else:
        assert rows % t.rows_per_tile == 0, spec.id
    assert tasks.geometry_holds(t, spec.geometry), spec.id
    if spec.geometry == "batch":
        assert n >= 2 and p.teams.rounds >= 2, spec.id
    else:
        assert n <= max(tasks.EVEN_SAMPLES), spec.id
    assert case.numel <= tasks.MAX_ELEMENTS, spec.id
    assert case.expected_grid == p.grid and case.tile_rows == t.rows_per_tile, spec.id
    if spec.profile is not None:
        assert case.cap == case.residency == p.residency, spec.id  # the grid capped at the profile's
    else:
        assert case.cap == capped_at(spec), spec.id


def assert_chunks_claim(case: GnCase, p: TaskPlan) -> None:
    """A case whose members keep chunks (the forward) or chunk pairs (the one-launch backward) on chip:
    its shape, run through the model (`p`, the scope's plan), gives the busiest member the count the
    case claims: M x slots + K, or (said in the notes) the nearest count within one ring of slots that
    stays above M x slots; x1 re-reads nothing, every other ratio re-reads; and the geometry holds."""
    spec, t = case.spec, tiling_of(case)
    ratio, slots = spec.ratio, p.slots
    busiest = p.teams.chunks_per_member
    assert busiest == max(schedule.task_member_chunks(t, p.teams.team_size)) == case.task.chunks, spec.id
    assert case.task.model_slots == slots and case.tiles == t.tiles == p.tiles and p.schedule == 1, spec.id
    want = ratio.mult * slots + ratio.plus
    if busiest != want:
        assert ratio.plus > 0 and ratio.mult * slots < busiest and abs(busiest - want) < slots, spec.id
        assert any(f"instead of {want} ({ratio.label})" in note for note in case.notes), case.notes
    reread = schedule.task_reread_chunks(p)
    if ratio.label == "x1":
        assert busiest == slots and reread == 0, spec.id  # everything kept, at the boundary
    else:
        assert busiest > slots and reread > 0, spec.id  # the re-read path runs
    assert_geometry(case, t, p)


def seconds_to_resolve(resolve: Callable[[CaseSpec], GnCase], specs: Iterable[CaseSpec]) -> float:
    """The CPU seconds resolving the specs takes with the search's plans forgotten (cold): this
    process's CPU time, so that other processes on a loaded machine (xdist workers, builds) do not
    count, as they did in wall time."""
    tasks._PLANS.clear()
    started = time.process_time()
    for spec in specs:
        resolve(spec)
    return time.process_time() - started


def plant_bug() -> ModuleType:
    """scripts/plant_bug.py, imported."""
    return load_script("plant_bug", register=True)


# ------------------------------------------------------------------ the runner's tests
def good_record(plan: TaskPlan) -> dict:
    """The launch record the task kernels leave when they follow `plan` (`tasks.record_problems`)."""
    return {"arch": 2, "schedule": plan.schedule, "grid": plan.grid, "tiles_phase1": plan.tiles,
            "tiles_applied": plan.tiles, "chunks_reread": schedule.task_reread_chunks(plan),
            "plan": plan}  # fmt: skip


def torch_group_norm(x, num_groups: int, weight, bias, eps: float, act: str | None):
    """gn_module.group_norm's result, from torch's GroupNorm in fp32."""
    import torch.nn.functional as F

    y = F.group_norm(x.float(), num_groups, weight.float(), bias.float(), eps)
    return (F.silu(y) if act == "silu" else y).to(x.dtype)


def patch_kernels(monkeypatch: pytest.MonkeyPatch, group_norm: Callable, record: dict) -> None:
    """Put `group_norm` (a CPU stand-in for gn_module's) in place, and make ops.launch_record hand out
    `record`, cleared, which the stand-in fills as the kernels would."""
    import gn_module
    from gn_module import ops

    @contextlib.contextmanager
    def launch_record():
        record.clear()
        yield record

    monkeypatch.setattr(gn_module, "group_norm", group_norm)
    monkeypatch.setattr(ops, "launch_record", launch_record)


def assert_outcome(result, problem: str | None) -> None:
    """The runner's result passed (`problem` None), or failed saying `problem`; GN_ARCH is restored."""
    if problem is None:
        assert result.ok, result.problems
    else:
        assert not result.ok and any(problem in p for p in result.problems), result.problems
    assert os.environ.get("GN_ARCH") is None
