"""One benchmark measurement and its derived numbers (bytes, TB/s, fraction of SOL). Pure Python."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gn_module.bench.cases import Case, bytes_moved, size_class
from gn_module.bench.timing import Timing, sol_fraction, throughput_tbps


@dataclass
class Result:
    """The timing of one implementation on one (shape, dtype, direction); `timing` is None on error."""

    case: Case
    dtype: str
    direction: str
    impl: str
    timing: Timing | None
    error: str | None = None
    plan: dict[str, Any] | None = None  # schedule and launch plan (ours only)
    setup_s: float | None = None  # wall time of preparation and warm-up (includes torch.compile)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.case.name, self.dtype, self.direction)

    @property
    def bytes(self) -> int:
        return bytes_moved(self.case, self.dtype, self.direction)

    @property
    def tensor_bytes(self) -> int:
        return self.case.nbytes(self.dtype)

    @property
    def median_us(self) -> float | None:
        return self.timing.median_us if self.timing else None

    @property
    def tbps(self) -> float | None:
        return throughput_tbps(self.bytes, self.timing.median_us) if self.timing else None

    def sol(self, copy_tbps: float | None) -> float | None:
        if self.timing is None or not copy_tbps:
            return None
        return sol_fraction(self.bytes, self.timing.median_us, copy_tbps)

    def as_dict(self, copy_tbps: float | None = None) -> dict[str, Any]:
        return {
            "case": self.case.name,
            "shape": list(self.case.shape),
            "groups": self.case.groups,
            "act": self.case.act,
            "dtype": self.dtype,
            "direction": self.direction,
            "impl": self.impl,
            "tensor_bytes": self.tensor_bytes,
            "size_class": size_class(self.tensor_bytes),
            "bytes": self.bytes,
            "tbps": self.tbps,
            "sol_fraction": self.sol(copy_tbps),
            "timing_us": self.timing.as_dict() if self.timing else None,
            "error": self.error,
            "plan": self.plan,
            "setup_s": self.setup_s,
            **self.extra,
        }


def group_results(results: list[Result]) -> dict[tuple[str, str, str], dict[str, Result]]:
    """Results keyed by (case, dtype, direction), then by implementation; insertion order kept."""
    groups: dict[tuple[str, str, str], dict[str, Result]] = {}
    for r in results:
        groups.setdefault(r.key, {})[r.impl] = r
    return groups
