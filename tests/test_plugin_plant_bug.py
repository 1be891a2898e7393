"""scripts/plant_bug.py: every planting site is still in csrc/ (the kernels get rewritten; the
GPU demonstrations of issue 11 depend on these sites), and planting changes exactly that site."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "plant_bug.py"


plant_bug = load_script("plant_bug", register=True)

#: The source whose kernels instantiate each task planting's site (device functions of csrc/gn_task_*.cuh).
TASK_PLANTING_SOURCES = {
    "task-overflow-drop": "gn_forward.cu",
    "task-bwd-overflow-drop": "gn_backward_tasks.cu",
    "task-bwd1-reread-skip": "gn_backward_onepass.cu",
    "task-bwd1-param-clobbered": "gn_backward_onepass.cu",
    "task-bwd-strips-count": "gn_backward_tasks.cu",
    "task-bwd-column-word": "gn_backward_tasks.cu",
    "task-bwd-strip-blocks-late": "gn_backward_tasks.cu",
    "task-fwd1-shift-other-task": "gn_forward.cu",
}


#: The timing experiments (scripts/ab_trees.sh TREE%PLANTING), by the source that instantiates them.
TIMING_PLANTING_SOURCES = {
    "timing-bwd-no-param-sums": "gn_backward_tasks.cu",
    "timing-bwd-warm-chunks-2": "gn_backward_tasks.cu",
    "timing-fwd-less-math": "gn_forward.cu",
    "timing-fwd-no-fold": "gn_forward.cu",
    "timing-fwd-copy-only": "gn_forward.cu",
}


def test_every_planting_site_is_in_csrc_exactly_once() -> None:
    assert {n for n in plant_bug.PLANTINGS if n.startswith("task-")} == set(TASK_PLANTING_SOURCES)
    assert {n for n in plant_bug.PLANTINGS if n.startswith("timing-")} == set(TIMING_PLANTING_SOURCES)
    assert plant_bug.missing_sites() == [], "move the sites in scripts/plant_bug.py to the new kernels"


def local_includes(source: Path) -> set[str]:
    """The csrc headers `source` includes, directly or through other headers."""
    seen: set[str] = set()
    todo = [source]
    while todo:
        for name in re.findall(r'^#include "([^"]+)"', todo.pop().read_text(), flags=re.MULTILINE):
            if name not in seen:
                seen.add(name)
                todo.append(source.parent / name)
    return seen


@pytest.mark.parametrize("name", sorted(plant_bug.PLANTINGS))
def test_planting_changes_its_site_only(name: str) -> None:
    p = plant_bug.PLANTINGS[name]
    bad = plant_bug.plant(name)
    try:
        for source in (ROOT / "csrc").iterdir():
            planted = (bad / source.name).read_text()
            if source.name == p.file:
                assert p.site not in planted or p.site in p.replacement
                assert "PLANTED" in planted and planted.count("PLANTED") == p.replacement.count("PLANTED")
                assert planted.replace(p.replacement, p.site) == source.read_text()
            else:
                assert planted == source.read_text()
    finally:
        shutil.rmtree(bad.parent)


@pytest.mark.parametrize("name", sorted(TASK_PLANTING_SOURCES | TIMING_PLANTING_SOURCES))
def test_a_task_planting_compiles(name: str) -> None:
    """The GPU run builds the planted copy (GN_CSRC_DIR): a planting that does not compile would turn
    every case red for the wrong reason. The source that instantiates it, for the H200."""
    from gn_module import resources

    try:
        nvcc = resources.find_nvcc()
    except resources.NvccNotFound as exc:
        pytest.skip(str(exc))
    p = plant_bug.PLANTINGS[name]
    bad = plant_bug.plant(name)
    try:
        src = bad / (TASK_PLANTING_SOURCES | TIMING_PLANTING_SOURCES)[name]
        assert p.file == src.name or p.file in local_includes(src)
        kernels = [k.name for k in resources.compile_source(nvcc, src, "sm_90")]
        assert any("task" in k for k in kernels), kernels
    finally:
        shutil.rmtree(bad.parent)


def test_a_missing_site_is_reported(tmp_path) -> None:
    shutil.copytree(ROOT / "csrc", tmp_path / "csrc")
    kernels = tmp_path / "csrc" / "gn_kernels.cuh"
    kernels.write_text(
        kernels.read_text().replace(plant_bug.TILE_SAMPLE, "    n = tile / (a.tiles_per_slice);")
    )
    problems = plant_bug.missing_sites(tmp_path / "csrc")
    assert len(problems) == 1 and problems[0].startswith("sample-boundary: site occurs 0 times")
    with pytest.raises(LookupError, match="moved"):
        plant_bug.plant("sample-boundary", tmp_path / "csrc")


def test_command_line() -> None:
    run = lambda *a: subprocess.run([sys.executable, str(SCRIPT), *a], capture_output=True, text=True)  # noqa: E731
    assert run("--check").returncode == 0
    listing = run("--list")
    assert listing.returncode == 0 and len(listing.stdout.splitlines()) == len(plant_bug.PLANTINGS)
    assert run("no-such-bug").returncode == 2
    out = run("group-straddle")
    assert out.returncode == 0
    folder = Path(out.stdout.strip())
    assert "PLANTED" in (folder / "gn_kernels.cuh").read_text()
    shutil.rmtree(folder.parent)
