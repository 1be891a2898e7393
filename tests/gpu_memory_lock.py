"""GPU tests that take most of the device's memory run alone, under pytest-xdist too: every GPU test holds a
shared lock while it runs, a memory hog (`@pytest.mark.gpu_memory_hog`) an exclusive one. Session 49's H100
(80 GB) ran the suite out of memory under `-n 8`: the two >2**31-element tests (one holds about 50 GB) and
the out-of-memory test (70 % of what is free) at once, beside the other workers. Two locks, so that a hog
does not wait for a gap in a stream of short tests: it closes a gate that new tests pass through, then
waits for the running ones to finish. The folder is per user and per CUDA_VISIBLE_DEVICES: concurrent runs
on one GPU share it.

A lock alone is not enough: torch's caching allocator keeps a finished test's memory reserved in its worker.
Session 50's H100 run under `-n 8` had the lock and still ran out: a finished hog's worker held 49.5 GB and
another worker 17.2 GB while the others ran. So each turn ends with `release` (the caller's: return the cached
memory to the driver) while the lock is still held."""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


def lock_folder() -> Path:
    devices = re.sub(r"[^0-9A-Za-z,-]", "_", os.environ.get("CUDA_VISIBLE_DEVICES", "all")) or "none"
    return Path(tempfile.gettempdir()) / f"gn-gpu-memory-{getpass.getuser()}-{devices}"


@contextlib.contextmanager
def gpu_memory_turn(
    exclusive: bool, folder: Path | None = None, release: Callable[[], None] | None = None
) -> Iterator[None]:
    """Hold the GPU's memory shared (a test), or exclusively (a hog), for the `with` body. `release` runs
    after the body, before the lock is let go (so a hog starts only once the memory is back)."""
    folder = lock_folder() if folder is None else folder
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "gate.lock", "a+") as gate, open(folder / "run.lock", "a+") as run:
        if exclusive:
            fcntl.flock(gate, fcntl.LOCK_EX)  # no test starts from here on
            fcntl.flock(run, fcntl.LOCK_EX)  # the running ones finish
        else:
            fcntl.flock(gate, fcntl.LOCK_SH)  # (waits while a hog holds the gate)
            fcntl.flock(run, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            try:
                if release is not None:
                    release()
            finally:
                fcntl.flock(run, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)
