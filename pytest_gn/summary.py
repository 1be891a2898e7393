"""The `gn summary` section of the terminal report: overflow outcomes and the arch-sweep matrix."""

from __future__ import annotations

from typing import Any

from pytest_gn.report import MATRIX_COLUMNS, overflow_lines, table


def _exercised(profile: Any, device: Any) -> str:
    from pytest_gn.sweep import ptx_variant

    if device is None:
        return "no (no GPU)"
    variant = ptx_variant(profile, device.cc)
    if variant:
        return f"yes ({variant} PTX on {device.arch})"
    return f"no ({profile.arch} > {device.arch}: native build + cap)"


def sweep_lines(state: Any) -> list[str]:
    from pytest_gn.sweep import main_numbers

    sweep = state.sweep
    sweep.compile_all()
    # Probe here too: under xdist the controller ran no case itself and has not looked yet.
    try:
        device, reason = state.device(with_residency=False)
    except Exception as exc:  # the summary must never break the session
        device, reason = None, f"{type(exc).__name__}: {exc}"
    rows, errors = [], []
    for p in state.selected:
        st = sweep.static(p.name)
        c = state.tally.counts(lambda s, name=p.name: s.get("profile") == name)
        row = {"profile": p.name, "arch": p.arch, "SMs": p.sm_count, **main_numbers(st),
               "cases": sum(c.values()), "passed": c["passed"], "failed": c["failed"],
               "skipped": c["skipped"], "arch code exercised": _exercised(p, device)}  # fmt: skip
        if st.error and sweep.nvcc_error is None:
            row["regs/smem f,b"] = "compile failed"
            errors.append(f"{p.name} ({p.arch}): {st.error.splitlines()[0]}")
        rows.append(row)
    lines = [
        "arch sweep (f,b = one-pass forward, backward; fp16, C=128; residency = blocks on the whole GPU):"
    ]
    lines += table(rows, MATRIX_COLUMNS)
    lines += [f"compile error: {e}" for e in errors]
    if sweep.nvcc_error:
        lines.append("nvcc not found, so compiling for each profile's arch, registers/shared memory, "
                     "modelled residency and the profiles' overflow cases were skipped")  # fmt: skip
        lines.append(f"  ({sweep.nvcc_error})")
    if device is None:
        n = sum(r["cases"] for r in rows)
        lines.append(f"GPU part skipped ({reason}): the {n} profile cases and the self-check did not run; "
                     "the static part above (compile, registers, residency) is complete")  # fmt: skip
    return lines


def summary_lines(state: Any) -> list[str]:
    lines = overflow_lines(state.tally)
    if state.opts.arch_sweep:
        lines += sweep_lines(state)
    return lines
