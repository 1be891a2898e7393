"""The speed targets of issues 12 (forward) and 13 (backward), checked against one run's results.

Reports pass/miss; never raises on a miss. The targets judge ``ours-auto`` (what users get by default)
in fp16 and bf16; fp32 rows get the same checks with their values, status "reported", and are not judged.
"torch.compile at its best layout" is the faster of compile-cl and compile-nchw for that shape, dtype and
direction; "eager" is PyTorch eager on channels_last input.

By one tensor's size (``cases.size_class``: large >= 128 MiB, mid 8..64 MiB, small < 8 MiB):

=================================  ==========================  ==========================
target                             forward (issue 12)          backward (issue 13)
=================================  ==========================  ==========================
large: fraction of SOL             >= 0.62                     >= 0.58
large, a sample fits on chip       >= 0.80                     >= 0.75
mid: fraction of SOL               >= 0.65                     >= 0.55
mid, tensor <= 24 MiB              >= 0.75                     >= 0.70
small: median GPU time             <= 6 us                     <= 10 us
x compile-best, every shape        >= 1.0                      >= 1.0 (0.9: see exceptions)
x compile-best, up to 64 MiB       >= 1.5                      >= 1.5
x eager (channels_last), >= 8 MiB  >= 5                        >= 2
x compile-cl, >= 8 MiB             >= 2                        (none)
=================================  ==========================  ==========================

Where the run measured a row's floor (`floor`: one launch moving the row's minimum bytes) and the floor rules
the SOL or latency target out, that target becomes 90 % of the floor (the issues' "90 % of a measured limit"),
named "..., 90 % of the floor" with the issue's target in the note. The same holds for a speedup over a peer:
the peer's time over the floor is the most any GroupNorm can reach, and a speedup target above it becomes 90 %
of it. A chain floor (`chain_floors`: the bare read-reduce-write chain of scripts/chain_floor.py, measured on
the same device) is the tighter limit where it is slower than the copy floor; the target is then named "...,
90 % of the chain floor".

"A sample fits on chip" (issue 12: "each sample's 16 MiB fits on chip", 32x128x256x256; issue 13: "a
sample's channel window fits on chip") is ruled as: the tensor has more than one sample and one sample's
bytes are at most ON_CHIP_BYTES, the same 24 MiB bound under which a mid tensor gets its higher target.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

from gn_module.bench.cases import COMPILE_IMPLS, MIB, OURS, Case, size_class
from gn_module.bench.floor import limit_adjusted
from gn_module.bench.results import Result, group_results
from gn_module.bench.timing import sol_fraction

#: The dtypes the targets judge (issue 12: "fp16 and bf16 (fp32 rows are reported, not judged)").
JUDGED_DTYPES = ("fp16", "bf16")

#: Bytes that fit on chip: a mid tensor this small, or one sample of a large tensor this small, gets the
#: higher SOL target (issues 12 and 13: "at 24 MiB and below"; 32x128x256x256's 16 MiB samples).
ON_CHIP_BYTES = 24 * MIB

#: Minimum fraction of SOL by (size class, direction): the base target and the on-chip one.
SOL_TARGETS = {("large", "fwd"): 0.62, ("large", "bwd"): 0.58, ("mid", "fwd"): 0.65, ("mid", "bwd"): 0.55}
SOL_TARGETS_ON_CHIP = {
    ("large", "fwd"): 0.80,
    ("large", "bwd"): 0.75,
    ("mid", "fwd"): 0.75,
    ("mid", "bwd"): 0.70,
}
#: Maximum median microseconds per call for small tensors.
LATENCY_TARGETS_US = {"fwd": 6.0, "bwd": 10.0}

#: Speedup over torch.compile at its best layout: always >= 1; >= 1.5 for tensors up to 64 MiB.
COMPILE_BEST_MIN = 1.0
COMPILE_BEST_MIN_SMALL = 1.5
COMPILE_BEST_SMALL_BYTES = 64 * MIB
#: The shapes where the issues name a lower "every shape" compile-best target, by (case name, direction).
#: Issue 13: "1x128x1024x2048 G16, where Inductor's NCHW group slices stay in L2: there, at least 0.9x".
COMPILE_BEST_EXCEPTIONS = {("1x128x1024x2048-G16", "bwd"): 0.9}

#: Speedups over the slow peers, applied to tensors of at least PEER_MIN_BYTES only.
PEER_MIN_BYTES = 8 * MIB
#: Over PyTorch eager on channels_last (issue 12: 5x forward; issue 13: 2x backward).
EAGER_MIN = {"fwd": 5.0, "bwd": 2.0}
#: Over torch.compile on channels_last (issue 12, forward only; issue 13 sets none for backward).
COMPILE_CL_MIN = {"fwd": 2.0}

_STATUS = {True: "PASS", False: "MISS", None: "n/a"}
#: Every status summarize_checks counts; "reported": an fp32 row, measured but not judged.
STATUSES = ("PASS", "MISS", "n/a", "reported")


@dataclass(frozen=True)
class TargetCheck:
    case: str
    dtype: str
    direction: str
    target: str  # e.g. "large SOL", "x compile-best (<=64MiB)"
    value: float | None  # None: a measurement needed for the check is missing
    threshold: float
    higher_is_better: bool
    judged: bool = True  # False: reported only (fp32)
    note: str = ""  # context printed after the target (not judged)

    @property
    def met(self) -> bool | None:
        """Whether the value meets the threshold, judged or not; None when the value is missing."""
        if self.value is None:
            return None
        return self.value >= self.threshold if self.higher_is_better else self.value <= self.threshold

    @property
    def passed(self) -> bool | None:
        """PASS (True) / MISS (False) of a judged check; None when missing or not judged."""
        return self.met if self.judged else None

    @property
    def status(self) -> str:
        return _STATUS[self.passed] if self.judged else "reported"

    @property
    def margin(self) -> float | None:
        """value / threshold for 'at least' targets, threshold / value for 'at most' ones (>= 1 meets)."""
        if self.value is None or self.value == 0:
            return None
        return self.value / self.threshold if self.higher_is_better else self.threshold / self.value

    def as_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed, "status": self.status, "margin": self.margin}


def _speedup(peer: Result | None, ours: Result | None) -> float | None:
    if peer is None or ours is None or peer.median_us is None or not ours.median_us:
        return None
    return peer.median_us / ours.median_us


def sample_on_chip(case: Case, tensor_bytes: int) -> bool:
    """More than one sample, and one sample's bytes fit on chip (at most ON_CHIP_BYTES)."""
    n = case.shape[0]
    return n > 1 and tensor_bytes // n <= ON_CHIP_BYTES


