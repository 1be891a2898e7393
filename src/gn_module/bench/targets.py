"""Issue 6's speed targets, checked against one run's results. Reports pass/miss; never raises on a miss.

The targets judge ``ours-auto`` (what users get by default). "torch.compile at its best layout" is the
faster of compile-cl and compile-nchw for that shape, dtype and direction.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from gn_module.bench.cases import COMPILE_IMPLS, MIB, OURS, size_class
from gn_module.bench.results import Result, group_results

#: Minimum fraction of SOL by size class and direction.
SOL_TARGETS = {("large", "fwd"): 0.62, ("large", "bwd"): 0.58, ("mid", "fwd"): 0.65, ("mid", "bwd"): 0.55}
#: Maximum median microseconds per call for small tensors.
LATENCY_TARGETS_US = {"fwd": 6.0, "bwd": 10.0}
#: Speedup over torch.compile at its best layout: always >= 1; >= 1.5 for tensors up to 64 MiB.
COMPILE_BEST_MIN = 1.0
COMPILE_BEST_MIN_SMALL = 1.5
COMPILE_BEST_SMALL_BYTES = 64 * MIB
#: Speedup over torch.compile on channels_last input and over PyTorch eager.
SLOW_PEER_MIN = 5.0


@dataclass(frozen=True)
class TargetCheck:
    case: str
    dtype: str
    direction: str
    target: str  # e.g. "SOL >= 0.62", "x compile-best >= 1.5"
    value: float | None  # None: a measurement needed for the check is missing
    threshold: float
    higher_is_better: bool

    @property
    def passed(self) -> bool | None:
        if self.value is None:
            return None
        return self.value >= self.threshold if self.higher_is_better else self.value <= self.threshold

    @property
    def status(self) -> str:
        return {True: "PASS", False: "MISS", None: "n/a"}[self.passed]

    @property
    def margin(self) -> float | None:
        """value / threshold for 'at least' targets, threshold / value for 'at most' ones (>= 1 passes)."""
        if self.value is None or self.value == 0:
            return None
        return self.value / self.threshold if self.higher_is_better else self.threshold / self.value

    def as_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed, "margin": self.margin}


def _speedup(peer: Result | None, ours: Result | None) -> float | None:
    if peer is None or ours is None or peer.median_us is None or not ours.median_us:
        return None
    return peer.median_us / ours.median_us


def check_targets(results: list[Result], copy_tbps: float | None) -> list[TargetCheck]:
    """Every target that applies to every measured (shape, dtype, direction)."""
    checks: list[TargetCheck] = []
    for (case, dtype, direction), by_impl in group_results(results).items():
        ours = by_impl.get(OURS)
        if ours is None:
            continue
        any_result = next(iter(by_impl.values()))
        tensor_bytes = any_result.tensor_bytes
        cls = size_class(tensor_bytes)

        def add(target: str, value: float | None, threshold: float, higher: bool = True) -> None:
            checks.append(TargetCheck(case, dtype, direction, target, value, threshold, higher))  # noqa: B023

        if (cls, direction) in SOL_TARGETS:
            add(f"{cls} SOL", ours.sol(copy_tbps), SOL_TARGETS[(cls, direction)])
        if cls == "small":
            add("small us", ours.median_us, LATENCY_TARGETS_US[direction], higher=False)
        compiled = [by_impl[i] for i in COMPILE_IMPLS if i in by_impl and by_impl[i].median_us is not None]
        best = min(compiled, key=lambda r: r.median_us) if compiled else None
        if any(i in by_impl for i in COMPILE_IMPLS):
            add("x compile-best", _speedup(best, ours), COMPILE_BEST_MIN)
            if tensor_bytes <= COMPILE_BEST_SMALL_BYTES:
                add("x compile-best (<=64MiB)", _speedup(best, ours), COMPILE_BEST_MIN_SMALL)
        if "compile-cl" in by_impl:
            add("x compile-cl", _speedup(by_impl["compile-cl"], ours), SLOW_PEER_MIN)
        if "eager" in by_impl:
            add("x eager", _speedup(by_impl["eager"], ours), SLOW_PEER_MIN)
    return checks


def summarize_checks(checks: list[TargetCheck]) -> dict[str, int]:
    out = {"PASS": 0, "MISS": 0, "n/a": 0}
    for c in checks:
        out[c.status] += 1
    return out
