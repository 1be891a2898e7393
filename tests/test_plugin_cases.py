"""Overflow case generation from the schedule model, with fake profiles and kernel resources."""

from __future__ import annotations

import textwrap

import pytest

from gn_module import profiles, resources, schedule
from pytest_gn.cases import CaseSpec, Ratio, resolve, resolve_foreign, specs_from_marker
from pytest_gn.device import GnDevice, worker_gpu_index
from pytest_gn.sweep import ProfileStatic, Sweep, ptx_variant

FAKE = profiles.limits_for("Fake", (8, 6), 10)


def _spec(ratio: str = "x2p1", direction: str = "fwd", dtype: str = "fp16", **kw) -> CaseSpec:
    return CaseSpec(direction, Ratio.parse(ratio), dtype, "silu", **kw)


@pytest.mark.parametrize("ratio", ["x1", "x1p1", "x2p1", "x4p3"])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_resolved_shape_has_exact_tiles(ratio: str, direction: str, dtype: str) -> None:
    spec = _spec(ratio, direction, dtype)
    case = resolve(spec, 37)
    r = Ratio.parse(ratio)
    assert case.tiles == r.mult * 37 + r.plus
    n, c, h, w = case.shape
    t = schedule.tiling(c, spec.groups, h * w, spec.itemsize, direction, batch=n)
    assert n * t.tiles_per_slice == case.tiles  # the model's own tiling of the shape
    assert case.expected_grid == 37 and case.overflow_tiles == case.tiles - 37


def test_residency_follows_the_tiling_of_the_generated_shape() -> None:
    # Small totals get small tiles (less shared memory, more blocks): the residency used for the
    # shape must be the one of the shape's own tiling.
    orin = profiles.get_profile("Orin")
    spec = _spec("x1", "bwd", "fp32")

    def modelled(t: schedule.Tiling) -> int:
        return schedule.model_residency(orin, schedule.KernelResources(32), t)

    case = resolve(spec, modelled)
    n, c, h, w = case.shape
    t = schedule.tiling(c, spec.groups, h * w, spec.itemsize, "bwd", batch=n)
    assert case.residency == modelled(t) and case.tiles == n * t.tiles_per_slice


def test_ids_are_readable_and_unique() -> None:
    specs = specs_from_marker({"shapes": [(128, 16), (96, 32)]}, profiles=("A100", "Thor"))
    ids = [s.id for s in specs]
    assert len(ids) == len(set(ids))
    assert "fwd-onepass-x1p1-fp16-silu" in ids
    assert "bwd-onepass-cap3-x4p3-bf16-noact" in ids
    assert "Thor-fwd-onepass-x2p1-fp32-silu-c96g32" in ids
    # 2 shapes x 2 directions x 4 ratios x 3 dtypes x 2 acts x (capped + natural + 2 profiles)
    assert len(ids) == 2 * 2 * 4 * 3 * 2 * 4
    assert specs_from_marker({}) == specs_from_marker({})  # deterministic: identical on every worker


def test_foreign_cases_are_natural_only_and_overflow_512_row_tiles() -> None:
    specs = specs_from_marker({"dtypes": ("fp16",), "acts": ("silu",)}, profiles=("A100",), foreign=True)
    assert {s.variant for s in specs} == {"natural"} and all(s.profile is None for s in specs)
    case = resolve_foreign(_spec("x1p1"), sm_count=132, max_blocks_per_sm=32)
    rows = case.shape[2] * case.shape[3]
    assert rows // 512 > 132 * 32  # even a 512-row tile with 32 blocks on every SM overflows


def test_device_limited_grid_is_noted() -> None:
    case = resolve(_spec("x1p1"), 200, cap=200, device_residency=150)
    assert case.expected_grid == 150 and "grid limited by the device" in case.notes[0]


def _fake_sweep(regs: int) -> Sweep:
    sweep = Sweep([FAKE])
    kernels = [resources.KernelReport(mangled=n, name=n, arch=FAKE.arch, source="x.cu", registers=regs)
               for n in ("fwd_onepass[fp16,vec8]", "bwd_onepass[fp16,vec8]")]  # fmt: skip
    report = resources.ArchReport(FAKE.arch, "fake", "0", kernels)
    sweep._static = {FAKE.name: Sweep._analyse(FAKE, report)}
    return sweep


