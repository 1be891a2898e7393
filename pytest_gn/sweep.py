"""Arch sweep: per GPU profile, compile for its arch, read kernel resources, model residency,
and turn the profile's overflow cases into concrete ones for the GPU at hand.

The task architecture's profile model (`schedule.task_model`): chunk slots from the profile's shared
memory split between two blocks per SM (`schedule.task_smem_budget`), blocks per SM from those slots'
shared memory and the registers ptxas gives ``fwd_task_onepass`` (forward) or ``bwd_task_stats``
(backward) for the profile's arch, times its SMs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from gn_module import resources, schedule
from gn_module.schedule import DeviceLimits
from pytest_gn.cases import CaseSpec, GnCase, Residency, resolve
from pytest_gn.device import MAIN_CONFIGS, MAIN_TASK_CONFIGS, GnDevice, kernel_configs, task_kernel_configs
from pytest_gn.tasks import TaskModel
from pytest_gn.tasks_bwd import resolver_of


@dataclass
class ProfileStatic:
    """The static part of one profile: what needs nvcc but no GPU."""

    profile: DeviceLimits
    report: resources.ArchReport | None = None
    error: str | None = None
    blocks_per_sm: dict[str, int] = field(default_factory=dict)  # one-pass config -> blocks/SM
    residency: dict[str, int] = field(default_factory=dict)  # one-pass config -> blocks on the GPU
    task_slots: dict[str, int] = field(default_factory=dict)  # task config (fwd, bwd) -> chunk slots
    task_residency: dict[str, int] = field(default_factory=dict)  # task config (fwd, bwd) -> blocks

    def task_model(self, config: str) -> TaskModel:
        """The profile's (slots, residency) of the task architecture as a function of the tiling."""
        res = self.resources(config)
        return lambda t: schedule.task_model(self.profile, res, t)

    def resources(self, config: str) -> schedule.KernelResources:
        if self.report is None:
            raise RuntimeError(self.error or "not compiled")
        return self.report.launch_resources(config)


def ptx_variant(profile: DeviceLimits, device_cc: tuple[int, int]) -> str | None:
    """The PTX build that runs the profile's arch code on this device, or None when it cannot."""
    return f"compute_{profile.cc[0]}{profile.cc[1]}" if profile.cc <= device_cc else None


class Sweep:
    """Lazily computed, cached static results for a list of profiles (thread-safe)."""

    def __init__(self, profiles: list[DeviceLimits]) -> None:
        self.profiles = {p.name: p for p in profiles}
        self._static: dict[str, ProfileStatic] = {}
        self._lock = threading.Lock()
        self.nvcc_error: str | None = None

    def compile_all(self) -> None:
        """Compile every profile's arch once, in parallel (results are cached on disk too)."""
        with self._lock:
            if self._static:
                return
            try:
                nvcc = resources.find_nvcc()
            except resources.NvccNotFound as exc:
                self.nvcc_error = str(exc)
                for p in self.profiles.values():
                    self._static[p.name] = ProfileStatic(p, error=str(exc))
                return
            reports = resources.compile_archs([p.arch for p in self.profiles.values()], nvcc=nvcc)
            for p in self.profiles.values():
                self._static[p.name] = self._analyse(p, reports[p.arch])

    @staticmethod
    def _analyse(p: DeviceLimits, report: resources.ArchReport | Exception) -> ProfileStatic:
        if isinstance(report, Exception):
            return ProfileStatic(p, error=f"{type(report).__name__}: {report}")
        st = ProfileStatic(p, report)
        for name, _dtype, t in kernel_configs():
            try:
                res = report.resources(name)
            except KeyError as exc:
                st.error = str(exc)
                continue
            st.blocks_per_sm[name] = schedule.blocks_per_sm(p, res, schedule.THREADS, t.onepass_smem)
            st.residency[name] = schedule.model_residency(p, res, t)
        for name, _dtype, tt in task_kernel_configs():
            if name in report.by_name():
                st.task_slots[name], st.task_residency[name] = schedule.task_model(
                    p, report.launch_resources(name), tt
                )
        return st

    def static(self, name: str) -> ProfileStatic:
        self.compile_all()
        return self._static[name]

    def resolve_case(
        self, spec: CaseSpec, device: GnDevice | None, device_residency: Residency | None
    ) -> GnCase:
        """A profile's case: tiles from the profile's modelled residency, grid capped at it."""
        if spec.profile is None:
            raise ValueError(f"{spec.id} is not a profile case")
        st = self.static(spec.profile)
        res = st.resources(spec.config)
        variant = ptx_variant(st.profile, device.cc) if device is not None else None
        notes: tuple[str, ...] = ()
        if device is not None and variant is None:
            notes = (f"arch code not exercised: {st.profile.arch} > device {device.arch}; "
                     "native build under the profile's residency cap",)  # fmt: skip
        return resolve(spec, lambda t: schedule.model_residency(st.profile, res, t), cap_at_residency=True,
                       device_residency=device_residency, variant=variant, notes=notes)  # fmt: skip

    def resolve_task_case(
        self, spec: CaseSpec, device: GnDevice | None, run_model: TaskModel | None
    ) -> GnCase:
        """A profile's task case (forward, backward or one-launch backward): shape from the profile's
        modelled slots and residency, grid capped at that residency; `run_model` is what the GPU at hand
        launches with (its slots and residency)."""
        if spec.profile is None or not spec.is_task:
            raise ValueError(f"{spec.id} is not a profile's task case")
        st = self.static(spec.profile)
        model = st.task_model(spec.config)
        variant = ptx_variant(st.profile, device.cc) if device is not None else None
        notes: tuple[str, ...] = ()
        if device is not None and variant is None:
            notes = (f"arch code not exercised: {st.profile.arch} > device {device.arch}; "
                     "native build under the profile's residency cap",)  # fmt: skip
        resolve_ = resolver_of(spec)
        return resolve_(spec, model, emulated=True, run_model=run_model, variant=variant, notes=notes)


def main_numbers(st: ProfileStatic) -> dict[str, str]:
    """Matrix cells of one profile for the main (fp16, vec8) forward and backward configs (the task
    kernels': slots and resident blocks, forward then backward)."""
    if st.report is None:
        return {}
    kernels = st.report.by_name()
    regs = []
    for cfg in MAIN_CONFIGS:
        k = kernels.get(cfg)
        regs.append(f"{k.registers}/{k.static_smem}" if k else "?")
    return {
        "regs/smem f,b": " ".join(regs),
        "blocks/SM f,b": " ".join(str(st.blocks_per_sm.get(c, "?")) for c in MAIN_CONFIGS),
        "residency f,b": " ".join(str(st.residency.get(c, "?")) for c in MAIN_CONFIGS),
        "tasks slots,res f,b": ", ".join(
            f"{st.task_slots.get(c, '?')} {st.task_residency.get(c, '?')}" for c in MAIN_TASK_CONFIGS
        ),
    }
