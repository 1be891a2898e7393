"""Text of the report header and the terminal summary (pure formatting, no torch)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gn_module.schedule import DeviceLimits
from pytest_gn.cases import TASK_ARCHS
from pytest_gn.device import MAIN_CONFIGS, GnDevice, describe_limits

LOCAL = "this GPU"  # the summary's name for the cases of the GPU at hand (not a profile's)


@dataclass
class Tally:
    """Outcomes of overflow cases, keyed by case id (xdist-safe: filled from test reports)."""

    cases: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> case labels / summary
    outcomes: dict[str, str] = field(default_factory=dict)  # id -> passed / failed / skipped
    reasons: dict[str, str] = field(default_factory=dict)  # id -> skip reason
    selfcheck: dict[str, str] = field(default_factory=dict)  # nodeid -> outcome of the self-check
    memory: dict[str, dict[str, int]] = field(default_factory=dict)  # id -> {"peak", "estimate"} bytes

    def add(self, case: dict[str, Any], outcome: str, reason: str = "") -> None:
        cid = case["id"]
        self.cases[cid] = {**self.cases.get(cid, {}), **case}
        if self.outcomes.get(cid) != "failed":  # a failed phase stays failed
            self.outcomes[cid] = outcome
        if reason:
            self.reasons[cid] = reason

    def add_selfcheck(self, nodeid: str, outcome: str) -> None:
        if self.selfcheck.get(nodeid) != "failed":
            self.selfcheck[nodeid] = outcome

    def counts(self, select: Callable[[dict[str, Any]], bool] | None = None) -> Counter:
        """Outcome counts of the cases whose summary `select` accepts (all by default)."""
        return Counter(o for i, o in self.outcomes.items() if select is None or select(self.cases[i]))


def local_kind(case: dict[str, Any]) -> str:
    """Which of this GPU's case families a case is: natural, capped or over 2**31 elements."""
    if case.get("geometry") == "2_31":
        return "over 2**31 elements"
    return "capped" if case.get("variant") == "capped" else "natural"


def header_lines(
    impl: str, seed: int, cap: int | None, device: GnDevice | None, reason: str | None,
    profiles: Iterable[DeviceLimits], sweep: bool, shapes: tuple[tuple[int, int], ...] | None = None,
    archs: tuple[str, ...] = ("tiles",),
) -> list[str]:  # fmt: skip
    lines = [f"gn: impl {impl}, seed {seed}" + (f", one-pass residency capped at {cap}" if cap else "")]
    if archs != ("tiles",):
        flag = {("tiles", "tasks"): "both", ("tiles", "tasks", "wide"): "all"}.get(archs, archs[0])
        also = ", and the tile kernels' cases" if "tiles" in archs else "; no tile kernel cases"
        wide = ("the wide launches' cases (fwd-tasksw-..., bwd-tasksw-...: fp16/bf16 x under CUDA autocast, "
                "float32 y and dy)")  # fmt: skip
        if "tasks" in archs:
            also = f", {wide}{also}" if "wide" in archs else also
            lines.append(f"gn: --gn-arch={flag}: task kernel cases, forward (GN_ARCH=tasks) and backward "
                         f"(GN_ARCH=tasks+bwd; its one-launch kernel: tasks+bwd1){also}")  # fmt: skip
        else:
            lines.append(f"gn: --gn-arch={flag}: {wide}{also}")
    if shapes:
        lines.append("gn: overflow shapes (C:G) " + ",".join(f"{c}:{g}" for c, g in shapes))
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


def _outcomes(c: Counter) -> str:
    return f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped"


def scope_lines(tally: Tally) -> list[str]:
    """One line per row of cases: this GPU's (by family) and the profiles' (together)."""
    local = tally.counts(lambda s: not s.get("profile"))
    lines = []
    if local:
        families = Counter(
            local_kind(tally.cases[i]) for i in tally.outcomes if not tally.cases[i].get("profile")
        )
        parts = ", ".join(
            f"{families[k]} {k}" for k in ("natural", "capped", "over 2**31 elements") if families[k]
        )
        mine = [tally.cases[i] for i in tally.outcomes if not tally.cases[i].get("profile")]
        tasks = Counter(
            task_kind(s) for s in mine if s.get("arch") in TASK_ARCHS and s.get("arch") != "tasksw"
        )
        if tasks:
            one = f", {tasks['bwd1']} one-launch backward" if tasks["bwd1"] else ""
            parts += (f"; {sum(tasks.values())} of them task kernel cases ({tasks['fwd']} forward, "
                      f"{tasks['bwd']} backward{one})")  # fmt: skip
        wide = Counter(str(s.get("direction")) for s in mine if s.get("arch") == "tasksw")
        if wide:
            parts += (
                f"; {sum(wide.values())} wide-launch cases ({wide['fwd']} forward, {wide['bwd']} backward)"
            )
        lines.append(f"  {LOCAL}: {sum(local.values())} ({parts}): {_outcomes(local)}")
    prof = tally.counts(lambda s: bool(s.get("profile")))
    if prof:
        names = Counter(tally.cases[i]["profile"] for i in tally.outcomes if tally.cases[i].get("profile"))
        each = sorted(set(names.values()))
        per = f"{each[0]} each" if len(each) == 1 else "see the matrix"
        lines.append(f"  profiles: {sum(prof.values())} ({len(names)} profiles, {per}): {_outcomes(prof)}")
    return lines


