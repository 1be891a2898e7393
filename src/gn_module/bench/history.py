"""Saved pytest-benchmark runs of benchmarks/: read them, gate a run against a baseline, show history.

A saved run is pytest-benchmark's JSON (``--benchmark-autosave`` into ``.benchmarks/``, or
``--benchmark-json``). Each benchmark's ``extra_info`` (benchmarks/test_bench_groupnorm.py) names its
case, dtype, direction and implementation and holds the fraction of SOL; ``stats`` holds the CUDA-event
times in seconds. Pure Python (no torch); matplotlib only for the plot.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gn_module.bench.cases import COMPILE_IMPLS, IMPLS, OURS

#: Our implementations: the gate fails on these only; the peers are reported.
OUR_IMPLS = ("ours-auto", "ours-1pass", "ours-2pass")
#: Default regression threshold: a median more than 10 % above the baseline's.
DEFAULT_THRESHOLD = 0.10

Key = tuple[str, str, str, str]  # case, dtype, direction, impl


@dataclass(frozen=True)
class Entry:
    """One benchmark of a saved run."""

    key: Key
    name: str  # pytest-benchmark's fullname
    median_us: float
    sol: float | None

    @property
    def impl(self) -> str:
        return self.key[3]


@dataclass
class SavedRun:
    """One saved pytest-benchmark run."""

    path: Path
    datetime: str
    commit: str
    dirty: bool
    machine_info: dict[str, Any]
    entries: dict[Key, Entry] = field(default_factory=dict)
    #: a baseline merged from several runs (`newest_per_benchmark`): each run's label and entries taken
    parts: tuple[tuple[str, int], ...] = ()

    @property
    def label(self) -> str:
        own = f"{self.commit[:8]}{'+' if self.dirty else ''} {self.datetime[:16].replace('T', ' ')}"
        if len(self.parts) < 2:
            return own
        return "newest run per benchmark: " + ", ".join(f"{label} ({n})" for label, n in self.parts)


def storage_path(storage: str | Path) -> Path:
    """A pytest-benchmark storage spec (``file://PATH`` or a plain path) -> the folder."""
    text = str(storage)
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif "://" in text:
        raise ValueError(f"only file storage is supported, got {storage!r}")
    return Path(text).expanduser()


def parse_run(path: Path, data: Mapping[str, Any]) -> SavedRun:
    """A SavedRun from the JSON of one run; benchmarks without our extra_info are skipped."""
    commit = data.get("commit_info") or {}
    run = SavedRun(
        path=path,
        datetime=str(data.get("datetime", "")),
        commit=str(commit.get("id") or "unknown"),
        dirty=bool(commit.get("dirty")),
        machine_info=dict(data.get("machine_info") or {}),
    )
    for bench in data.get("benchmarks", []):
        extra = bench.get("extra_info") or {}
        stats = bench.get("stats") or {}
        try:
            key = (extra["case"], extra["dtype"], extra["direction"], extra["impl"])
            median_us = float(stats["median"]) * 1e6
        except (KeyError, TypeError, ValueError):
            continue
        if extra["impl"] == "foreign" and extra.get("impl_spec"):
            key = (*key[:3], f"foreign:{extra['impl_spec']}")
        sol = extra.get("sol_fraction")
        run.entries[key] = Entry(key, str(bench.get("fullname", "")), median_us, float(sol) if sol else None)
    return run


def load_run(path: str | Path) -> SavedRun:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read a saved benchmark run from {path}: {exc}") from exc
    return parse_run(path, data)


def load_runs(storage: str | Path) -> list[SavedRun]:
    """Every saved run under `storage` (any machine-id subfolder), oldest first."""
    root = storage_path(storage)
    if not root.is_dir():
        raise ValueError(f"benchmark storage {root} does not exist")
    runs = [load_run(p) for p in sorted(root.rglob("*.json"))]
    return sorted(runs, key=lambda r: (r.datetime, r.path.name))


def _runs_but(storage: str | Path, exclude: Iterable[str | Path]) -> list[SavedRun]:
    """The saved runs under `storage` other than `exclude`, oldest first; at least one."""
    excluded = {Path(p).resolve() for p in exclude}
    runs = [r for r in load_runs(storage) if r.path.resolve() not in excluded]
    if not runs:
        raise ValueError(f"no saved benchmark run in {storage_path(storage)}")
    return runs


def newest_run(
    storage: str | Path, *, exclude: Iterable[str | Path] = (), gpu: tuple[str, int] | None = None
) -> SavedRun:
    """The newest saved run; with `gpu` (name, SM count), the newest timed on that GPU, where one is saved
    (else the newest of all)."""
    runs = _runs_but(storage, exclude)
    same = [r for r in runs if gpu is not None and run_gpu(r) == gpu]
    return (same or runs)[-1]


def machine_folder(machine_info: Mapping[str, Any]) -> str:
    """pytest-benchmark's storage subfolder for a run's machine, e.g. ``Linux-CPython-3.12-64bit``."""
    system = machine_info.get("system", "Linux")
    implementation = machine_info.get("python_implementation", "CPython")
    version = ".".join(str(machine_info.get("python_version", "")).split(".")[:2])
    wide = str(machine_info.get("machine", "")) in ("x86_64", "aarch64", "AMD64", "arm64")
    bits = "64bit" if wide else "32bit"
    return f"{system}-{implementation}-{version}-{bits}"


def saved_name(storage: str | Path, run_json: str | Path) -> Path:
    """Where a run (a ``--benchmark-json`` file) goes in the history: the path under `storage` that
    pytest-benchmark's autosave would give it, numbered after the runs already saved for its machine and
    named by the commit the run records (``commit_info.id``: benchmarks/conftest.py takes it from
    GN_BENCH_COMMIT where the tree has no current git) and the run's start,
    ``NNNN_<commit>_<YYYYMMDD_HHMMSS>[_uncommited-changes].json``."""
    path = Path(run_json)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read a benchmark run from {path}: {exc}") from exc
    commit = data.get("commit_info") or {}
    if not commit.get("id"):
        raise ValueError(f"{path} records no commit (commit_info.id): set GN_BENCH_COMMIT for the run")
    when = str(data.get("datetime", ""))
    stamp = when[:19].replace("-", "").replace(":", "").replace("T", "_")
    if len(stamp) != 15:
        raise ValueError(f"{path} has no start time (datetime: {when!r})")
    folder = storage_path(storage) / machine_folder(data.get("machine_info") or {})
    numbers = [int(p.name[:4]) for p in folder.glob("[0-9][0-9][0-9][0-9]_*.json")] if folder.is_dir() else []
    dirty = "_uncommited-changes" if commit.get("dirty") else ""  # (pytest-benchmark's spelling)
    return folder / f"{max(numbers, default=0) + 1:04d}_{commit['id']}_{stamp}{dirty}.json"


def parse_gpu(spec: str) -> tuple[str, int]:
    """`NAME:SMS` (torch's device name and SM count, e.g. "NVIDIA H200:132") as `run_gpu` gives it."""
    name, _, sms = spec.rpartition(":")
    if not name or not sms.isdigit():
        raise ValueError(f"a GPU is NAME:SMS (e.g. 'NVIDIA H200:132'), not {spec!r}")
    return name, int(sms)


def run_gpu(run: SavedRun) -> tuple[str, int] | None:
    """The GPU a run timed on: its machine_info's GPU name and SM count (None where the run does not say)."""
    gpu = run.machine_info.get("gpu") or {}
    if not isinstance(gpu, Mapping) or not gpu.get("name"):
        return None
    return str(gpu["name"]), int(gpu.get("sm_count") or 0)


def gpu_label(gpu: tuple[str, int] | None) -> str:
    if gpu is None:
        return "an unnamed GPU"
    return f"{gpu[0]} ({gpu[1]} SMs)" if gpu[1] else gpu[0]


class NoBaselineOnThisGpu(ValueError):
    """No saved run timed on the GPU of the run to judge: times of another GPU say nothing about it."""


def newest_per_benchmark(
    storage: str | Path, *, exclude: Iterable[str | Path] = (), gpu: tuple[str, int] | None = None
) -> SavedRun:
    """A baseline of each benchmark's newest saved time: the newest run, with the benchmarks it did not
    time (a run of one direction, `-k fwd`) taken from the newest older run that has them. So a partial
    run does not take the other benchmarks out of the next gate. `gpu` (`run_gpu` of the run to judge):
    only runs timed on that GPU; `NoBaselineOnThisGpu` where there is none (an H100's run gated against
    an H200's would fail on bandwidth alone)."""
    runs = _runs_but(storage, exclude)
    if gpu is not None:
        runs = [r for r in runs if run_gpu(r) == gpu]
        if not runs:
            raise NoBaselineOnThisGpu(f"no saved benchmark run timed on {gpu_label(gpu)} to compare with")
    newest = runs[-1]
    merged = SavedRun(newest.path, newest.datetime, newest.commit, newest.dirty, newest.machine_info)
    parts = []
    for run in reversed(runs):
        taken = {k: e for k, e in run.entries.items() if k not in merged.entries}
        if taken:
            merged.entries.update(taken)
            parts.append((run.label, len(taken)))
    merged.parts = tuple(parts)
    return merged


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def machine_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """'key: saved -> current' for every machine_info field that differs (nested keys dotted)."""
    a, b = _flatten(saved), _flatten(current)
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


# ---------------------------------------------------------------- gate
@dataclass(frozen=True)
class Change:
    key: Key
    name: str
    baseline_us: float
    current_us: float

    @property
    def ratio(self) -> float:
        return self.current_us / self.baseline_us


@dataclass
class GateResult:
    threshold: float
    regressions: list[Change]  # ours, slower than the threshold allows: the gate fails
    ours: list[Change]  # every compared benchmark of ours
    peers: list[Change]  # eager / torch.compile / foreign: reported, never failing
    only_in_run: list[Key]
    only_in_baseline: list[Key]
    # slower than the threshold in the run, within it when timed again (the recheck): reported, not failing
    cleared: list[tuple[Change, Change]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.regressions


def gate(
    baseline: SavedRun,
    current: SavedRun,
    threshold: float = DEFAULT_THRESHOLD,
    is_ours: Callable[[str], bool] = lambda impl: impl in OUR_IMPLS,
    recheck: SavedRun | None = None,
) -> GateResult:
    """Compare medians of the benchmarks both runs have; ours more than `threshold` slower fail.

    `recheck`: the flagged benchmarks timed once more (scripts/gpu_check.sh does it). A flagged one whose
    recheck median is within the threshold is cleared (reported, not failing): a burst of slow rounds in
    the run, e.g. the host stalls that session 16's and 17's history runs caught in single rows. One
    missing from the recheck, or slower there too, still fails."""
    if not threshold > 0:
        raise ValueError(f"the regression threshold must be positive, got {threshold}")
    ours, peers, regressions, cleared = [], [], [], []
    for key in sorted(set(baseline.entries) & set(current.entries)):
        b, c = baseline.entries[key], current.entries[key]
        change = Change(key, c.name, b.median_us, c.median_us)
        if is_ours(key[3]):
            ours.append(change)
            if change.ratio > 1.0 + threshold:
                again = recheck.entries.get(key) if recheck is not None else None
                second = Change(key, c.name, b.median_us, again.median_us) if again is not None else None
                if second is not None and second.ratio <= 1.0 + threshold:
                    cleared.append((change, second))
                else:
                    regressions.append(change)
        else:
            peers.append(change)
    return GateResult(
        threshold=threshold,
        regressions=regressions,
        ours=ours,
        peers=peers,
        only_in_run=sorted(set(current.entries) - set(baseline.entries)),
        only_in_baseline=sorted(set(baseline.entries) - set(current.entries)),
        cleared=cleared,
    )


def _change_line(c: Change) -> str:
    case, dtype, direction, impl = c.key
    return (
        f"  {case:26} {dtype} {direction} {impl:13} {c.baseline_us:9.1f} -> {c.current_us:9.1f} us"
        f"  x{c.ratio:.3f}"
    )


def render_gate(result: GateResult, baseline: SavedRun, current: SavedRun) -> str:
    pct = f"{result.threshold:.0%}"
    lines = [
        f"baseline: {baseline.path} ({baseline.label})",
        f"run:      {current.path} ({current.label})",
    ]
    diffs = machine_differences(baseline.machine_info, current.machine_info)
    if diffs:
        lines.append("machine_info differs (times may not be comparable): " + "; ".join(diffs))
    if not result.ours:
        lines.append("no benchmark of ours is in both runs: nothing to gate")
    ratios = sorted(c.ratio for c in result.ours)
    if ratios:
        lines.append(
            f"ours: {len(ratios)} compared, median ratio x{ratios[len(ratios) // 2]:.3f} "
            f"(best x{ratios[0]:.3f}, worst x{ratios[-1]:.3f}; >x{1 + result.threshold:.2f} fails)"
        )
    if result.peers:
        pr = sorted(c.ratio for c in result.peers)
        lines.append(
            f"peers (reported, not gated): {len(pr)} compared, median ratio x{pr[len(pr) // 2]:.3f} "
            f"(best x{pr[0]:.3f}, worst x{pr[-1]:.3f})"
        )
        slow_peers = [c for c in result.peers if c.ratio > 1.0 + result.threshold]
        if slow_peers:
            lines.append(f"peers more than {pct} slower than in the baseline (not gated):")
            lines += [_change_line(c) for c in slow_peers]
    if result.only_in_run:
        lines.append(f"{len(result.only_in_run)} benchmarks of this run have no baseline (new)")
    if result.only_in_baseline:
        lines.append(f"{len(result.only_in_baseline)} baseline benchmarks did not run this time")
    if result.cleared:
        n = len(result.cleared)
        lines.append(f"{n} of ours were more than {pct} slower, within it when timed again (not failing):")
        lines += [f"{_change_line(a)}; again {b.current_us:.1f} us" for a, b in result.cleared]
    if result.regressions:
        lines.append(f"REGRESSION: {len(result.regressions)} of our medians are more than {pct} slower:")
        lines += [_change_line(c) for c in sorted(result.regressions, key=lambda c: -c.ratio)]
        lines += ["  " + c.name for c in result.regressions]
    else:
        lines.append(f"gate passed: none of our medians is more than {pct} slower than the baseline")
    return "\n".join(lines)


# ---------------------------------------------------------------- history
def best_compile_us(run: SavedRun, case: str, dtype: str, direction: str) -> float | None:
    times = [e.median_us for impl in COMPILE_IMPLS if (e := run.entries.get((case, dtype, direction, impl)))]
    return min(times) if times else None


def history_rows(runs: Sequence[SavedRun], impl: str = OURS) -> list[dict[str, Any]]:
    """Per (case, dtype, direction) and run: our median, SOL and speedup over the best torch.compile."""
    rows = []
    groups = sorted({k[:3] for r in runs for k in r.entries if k[3] == impl})
    for case, dtype, direction in groups:
        for run in runs:
            e = run.entries.get((case, dtype, direction, impl))
            if e is None:
                continue
            best = best_compile_us(run, case, dtype, direction)
            rows.append(
                {
                    "case": case,
                    "dtype": dtype,
                    "direction": direction,
                    "run": run.label,
                    "gpu": run_gpu(run),
                    "commit": run.commit,
                    "median_us": e.median_us,
                    "sol": e.sol,
                    "vs_compile": best / e.median_us if best else None,
                }
            )
    return rows


def render_history(runs: Sequence[SavedRun], impl: str = OURS) -> str:
    rows = history_rows(runs, impl)
    if not rows:
        return f"no saved run has {impl} benchmarks"
    out = [
        f"{impl} across {len(runs)} saved runs (median us, fraction of SOL, speedup over the best "
        "torch.compile of the same run)"
    ]
    several_gpus = len({run_gpu(r) for r in runs}) > 1  # (then each row names its GPU: its us are its own)
    last = None
    for r in rows:
        group = (r["case"], r["dtype"], r["direction"])
        if group != last:
            out.append(f"{r['case']} {r['dtype']} {r['direction']}")
            last = group
        sol = f"{r['sol']:.3f}" if r["sol"] is not None else "  -  "
        vs = f"x{r['vs_compile']:.2f}" if r["vs_compile"] else "  -"
        gpu = f"  on {gpu_label(r['gpu'])}" if several_gpus else ""
        out.append(f"  {r['run']:26} {r['median_us']:10.1f} us  SOL {sol}  vs compile {vs}{gpu}")
    return "\n".join(out)


def run_tables(run: SavedRun, against: SavedRun | None = None) -> str:
    """Markdown tables of one saved run, one per (dtype, direction) in the run's order: every
    implementation's median (us), then for ours-auto its fraction of SOL, the speedup over the best
    torch.compile and over eager, and, given `against`, that run's ours-auto and the ratio of the two."""
    groups: list[tuple[str, str]] = []
    cases: list[str] = []
    for case, dtype, direction, _ in run.entries:
        if (dtype, direction) not in groups:
            groups.append((dtype, direction))
        if case not in cases:
            cases.append(case)
    impls = [i for i in IMPLS if any(k[3] == i for k in run.entries)]
    impls += sorted({k[3] for k in run.entries} - set(impls))  # (foreign implementations last)
    out = [f"Run {run.label} ({run.path.name}): median us; SOL, x compile best and x eager of {OURS}"]
    if against is not None:
        out[0] += f"; against {against.label}"
    for dtype, direction in sorted(groups, key=lambda g: (g[1] != "fwd", g[0] != "fp16", g)):
        head = ["shape", *impls, "SOL", "x compile", "x eager"]
        if against is not None:
            head += [f"{OURS} before", "now / before"]
        out += ["", f"{dtype} {direction}:", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for case in cases:
            got = {i: run.entries.get((case, dtype, direction, i)) for i in impls}
            ours = got.get(OURS)
            if not any(got.values()):
                continue
            cells = [case, *(f"{e.median_us:.1f}" if e else "-" for e in got.values())]
            best = best_compile_us(run, case, dtype, direction)
            eager = got.get("eager")
            cells += [
                f"{ours.sol:.3f}" if ours and ours.sol else "-",
                f"{best / ours.median_us:.2f}" if ours and best else "-",
                f"{eager.median_us / ours.median_us:.1f}" if ours and eager else "-",
            ]
            if against is not None:
                before = against.entries.get((case, dtype, direction, OURS))
                cells += [
                    f"{before.median_us:.1f}" if before else "-",
                    f"x{ours.median_us / before.median_us:.3f}" if ours and before else "-",
                ]
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def write_history_plot(runs: Sequence[SavedRun], path: str | Path, impl: str = OURS) -> bool:
    """SOL over runs, one line per shape, a panel per (dtype, direction). False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = history_rows(runs, impl)
    panels = sorted({(r["dtype"], r["direction"]) for r in rows})
    labels = [r.label for r in runs]
    fig, axes = plt.subplots(
        1, max(len(panels), 1), figsize=(4.5 * max(len(panels), 1), 4.2), sharey=True, squeeze=False
    )
    for ax, (dtype, direction) in zip(axes[0], panels, strict=False):
        for case in sorted({r["case"] for r in rows if (r["dtype"], r["direction"]) == (dtype, direction)}):
            pts = [
                (labels.index(r["run"]), r["sol"])
                for r in rows
                if (r["case"], r["dtype"], r["direction"]) == (case, dtype, direction) and r["sol"]
            ]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, marker="o", label=case)
        ax.set_title(f"{impl} {dtype} {direction}")
        ax.set_xticks(range(len(labels)), [lb.split()[0] for lb in labels], rotation=45, ha="right")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("fraction of SOL (copy bandwidth)")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=4, fontsize=7)
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
