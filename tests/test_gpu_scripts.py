"""The GPU calls' shell scripts without a GPU: each parses (`bash -n`), and what each names still exists (its
plantings, the build flags it passes, the GPU test files it runs), so a lent GPU's minutes are not spent on
a script that has drifted from the code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "scripts").glob("*.sh"))


def plantings() -> set[str]:
    listing = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "plant_bug.py"), "--list"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {line.split("\t")[0] for line in listing.splitlines()}


def preprocessor_names() -> set[str]:
    """Every macro csrc's #if / #ifdef / #ifndef lines test."""
    text = "".join(p.read_text() for p in (ROOT / "csrc").iterdir())
    return set(re.findall(r"^\s*#\s*(?:if|ifdef|ifndef|elif)\b.*?\b(GN_\w+)", text, re.M))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_parses(script: Path) -> None:
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_what_a_script_names_exists(script: Path) -> None:
    text = script.read_text()
    for name in re.findall(r"plant_bug\.py ([a-z0-9][a-z0-9-]*)", text):
        assert name in plantings(), f"{script.name}: no planting {name!r}"
    for macro in re.findall(r"-D(GN_\w+)", text):
        assert macro in preprocessor_names(), f"{script.name}: -D{macro} switches nothing in csrc"
    for test in re.findall(r"tests/gpu/\w+\.py", text):
        assert (ROOT / test).is_file(), f"{script.name}: {test} is gone"


def test_streamed_rounds_check_names_its_experiments() -> None:
    """The options and variables streamed_rounds_check.sh passes to the timing and trace scripts."""
    text = (ROOT / "scripts" / "streamed_rounds_check.sh").read_text()
    options = set(re.findall(r"--(?:launch|sample)-tiles", text))
    envs = set(re.findall(r"GN_PROFILE_\w+", text))
    assert options == {"--launch-tiles", "--sample-tiles"} and "GN_PROFILE_SAMPLE_TILES" in envs
    assert {"GN_EXP_STREAMED_ROUNDS", "GN_EXP_STREAMED_PUBLISH"} <= set(re.findall(r"-D(GN_\w+)", text))
    assert "plant_bug.py streamed-reader-stuck" in text
    time_shapes = (ROOT / "scripts" / "time_shapes.py").read_text()
    for option in options:
        assert f'"{option}"' in time_shapes, option
    profile = (ROOT / "scripts" / "profile_tasks.py").read_text()
    for env in envs:
        assert env in profile, env


def test_sweep_shapes_parse() -> None:
    """The sweeps' --shape option (task_team_sweep.py's, shared by window_sweep.py and geometry_sweep.py):
    time_shapes.py's specs, with argparse's error for a bad one."""
    import argparse

    from script_loader import SCRIPTS, load_script

    sys.path.insert(0, str(SCRIPTS))  # (as when run as a script: its folder is sys.path[0])
    try:
        sweep = load_script("task_team_sweep")
        assert sweep.parse_shape("8x256x56x56") == ((8, 256, 56, 56), 32, None)
        assert sweep.parse_shape("8x240x28x28:G8:silu") == ((8, 240, 28, 28), 8, "silu")
        assert sweep.parse_shape("2x320x4x16x16:silu") == ((2, 320, 4, 16, 16), 32, "silu")
        for bad in ("8xAx56x56", "8x256x56x56:G", "8x256x56x56:swish"):
            with pytest.raises(argparse.ArgumentTypeError):
                sweep.parse_shape(bad)
    finally:
        sys.path.remove(str(SCRIPTS))
