"""The GPU memory lock without a GPU (tests/gpu_memory_lock.py): a hog runs alone among processes that
share the device, and it is not starved by a stream of short tests."""

from __future__ import annotations

import fcntl
import multiprocessing
import time
from pathlib import Path

import pytest
from gpu_memory_lock import gpu_memory_turn, lock_folder


def _record(folder: Path, log: Path, name: str, exclusive: bool, repeats: int, hold_s: float) -> None:
    for _ in range(repeats):
        with gpu_memory_turn(exclusive, folder):
            start = time.monotonic()
            time.sleep(hold_s)
            end = time.monotonic()
        with open(log, "a") as f:
            f.write(f"{name} {int(exclusive)} {start} {end}\n")


def test_a_hog_runs_alone_and_is_not_starved(tmp_path: Path) -> None:
    folder, log = tmp_path / "locks", tmp_path / "log"
    ctx = multiprocessing.get_context("fork")
    tests = [ctx.Process(target=_record, args=(folder, log, f"t{i}", False, 40, 0.02)) for i in range(4)]
    for p in tests:
        p.start()
    time.sleep(0.1)  # (the short tests are running, overlapping each other)
    hog = ctx.Process(target=_record, args=(folder, log, "hog", True, 1, 0.2))
    hog.start()
    for p in [*tests, hog]:
        p.join(60)
        assert p.exitcode == 0
    rows = [line.split() for line in log.read_text().splitlines()]
    spans = [(name, bool(int(x)), float(a), float(b)) for name, x, a, b in rows]
    ((_, _, h0, h1),) = [s for s in spans if s[1]]
    shared = [s for s in spans if not s[1]]
    assert len(shared) == 160
    assert not [s for s in shared if s[2] < h1 and h0 < s[3]], "a test ran beside the hog"
    # the short tests overlapped each other (shared), and the hog did not wait for all of them to end
    assert any(a[2] < b[3] and b[2] < a[3] for a in shared for b in shared if a[0] != b[0])
    assert h1 < max(s[3] for s in shared) - 0.1


def test_the_folder_is_per_visible_device_set(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    one = lock_folder()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert lock_folder() != one and lock_folder().name.endswith("-0,1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert lock_folder().name.endswith("-all")


def _run_lock_is_free(folder: Path) -> bool:
    with open(folder / "run.lock", "a+") as f:  # (a new open file: flock sees another holder)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
        return True


@pytest.mark.parametrize("exclusive", [False, True], ids=["test", "hog"])
def test_the_memory_goes_back_before_the_turn_ends(tmp_path: Path, exclusive: bool) -> None:
    # the cached memory must be back with the driver before a waiting hog starts, even when the test failed
    folder, seen = tmp_path / "locks", []
    with (
        pytest.raises(ValueError),
        gpu_memory_turn(exclusive, folder, release=lambda: seen.append(_run_lock_is_free(folder))),
    ):
        raise ValueError("the test failed")
    assert seen == [False] and _run_lock_is_free(folder)
