"""GPU tests of the task kernels' synchronisation words (csrc gn_task_primitives.cuh, "Counters are never
reset").

A launch adds its arrivals to a task's counter and its last arriver rounds the counter up to the next
multiple of 2**GENERATION_BITS; flags carry the counter's generation, so no word is ever zeroed again and
no launch-wide epoch exists. What would go wrong: a launch that miscounts or forgets to round leaves low
bits behind, and the next launch's barrier on that task opens early (members apply before the statistics
exist: wrong y) or never (a hang). So, with launches of other team sizes and task counts interleaved on one
stream (one buffer of words):
- after every launch, every counter word's low bits are zero, and the launches that count did advance
  their words (the check is not vacuous);
- every result equals the fp64 reference and is bitwise equal to the same shape run on fresh words.
The counters are checked after the first one-launch forward already: with a miscounted word the next
launch on it may wait for a flag no block will set (the planted `+ 1` in the rounding hung the old order).
"""

from __future__ import annotations

import pytest
import torch

import gn_module
from gn_module import ops, schedule

from .test_kernels import check_against_reference, make_case, run

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

LOW = (1 << schedule.GENERATION_BITS) - 1
# (shape, groups, passes): one-launch teams of 6 and 66 and a one-launch task of 64 tiles x 128 groups,
# two-launch forwards, and every backward (its stats launch counts arrivals, its apply launch counts
# blocks on a column word)
CASES = [
    ((2, 1280, 16, 16), 32, 1),
    ((2, 320, 64, 64), 32, 1),
    ((1, 2048, 64, 64), 2048, 1),
    ((4, 256, 48, 48), 32, 2),
    ((1, 2048, 64, 64), 2048, 2),
]


@pytest.fixture(autouse=True)
def _task_kernels(monkeypatch):
    monkeypatch.setenv(ops.ENV_ARCH, "tasks+bwd")
    with ops.poison_outputs():
        yield


def words() -> list[torch.Tensor]:
    torch.cuda.synchronize()
    return [buf.clone() for buf in ops._sync_buffers.values()]


def counters(buf: torch.Tensor) -> torch.Tensor:
    """The arrival and column counters of a buffer of (arrivals, flag, column count) per task."""
    per_task = buf[: buf.numel() // schedule.SYNC_WORDS_PER_TASK * schedule.SYNC_WORDS_PER_TASK]
    return per_task.view(-1, schedule.SYNC_WORDS_PER_TASK)[:, [0, 2]]


def assert_at_generation_boundaries(what: str) -> list[torch.Tensor]:
    got = words()
    for buf in got:
        assert not (counters(buf) & LOW).any(), f"{what}: counters left mid-generation"
    return got


def test_interleaved_launches_leave_every_counter_at_a_generation_boundary():
    x, w, b, _ = make_case(*CASES[0][:2], torch.float16)
    with torch.no_grad():
        gn_module.group_norm(x, CASES[0][1], w, b, act="silu", passes=1)
    assert_at_generation_boundaries("the first one-launch forward")
    fresh = {}
    for shape, groups, passes in CASES:  # each shape on its own first
        x, w, b, dy = make_case(shape, groups, torch.float16)
        fresh[shape, passes] = (x, w, b, dy, run(x, groups, w, b, "silu", passes, dy))
        assert_at_generation_boundaries(f"{shape} passes={passes}")
    advanced = 0
    for _ in range(3):
        for shape, groups, passes in CASES + CASES[::-1]:
            x, w, b, dy, alone = fresh[shape, passes]
            before = words()
            got = check_against_reference(x, groups, w, b, "silu", passes, dy)
            after = assert_at_generation_boundaries(f"{shape} passes={passes}")
            for a, b_ in zip(got, alone, strict=True):
                assert torch.equal(a, b_), f"{shape} passes={passes}: bits differ after other launches"
            for a, b_ in zip(after, before, strict=False):  # (a buffer that grew starts zeroed: changed)
                advanced += a.numel() != b_.numel() or bool((counters(a) != counters(b_)).any())
    assert advanced >= 3 * len(CASES), "the launches did not count their arrivals in the words checked"