def sol_target(case: Case, tensor_bytes: int, direction: str) -> tuple[str, float] | None:
    """The SOL target (label, minimum fraction) of a shape whose one tensor has `tensor_bytes`, if any."""
    cls = size_class(tensor_bytes)
    if (cls, direction) not in SOL_TARGETS:
        return None
    if cls == "large" and sample_on_chip(case, tensor_bytes):
        return f"large SOL (sample <={ON_CHIP_BYTES // MIB}MiB)", SOL_TARGETS_ON_CHIP[(cls, direction)]
    if cls == "mid" and tensor_bytes <= ON_CHIP_BYTES:
        return f"mid SOL (<={ON_CHIP_BYTES // MIB}MiB)", SOL_TARGETS_ON_CHIP[(cls, direction)]
    return f"{cls} SOL", SOL_TARGETS[(cls, direction)]


def row_floor(
    key: tuple[str, str, str],
    floors: Mapping[tuple[str, str, str], float],
    chain_floors: Mapping[tuple[str, str, str], float],
) -> tuple[float | None, str]:
    """The row's tightest measured floor in us (the slower of its copy and chain floors) and its kind."""
    copy, chain = floors.get(key), chain_floors.get(key)
    if chain is not None and (copy is None or chain > copy):
        return chain, "chain"
    return copy, "copy"


