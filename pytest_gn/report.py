"""Text of the report header and the terminal summary (pure formatting, no torch)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gn_module.schedule import DeviceLimits
from pytest_gn.device import MAIN_CONFIGS, GnDevice, describe_limits


@dataclass
class Tally:
    """Outcomes of overflow cases, keyed by case id (xdist-safe: filled from test reports)."""

    cases: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> case summary
    outcomes: dict[str, str] = field(default_factory=dict)  # id -> passed / failed / skipped
    reasons: dict[str, str] = field(default_factory=dict)  # id -> skip reason

    def add(self, case: dict[str, Any], outcome: str, reason: str = "") -> None:
        cid = case["id"]
        self.cases[cid] = {**self.cases.get(cid, {}), **case}
        if self.outcomes.get(cid) != "failed":  # a failed phase stays failed
            self.outcomes[cid] = outcome
        if reason:
            self.reasons[cid] = reason

    def counts(self, select: Callable[[dict[str, Any]], bool] | None = None) -> Counter:
        """Outcome counts of the cases whose summary `select` accepts (all by default)."""
        return Counter(o for i, o in self.outcomes.items() if select is None or select(self.cases[i]))


def header_lines(
    impl: str, seed: int, cap: int | None, device: GnDevice | None, reason: str | None,
    profiles: Iterable[DeviceLimits], sweep: bool,
) -> list[str]:  # fmt: skip
    lines = [f"gn: impl {impl}, seed {seed}" + (f", one-pass residency capped at {cap}" if cap else "")]
    if device is None:
        lines.append(f"gn: no CUDA device ({reason}); GPU cases will be skipped")
    else:
        cc = f"{device.cc[0]}.{device.cc[1]}"
        lines.append(f"gn: device {device.index}: {device.name}, cc {cc}, {device.sm_count} SMs "
                     f"({describe_limits(device.limits)}), build {device.build}")  # fmt: skip
        if device.error:
            lines.append(f"gn: kernel residency unavailable: {device.error}")
        elif device.residency:
            main = ", ".join(f"{c} {device.residency[c]}" for c in MAIN_CONFIGS if c in device.residency)
            lines.append(f"gn: one-pass residency (occupancy API, blocks on the device): {main}")
    if sweep:
        names = ", ".join(f"{p.name} ({p.arch}, {p.sm_count} SMs)" for p in profiles)
        lines.append(f"gn: arch sweep over {names}")
    return lines


def table(rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) if rows else len(c) for c in columns}
    out = ["  ".join(c.ljust(widths[c]) for c in columns).rstrip()]
    out += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns).rstrip() for r in rows]
    return out


MATRIX_COLUMNS = ["profile", "arch", "SMs", "regs/smem f,b", "blocks/SM f,b", "residency f,b", "cases",
                  "passed", "failed", "skipped", "arch code exercised"]  # fmt: skip


def overflow_lines(tally: Tally) -> list[str]:
    c = tally.counts()
    if not c:
        return []
    lines = [f"overflow cases: {sum(c.values())} collected: {c['passed']} passed, {c['failed']} failed, "
             f"{c['skipped']} skipped"]  # fmt: skip
    ran = [
        tally.cases[i]
        for i, o in tally.outcomes.items()
        if o in ("passed", "failed") and "tiles" in tally.cases[i]
    ]
    if ran:
        worst = max(ran, key=lambda s: s["tiles"] / max(1, s.get("grid") or s["residency"]))
        grid = worst.get("grid") or worst["residency"]
        lines.append(f"largest overflow: {worst['id']}: {worst['tiles']} tiles on a {grid}-block grid "
                     f"({worst['overflow']} overflow tiles, {worst['tiles'] / grid:.2f}x)")  # fmt: skip
        over = sum(1 for s in ran if s["overflow"] > 0)
        lines.append(f"cases that overflowed the grid: {over} of {len(ran)} run")
    failed = [i for i, o in tally.outcomes.items() if o == "failed"]
    if failed:
        lines.append(
            "failed: " + ", ".join(failed[:12]) + (f" (+{len(failed) - 12} more)" if len(failed) > 12 else "")
        )
    reasons = Counter(
        tally.reasons[i] for i, o in tally.outcomes.items() if o == "skipped" and i in tally.reasons
    )
    lines += [f"skipped {n}: {r}" for r, n in reasons.most_common(5)]
    return lines
