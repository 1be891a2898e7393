"""Benchmark history on CPU: stable machine_info across fresh machines, storage anywhere, the ours-only
regression gate, the history table and plot, and --gn-impl timing plumbing in benchmarks/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gn_module.bench import device as bench_device
from gn_module.bench import history

ROOT = Path(__file__).resolve().parents[1]
BASELINE_DIR = ROOT / ".benchmarks"

FAKE_GPU = {
    "cuda": True,
    "name": "NVIDIA H200",
    "compute_capability": "9.0",
    "sm_count": 132,
    "total_memory_gib": 139.8,
    "driver_version": "580.159.04",
    "cuda_runtime": "13.0",
    "torch": "2.11.0+cu130",
    "sm_clock_mhz": "1980",
    "power_limit_w": "700.00",
}


# ---------------------------------------------------------------- machine identity
def test_machine_info_keeps_identity_and_drops_host_and_measured_fields() -> None:
    info = {
        "node": "host-1234",
        "processor": "x86_64",
        "machine": "x86_64",
        "python_version": "3.12.3",
        "python_implementation": "CPython",
        "python_build": ["main", "Nov 6 2025"],
        "release": "6.18.44-fc-v236-gpu",
        "system": "Linux",
        "cpu": {"brand_raw": "AMD EPYC", "hz_actual_friendly": "2.4 GHz"},
    }
    bench_device.stable_machine_info(info, FAKE_GPU)
    assert set(info) == {"machine", "python_version", "python_implementation", "system", "gpu"}
    assert info["gpu"]["name"] == "NVIDIA H200" and info["gpu"]["sm_count"] == 132
    assert "sm_clock_mhz" not in info["gpu"] and "power_limit_w" not in info["gpu"]
    assert bench_device.run_conditions(FAKE_GPU) == {"sm_clock_mhz": "1980", "power_limit_w": "700.00"}


def test_machine_differences_names_nested_keys() -> None:
    a = {"system": "Linux", "gpu": {"name": "NVIDIA H200", "sm_count": 132}}
    b = {"system": "Linux", "gpu": {"name": "NVIDIA H100", "sm_count": 132}}
    assert history.machine_differences(a, b) == ["gpu.name: 'NVIDIA H200' -> 'NVIDIA H100'"]
    assert history.machine_differences(a, a) == []


BENCH_TEST = """
def test_tiny(benchmark):
    benchmark.extra_info.update(impl="ours-auto", case="tiny", dtype="fp16", direction="fwd")
    benchmark(lambda: sum(range(100)))
"""


#: Appended to the project's copy of benchmarks/conftest.py: the machine comes from the environment.
FAKE_MACHINE = """
import json as _json, os as _os, platform as _platform
import pytest_benchmark.plugin as _pb
from gn_module.bench import device as _dev

_platform.node = lambda: _os.environ["FAKE_HOST"]
_pb.get_cpu_info = lambda: {"brand_raw": "EPYC", "hz_actual": [len(_os.environ["FAKE_HOST"]), 0]}
_dev.device_info = lambda device=None: _json.loads(_os.environ["FAKE_GPU"])
"""


@pytest.fixture(autouse=True)
def _not_an_xdist_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Child pytest runs must not inherit this worker's xdist identity (pytest-benchmark turns itself
    off under xdist)."""
    for key in [k for k in os.environ if k.startswith("PYTEST_XDIST")]:
        monkeypatch.delenv(key)


@pytest.fixture
def bench_project(pytester: pytest.Pytester) -> pytest.Pytester:
    """A project with benchmarks/conftest.py's hooks and one cheap CPU benchmark."""
    conftest = (ROOT / "benchmarks" / "conftest.py").read_text()
    (pytester.path / "conftest.py").write_text(conftest + FAKE_MACHINE)
    pytester.makepyfile(test_tiny=BENCH_TEST)
    return pytester


def run_on_machine(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, host: str, gpu: dict[str, Any], *args: str
) -> pytest.RunResult:
    """Run the project in a subprocess as if on a fresh machine: host name, CPU clock and GPU facts."""
    monkeypatch.setenv("FAKE_HOST", host)
    monkeypatch.setenv("FAKE_GPU", json.dumps(gpu))
    return project.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", *args)


