"""Run one overflow case against the fp64 reference; foreign implementations in a child process.

`check_case` is what the bundled suite calls. For gn_module it also reads back the launch
(grid and tiles visited must match the schedule model) and checks that the one-pass results are
bitwise equal to the two-pass ones. A foreign implementation runs in `python -m pytest_gn.child`
so that an abort (a device assert, a segfault) becomes a failed case carrying its stderr.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from pytest_gn.cases import CaseSpec, GnCase, Ratio

RESULT_TAG = "GN-CHILD-RESULT "
EPS = 1e-5


@dataclass
class CaseResult:
    ok: bool
    problems: list[str] = field(default_factory=list)
    record: dict[str, Any] = field(default_factory=dict)
    runtime_arch: int | None = None
    stderr: str = ""

    def message(self, case: GnCase) -> str:
        lines = [f"{case.id}: shape {list(case.shape)}, {case.tiles} tiles, residency {case.residency}, "
                 f"grid {case.expected_grid}, overflow {case.overflow_tiles} tiles"]  # fmt: skip
        lines += [f"  - {p}" for p in self.problems]
        if self.stderr:
            lines.append("  child stderr (tail):\n" + self.stderr[-4000:])
        return "\n".join(lines)


def load_impl(spec: str) -> Callable[..., Any]:
    """Import ``module:callable`` (the callable may be dotted: ``mod:Class.method``)."""
    module_name, _, attr = spec.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"--gn-impl {spec!r}: cannot import {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImportError(f"--gn-impl {spec!r}: {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise TypeError(f"--gn-impl {spec!r} is not callable")
    return obj


@contextlib.contextmanager
def case_context(case: GnCase) -> Iterator[None]:
    """Apply the case's residency cap and build variant (gn_module only)."""
    if case.cap is None and case.variant is None:
        yield
        return
    from gn_module import ops

    with contextlib.ExitStack() as stack:
        if case.variant is not None:
            stack.enter_context(ops.build_variant(case.variant))
        if case.cap is not None:
            stack.enter_context(ops.max_resident_blocks(case.cap))
        yield


def _run_impl(fn: Callable[..., Any], case: GnCase, inp: dict, **kwargs: Any) -> tuple:
    x = inp["x"].detach().clone().requires_grad_()
    w = inp["weight"].detach().clone().requires_grad_()
    b = inp["bias"].detach().clone().requires_grad_()
    y = fn(x, case.num_groups, w, b, EPS, case.act, **kwargs)
    y.backward(inp["dy"])
    return y.detach(), x.grad, w.grad, b.grad


def check_case(case: GnCase, impl: Callable[..., Any] | None, seed: int, device: Any = None) -> CaseResult:
    """Run `case` with `impl` (None: gn_module.group_norm) in this process and compare."""
    import torch

    from pytest_gn import reference as ref

    ours = impl is None
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    dtype = getattr(torch, case.dtype)
    inp = ref.make_inputs(case.shape, dtype, device, ref.case_seed(seed, case.id))
    result = CaseResult(ok=True)
    if ours:
        import gn_module
        from gn_module import ops

        with case_context(case), ops.launch_record() as record:
            got = _run_impl(gn_module.group_norm, case, inp, passes=1)
            if case.variant is not None:
                result.runtime_arch = ops.runtime_cuda_arch(device)
        with case_context(case):
            two = _run_impl(gn_module.group_norm, case, inp, passes=2)
        result.record = {k: {kk: vv for kk, vv in v.items() if kk != "plan"} for k, v in record.items()}
        result.problems += _launch_problems(case, result)
        for name, a, b in zip(("y", "dx", "dweight", "dbias"), got, two, strict=True):
            if not torch.equal(a, b):
                diff = (a.double() - b.double()).abs().max().item()
                result.problems.append(f"{name}: one-pass differs from two-pass (max |diff| {diff:.3g}); "
                                       "results must be bitwise identical across schedules")  # fmt: skip
    else:
        got = _run_impl(impl, case, inp)
    expect = ref.reference(inp["x"], case.num_groups, inp["weight"], inp["bias"], EPS, case.act, inp["dy"])
    terms = case.numel // case.shape[1]
    checks = (("y", got[0], expect.y, 1), ("dx", got[1], expect.dx, 1),
              ("dweight", got[2], expect.dweight, terms), ("dbias", got[3], expect.dbias, terms))  # fmt: skip
    for name, a, e, n in checks:
        if a is None:
            result.problems.append(f"{name}: the implementation returned no gradient")
            continue
        msg = ref.compare(name, a, e, a.dtype, n)
        if msg:
            result.problems.append(msg + " (fp64 reference)")
    result.ok = not result.problems
    return result


def _launch_problems(case: GnCase, result: CaseResult) -> list[str]:
    problems = []
    if case.variant is not None:
        want = int(case.variant.removeprefix("compute_")) * 10
        if result.runtime_arch != want:
            problems.append(
                f"build {case.variant} ran with __CUDA_ARCH__={result.runtime_arch}, expected {want}"
            )
    rec = result.record.get(case.direction)
    if rec is None:
        return [*problems, f"no launch record for the {case.direction} kernel (did the fast path run?)"]
    if rec.get("schedule") != 1:
        problems.append(f"{case.direction} ran schedule {rec.get('schedule')}, expected one-pass")
    if case.expected_grid is not None and rec.get("grid") != case.expected_grid:
        problems.append(
            f"{case.direction} grid {rec.get('grid')} != {case.expected_grid} predicted by the model"
        )
    for key in ("tiles_phase1", "tiles_applied"):
        if key in rec and rec[key] != case.tiles:
            problems.append(f"{case.direction} {key}={rec[key]} but the shape has {case.tiles} tiles")
    return problems


# ------------------------------------------------------------------ child processes
def case_to_json(case: GnCase) -> dict[str, Any]:
    spec = asdict(case.spec)
    spec["ratio"] = case.spec.ratio.label
    data = asdict(case)
    data["spec"] = spec
    return data


def case_from_json(data: dict[str, Any]) -> GnCase:
    spec = dict(data["spec"])
    spec["ratio"] = Ratio.parse(spec["ratio"])
    fields_ = {k: v for k, v in data.items() if k != "spec"}
    fields_["shape"] = tuple(fields_["shape"])
    fields_["notes"] = tuple(fields_["notes"])
    return GnCase(spec=CaseSpec(**spec), **fields_)


def check_case_in_child(
    case: GnCase, impl_spec: str, seed: int, device_index: int | str, timeout: float = 900
) -> CaseResult:
    """`check_case` in a fresh interpreter; a crash or timeout is a failed case with stderr."""
    payload = json.dumps(
        {"case": case_to_json(case), "impl": impl_spec, "seed": seed, "device": device_index}
    )
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest_gn.child"], input=payload, capture_output=True,
                              text=True, timeout=timeout, check=False)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return CaseResult(False, [f"the implementation did not finish within {timeout:.0f} s"], stderr=err)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            data = json.loads(line[len(RESULT_TAG) :])
            return CaseResult(**{**data, "stderr": proc.stderr if not data["ok"] else ""})
    why = (
        f"the child process died (exit code {proc.returncode})" if proc.returncode else "no result from child"
    )
    return CaseResult(False, [why + ": the implementation aborted the process"], stderr=proc.stderr)
