"""gn_module.bench.floor and the targets it may lower (CPU): what a floor rules out, what the target becomes
(90 % of the floor), that the floor's launches move exactly a row's minimum bytes, and that an unmeasured or
reachable floor leaves the issues' targets alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gn_module.bench import chain_floors as bench_chain
from gn_module.bench import floor as bench_floor
from gn_module.bench import targets as bench_targets
from gn_module.bench.cases import Case, bytes_moved
from gn_module.bench.results import Result
from gn_module.bench.timing import Timing

COPY_TBPS = 4.0
MID16 = Case((1, 512, 128, 128), 32, "silu")  # 16 MiB fp16: the mid target at <= 24 MiB (0.75 forward)
SMALL = Case((2, 320, 64, 64), 32, "silu")  # 5 MiB fp16
LARGE = Case((1, 128, 1024, 2048), 16)


def t(us: float) -> Timing:
    return Timing(us, us, us, us, us, us, 10)


def us_at_sol(case: Case, direction: str, fraction: float, dtype: str = "fp16") -> float:
    return bytes_moved(case, dtype, direction) / (COPY_TBPS * 1e12) * 1e6 / fraction


def checks(case: Case, direction: str, ours_us: float, floor_us: float | None, dtype: str = "fp16") -> dict:
    results = [Result(case, dtype, direction, "ours-auto", t(ours_us))]
    floors = {} if floor_us is None else {(case.name, dtype, direction): floor_us}
    return {c.target: c for c in bench_targets.check_targets(results, COPY_TBPS, floors)}


@pytest.mark.parametrize(
    ("threshold", "floor", "higher", "expected"),
    [
        (0.75, 0.68, True, 0.9 * 0.68),  # SOL: the floor is below the target
        (0.75, 0.75, True, None),  # reachable at the floor exactly
        (0.62, 0.98, True, None),
        (6.0, 6.37, False, 6.37 / 0.9),  # latency: the floor is above the target
        (6.0, 6.0, False, None),
        (10.0, 7.78, False, None),
    ],
)
def test_limit_adjusted(threshold: float, floor: float, higher: bool, expected: float | None) -> None:
    got = bench_floor.limit_adjusted(threshold, floor, higher)
    if expected is None:
        assert got is None
    else:
        assert got is not None and got[0] == pytest.approx(expected)
        assert f"issue: {threshold:g}" in got[1]


def test_a_sol_target_under_the_floor_becomes_ninety_percent_of_it() -> None:
    floor_us = us_at_sol(MID16, "fwd", 0.68)
    by = checks(MID16, "fwd", us_at_sol(MID16, "fwd", 0.62), floor_us)
    check = by["mid SOL (<=24MiB), 90 % of the floor"]
    assert check.threshold == pytest.approx(0.612) and check.passed is True
    assert "issue: 0.75" in check.note and "0.680" in check.note
    # the same time misses the issue's own target where no floor was measured
    plain = checks(MID16, "fwd", us_at_sol(MID16, "fwd", 0.62), None)["mid SOL (<=24MiB)"]
    assert plain.threshold == 0.75 and plain.passed is False


def test_a_reachable_target_stays_the_issues() -> None:
    by = checks(LARGE, "fwd", us_at_sol(LARGE, "fwd", 0.60), us_at_sol(LARGE, "fwd", 0.98))
    assert set(by) >= {"large SOL"} and by["large SOL"].threshold == 0.62 and by["large SOL"].passed is False


def test_a_latency_target_under_the_floor() -> None:
    by = checks(SMALL, "fwd", 7.0, 6.37)
    check = by["small us, 90 % of the floor"]
    assert check.threshold == pytest.approx(6.37 / 0.9) and check.passed is True
    assert checks(SMALL, "fwd", 7.0, 5.0)["small us"].passed is False  # a 5 us floor leaves 6 us


def test_fp32_rows_are_adjusted_but_not_judged() -> None:
    by = checks(Case((2, 1280, 16, 16), 32, "silu"), "fwd", 7.0, 6.37, dtype="fp32")  # 5 MiB in fp32
    assert by["small us, 90 % of the floor"].status == "reported"


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32", "bf16-autocast", "fp16-autocast"])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_floor_launches_move_the_rows_minimum_bytes(dtype: str, direction: str) -> None:
    case = Case((2, 8, 3, 5), 4)
    calls = bench_floor.floor_calls(case, dtype, direction, "cpu")
    kernels = bench_floor.KERNELS[direction]
    assert tuple(calls) == (kernels[:1] if direction == "fwd" and "autocast" in dtype else kernels)
    for fn in calls.values():
        out = fn()
        assert out.shape == case.shape and out.is_contiguous(memory_format=torch.channels_last)
        inputs = [v.cell_contents for v in fn.__closure__ if isinstance(v.cell_contents, torch.Tensor)]
        moved = sum(x.numel() * x.element_size() for x in {id(x): x for x in [*inputs, out]}.values())
        assert moved == bytes_moved(case, dtype, direction)


def test_floor_is_the_faster_kernel() -> None:
    assert bench_floor.Floor({"copy_": 5.3, "neg": 5.1}).us == 5.1


def test_five_dimensional_rows_use_channels_last_3d() -> None:
    case = Case((1, 8, 2, 3, 4), 4)
    y = bench_floor.floor_calls(case, "fp16", "fwd", "cpu")["copy_"]()
    assert y.is_contiguous(memory_format=torch.channels_last_3d)


# --- chain floors (scripts/chain_floor.py's JSON, bench --chain-floors) ----

H100 = "NVIDIA H100 80GB HBM3"
SESSION51 = (
    Path(__file__).parent.parent / "benchmarks" / "results" / "2026-12-05-h100-session51-chain-floor.json"
)


def chain_row(shape: str, direction: str, best_us: float, ours_us: float, ok: bool = True) -> dict:
    return {"shape": shape, "dtype": "fp16", "direction": direction, "best": {"us": best_us, "ok": ok},
            "ours_us": ours_us}  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        ("2x1280x16x16:silu", "2x1280x16x16-G32-silu"),
        ("1x128x1024x2048:G16", "1x128x1024x2048-G16"),
        ("1x128x16x256x256:G32:silu", "1x128x16x256x256-G32-silu"),
    ],
)
def test_chain_floor_specs_name_the_benchmark_cases(spec: str, name: str) -> None:
    assert bench_chain.case_name(spec) == name


@pytest.mark.parametrize("spec", ["2x1280", "2x1280x16x16:gelu", "2x1280x16x16 G32"])
def test_chain_floor_specs_that_are_not_shapes_raise(spec: str) -> None:
    with pytest.raises(bench_chain.ChainFloorError):
        bench_chain.case_name(spec)


def test_chain_floors_keep_rows_that_are_floors_and_say_why_others_are_not() -> None:
    rows = [
        chain_row("2x1280x16x16:silu", "fwd", 9.54, 11.55),
        chain_row("2x640x32x32:silu", "bwd", 25.0, 20.8),  # ours is faster: the bare kernel found no geometry
        chain_row("2x320x64x64:silu", "fwd", 9.0, 18.0, ok=False),
    ]
    got = bench_chain.parse_chain_floors({"device": H100, "rows": rows}, H100)
    assert got.us == {("2x1280x16x16-G32-silu", "fp16", "fwd"): 9.54}
    assert "beat it" in got.skipped[("2x640x32x32-G32-silu", "fp16", "bwd")]
    assert "fp64" in got.skipped[("2x320x64x64-G32-silu", "fp16", "fwd")]


@pytest.mark.parametrize("data", [{}, {"device": H100}, [], {"device": H100, "rows": [{"shape": "2x8x4x4"}]}])
def test_malformed_chain_floor_files_raise(data: object) -> None:
    with pytest.raises(bench_chain.ChainFloorError):
        bench_chain.parse_chain_floors(data, H100)  # type: ignore[arg-type]


def test_chain_floors_of_another_device_raise(tmp_path: Path) -> None:
    with pytest.raises(bench_chain.ChainFloorError, match="do not carry between GPUs"):
        bench_chain.load_chain_floors(SESSION51, "NVIDIA H200")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(bench_chain.ChainFloorError, match="cannot read"):
        bench_chain.load_chain_floors(bad, H100)


def test_the_committed_h100_chain_floors_load() -> None:
    got = bench_chain.load_chain_floors(SESSION51, H100)
    assert got.us[("2x1280x16x16-G32-silu", "fp16", "fwd")] == 9.54
    assert got.us[("2x1280x16x16-G32-silu", "fp16", "bwd")] == 13.12
    assert ("1x512x128x128-G32-silu", "fp16", "fwd") in got.skipped  # ours was faster there


def test_a_chain_floor_slower_than_the_copy_floor_sets_the_small_target() -> None:
    results = [Result(SMALL, "fp16", "fwd", "ours-auto", t(15.0))]
    key = (SMALL.name, "fp16", "fwd")
    by = {c.target: c for c in bench_targets.check_targets(results, COPY_TBPS, {key: 6.9}, {key: 14.26})}
    check = by["small us, 90 % of the chain floor"]
    assert check.threshold == pytest.approx(14.26 / 0.9) and check.passed is True
    assert "issue: 6 us" in check.note and "14.26 us" in check.note and "chain_floor.py" in check.note


def test_a_chain_floor_faster_than_the_copy_floor_leaves_the_copy_floor() -> None:
    results = [Result(SMALL, "fp16", "fwd", "ours-auto", t(7.0))]
    key = (SMALL.name, "fp16", "fwd")
    by = {c.target: c for c in bench_targets.check_targets(results, COPY_TBPS, {key: 6.9}, {key: 6.5})}
    assert set(by) == {"small us, 90 % of the floor"} and by["small us, 90 % of the floor"].passed is True


def test_a_chain_floor_under_the_target_leaves_the_issue_target() -> None:
    results = [Result(SMALL, "fp16", "bwd", "ours-auto", t(11.0))]
    key = (SMALL.name, "fp16", "bwd")
    by = {c.target: c for c in bench_targets.check_targets(results, COPY_TBPS, {}, {key: 9.0})}
    assert set(by) == {"small us"} and by["small us"].passed is False


def peer_checks(ours_us: float, peers: dict[str, float], floor_us: float | None, case: Case = SMALL) -> dict:
    results = [Result(case, "fp16", "fwd", "ours-auto", t(ours_us))]
    results += [Result(case, "fp16", "fwd", impl, t(us)) for impl, us in peers.items()]
    key = (case.name, "fp16", "fwd")
    chain = {} if floor_us is None else {key: floor_us}
    return {c.target: c for c in bench_targets.check_targets(results, COPY_TBPS, {}, chain)}


def test_a_speedup_target_the_floor_rules_out_becomes_ninety_percent_of_the_peer_over_the_floor() -> None:
    """2x320x64x64 with compile's best at 15.0 us and a 13.44 us chain floor: no GroupNorm reaches 1.5x
    (15.0 / 13.44 = 1.116x at most), so that target is 0.9 x 1.116; the 1.0x target stays the issue's."""
    by = peer_checks(14.0, {"compile-cl": 20.0, "compile-nchw": 15.0}, 13.44)
    check = by["x compile-best (<=64MiB), 90 % of the chain floor"]
    assert check.threshold == pytest.approx(0.9 * 15.0 / 13.44) and check.value == pytest.approx(15.0 / 14.0)
    assert check.passed is True and "issue: 1.5" in check.note and "1.116" in check.note
    assert by["x compile-best"].threshold == 1.0 and by["x compile-best"].passed is True
    slower = peer_checks(15.5, {"compile-nchw": 15.0}, 13.44)[
        "x compile-best (<=64MiB), 90 % of the chain floor"
    ]
    assert slower.passed is False  # 0.97x against 1.004x


