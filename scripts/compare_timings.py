"""Compare builds (or trees) timed by scripts/time_shapes.py --json: one Markdown row per shape, dtype,
direction and schedule, each build's rounds and the ratio of its median to the baseline's.

    python scripts/compare_timings.py default=OUT/fp16_default_*.json fused=OUT/fp16_fused_*.json
    python scripts/compare_timings.py --dir OUT [--baseline default]

Each NAME=GLOB names one build and the JSON files of its rounds (a build's rounds are its files in name
order). `--dir OUT` takes every OUT/<dtype>_<name>_<round>.json (what scripts/fused_apply_check.sh
writes). The baseline is the first build named (or `--baseline`). A ratio below 1 is faster than the
baseline. No GPU, no torch: it reads the files only.
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import statistics
import sys
from pathlib import Path

#: OUT/<dtype>_<build>_<round>.json, as scripts/fused_apply_check.sh names its time_shapes.py runs
RUN_FILE = re.compile(r"^(?P<dtype>fp16|bf16|fp32)_(?P<build>.+)_(?P<round>\d+)\.json$")

Key = tuple[str, str, str, str]  # shape, dtype, direction, passes


def load_rounds(paths: list[str]) -> dict[Key, list[float]]:
    """us per row key over the files (rounds) given, in file order."""
    rounds: dict[Key, list[float]] = {}
    for path in paths:
        with open(path) as fh:
            data = json.load(fh)
        for row in data["rows"]:
            if row.get("warm_code"):
                continue
            key = (row["shape"], row["dtype"], row["dir"], str(row["passes"]))
            rounds.setdefault(key, []).append(float(row["us"]))
    return rounds


def builds_from_dir(out: Path) -> dict[str, list[str]]:
    """{build: its files} of every <dtype>_<build>_<round>.json under `out`, builds in first-seen order."""
    found: dict[str, list[str]] = {}
    for path in sorted(out.glob("*.json"), key=lambda p: p.name):
        m = RUN_FILE.match(path.name)
        if m:
            found.setdefault(m["build"], []).append(str(path))
    return found


def table(builds: dict[str, dict[Key, list[float]]], baseline: str) -> list[str]:
    """Markdown lines: a row per key the baseline has, each build's rounds and median/baseline median."""
    names = list(builds)
    ratios = [f"{n} / {baseline}" for n in names if n != baseline]
    head = ["shape", "dtype", "dir", "passes"] + [f"{n} us" for n in names] + ratios
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in sorted(builds[baseline]):
        base = statistics.median(builds[baseline][key])
        cells = list(key)
        for n in names:
            got = builds[n].get(key)
            cells.append(" / ".join(f"{v:.2f}" for v in got) if got else "-")
        for n in names:
            if n == baseline:
                continue
            got = builds[n].get(key)
            cells.append(f"{statistics.median(got) / base:.3f}" if got and base > 0 else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("builds", nargs="*", metavar="NAME=GLOB", help="a build's name and its JSON rounds' glob")
    ap.add_argument("--dir", type=Path, help="take every <dtype>_<build>_<round>.json in this directory")
    ap.add_argument("--baseline", help="the build the ratios divide by (default: the first)")
    args = ap.parse_args(argv)
    files: dict[str, list[str]] = builds_from_dir(args.dir) if args.dir else {}
    for spec in args.builds:
        name, sep, pattern = spec.partition("=")
        if not sep or not name:
            ap.error(f"expected NAME=GLOB, got {spec!r}")
        files[name] = sorted(glob.glob(pattern))
    files = {n: paths for n, paths in files.items() if paths}
    if not files:
        print("compare_timings: no JSON files found", file=sys.stderr)
        return 2
    baseline = args.baseline or next(iter(files))
    if baseline not in files:
        ap.error(f"baseline {baseline!r} is not among the builds found: {', '.join(files)}")
    builds = {n: load_rounds(paths) for n, paths in files.items()}
    print("\n".join(table(builds, baseline)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