@pytest.mark.parametrize("where", ["absolute outside the working directory", "relative"])
def test_two_fresh_machines_of_one_kind_compare_without_machine_warning(
    bench_project: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
    where: str,
) -> None:
    storage = "file://store" if where == "relative" else f"file://{tmp_path_factory.mktemp('elsewhere')}"
    first = run_on_machine(
        bench_project,
        monkeypatch,
        "host-a",
        FAKE_GPU,
        "--benchmark-autosave",
        f"--benchmark-storage={storage}",
    )
    first.assert_outcomes(passed=1)
    second = run_on_machine(
        bench_project,
        monkeypatch,
        "host-bb",
        {**FAKE_GPU, "sm_clock_mhz": "345"},  # clocks are run conditions, not identity
        f"--benchmark-storage={storage}",
        "--benchmark-compare",
        "--benchmark-compare-fail=median:100000%",
    )
    out = second.stdout.str() + second.stderr.str()
    assert second.ret == 0, out
    assert "Comparing against benchmarks from" in out
    assert "machine_info is different" not in out
    assert "INTERNALERROR" not in out


@pytest.mark.parametrize("where", ["absolute outside the working directory", "relative"])
def test_another_gpu_warns_and_does_not_crash(
    bench_project: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
    where: str,
) -> None:
    storage = "file://store" if where == "relative" else f"file://{tmp_path_factory.mktemp('elsewhere')}"
    run_on_machine(
        bench_project, monkeypatch, "a", FAKE_GPU, "--benchmark-autosave", f"--benchmark-storage={storage}"
    )
    other = run_on_machine(
        bench_project,
        monkeypatch,
        "a",
        {**FAKE_GPU, "name": "NVIDIA H100 80GB HBM3"},
        f"--benchmark-storage={storage}",
        "--benchmark-compare",
    )
    out = other.stdout.str() + other.stderr.str()
    assert other.ret == 0, out
    assert "machine_info is different" in out and "H100" in out
    assert "INTERNALERROR" not in out


def test_the_committed_baseline_holds_no_measured_machine_info() -> None:
    runs = history.load_runs(BASELINE_DIR)
    assert runs, "the committed H200 baseline is missing from .benchmarks/"
    for run in runs:
        gpu = run.machine_info.get("gpu", {})
        assert set(run.machine_info) <= {*bench_device.PLATFORM_KEYS, "gpu"}, run.path
        assert set(gpu) <= set(bench_device.IDENTITY_KEYS), run.path
        assert gpu.get("name") and run.commit not in ("unknown", "unversioned")


# ---------------------------------------------------------------- gate and history
def saved_json(
    medians_us: dict[tuple[str, str, str, str], float],
    commit: str,
    when: str,
    gpu: dict[str, Any] | None = None,
) -> dict[str, Any]:
    benchmarks = []
    for (case, dtype, direction, impl), us in medians_us.items():
        benchmarks.append(
            {
                "fullname": f"{BENCH_FILE}::test_groupnorm[{case}-{dtype}-{direction}-{impl}]",
                "stats": {"median": us * 1e-6},
                "extra_info": {
                    "case": case,
                    "dtype": dtype,
                    "direction": direction,
                    "impl": impl,
                    "sol_fraction": 100.0 / us,
                },
            }
        )
    return {
        "machine_info": {"system": "Linux", "gpu": gpu or {"name": "NVIDIA H200"}},
        "commit_info": {"id": commit, "dirty": False},
        "datetime": when,
        "benchmarks": benchmarks,
    }


BENCH_FILE = "benchmarks/test_bench_groupnorm.py"
BASE = {
    ("1x8x4x4-G2", "fp16", "fwd", "ours-auto"): 200.0,
    ("1x8x4x4-G2", "fp16", "fwd", "ours-2pass"): 210.0,
    ("1x8x4x4-G2", "fp16", "fwd", "eager"): 400.0,
    ("1x8x4x4-G2", "fp16", "fwd", "compile-cl"): 300.0,
    ("1x8x4x4-G2", "fp16", "fwd", "compile-nchw"): 250.0,
    ("1x8x4x4-G2", "fp16", "bwd", "ours-auto"): 500.0,
}


def write_runs(folder: Path, *runs: dict[str, Any]) -> list[Path]:
    sub = folder / "Linux-CPython-3.12-64bit"
    sub.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, run in enumerate(runs, 1):
        path = sub / f"{i:04d}_{run['commit_info']['id']}.json"
        path.write_text(json.dumps(run))
        paths.append(path)
    return paths