def check_targets(
    results: list[Result],
    copy_tbps: float | None,
    floors: Mapping[tuple[str, str, str], float] | None = None,
    chain_floors: Mapping[tuple[str, str, str], float] | None = None,
) -> list[TargetCheck]:
    """Every target that applies to every measured (shape, dtype, direction).

    `floors` (us by `Result.key`, `floor.measure_floor` in the same run) and `chain_floors` (us by the same
    key, `chain_floors.load_chain_floors` of this device) may lower a SOL, latency or speedup target to 90 %
    of what the row's tighter floor allows where it rules the issue's target out (`floor.limit_adjusted`);
    the check's note then gives the issue's target and the floor.
    """
    floors = floors or {}
    chain_floors = chain_floors or {}
    checks: list[TargetCheck] = []
    for (case, dtype, direction), by_impl in group_results(results).items():
        ours = by_impl.get(OURS)
        if ours is None:
            continue
        tensor_bytes = ours.tensor_bytes
        cls = size_class(tensor_bytes)
        judged = dtype in JUDGED_DTYPES

        def add(
            target: str, value: float | None, threshold: float, higher: bool = True, note: str = ""
        ) -> None:
            checks.append(TargetCheck(case, dtype, direction, target, value, threshold, higher, judged, note))  # noqa: B023

        floor_us, floor_kind = row_floor(ours.key, floors, chain_floors)

        def add_limited(
            target: str,
            value: float | None,
            threshold: float,
            floor_value: float | None,
            higher: bool,
            kind: str,
        ) -> None:
            adjusted = None if floor_value is None else limit_adjusted(threshold, floor_value, higher, kind)
            if adjusted is None:
                add(target, value, threshold, higher)
            else:
                label = "the floor" if kind == "copy" else f"the {kind} floor"
                add(f"{target}, 90 % of {label}", value, adjusted[0], higher, adjusted[1])

        sol = sol_target(ours.case, tensor_bytes, direction)
        if sol is not None:
            floor_sol = sol_fraction(ours.bytes, floor_us, copy_tbps) if floor_us and copy_tbps else None
            add_limited(sol[0], ours.sol(copy_tbps), sol[1], floor_sol, True, floor_kind)
        if cls == "small":
            add_limited(
                "small us", ours.median_us, LATENCY_TARGETS_US[direction], floor_us, False, floor_kind
            )

        def add_speedup(target: str, peer: Result | None, threshold: float) -> None:
            # No GroupNorm runs faster than the row's floor, so the peer's time over the floor is the most
            # any can reach: a threshold above that becomes 90 % of it, as the SOL and latency targets do.
            limit = peer.median_us / floor_us if peer and peer.median_us and floor_us else None  # noqa: B023
            add_limited(target, _speedup(peer, ours), threshold, limit, True, floor_kind)  # noqa: B023

        compiled = [by_impl[i] for i in COMPILE_IMPLS if i in by_impl and by_impl[i].median_us is not None]
        best = min(compiled, key=lambda r: r.median_us) if compiled else None
        if any(i in by_impl for i in COMPILE_IMPLS):
            exception = COMPILE_BEST_EXCEPTIONS.get((case, direction))
            if exception is None:
                add_speedup("x compile-best", best, COMPILE_BEST_MIN)
            else:
                add_speedup("x compile-best (named exception)", best, exception)
            if tensor_bytes <= COMPILE_BEST_SMALL_BYTES:
                add_speedup("x compile-best (<=64MiB)", best, COMPILE_BEST_MIN_SMALL)

        if tensor_bytes >= PEER_MIN_BYTES:
            if "compile-cl" in by_impl and direction in COMPILE_CL_MIN:
                add_speedup("x compile-cl", by_impl["compile-cl"], COMPILE_CL_MIN[direction])
            if "eager" in by_impl and direction in EAGER_MIN:
                add_speedup("x eager", by_impl["eager"], EAGER_MIN[direction])
    return checks


def summarize_checks(checks: list[TargetCheck]) -> dict[str, int]:
    """How many checks have each status: PASS, MISS, n/a (missing value) and reported (not judged)."""
    out = dict.fromkeys(STATUSES, 0)
    for c in checks:
        out[c.status] += 1
    return out
