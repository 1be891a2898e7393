"""Run one overflow case against the fp64 reference; foreign implementations in a child process.

`check_case` is what the bundled suite calls. A ``fwd`` case runs and checks the forward only
(y), a ``bwd`` case runs forward and backward and checks the gradients (dx, dweight, dbias), so
a forward that fails and a backward that is right show up as such. For gn_module it also reads
back the launch (grid and tiles visited must match the schedule model) and checks that the
one-pass results are bitwise equal to the two-pass ones. A task architecture case runs several times
with outputs and workspace poisoned, each run's launch record showing the model's plan (its grid, every
tile reduced and applied, the chunks it re-reads), every run bitwise equal to the first, which must
match the fp64 reference: a forward case (``fwd-tasks-...``, GN_ARCH=tasks) one-pass under the case's
cap, one-pass under another cap and two-pass; a backward case (``bwd-tasks-...``, GN_ARCH=tasks+bwd:
one schedule) forward and backward under the case's cap, then under whichever of caps 1 and 2 it is not
(each extra run's cap replaces the case's: `ops.max_resident_blocks(k, replace=True)`). A foreign
implementation runs in `python -m pytest_gn.child` so that an abort (a device assert, a segfault)
becomes a failed case carrying its stderr and the phase it died in; a NotImplementedError it raises is
its documented "not supported" signal and skips the case with its message.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from pytest_gn.cases import CaseSpec, GnCase, Ratio, TaskRun

RESULT_TAG = "GN-CHILD-RESULT "
PHASE_TAG = "GN-CHILD-PHASE "
EPS = 1e-5


@dataclass
class CaseResult:
    ok: bool
    problems: list[str] = field(default_factory=list)
    record: dict[str, Any] = field(default_factory=dict)
    runtime_arch: int | None = None
    stderr: str = ""
    skipped: str = ""  # the implementation said "not supported" (NotImplementedError): its message
    phase: str = ""  # the last phase started: forward, backward, two-pass, reference
    peak_bytes: int | None = None  # device memory the check allocated at its peak (CUDA only)

    def message(self, case: GnCase) -> str:
        if case.nan_at is not None:
            where = list(case.nan_at)
            lines = [f"{case.id}: shape {list(case.shape)}, {case.num_groups} groups, x{where} = NaN"]
        else:
            lines = [f"{case.id}: shape {list(case.shape)}, {case.tiles} tiles, residency {case.residency}, "
                     f"grid {case.expected_grid}, overflow {case.overflow_tiles} tiles"]  # fmt: skip
        lines += [f"  - {p}" for p in self.problems]
        if self.stderr:
            lines.append("  child stderr (tail):\n" + self.stderr[-4000:])
        return "\n".join(lines)


class ImplError(Exception):
    """--gn-impl names nothing usable: the module, the attribute or a callable is missing."""


def load_impl(spec: str) -> Callable[..., Any]:
    """Import ``module:callable`` (the callable may be dotted: ``mod:Class.method``).

    Raises ImplError carrying the import error (any exception the module raises on import
    counts: a broken implementation must not pass for a missing one)."""
    module_name, _, attr = spec.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise ImplError(
            f"--gn-impl {spec!r}: cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise ImplError(
                f"--gn-impl {spec!r}: {module_name!r} has no attribute {attr!r} ({exc})"
            ) from None
    if not callable(obj):
        raise ImplError(f"--gn-impl {spec!r} is not callable (it is a {type(obj).__name__}: {obj!r})")
    return obj


#: gn_module's switch of the forward architecture (gn_module.ops.ENV_ARCH; not imported: torch).
ENV_ARCH = "GN_ARCH"


@contextlib.contextmanager
def arch_env(arch: str) -> Iterator[None]:
    """GN_ARCH=`arch` inside the block (gn_module reads it on every call), restored afterwards."""
    old = os.environ.get(ENV_ARCH)
    os.environ[ENV_ARCH] = arch
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV_ARCH, None)
        else:
            os.environ[ENV_ARCH] = old


@contextlib.contextmanager
def case_context(case: GnCase, own: bool = True) -> Iterator[None]:
    """Apply the case's residency cap and build variant and, for gn_module's own cases (`own`), its
    architecture (`CaseSpec.env_arch`): GN_ARCH=tasks for a forward task case, tasks+bwd for a backward
    one, tiles otherwise (whatever the environment says, so a tile case never runs the task kernels);
    and no room for strip blocks."""
    if not own:
        yield
        return
    with contextlib.ExitStack() as stack:
        stack.enter_context(arch_env(case.spec.env_arch))
        from gn_module import ops

        # A case's plan has the model's teams at its ratio of tiles to blocks; room for the backward's
        # strip blocks (ops.strip_room, on by default) would shrink a team and move its members off that
        # ratio (bwd-tasks-cap3-x1p1 would run as x2), so cases run without it (the same bits either way;
        # tests/gpu/test_strip_blocks.py runs it).
        stack.enter_context(ops.strip_room(False))
        if case.variant is not None:
            stack.enter_context(ops.build_variant(case.variant))
        if case.cap is not None:
            stack.enter_context(ops.max_resident_blocks(case.cap))
        yield


Phase = Callable[[str], None]


def _call(fn: Callable[..., Any], case: GnCase, inp: dict, phase: Phase, copy: bool, **kwargs: Any) -> dict:
    """Outputs the case checks: {"y"} for fwd (run without autograd), {"dx", "dweight",
    "dbias"} for bwd. `copy` hands the implementation a copy of x (a foreign one may write it)."""
    import torch

    x = inp["x"].detach()
    x = x.clone() if copy else x
    w = inp["weight"].detach().clone()
    b = inp["bias"].detach().clone()
    # a wide case: CUDA autocast to x's dtype, so y and dy are float32 (gn_module's wide launches)
    autocast = torch.autocast("cuda", dtype=x.dtype) if case.spec.wide else contextlib.nullcontext()
    phase("forward")
    if case.direction == "fwd":
        with torch.no_grad(), autocast:
            y = fn(x, case.num_groups, w, b, EPS, case.act, **kwargs)
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"the forward returned {type(y).__name__}, not a tensor")
        return {"y": y.detach()}
    for t in (x, w, b):
        t.requires_grad_()
    with autocast:
        y = fn(x, case.num_groups, w, b, EPS, case.act, **kwargs)
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"the forward returned {type(y).__name__}, not a tensor")
    phase("backward")
    y.backward(inp["dy"])
    return {"dx": x.grad, "dweight": w.grad, "dbias": b.grad}


def check_case(
    case: GnCase, impl: Callable[..., Any] | None, seed: int, device: Any = None, phase: Phase | None = None
) -> CaseResult:
    """Run `case` with `impl` (None: gn_module.group_norm) in this process and compare."""
    import torch

    from pytest_gn import reference as ref

    ours = impl is None
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    cuda = device.type == "cuda"
    result = CaseResult(ok=True)

    def enter(name: str) -> None:
        result.phase = name
        if phase is not None:
            phase(name)

    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    dtype = getattr(torch, case.dtype)
    bwd = case.direction == "bwd"
    dy_dtype = torch.float32 if case.spec.wide else None
    inp = ref.make_inputs(case.shape, dtype, device, ref.case_seed(seed, case.id), bwd, dy_dtype)
    if case.nan_at is not None:
        inp["x"][case.nan_at] = float("nan")
    if ours and case.nan_at is not None:
        got = _check_nan_probe_runs(case, inp, result, enter)
    elif ours and case.task is not None:
        got = _check_task_runs(case, inp, result, enter, device)
    elif ours:
        import gn_module
        from gn_module import ops

        with case_context(case), ops.launch_record() as record:
            got = _call(gn_module.group_norm, case, inp, enter, False, passes=1)
            if case.variant is not None:
                result.runtime_arch = ops.runtime_cuda_arch(device)
        result.record = {k: {kk: vv for kk, vv in v.items() if kk != "plan"} for k, v in record.items()}
        result.problems += _launch_problems(case, result)
        enter("two-pass")
        with case_context(case):
            two = _call(gn_module.group_norm, case, inp, lambda _n: None, False, passes=2)
        for name, a in got.items():
            b = two[name]
            if a is not None and b is not None and not torch.equal(a, b):
                diff = (a.double() - b.double()).abs().max().item()
                result.problems.append(f"{name}: one-pass differs from two-pass (max |diff| {diff:.3g}); "
                                       "results must be bitwise identical across schedules")  # fmt: skip
        del two
    else:
        try:
            got = _call(impl, case, inp, enter, True)
        except NotImplementedError as exc:  # the documented "shape not supported" signal
            return CaseResult(ok=True, skipped=str(exc) or "NotImplementedError", phase=result.phase)
        except Exception as exc:  # report it as data: the forward/backward split says which one
            msg = f"the {result.phase} raised {type(exc).__name__}: {exc}"
            if case.direction == "bwd" and result.phase == "forward":
                msg += " (so the backward could not be checked)"
            return CaseResult(False, [msg], phase=result.phase)
    enter("reference")
    result.problems += ref.check_outputs(got, inp, case.num_groups, EPS, case.act)
    if cuda:
        result.peak_bytes = int(torch.cuda.max_memory_allocated(device) - base)
    result.ok = not result.problems
    return result


def _check_nan_probe_runs(case: GnCase, inp: dict, result: CaseResult, enter: Phase) -> dict:
    """gn_module's own NaN probe: the default architecture, one launch and two, the same bits (a NaN where
    the other has one)."""
    import torch

    import gn_module

    got = _call(gn_module.group_norm, case, inp, enter, False, passes=1)
    enter("two-pass")
    two = _call(gn_module.group_norm, case, inp, lambda _n: None, False, passes=2)
    for name, a in got.items():
        b = two[name]
        if a is not None and b is not None and not torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)):
            result.problems.append(f"{name}: one-pass differs from two-pass around a NaN")
        elif a is not None and b is not None and not torch.equal(a.isnan(), b.isnan()):
            result.problems.append(f"{name}: one-pass and two-pass put their NaNs in other places")
    return got


#: The second cap a task case's one-pass forward runs under (the first is the case's own): one block,
#: which runs every task alone and re-reads the most, or two where the case already has one.
def other_task_cap(case: GnCase) -> int:
    return 2 if case.cap == 1 else 1


#: Caps a backward task case runs under after its own (those it is not under): one block (one member
#: with every tile of every task), then two.
BWD_OTHER_CAPS = (1, 2)


def task_runs(case: GnCase, cap: int | None) -> list[tuple[str, int, int | None]]:
    """(label, passes, cap entered or None) of a task case's runs under `cap`, the cap in force (module
    docstring). The backward's two-launch cases have one schedule; their runs take passes=2 (the
    two-pass task forward). The one-launch backward's cases run as the forward's."""
    if case.spec.task_kind != "bwd":  # the forward and the one-launch backward keep chunks on chip
        other = other_task_cap(case)
        return [("one-pass", 1, None), (f"one-pass cap {other}", 1, other), ("two-pass", 2, None)]
    first = "natural" if cap is None else f"cap {cap}"
    return [(first, 2, None)] + [(f"cap {k}", 2, k) for k in BWD_OTHER_CAPS if k != cap]


def _check_task_runs(case: GnCase, inp: dict, result: CaseResult, enter: Phase, device: Any) -> dict:
    """The task case's runs (module docstring); problems go to `result`; returns the first run's outputs."""
    import gn_module
    from gn_module import ops
    from pytest_gn import tasks

    base: dict | None = None
    with case_context(case):
        runs = task_runs(case, ops.current_cap())
        for i, (label, passes, extra) in enumerate(runs):
            with contextlib.ExitStack() as stack:
                if extra is not None:  # exactly this cap, even above the case's (a cap-1 case's cap 2)
                    stack.enter_context(ops.max_resident_blocks(extra, replace=True))
                cap = ops.current_cap()
                stack.enter_context(ops.poison_outputs())
                record = stack.enter_context(ops.launch_record())
                out = _call(gn_module.group_norm, case, inp, enter if i == 0 else lambda _n: None, False,
                            passes=passes)  # fmt: skip
                if i == 0 and case.variant is not None:
                    result.runtime_arch = ops.runtime_cuda_arch(device)
            plan = tasks.expected_plan(case, passes, cap)
            rec = record.get(case.direction)
            result.problems += tasks.record_problems(rec, plan, label)
            if base is None:
                base = out
                result.record = {case.direction: {k: v for k, v in (rec or {}).items() if k != "plan"}}
                result.problems += _task_claim_problems(case, plan)
                continue
            first = runs[0][0]
            result.problems += _bitwise_problems(base, out, f"{label} differs from the first {first} run")
            del out
    result.problems += _launch_problems(case, result, record_checks=False)
    assert base is not None
    return base


def _bitwise_problems(base: dict, out: dict, what: str) -> list[str]:
    """Each output of `out` that is not bitwise equal to `base`'s, as `what` (which run against which)."""
    import torch

    problems = []
    for name, first in base.items():
        if first is not None and out[name] is not None and not torch.equal(first, out[name]):
            diff = (first.double() - out[name].double()).abs().max().item()
            problems.append(f"{name}: {what} (max |diff| {diff:.3g}); results must be bitwise identical "
                            "across caps and schedules")  # fmt: skip
    return problems