def test_gate_fails_on_our_regression_only_and_names_it(tmp_path: Path) -> None:
    slower_ours = {**BASE, ("1x8x4x4-G2", "fp16", "bwd", "ours-auto"): 1000.0}
    slower_peer = {**BASE, ("1x8x4x4-G2", "fp16", "fwd", "eager"): 900.0}
    base, bad, peer = write_runs(
        tmp_path,
        saved_json(BASE, "aaa", "2026-11-30T07:00:00"),
        saved_json(slower_ours, "bbb", "2026-11-30T08:00:00"),
        saved_json(slower_peer, "ccc", "2026-11-30T09:00:00"),
    )
    result = history.gate(history.load_run(base), history.load_run(bad))
    assert not result.ok
    assert [c.key for c in result.regressions] == [("1x8x4x4-G2", "fp16", "bwd", "ours-auto")]
    text = history.render_gate(result, history.load_run(base), history.load_run(bad))
    assert "REGRESSION" in text and "test_groupnorm[1x8x4x4-G2-fp16-bwd-ours-auto]" in text
    peer_result = history.gate(history.load_run(base), history.load_run(peer))
    assert peer_result.ok and len(peer_result.peers) == 3
    assert "eager" in history.render_gate(peer_result, history.load_run(base), history.load_run(peer))
    # 9 % slower passes at the default 10 %, fails at 5 %
    near = {**BASE, ("1x8x4x4-G2", "fp16", "fwd", "ours-auto"): 218.0}
    (near_path,) = write_runs(tmp_path / "near", saved_json(near, "ddd", "2026-11-30T10:00:00"))
    assert history.gate(history.load_run(base), history.load_run(near_path)).ok
    assert not history.gate(history.load_run(base), history.load_run(near_path), 0.05).ok


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gn_module.bench", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_gate_cli_exit_status_and_default_baseline(tmp_path: Path) -> None:
    slower = {k: v * 2 if k[3].startswith("ours") else v for k, v in BASE.items()}
    base, _ = write_runs(
        tmp_path,
        saved_json(BASE, "aaa", "2026-11-30T07:00:00"),
        saved_json(slower, "bbb", "2026-11-30T08:00:00"),
    )
    proc = run_cli("gate", "--storage", f"file://{tmp_path}")  # newest run vs the newest other one
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (
        "REGRESSION: 3 of our medians" in proc.stdout
        and "ours: 3 compared, median ratio x2.000" in proc.stdout
    )
    same = run_cli("gate", "--baseline", str(base), "--run", str(base))
    assert same.returncode == 0 and "gate passed" in same.stdout
    empty = run_cli("gate", "--storage", str(tmp_path / "nothing"))
    assert empty.returncode == 2 and "does not exist" in empty.stderr


def test_a_partial_run_leaves_the_other_benchmarks_gated(tmp_path: Path) -> None:
    # run 2 timed the forward only (-k fwd): the backward's baseline stays run 1's, and a slower backward
    # in run 3 still fails the default gate
    bwd = ("1x8x4x4-G2", "fp16", "bwd", "ours-auto")
    fwd_only = {k: v * 0.95 for k, v in BASE.items() if k[2] == "fwd"}
    base, partial, slower = write_runs(
        tmp_path,
        saved_json(BASE, "aaa", "2026-11-30T07:00:00"),
        saved_json(fwd_only, "bbb", "2026-11-30T08:00:00"),
        saved_json({**BASE, bwd: 1000.0}, "ccc", "2026-11-30T09:00:00"),
    )
    merged = history.newest_per_benchmark(tmp_path, exclude=[slower])
    assert merged.entries[bwd].median_us == 500.0 and merged.entries[
        (*bwd[:2], "fwd", "ours-auto")
    ].median_us == pytest.approx(190.0)
    assert [n for _, n in merged.parts] == [5, 1] and "newest run per benchmark: bbb" in merged.label
    assert history.newest_per_benchmark(tmp_path).entries == history.load_run(slower).entries  # a full run
    proc = run_cli("gate", "--storage", f"file://{tmp_path}")  # run 3 against runs 2 and 1
    assert proc.returncode == 1 and "REGRESSION: 1 of our medians" in proc.stdout, proc.stdout + proc.stderr
    assert "ours: 3 compared" in proc.stdout and "(5), aaa" in proc.stdout
    # against run 2 alone, the backward would not have been compared
    assert bwd not in {c.key for c in history.gate(history.load_run(partial), history.load_run(slower)).ours}
    assert history.load_run(base).parts == ()


H100 = {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132}


