"""The `gn summary` section of the terminal report: overflow outcomes and the arch-sweep matrix.

Every count comes from the tally of test reports, and every case belongs to exactly one row:
a profile's row (its emulated cases) or the ``this GPU`` row (natural, capped and over-2**31
cases of the GPU at hand), so the ``cases`` column adds up to the cases collected.
"""

from __future__ import annotations

from typing import Any

from pytest_gn.report import LOCAL, MATRIX_COLUMNS, overflow_lines, table


def _exercised(profile: Any, device: Any) -> str:
    from pytest_gn.sweep import ptx_variant

    if device is None:
        return "no (no GPU)"
    variant = ptx_variant(profile, device.cc)
    if variant:
        return f"yes ({variant} PTX on {device.arch})"
    return f"no ({profile.arch} > {device.arch}: native build + cap)"


def _local_row(state: Any, device: Any) -> dict[str, Any]:
    from pytest_gn.device import MAIN_CONFIGS

    c = state.tally.counts(lambda s: not s.get("profile"))
    row = {"profile": LOCAL, "cases": sum(c.values()), "passed": c["passed"], "failed": c["failed"],
           "skipped": c["skipped"]}  # fmt: skip
    if device is None:
        return {**row, "arch": "-", "SMs": "-", "arch code exercised": "no (no GPU)"}
    residency = " ".join(str(device.residency.get(m, "?")) for m in MAIN_CONFIGS) if device.residency else "-"
    what = "foreign impl" if state.opts.foreign else f"native {device.arch}"
    return {**row, "arch": device.arch, "SMs": device.sm_count, "residency f,b": residency,
            "arch code exercised": what}  # fmt: skip


def sweep_lines(state: Any) -> list[str]:
    from pytest_gn.sweep import main_numbers

    sweep = state.sweep
    sweep.compile_all()
    # Probe here too: under xdist the controller ran no case itself and has not looked yet.
    try:
        device, reason = state.device(with_residency=False)
    except Exception as exc:  # the summary must never break the session
        device, reason = None, f"{type(exc).__name__}: {exc}"
    foreign = state.opts.foreign
    rows, errors = [], []
    for p in state.selected:
        st = sweep.static(p.name)
        c = state.tally.counts(lambda s, name=p.name: s.get("profile") == name)
        row = {"profile": p.name, "arch": p.arch, "SMs": p.sm_count, **main_numbers(st),
               "cases": sum(c.values()), "passed": c["passed"], "failed": c["failed"],
               "skipped": c["skipped"], "arch code exercised": _exercised(p, device)}  # fmt: skip
        if foreign:
            row.update({"cases": "-", "passed": "-", "failed": "-", "skipped": "-"})
        if st.error and sweep.nvcc_error is None:
            row["regs/smem f,b"] = "compile failed"
            errors.append(f"{p.name} ({p.arch}): {st.error.splitlines()[0]}")
        rows.append(row)
    rows.append(_local_row(state, device))
    lines = [
        "arch sweep (f,b = one-pass forward, backward; fp16, C=128; residency = blocks on the whole GPU; "
        f"'{LOCAL}' = the natural, capped and over-2**31 cases of the GPU at hand"
        + (
            "; tasks f,b = the task kernels, forward (one-pass) and backward (stats): chunks a block "
            "keeps, blocks on the GPU"
            if "tasks" in state.opts.archs
            else ""
        )
        + "):"
    ]
    columns = list(MATRIX_COLUMNS)
    if "tasks" in state.opts.archs:  # fp16, C=128: chunk slots per block, resident blocks (fwd, bwd)
        columns.insert(columns.index("cases"), "tasks slots,res f,b")
    lines += table(rows, columns)
    total = state.tally.counts()
    lines.append(f"cases column total: {sum(total.values())} = the overflow cases collected")
    lines += [f"compile error: {e}" for e in errors]
    if foreign:
        lines.append("profile rows: gn_module's own kernels (static part only); profile cases emulate a GPU "
                     "with a residency cap and a PTX build of gn_module, which do not apply to a foreign "
                     f"implementation, so it has none: its cases are the '{LOCAL}' row")  # fmt: skip
    if sweep.nvcc_error:
        lines.append("static part skipped: nvcc not found, so compiling for each profile's arch, "
                     "registers/shared memory and modelled residency did not happen, and the profiles' "
                     "cases cannot be sized")  # fmt: skip
        lines.append(f"  ({sweep.nvcc_error})")
    else:
        ok = len(state.selected) - len(errors)
        lines.append(f"static part done: compiled for {ok} of {len(state.selected)} profiles' archs, "
                     "registers, shared memory and modelled residency above")  # fmt: skip
    if device is None:
        prof = sum(r["cases"] for r in rows[:-1] if isinstance(r["cases"], int))
        local = rows[-1]["cases"]
        checks = len(state.tally.selfcheck)
        lines.append(f"GPU part skipped ({reason}): none of the {sum(total.values())} overflow cases ran "
                     f"({prof} profile cases, {local} cases of {LOCAL}), and the {checks} self-check tests "
                     "were skipped")  # fmt: skip
    return lines


def summary_lines(state: Any) -> list[str]:
    lines = overflow_lines(state.tally)
    if state.opts.arch_sweep:
        lines += sweep_lines(state)
    elif state.tally.selfcheck:
        c = {o: list(state.tally.selfcheck.values()).count(o) for o in ("passed", "failed", "skipped")}
        lines.append(f"self-check: {len(state.tally.selfcheck)} tests: {c['passed']} passed, "
                     f"{c['failed']} failed, {c['skipped']} skipped")  # fmt: skip
    return lines