def _task_claim_problems(case: GnCase, plan: Any) -> list[str]:
    """This GPU's case: the plan that ran gives the busiest member the chunks (forward) and the team the
    size and tiles (backward) the case claims. (A profile's counts are its modelled plan's, which this
    GPU's slots or residency may not reproduce: its notes say what was launched, and the record is
    checked against that.)"""
    from pytest_gn.tasks import member_tiles

    task = case.task
    if task is None or case.spec.profile is not None or case.spec.big:
        return []
    if plan.teams is None:
        return ["the plan that ran has no teams"]
    got = (plan.teams.chunks_per_member, plan.teams.team_size, member_tiles(plan))
    if got != (task.chunks, task.team, task.member_tiles):
        return [f"the plan that ran gives its busiest member {got[0]} chunks per task in a team of {got[1]} "
                f"({got[2]} tiles), the case claims {task.chunks} in a team of {task.team} "
                f"({task.member_tiles} tiles; {case.spec.ratio.label})"]  # fmt: skip
    return []


def _launch_problems(case: GnCase, result: CaseResult, record_checks: bool = True) -> list[str]:
    problems = []
    if case.variant is not None:
        want = int(case.variant.removeprefix("compute_")) * 10
        if result.runtime_arch != want:
            problems.append(
                f"build {case.variant} ran with __CUDA_ARCH__={result.runtime_arch}, expected {want}"
            )
    if not record_checks:
        return problems
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
    if fields_.get("task") is not None:
        fields_["task"] = TaskRun(**fields_["task"])
    if fields_.get("nan_at") is not None:
        fields_["nan_at"] = tuple(fields_["nan_at"])
    return GnCase(spec=CaseSpec(**spec), **fields_)