def test_newest_of_this_gpu_for_the_comparison_table(tmp_path: Path) -> None:
    """gpu_check.sh's pytest-benchmark comparison: the newest run of the device's GPU (session 50 saved the
    first H100 run after 23 H200 runs; an H200 compared with it would read every row as 1.4x faster)."""
    h200_gpu = {"name": "NVIDIA H200", "sm_count": 132}
    h200_old, h100, h200 = write_runs(
        tmp_path,
        saved_json(BASE, "aaa", "2026-11-30T07:00:00", gpu=h200_gpu),
        saved_json(BASE, "bbb", "2026-11-30T08:00:00", gpu=H100),
        saved_json(BASE, "ccc", "2026-11-30T09:00:00", gpu=h200_gpu),
    )
    newest = lambda *gpu: run_cli("history", "--storage", str(tmp_path), "--newest", *gpu)  # noqa: E731
    assert newest().stdout.strip() == str(h200)
    assert newest("--gpu", "NVIDIA H100 80GB HBM3:132").stdout.strip() == str(h100)
    assert newest("--gpu", "NVIDIA H200:132").stdout.strip() == str(h200)
    assert newest("--gpu", "NVIDIA B200:148").stdout.strip() == str(h200)  # (none saved: the newest of all)
    assert history.newest_run(tmp_path, exclude=[h200], gpu=("NVIDIA H200", 132)).path == h200_old
    bad = newest("--gpu", "H100")
    assert bad.returncode == 2 and "NAME:SMS" in bad.stderr


def test_the_gate_compares_runs_of_the_same_gpu_only(tmp_path: Path) -> None:
    """Session 49 got an H100 where the history holds H200 runs: its copy is 3.0 TB/s against 4.25, so
    every bandwidth-bound row would have failed against the H200's times. The default baseline is the
    newest runs of the judged run's GPU; with none, nothing is gated."""
    h100_speed = {k: v * 1.4 for k, v in BASE.items()}
    write_runs(
        tmp_path,
        saved_json(BASE, "aaa", "2026-11-30T07:00:00"),
        saved_json(h100_speed, "bbb", "2026-11-30T08:00:00", gpu=H100),
    )
    first = run_cli("gate", "--storage", f"file://{tmp_path}")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "no saved benchmark run timed on NVIDIA H100 80GB HBM3 (132 SMs)" in first.stdout
    assert "nothing to gate" in first.stdout
    # a later H200 run sits between two H100 runs: the second H100 run is judged against the first
    slower = {**h100_speed, ("1x8x4x4-G2", "fp16", "bwd", "ours-auto"): 1400.0}
    _, h100, _, h100_slower = write_runs(
        tmp_path,
        saved_json(BASE, "aaa", "2026-11-30T07:00:00"),
        saved_json(h100_speed, "bbb", "2026-11-30T08:00:00", gpu=H100),
        saved_json({k: v * 0.9 for k, v in BASE.items()}, "ccc", "2026-11-30T09:00:00"),
        saved_json(slower, "ddd", "2026-11-30T10:00:00", gpu=H100),
    )
    gpu = history.run_gpu(history.load_run(h100_slower))
    assert gpu == ("NVIDIA H100 80GB HBM3", 132)
    baseline = history.newest_per_benchmark(tmp_path, exclude=[h100_slower], gpu=gpu)
    assert baseline.path == h100 and baseline.entries == history.load_run(h100).entries
    proc = run_cli("gate", "--storage", f"file://{tmp_path}")
    assert proc.returncode == 1 and "REGRESSION: 1 of our medians" in proc.stdout, proc.stdout + proc.stderr
    assert "ours: 3 compared, median ratio x1.000" in proc.stdout  # (not x1.556 against the H200's ccc)
    table = run_cli("table", "--storage", f"file://{tmp_path}")
    assert table.returncode == 0 and "bbb" in table.stdout and "ccc" not in table.stdout, table.stdout
    text = history.render_history(history.load_runs(tmp_path))
    assert "on NVIDIA H100 80GB HBM3 (132 SMs)" in text and "on NVIDIA H200\n" in text
    assert " on " not in history.render_history([history.load_run(h100), history.load_run(h100_slower)])