def task_kind(case: dict[str, Any]) -> str:
    """A task case's kind from its summary (JSON: `CaseSpec.task_kind`'s rule)."""
    return "bwd1" if case.get("arch") == "tasks1" else str(case.get("direction"))


def task_lines(tally: Tally) -> list[str]:
    """The task architecture's cases that ran, per kind: how many re-read chunks (the forward and the
    one-launch backward) or gave a member several tiles of a task (the backward), and the heaviest."""
    ran = [
        case
        for case in (tally.cases[i] for i, o in tally.outcomes.items() if o in ("passed", "failed"))
        if case.get("arch") in TASK_ARCHS and "chunks" in case
    ]
    lines = []
    kinds = (("fwd", "task forward cases (GN_ARCH=tasks)", "chunks"),
             ("bwd1", "task one-launch backward cases (GN_ARCH=tasks+bwd1)", "chunk pairs"))  # fmt: skip
    for kind, what, unit in kinds:
        mine = [s for s in ran if task_kind(s) == kind]
        if mine:
            worst = max(mine, key=lambda s: s["chunks"] / max(1, s["slots"]))
            over = sum(1 for s in mine if s["over"] > 0)
            lines.append(f"{what}: {len(mine)} run, {over} with members over their slots ({unit} read "
                         f"twice); heaviest: {worst['id']}: busiest member {worst['chunks']} {unit} per task "
                         f"over {worst['slots']} slots")  # fmt: skip
    bwd = [s for s in ran if task_kind(s) == "bwd"]
    if bwd:
        worst = max(bwd, key=lambda s: (s.get("member_tiles", 0), s.get("team", 0)))
        several = sum(1 for s in bwd if s.get("member_tiles", 0) > 1)
        wraps = sum(1 for s in bwd if s["over"] > 0)
        lines.append(f"task backward cases (GN_ARCH=tasks+bwd): {len(bwd)} run, {several} with members of "
                     f"several tiles of a task, {wraps} wrapping their ring of slots; heaviest: "
                     f"{worst['id']}: busiest member {worst.get('member_tiles')} tiles per task in a team of "
                     f"{worst.get('team')}")  # fmt: skip
    return lines


def memory_lines(tally: Tally) -> list[str]:
    """Measured peak device memory against the estimate the free-memory check used."""
    if not tally.memory:
        return []
    gib = 2**30
    biggest = max(tally.memory.items(), key=lambda kv: kv[1]["peak"])
    cid, m = biggest
    lines = [f"memory: largest measured peak {m['peak'] / gib:.2f} GiB ({cid}), estimated "
             f"{m['estimate'] / gib:.2f} GiB; {len(tally.memory)} cases measured"]  # fmt: skip
    low = [(i, v) for i, v in tally.memory.items() if v["peak"] > v["estimate"]]
    if low:
        worst = max(low, key=lambda kv: kv[1]["peak"] / max(1, kv[1]["estimate"]))
        peak, estimate = worst[1]["peak"] / gib, worst[1]["estimate"] / gib
        lines.append(f"memory estimate too low for {len(low)} cases, worst {worst[0]}: peak "
                     f"{peak:.2f} GiB > estimate {estimate:.2f} GiB")  # fmt: skip
    return lines


def overflow_lines(tally: Tally) -> list[str]:
    c = tally.counts()
    if not c:
        return []
    lines = [f"overflow cases: {sum(c.values())} collected: {_outcomes(c)}"]
    lines += scope_lines(tally)
    ran = [
        tally.cases[i]
        for i, o in tally.outcomes.items()
        if o in ("passed", "failed")
        and "tiles" in tally.cases[i]
        and tally.cases[i].get("arch") not in TASK_ARCHS
    ]
    lines += task_lines(tally)
    if ran:
        worst = max(ran, key=lambda s: s["tiles"] / max(1, s.get("grid") or s["residency"]))
        grid = worst.get("grid") or worst["residency"]
        lines.append(f"largest overflow: {worst['id']}: {worst['tiles']} tiles on a {grid}-block grid "
                     f"({worst['overflow']} overflow tiles, {worst['tiles'] / grid:.2f}x)")  # fmt: skip
        over = sum(1 for s in ran if s["overflow"] > 0)
        lines.append(f"cases that overflowed the grid: {over} of {len(ran)} run")
        big = [s for s in ran if s.get("geometry") == "2_31"]
        for s in big:
            n = 1
            for d in s["shape"]:
                n *= d
            grid = s.get("grid") or s["residency"]
            lines.append(f"over 2**31 elements: {s['id']}: {n} elements, shape {s['shape']}, "
                         f"{s['tiles']} tiles on a {grid}-block grid: {tally.outcomes[s['id']]}")  # fmt: skip
    lines += memory_lines(tally)
    failed = [i for i, o in tally.outcomes.items() if o == "failed"]
    if failed:
        lines.append(
            "failed: " + ", ".join(failed[:12]) + (f" (+{len(failed) - 12} more)" if len(failed) > 12 else "")
        )
    reasons = Counter(
        tally.reasons[i] for i, o in tally.outcomes.items() if o == "skipped" and i in tally.reasons
    )
    lines += [f"skipped {n}: {r}" for r, n in reasons.most_common(5)]
    if len(reasons) > 5:
        rest = sum(n for _, n in reasons.most_common()[5:])
        lines.append(f"skipped {rest} more for {len(reasons) - 5} other reasons")
    return lines