def check_case_in_child(
    case: GnCase, impl_spec: str, seed: int, device_index: int | str, timeout: float = 900
) -> CaseResult:
    """`check_case` in a fresh interpreter; a crash or timeout is a failed case with stderr and
    the phase (forward, backward, reference) the child had reached."""
    payload = json.dumps(
        {"case": case_to_json(case), "impl": impl_spec, "seed": seed, "device": device_index}
    )
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest_gn.child"], input=payload, capture_output=True,
                              text=True, timeout=timeout, check=False)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        where = _last_phase(out)
        msg = f"the implementation did not finish within {timeout:.0f} s" + (
            f" (in the {where})" if where else ""
        )
        return CaseResult(False, [msg], stderr=err, phase=where)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            data = json.loads(line[len(RESULT_TAG) :])
            return CaseResult(**{**data, "stderr": proc.stderr if not data["ok"] else ""})
    where = _last_phase(proc.stdout)
    during = f" during the {where}" if where else ""
    why = (
        f"the child process died (exit code {proc.returncode}){during}"
        if proc.returncode
        else f"no result from child{during}"
    )
    return CaseResult(
        False, [why + ": the implementation aborted the process"], stderr=proc.stderr, phase=where
    )


def _last_phase(stdout: str) -> str:
    phases = [line[len(PHASE_TAG) :].strip() for line in stdout.splitlines() if line.startswith(PHASE_TAG)]
    return phases[-1] if phases else ""