def test_a_recheck_clears_a_burst_and_keeps_a_real_regression(tmp_path: Path) -> None:
    key = ("1x8x4x4-G2", "fp16", "bwd", "ours-auto")
    base, run, calm, still = write_runs(
        tmp_path,
        saved_json(BASE, "aaa", "2026-11-30T07:00:00"),
        saved_json({**BASE, key: 1000.0}, "bbb", "2026-11-30T08:00:00"),
        saved_json({key: 510.0}, "bbb", "2026-11-30T08:10:00"),  # the flagged row alone, timed again
        saved_json({key: 990.0}, "bbb", "2026-11-30T08:20:00"),
    )
    b, r = history.load_run(base), history.load_run(run)
    cleared = history.gate(b, r, recheck=history.load_run(calm))
    assert cleared.ok and [(a.key, round(a.current_us), round(c.current_us)) for a, c in cleared.cleared] == [
        (key, 1000, 510)
    ]
    assert "within it when timed again" in history.render_gate(cleared, b, r)
    kept = history.gate(b, r, recheck=history.load_run(still))
    assert not kept.ok and [c.key for c in kept.regressions] == [key] and not kept.cleared
    # a recheck that lacks the row clears nothing
    (empty,) = write_runs(tmp_path / "empty", saved_json({}, "bbb", "2026-11-30T08:30:00"))
    assert [c.key for c in history.gate(b, r, recheck=history.load_run(empty)).regressions] == [key]
    proc = run_cli("gate", "--baseline", str(base), "--run", str(run), "--recheck", str(calm))
    assert proc.returncode == 0 and "again 510.0 us" in proc.stdout, proc.stdout + proc.stderr


STAND_IN_PYTHON = """#!/usr/bin/env bash
# python3 for scripts/gpu_check.sh without a GPU: the gate is the real one; pytest writes the saved runs
echo "$*" >> "$GN_FAKE_LOG"
case "$1 $2" in
  "-m gn_module.bench") exec "$GN_REAL_PYTHON" "$@" ;;
  "-m pytest")
    json=$(printf '%s\n' "$@" | sed -n 's/^--benchmark-json=//p')
    case $json in
      *recheck.json) cp "$GN_FAKE_RECHECK" "$json" ;;
      *) cp "$GN_FAKE_RUN" "$json" ;;
    esac
    echo "1 passed" ;;
esac
exit 0
"""


FLAGGED = ("1x8x4x4-G2", "fp16", "bwd", "ours-auto")


