"""Report formats of a benchmark run: console table, Markdown (for benchmarks/RESULTS.md), JSON, PNG chart."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gn_module.bench.cases import COMPILE_IMPLS, IMPLS, MIB, OURS
from gn_module.bench.results import Result, group_results
from gn_module.bench.targets import TargetCheck, summarize_checks

LABELS = {
    "ours-auto": "ours auto",
    "ours-1pass": "ours 1-pass",
    "ours-2pass": "ours 2-pass",
    "eager": "eager CL",
    "compile-cl": "compile CL",
    "compile-nchw": "compile NCHW",
}


@dataclass
class Report:
    """Everything one run produced, plus the context needed to reproduce it."""

    date: str
    command: str
    device: dict[str, Any]
    copy: dict[str, Any] | None  # CopyBandwidth.as_dict()
    results: list[Result]
    checks: list[TargetCheck] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    #: Each row's floor in us (`floor.measure_floor`) by (case, dtype, direction); empty when not measured.
    floors: dict[tuple[str, str, str], float] = field(default_factory=dict)
    #: Each row's chain floor in us (`chain_floors`, from --chain-floors) by the same key; empty when none.
    chain_floors: dict[tuple[str, str, str], float] = field(default_factory=dict)

    @property
    def copy_tbps(self) -> float | None:
        return self.copy["tbps"] if self.copy else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "date": self.date,
            "command": self.command,
            "device": self.device,
            "copy_bandwidth": self.copy,
            "settings": self.settings,
            "results": [r.as_dict(self.copy_tbps) for r in self.results],
            "floors": _floor_rows(self.floors),
            "chain_floors": _floor_rows(self.chain_floors),
            "targets": [c.as_dict() for c in self.checks],
            "targets_summary": summarize_checks(self.checks),
        }


def _floor_rows(floors: dict[tuple[str, str, str], float]) -> list[dict[str, Any]]:
    return [
        {"case": case, "dtype": dtype, "direction": direction, "floor_us": us}
        for (case, dtype, direction), us in floors.items()
    ]


def fmt_us(us: float | None) -> str:
    if us is None:
        return "-"
    return f"{us:.0f}" if us >= 1000 else f"{us:.1f}"


def fmt_ratio(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _speedup(peer: Result | None, ours: Result | None) -> float | None:
    if peer is None or ours is None or peer.median_us is None or not ours.median_us:
        return None
    return peer.median_us / ours.median_us


def _plan_cell(r: Result | None) -> str:
    if r is None or not r.plan:
        return "-"
    p = r.plan
    parts = [f"{p.get('schedule', '?')}p"]
    if "grid" in p:
        parts.append(f"grid {p['grid']}")
    if "reread_tiles" in p:  # task plans: members keep their tiles; only these are read again
        if p["reread_tiles"]:
            parts.append(f"+{p['reread_tiles']} re-read")
    elif p.get("overflow_tiles"):
        parts.append(f"+{p['overflow_tiles']} ovf")
    return " ".join(parts)


def table_rows(results: Sequence[Result], copy_tbps: float | None) -> tuple[list[str], list[list[str]]]:
    """Header and rows: one row per (shape, dtype, direction), implementations side by side."""
    present = [i for i in IMPLS if any(r.impl == i for r in results)]
    header = ["shape", "dtype", "dir", "MiB"]
    if OURS in present:
        header += ["ours auto us", "TB/s", "SOL"]
    header += [f"{LABELS[i]} us" for i in present if i != OURS]
    if OURS in present:
        if "eager" in present:
            header.append("x eager")
        if any(i in present for i in COMPILE_IMPLS):
            header.append("x compile best")
        header.append("auto plan")
    rows = []
    for (case, dtype, direction), by_impl in group_results(list(results)).items():
        first = next(iter(by_impl.values()))
        ours = by_impl.get(OURS)
        row = [case, dtype, direction, f"{first.tensor_bytes / MIB:.1f}"]
        if OURS in present:
            row += [
                fmt_us(ours and ours.median_us),
                fmt_ratio(ours and ours.tbps),
                fmt_ratio(ours and ours.sol(copy_tbps)),
            ]
        for impl in present:
            if impl == OURS:
                continue
            r = by_impl.get(impl)
            row.append("err" if r is not None and r.error else fmt_us(r and r.median_us))
        if OURS in present:
            if "eager" in present:
                row.append(fmt_ratio(_speedup(by_impl.get("eager"), ours), 1))
            if any(i in present for i in COMPILE_IMPLS):
                compiled = [by_impl[i] for i in COMPILE_IMPLS if i in by_impl and by_impl[i].median_us]
                best = min(compiled, key=lambda r: r.median_us) if compiled else None
                row.append(fmt_ratio(_speedup(best, ours), 2))
            row.append(_plan_cell(ours))
        rows.append(row)
    return header, rows


def render_text(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def render_markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _value_text(value: float, threshold: float) -> str:
    """`value` to 3 significant digits, or as many more (up to 8) as tell it apart from `threshold`: a
    miss by 0.04 % must not read "= 1 (target <= 1)"."""
    for digits in range(3, 9):
        text = f"{value:.{digits}g}"
        if value == threshold or float(text) != threshold:
            return text
    return text


def checks_lines(checks: Sequence[TargetCheck]) -> list[str]:
    """One line per target check: misses, then n/a, passes and the reported (not judged) fp32 rows."""
    order = {"MISS": 0, "n/a": 1, "PASS": 2, "reported": 3}
    lines = []
    for c in sorted(checks, key=lambda c: order[c.status]):
        op = ">=" if c.higher_is_better else "<="
        value = "missing" if c.value is None else _value_text(c.value, c.threshold)
        lines.append(
            f"{c.status:4}  {c.case} {c.dtype} {c.direction}: {c.target} = {value} "
            f"(target {op} {c.threshold:g}{'; ' + c.note if c.note else ''})"
        )
    return lines


def _summary_line(s: dict[str, int]) -> str:
    line = f"{s['PASS']} pass, {s['MISS']} miss, {s['n/a']} n/a"
    return line + (f", {s['reported']} reported (fp32, not judged)" if s["reported"] else "")


def render_console(report: Report) -> str:
    header, rows = table_rows(report.results, report.copy_tbps)
    out = [render_text(header, rows)]
    errors = [r for r in report.results if r.error]
    if errors:
        out.append("\nErrors:")
        out += [f"  {r.case.name} {r.dtype} {r.direction} {r.impl}: {r.error}" for r in errors]
    if report.checks:
        s = summarize_checks(report.checks)
        out.append(f"\nSpeed targets (issues 12, 13): {_summary_line(s)}")
        out += ["  " + line for line in checks_lines(report.checks)]
    return "\n".join(out)


def render_markdown_report(report: Report) -> str:
    header, rows = table_rows(report.results, report.copy_tbps)
    copy = report.copy
    copy_line = (
        f"{copy['tbps']:.3f} TB/s (median of copying {copy['nbytes'] / MIB:.0f} MiB device to device; "
        "read + write bytes)"
        if copy
        else "not measured"
    )
    lines = [
        f"### {report.date}: {report.device.get('name', 'unknown device')}",
        "",
        f"- Date: {report.date}",
        f"- Device: {_device_line(report.device)}",
        f"- Command: `{report.command}`",
        f"- Copy bandwidth (SOL reference): {copy_line}",
        f"- Settings: {', '.join(f'{k}={v}' for k, v in report.settings.items())}",
        "",
        "Times are medians in microseconds (CUDA events, L2 flushed before each repetition).",
        "TB/s and SOL are for `ours auto`; `x eager` and `x compile best` are speedups of `ours auto`.",
        "",
        render_markdown(header, rows),
    ]
    if report.checks:
        s = summarize_checks(report.checks)
        lines += ["", f"Speed targets (issues 12, 13): {_summary_line(s)}.", ""]
        misses = [line for line in checks_lines(report.checks) if line.startswith(("MISS", "n/a"))]
        judged = s["PASS"] + s["MISS"] + s["n/a"]
        lines += [f"- {line}" for line in misses] or [
            "- all targets met" if judged else "- no judged targets (fp32 is reported, not judged)"
        ]
    return "\n".join(lines) + "\n"


def _device_line(info: dict[str, Any]) -> str:
    from gn_module.bench.device import device_label

    return device_label(info)


def write_json(report: Report, path: str | Path) -> None:
    Path(path).write_text(json.dumps(report.as_dict(), indent=1) + "\n")


def write_plot(report: Report, path: str | Path) -> bool:
    """TB/s against tensor size, one panel per direction. False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    directions = [d for d in ("fwd", "bwd") if any(r.direction == d for r in report.results)]
    fig, axes = plt.subplots(
        1, max(1, len(directions)), figsize=(6.5 * max(1, len(directions)), 4.8), squeeze=False
    )
    markers = {"fp16": "o", "bf16": "s", "fp32": "^"}
    for ax, direction in zip(axes[0], directions, strict=False):
        for impl in IMPLS:
            for dtype in sorted({r.dtype for r in report.results}):
                pts = sorted(
                    (r.tensor_bytes / MIB, r.tbps)
                    for r in report.results
                    if r.impl == impl and r.dtype == dtype and r.direction == direction and r.tbps
                )
                if pts:
                    xs, ys = zip(*pts, strict=True)
                    style = "-" if impl == OURS else ":" if impl.startswith("ours") else "--"
                    ax.plot(
                        xs,
                        ys,
                        style,
                        color=f"C{IMPLS.index(impl)}",  # one color per implementation in every panel
                        marker=markers.get(dtype, "x"),
                        label=f"{LABELS[impl]} {dtype}",
                    )
        if report.copy_tbps:
            ax.axhline(report.copy_tbps, color="k", linewidth=0.8, label="copy bandwidth (SOL)")
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_xlabel("tensor size (MiB)")
        ax.set_ylabel("TB/s (minimum bytes / median time)")
        ax.set_title(f"GroupNorm {direction}, {report.device.get('name', '')}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return True