def test_a_speedup_target_stays_the_issues_where_the_floor_leaves_it_reachable_or_is_unmeasured() -> None:
    by = peer_checks(14.0, {"compile-nchw": 25.0}, 13.44)  # the floor allows 1.86x
    assert by["x compile-best (<=64MiB)"].threshold == 1.5 and by["x compile-best (<=64MiB)"].passed is True
    unmeasured = peer_checks(14.0, {"compile-nchw": 15.0}, None)
    assert unmeasured["x compile-best (<=64MiB)"].threshold == 1.5
    assert unmeasured["x compile-best (<=64MiB)"].passed is False


def test_the_peer_targets_of_mid_rows_follow_the_floor_too() -> None:
    """x eager and x compile-cl (from 8 MiB up) are speedups over a peer as well."""
    by = peer_checks(20.0, {"eager": 50.0, "compile-cl": 22.0}, 12.0, case=MID16)
    eager, cl = by["x eager, 90 % of the chain floor"], by["x compile-cl, 90 % of the chain floor"]
    assert eager.threshold == pytest.approx(0.9 * 50.0 / 12.0) and eager.passed is False  # 2.5 < 3.75
    assert cl.threshold == pytest.approx(0.9 * 22.0 / 12.0) and cl.passed is False  # 1.1 < 1.65
    assert "x compile-cl" in peer_checks(20.0, {"compile-cl": 25.0}, 12.0, case=MID16)  # 2.08x allows 2x