def _gpu_check_on_a_stand_in(
    tmp_path: Path, again_us: float, **env_extra: str
) -> tuple[subprocess.CompletedProcess[str], Path, list[str]]:
    """scripts/gpu_check.sh's benchmark part on a fake H200: FLAGGED runs 1000 us against the saved 500, then
    `again_us` when timed again. Returns the process, the run's json and the stand-in's pytest calls."""
    key = FLAGGED
    (tmp_path / "benchmarks").mkdir()
    storage = tmp_path / ".benchmarks"
    write_runs(storage, saved_json(BASE, "aaa", "2026-11-30T07:00:00"))
    fakes = tmp_path / "fakes"
    run, recheck = write_runs(
        fakes,
        _machine(saved_json({**BASE, key: 1000.0}, "bbb", "2026-11-30T08:00:00")),
        saved_json({key: again_us}, "bbb", "2026-11-30T08:10:00"),
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("python3", STAND_IN_PYTHON), ("nvidia-smi", "#!/bin/sh\necho 'NVIDIA H200'\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "calls.log"
    env = dict(
        os.environ,
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=str(ROOT / "src"),
        GN_REAL_PYTHON=sys.executable,
        GN_FAKE_LOG=str(log),
        GN_FAKE_RUN=str(run),
        GN_FAKE_RECHECK=str(recheck),
        GN_SKIP_TESTS="1",
        GN_BENCH_SELECT="",
        GN_BENCH_SAVE="1",
        GN_EXPECT_GPU="H200",  # the card it is meant for: the run goes on
        **env_extra,
    )
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path / "logs")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    pytest_calls = [line for line in log.read_text().splitlines() if line.startswith("-m pytest")]
    return proc, run, pytest_calls


@pytest.mark.parametrize("again_us", [510.0, 990.0], ids=["burst", "regression"])
def test_gpu_check_times_the_flagged_rows_again(tmp_path: Path, again_us: float) -> None:
    proc, run, pytest_calls = _gpu_check_on_a_stand_in(tmp_path, again_us)
    assert len(pytest_calls) == 2 and "test_groupnorm[1x8x4x4-G2-fp16-bwd-ours-auto]" in pytest_calls[1]
    summary = (tmp_path / "logs" / "summary.txt").read_text()
    assert "recheck of the 1 flagged benchmarks" in summary
    if again_us < 550:
        assert proc.returncode == 0, summary
        assert "again 510.0 us" in summary and "exit status 0" in summary
    else:
        assert proc.returncode == 1 and "REGRESSION: 1 of our medians" in summary, summary
    # GN_BENCH_SAVE: the run under its history name (after the one saved run), and no copy of the history
    saved = tmp_path / "logs" / "saved" / "Linux-CPython-3.12-64bit" / "0002_bbb_20261130_080000.json"
    assert saved.read_bytes() == run.read_bytes() and str(saved) in summary
    assert not (tmp_path / "logs" / "storage").exists()


def test_gpu_check_packs_its_logs_for_a_device_call(tmp_path: Path) -> None:
    """GN_PACK_LOGS=1: LOGDIR keeps what a reader opens first and the saved run, at most 2 folders down; the
    rest goes into logs.tgz. The device tool brings back 8 files of OUT at most, none deeper than that."""
    proc, run, _ = _gpu_check_on_a_stand_in(tmp_path, 510.0, GN_PACK_LOGS="1")
    logs = tmp_path / "logs"
    assert proc.returncode == 0, (logs / "summary.txt").read_text() + proc.stderr
    saved = "saved/Linux-CPython-3.12-64bit/0002_bbb_20261130_080000.json"
    files = sorted(str(f.relative_to(logs)) for f in logs.rglob("*") if f.is_file())
    assert files == ["bench.json", "gate.txt", "logs.tgz", saved, "summary.txt"]
    assert (logs / saved).read_bytes() == run.read_bytes()
    tgz = str(logs / "logs.tgz")
    listing = subprocess.run(["tar", "tzf", tgz], capture_output=True, text=True, check=True)
    names = {name.removeprefix("./") for name in listing.stdout.split()}
    assert {"install.log", "build.log", "bench.log", "recheck.json", "recheck.log"} <= names
    assert not names & {"summary.txt", "gate.txt", "bench.json", "saved"}


@pytest.mark.parametrize("script", ["gpu_check.sh", "tree_ab_check.sh", "silu_cost_check.sh"])
@pytest.mark.parametrize("card", ["NVIDIA H100 80GB HBM3", ""], ids=["other-card", "no-gpu"])
def test_gpu_scripts_stop_on_a_card_they_were_not_meant_for(tmp_path: Path, card: str, script: str) -> None:
    """GN_EXPECT_GPU (gpu_call.sh's stop_on_unexpected_gpu, shared by gpu_check.sh and every gpu_call_setup
    script): on any other card, or none, the script exits 3 before it installs, builds or times anything."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    smi = f"#!/bin/sh\necho '{card}'\n" if card else "#!/bin/sh\nexit 9\n"
    for name, text in (("python3", f'#!/bin/sh\necho "$*" >> {log}\n'), ("nvidia-smi", smi)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", GN_EXPECT_GPU="h200")
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / script), str(tmp_path / "logs")],
        cwd=ROOT,  # (the gpu_call_setup scripts run from the repository's root)
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    summary = (tmp_path / "logs" / "summary.txt").read_text()
    assert proc.returncode == 3, summary + proc.stderr
    assert f"stop: the GPU is '{card or 'none'}', not h200" in summary
    assert not log.exists()  # nothing installed, built or run


def _machine(run: dict[str, Any]) -> dict[str, Any]:
    """A run as benchmarks/conftest.py saves it on the GPU image (Python 3.12 on x86_64)."""
    run["machine_info"].update(machine="x86_64", python_implementation="CPython", python_version="3.12.3")
    return run


def test_save_names_a_run_as_autosave_would(tmp_path: Path) -> None:
    storage = tmp_path / ".benchmarks"
    write_runs(
        storage,
        saved_json(BASE, "aaa", "2026-11-30T07:00:00"),
        saved_json(BASE, "bbb", "2026-11-30T08:00:00"),
    )
    run = tmp_path / "bench.json"
    sha = "33b0f38039dcfd48e2145f2ce1a5f4acd38ebd3c"
    run.write_text(json.dumps(_machine(saved_json(BASE, sha, "2026-12-06T18:09:58.348561+00:00"))))
    name = f"0003_{sha}_20261206_180958.json"
    assert history.saved_name(storage, run) == storage / "Linux-CPython-3.12-64bit" / name
    proc = run_cli("save", "--storage", str(storage), "--run", str(run), "--into", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    saved = tmp_path / "out" / "Linux-CPython-3.12-64bit" / name
    assert proc.stdout.strip() == str(saved) and saved.read_bytes() == run.read_bytes()
    assert not (storage / "Linux-CPython-3.12-64bit" / name).exists()  # --into: the history itself untouched
    # into the storage: the next number after it
    assert run_cli("save", "--storage", str(storage), "--run", str(run)).returncode == 0
    assert history.saved_name(storage, run).name == f"0004_{sha}_20261206_180958.json"
    dirty = _machine(saved_json(BASE, "ccc", "2026-12-06T19:00:00"))
    dirty["commit_info"]["dirty"] = True
    run.write_text(json.dumps(dirty))
    assert history.saved_name(storage, run).name == "0004_ccc_20261206_190000_uncommited-changes.json"
    for bad in ({"commit_info": {}}, {"datetime": ""}):
        run.write_text(json.dumps({**dirty, **bad}))
        proc = run_cli("save", "--storage", str(storage), "--run", str(run))
        assert proc.returncode == 2 and ("commit" in proc.stderr or "start time" in proc.stderr), proc.stderr


def test_history_table_and_plot(tmp_path: Path) -> None:
    faster = {k: v / 2 if k[3] == "ours-auto" else v for k, v in BASE.items()}
    write_runs(
        tmp_path,
        saved_json(BASE, "aaa111", "2026-11-30T07:00:00"),
        saved_json(faster, "bbb222", "2026-12-01T07:00:00"),
    )
    runs = history.load_runs(tmp_path)
    rows = history.history_rows(runs)
    fwd = [r for r in rows if r["direction"] == "fwd"]
    assert [r["commit"] for r in fwd] == ["aaa111", "bbb222"]
    assert [round(r["vs_compile"], 3) for r in fwd] == [1.25, 2.5]  # best compile 250 us
    assert [r["sol"] for r in fwd] == [0.5, 1.0]
    pytest.importorskip("matplotlib")
    png = tmp_path / "history.png"
    proc = run_cli("history", "--storage", str(tmp_path), "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    assert "1x8x4x4-G2 fp16 fwd" in proc.stdout and "vs compile x2.50" in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_of_a_run_against_the_runs_before_it(tmp_path: Path) -> None:
    faster = {k: v / 2 if k[3] == "ours-auto" else v for k, v in BASE.items()}
    faster[("1x8x4x4-G2", "bf16", "bwd", "ours-auto")] = 80.0  # (a row the run before lacks)
    base, new = write_runs(
        tmp_path,
        saved_json(BASE, "aaa111", "2026-11-30T07:00:00"),
        saved_json(faster, "bbb222", "2026-12-01T07:00:00"),
    )
    text = history.run_tables(history.load_run(new), history.load_run(base))
    lines = text.splitlines()
    assert "bbb222" in lines[0] and "against aaa111" in lines[0]
    assert [ln for ln in lines if ln.endswith(":")] == ["fp16 fwd:", "fp16 bwd:", "bf16 bwd:"]
    fwd = next(ln for ln in lines if ln.startswith("| 1x8x4x4-G2") and "400.0" in ln)
    # ours-auto 100 us; SOL 100/100; best compile 250 us; eager 400 us; before 200 us
    want = "| 1x8x4x4-G2 | 100.0 | 210.0 | 400.0 | 300.0 | 250.0 | 1.000 | 2.50 | 4.0 | 200.0 | x0.500 |"
    assert fwd == want
    bwd_bf16 = lines[-1]
    assert bwd_bf16.startswith("| 1x8x4x4-G2 | 80.0 |") and bwd_bf16.endswith("| - | - |")
    header = next(ln for ln in lines if ln.startswith("| shape"))
    # (the columns of the implementations the run timed)
    assert "ours-1pass" not in header and "ours-2pass" in header and "ours-auto before" in header
    # the CLI: the newest run against the others by default; --no-against drops the columns
    proc = run_cli("table", "--storage", str(tmp_path))
    assert proc.returncode == 0 and fwd in proc.stdout, proc.stdout + proc.stderr
    plain = run_cli("table", "--storage", str(tmp_path), "--no-against")
    assert "ours-auto before" not in plain.stdout and "| 1x8x4x4-G2 | 100.0 |" in plain.stdout


def test_history_reads_the_committed_baseline() -> None:
    proc = run_cli("history", "--storage", str(BASELINE_DIR))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("1x128x1024x2048-G16") == 4  # 2 dtypes x 2 directions


def test_plant_slowdown_wraps_both_entry_points(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import plant_slowdown
    finally:
        sys.path.pop(0)
    plant_slowdown.plant(ROOT / "csrc", tmp_path / "csrc")
    for filename, entry in plant_slowdown.ENTRIES.items():
        text = (tmp_path / "csrc" / filename).read_text()
        assert text.count(f"{entry}_once_planted(args, stream)") == 2
        assert f'extern "C" int {entry}(const GnArgs* args, void* stream) {{' in text


# ---------------------------------------------------------------- --gn-impl in benchmarks/
CPU_FIXTURES = """
import time

import pytest
import torch


class CpuTimer:
    device = torch.device("cpu")
    delay_us = 0.0

    def warm_up(self, fn, warmup):
        fn()
        return 1.0

    def measure_once(self, fn):
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e6


class Bandwidth:
    tbps = 1.0


@pytest.fixture(scope="session")
def event_timer():
    return CpuTimer()


@pytest.fixture(scope="session")
def copy_bandwidth():
    return Bandwidth()
"""

FAKE_IMPL = """
import torch.nn.functional as F

calls = []


def group_norm(x, num_groups, weight, bias, eps, act):
    calls.append(tuple(x.shape))
    y = F.group_norm(x, num_groups, weight, bias, eps)
    return F.silu(y) if act == "silu" else y


def refuses_silu(x, num_groups, weight, bias, eps, act):
    if act == "silu":
        raise NotImplementedError("no fused SiLU")
    return F.group_norm(x, num_groups, weight, bias, eps)
"""


@pytest.fixture
def bench_suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """benchmarks/ with CPU stand-ins for the CUDA timer, on two tiny shapes."""
    (pytester.path / "conftest.py").write_text((ROOT / "benchmarks" / "conftest.py").read_text())
    sub = pytester.path / "suite"
    sub.mkdir()
    (sub / "conftest.py").write_text(CPU_FIXTURES)
    (sub / "test_bench_groupnorm.py").write_text(
        (ROOT / "benchmarks" / "test_bench_groupnorm.py").read_text()
    )
    (pytester.path / "fakemod.py").write_text(FAKE_IMPL)
    monkeypatch.setenv("PYTHONPATH", str(pytester.path))
    monkeypatch.setenv("GN_BENCH_SHAPES", "1x8x4x4 G2; 2x16x2x2 G4 +SiLU")
    monkeypatch.setenv("GN_BENCH_REPS", "3")
    return pytester


def test_benchmarks_time_a_foreign_groupnorm_next_to_ours(
    bench_suite: pytest.Pytester, tmp_path: Path
) -> None:
    out = tmp_path / "run.json"
    result = bench_suite.runpytest_subprocess(
        "suite",
        "-k",
        "foreign",
        "--gn-impl",
        "fakemod:group_norm",
        f"--benchmark-json={out}",
        "-p",
        "no:randomly",
    )
    result.assert_outcomes(passed=8)  # 2 shapes x 2 dtypes x 2 directions, only timing (no validation suite)
    benches = json.loads(out.read_text())["benchmarks"]
    assert {b["extra_info"]["impl"] for b in benches} == {"foreign"}
    assert {b["extra_info"]["impl_spec"] for b in benches} == {"fakemod:group_norm"}
    assert {b["group"] for b in benches} >= {"1x8x4x4-G2 fp16 fwd", "2x16x2x2-G4-silu bf16 bwd"}
    run = history.load_run(out)
    assert ("1x8x4x4-G2", "fp16", "fwd", "foreign:fakemod:group_norm") in run.entries


def test_foreign_benchmarks_are_deselected_without_gn_impl(bench_suite: pytest.Pytester) -> None:
    result = bench_suite.runpytest_subprocess("suite", "--collect-only", "-q", "-p", "no:randomly")
    text = result.stdout.str()
    assert "test_groupnorm_foreign" not in text
    assert "48/56 tests collected (8 deselected)" in text  # 2 shapes x 2 x 2 x 6 of ours and the peers


def test_unsupported_shapes_of_a_foreign_groupnorm_are_skipped(bench_suite: pytest.Pytester) -> None:
    result = bench_suite.runpytest_subprocess(
        "suite", "-k", "foreign", "--gn-impl", "fakemod:refuses_silu", "-rs", "-p", "no:randomly"
    )
    result.assert_outcomes(passed=4, skipped=4)
    result.stdout.fnmatch_lines(["*fakemod:refuses_silu does not support 2x16x2x2-G4-silu*no fused SiLU*"])