@pytest.mark.parametrize("regs", [64, 128])
def test_profile_case_uses_modelled_residency(regs: int) -> None:
    sweep = _fake_sweep(regs)
    spec = _spec("x2p1", profile="Fake")
    t = spec.tiling()
    expect = schedule.model_residency(FAKE, schedule.KernelResources(regs), t)
    assert sweep.static("Fake").blocks_per_sm["fwd_onepass[fp16,vec8]"] == schedule.blocks_per_sm(
        FAKE, schedule.KernelResources(regs), schedule.THREADS, t.onepass_smem
    )
    h200 = GnDevice(0, "H200", (9, 0), 132, profiles.get_profile("H200"), 0, "native")
    case = sweep.resolve_case(spec, h200, device_residency=10_000)
    n, c, h, w = case.shape  # small totals get smaller tiles: the residency is the shape's own
    own = schedule.model_residency(
        FAKE, schedule.KernelResources(regs), schedule.tiling(c, 16, h * w, 2, "fwd", batch=n)
    )
    assert (case.residency, case.cap, case.tiles) == (own, own, 2 * own + 1)
    assert own >= expect
    assert case.variant == "compute_86" and case.notes == ()
    old = GnDevice(0, "A100", (8, 0), 108, profiles.get_profile("A100"), 0, "native")
    case = sweep.resolve_case(spec, old, device_residency=10_000)
    assert case.variant is None and "arch code not exercised" in case.notes[0]


def test_ptx_variant_rule() -> None:
    assert ptx_variant(profiles.get_profile("A100"), (9, 0)) == "compute_80"
    assert ptx_variant(profiles.get_profile("Orin"), (9, 0)) == "compute_87"
    assert ptx_variant(profiles.get_profile("B200"), (9, 0)) is None


def test_missing_kernel_is_reported() -> None:
    st = Sweep._analyse(FAKE, resources.ArchReport(FAKE.arch, "fake", "0", []))
    assert isinstance(st, ProfileStatic) and "no kernel" in (st.error or "")


WORKERS = [("gw0", 2, 0), ("gw1", 2, 1), ("gw3", 2, 1), ("gw1", 1, 0), (None, 2, None), ("gw0", 0, None)]


@pytest.mark.parametrize(("worker", "count", "index"), WORKERS)
def test_worker_gpu_index(worker, count, index, monkeypatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert worker_gpu_index(count, worker) == index


def test_foreign_abort_is_a_failed_case_and_good_impl_passes(tmp_path, monkeypatch) -> None:
    pytest.importorskip("torch")
    from pytest_gn.cases import GnCase
    from pytest_gn.runner import check_case_in_child

    (tmp_path / "impls.py").write_text(
        textwrap.dedent("""
        import os, sys
        import torch.nn.functional as F

        def good(x, num_groups, weight, bias, eps, act):
            y = F.group_norm(x.float(), num_groups, weight, bias, eps)
            return (F.silu(y) if act == "silu" else y).to(x.dtype)

        def aborts(x, num_groups, weight, bias, eps, act):
            sys.stderr.write("Assertion `tiles <= grid` failed\\n")
            sys.stderr.flush()
            os.abort()

        def wrong(x, num_groups, weight, bias, eps, act):
            return good(x, num_groups, weight, bias, eps, act) * 1.01
    """)
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    spec = CaseSpec("fwd", Ratio(1, 1), "fp32", "silu", 8, 4)
    case = GnCase(spec, (2, 8, 6, 5), 4, 5, None, None)
    ok = check_case_in_child(case, "impls:good", 0, "cpu")
    assert ok.ok, ok.problems
    bad = check_case_in_child(case, "impls:aborts", 0, "cpu")
    assert not bad.ok and "aborted" in bad.problems[0] and "tiles <= grid" in bad.stderr
    wrong = check_case_in_child(case, "impls:wrong", 0, "cpu")
    assert not wrong.ok and any(p.startswith("y:") for p in wrong.problems)
