"""scripts/compare_timings.py without a GPU: time_shapes.py-style JSON rounds of several builds in, one
Markdown row per shape, dtype, direction and schedule out, with each build's rounds and median ratio."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from script_loader import load_script

ct = load_script("compare_timings")


def write_round(path: Path, rows: list[tuple[str, str, str, float]]) -> None:
    """One time_shapes.py --json file: rows of (shape, dtype, dir, us), passes "auto"."""
    data = {
        "copy_tbps": 4.25,
        "rows": [
            {"shape": s, "dtype": d, "dir": direction, "passes": "auto", "warm_code": False, "us": us}
            for s, d, direction, us in rows
        ],
    }
    path.write_text(json.dumps(data))


@pytest.fixture
def out(tmp_path: Path) -> Path:
    for r, (base, fused) in enumerate(((100.0, 90.0), (102.0, 92.0)), start=1):
        write_round(tmp_path / f"fp16_default_{r}.json", [("1x128x1024x1024:silu", "fp16", "fwd", base)])
        write_round(tmp_path / f"fp16_fused_{r}.json", [("1x128x1024x1024:silu", "fp16", "fwd", fused)])
    write_round(tmp_path / "bf16_default_1.json", [("1x128x1024x1024:silu", "bf16", "fwd", 110.0)])
    write_round(tmp_path / "bf16_fused_1.json", [("1x128x1024x1024:silu", "bf16", "fwd", 121.0)])
    (tmp_path / "other.json").write_text("{}")  # not a run file: ignored
    return tmp_path


def test_builds_from_dir_groups_rounds_by_build(out: Path) -> None:
    found = ct.builds_from_dir(out)
    assert list(found) == ["default", "fused"]  # (first seen in name order; other.json is no run file)
    assert sorted(Path(p).name for p in found["default"]) == [
        "bf16_default_1.json",
        "fp16_default_1.json",
        "fp16_default_2.json",
    ]


def test_table_gives_rounds_and_median_ratio(out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ct.main(["--dir", str(out), "--baseline", "default"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "| shape | dtype | dir | passes | default us | fused us | fused / default |"
    rows = {tuple(c.strip() for c in line.strip("|").split("|"))[1]: line for line in lines[2:]}
    # fp16: medians 101 and 91 over two rounds; bf16: one round each, 10 % slower
    assert "| 100.00 / 102.00 | 90.00 / 92.00 | 0.901 |" in rows["fp16"]
    assert "| 110.00 | 121.00 | 1.100 |" in rows["bf16"]


def test_named_globs_and_a_missing_baseline(out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = str(out / "fp16_default_*.json"), str(out / "fp16_fused_*.json")
    assert ct.main([f"fused={b}", f"default={a}"]) == 0  # the first build named is the baseline
    assert "default / fused" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        ct.main([f"default={a}", "--baseline", "paired"])
    assert ct.main([f"default={out / 'nothing_*.json'}"]) == 2


def test_warm_code_rows_are_left_out(tmp_path: Path) -> None:
    path = tmp_path / "fp16_default_1.json"
    data = {"rows": [
        {"shape": "s", "dtype": "fp16", "dir": "fwd", "passes": "auto", "warm_code": False, "us": 5.0},
        {"shape": "s", "dtype": "fp16", "dir": "fwd", "passes": "auto", "warm_code": True, "us": 4.0},
    ]}  # fmt: skip
    path.write_text(json.dumps(data))
    assert ct.load_rounds([str(path)]) == {("s", "fp16", "fwd", "auto"): [5.0]}
