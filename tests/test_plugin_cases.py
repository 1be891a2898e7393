"""Overflow case generation from the schedule model, with fake profiles and kernel resources."""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Callable
from itertools import product

import pytest

from gn_module import profiles, resources, schedule
from pytest_gn.cases import (
    DEFAULT_RATIOS,
    DEFAULT_SHAPES,
    DTYPES,
    GEOMETRIES,
    CaseSpec,
    CaseUnavailable,
    Ratio,
    _batches,
    nearby_plus,
    parse_shapes,
    resolve,
    resolve_foreign,
    specs_from_marker,
)
from pytest_gn.device import GnDevice, worker_gpu_index
from pytest_gn.sweep import ProfileStatic, Sweep, ptx_variant

FAKE = profiles.limits_for("Fake", (8, 6), 10)


def _spec(ratio: str = "x2p1", direction: str = "fwd", dtype: str = "fp16", **kw) -> CaseSpec:
    return CaseSpec(direction, Ratio.parse(ratio), dtype, "silu", **kw)


@pytest.mark.parametrize("geometry", ["even", "partial", "batch"])
@pytest.mark.parametrize("ratio", ["x1", "x1p1", "x2p1", "x4p3"])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_resolved_shape_has_exact_tiles(ratio: str, direction: str, dtype: str, geometry: str) -> None:
    spec = _spec(ratio, direction, dtype, geometry=geometry)
    case = resolve(spec, 37)
    r = Ratio.parse(ratio)
    assert case.tiles == r.mult * 37 + r.plus
    n, c, h, w = case.shape
    t = schedule.tiling(c, spec.groups, h * w, spec.itemsize, direction, batch=n)
    assert n * t.tiles_per_slice == case.tiles  # the model's own tiling of the shape
    assert case.expected_grid == 37 and case.overflow_tiles == case.tiles - 37
    assert case.tile_rows == t.rows_per_tile
    if geometry == "partial":  # the last tile of each slice is short
        assert (h * w) % t.rows_per_tile != 0
    if geometry == "batch":
        assert n >= 2


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
    specs = specs_from_marker({"shapes": [(128, 16), (96, 32)], "rotate": False}, profiles=("A100", "Thor"))
    ids = [s.id for s in specs]
    assert len(ids) == len(set(ids))
    assert "fwd-onepass-x1p1-fp16-silu" in ids
    assert "bwd-onepass-cap3-x4p3-bf16-noact-partial" in ids
    assert "Thor-fwd-onepass-x2p1-fp32-silu-c96g32-batch" in ids
    assert "bwd-onepass-cap3-x4p3-bf16-gelu_tanh-partial" in ids
    # 2 shapes x 3 geometries x 2 directions x 4 ratios x 3 dtypes x (4 fused acts + none: rotate=False
    # rotates no activation either) x (capped + natural + 2 profiles)
    assert len(ids) == 2 * 3 * 2 * 4 * 3 * 5 * 4
    assert specs_from_marker({}) == specs_from_marker({})  # deterministic: identical on every worker


def _scopes(specs):
    out = {}
    for s in specs:
        out.setdefault((s.profile, s.variant), []).append(s)
    return out


def test_rotation_keeps_every_scope_at_48_cases_and_spreads_the_kinds() -> None:
    names = tuple(p.name for p in profiles.BUILTIN_PROFILES)
    specs = specs_from_marker({}, profiles=names)
    scopes = _scopes(specs)
    assert len(scopes) == 2 + len(names) and all(len(v) == 48 for v in scopes.values())
    kinds = {(c, g, geo) for (c, g) in DEFAULT_SHAPES for geo in GEOMETRIES}
    assert len(kinds) == 15
    for scope in scopes.values():  # every scope meets every kind, with both directions
        seen = {}
        for s in scope:
            seen.setdefault((s.channels, s.groups, s.geometry), set()).add(s.direction)
        assert set(seen) == kinds
        assert all(d == {"fwd", "bwd"} for d in seen.values())
    for kind in kinds:  # over all scopes each kind meets every dtype, act and ratio
        mine = [s for s in specs if (s.channels, s.groups, s.geometry) == kind]
        assert {s.dtype for s in mine} == {"fp16", "bf16", "fp32"}
        assert {s.act for s in mine} == {"silu", "relu", "gelu", "gelu_tanh", None}
        assert {s.ratio.label for s in mine} == {"x1", "x1p1", "x2p1", "x4p3"}


def test_a_profile_gets_the_same_cases_whatever_else_is_selected() -> None:
    numbers = {p.name: i for i, p in enumerate(profiles.BUILTIN_PROFILES)}
    alone = specs_from_marker({}, profiles=("Thor",), profile_numbers=numbers)
    every = specs_from_marker({}, profiles=tuple(numbers), profile_numbers=numbers)
    assert [s for s in alone if s.profile] == [s for s in every if s.profile == "Thor"]


def test_default_shapes_can_be_replaced_and_marker_shapes_win() -> None:
    mine = specs_from_marker({}, default_shapes=((256, 32),))
    assert {(s.channels, s.groups) for s in mine} == {(256, 32)}
    named = specs_from_marker({"shapes": [(64, 8)]}, default_shapes=((256, 32),))
    assert {(s.channels, s.groups) for s in named} == {(64, 8)}


def test_over_2_31_cases_are_natural_one_pass_and_this_gpus_only() -> None:
    specs = specs_from_marker({"over_2_31": True}, profiles=("A100",))
    big = [s for s in specs if s.big]
    assert [s.id for s in big] == ["fwd-onepass-2_31-bf16-silu", "bwd-onepass-2_31-bf16-silu"]
    assert all(s.variant == "natural" and s.profile is None for s in big)
    for s in big:
        case = resolve(s, 264)
        assert case.numel > 2**31 and case.shape[0] == 1
        _, c, h, w = case.shape
        t = schedule.tiling(c, s.groups, h * w, s.itemsize, s.direction)
        assert case.tiles == t.tiles_per_slice > case.expected_grid == 264
        assert case.bytes_needed() < 32 * 2**30  # fits an 80 GiB GPU, with room for xdist neighbours
    assert not [s for s in specs_from_marker({}) if s.big]


@pytest.mark.parametrize("residency", [2, 3, 7, 40, 216, 264, 1000])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_every_default_kind_has_a_shape(residency: int, geometry: str) -> None:
    for (c, g), direction, ratio, dtype in product(DEFAULT_SHAPES, ("fwd", "bwd"), DEFAULT_RATIOS, DTYPES):
        spec = CaseSpec(direction, Ratio.parse(ratio), dtype, "silu", c, g, geometry=geometry)
        case = resolve(spec, residency)
        n, _, h, w = case.shape
        t = schedule.tiling(c, g, h * w, spec.itemsize, direction, batch=n)
        assert n * t.tiles_per_slice == case.tiles == Ratio.parse(ratio).tiles(residency), spec.id


#: ptxas gives every one-pass kernel 122-128 registers on every built-in arch (the arch sweep's
#: matrix): two blocks per SM by registers, one on the 100 KB-SM GPUs once the tiles are large.
ONEPASS_REGISTERS = 128
BUILTIN_NUMBERS = {p.name: i for i, p in enumerate(profiles.BUILTIN_PROFILES)}


def _assert_partial_case(case, of) -> None:
    """The shape has the case's tile count in the model's own tiling, every slice ends in a
    partial tile, and the count is the id's ratio of the shape's residency (or, where no partial
    shape has that count, the nearest count of the same class, said in the notes)."""
    spec, ratio = case.spec, case.spec.ratio
    n, c, h, w = case.shape
    t = schedule.tiling(c, spec.groups, h * w, spec.itemsize, spec.direction, batch=n)
    assert (n * t.tiles_per_slice, t.rows_per_tile) == (case.tiles, case.tile_rows), spec.id
    assert t.tiles_per_slice >= 2 and (h * w) % t.rows_per_tile != 0, spec.id  # partial last tile
    r = case.residency
    assert r == of(t) and case.cap == r and case.expected_grid == min(case.tiles, r), spec.id
    assert case.numel <= 2**26, spec.id  # as small as the other cases
    if case.tiles == ratio.tiles(r):
        return
    assert ratio.plus > 0 and ratio.mult * r < case.tiles < (ratio.mult + 1) * r, spec.id  # same class
    assert abs(case.tiles - ratio.tiles(r)) == 1, spec.id  # the nearest count
    assert any(f"instead of {ratio.tiles(r)} ({ratio.label})" in note for note in case.notes), case.notes


def _profile_residency(name: str, regs: int = ONEPASS_REGISTERS) -> Callable[[schedule.Tiling], int]:
    profile = profiles.get_profile(name)
    return lambda t: schedule.model_residency(profile, schedule.KernelResources(regs), t)


#: The partial cases `pytest --gn-arch-sweep` runs on the built-in profiles (16 per profile).
SWEEP_PARTIAL = [
    s
    for s in specs_from_marker({}, profiles=tuple(BUILTIN_NUMBERS), profile_numbers=BUILTIN_NUMBERS)
    if s.profile and s.geometry == "partial"
]


@pytest.mark.parametrize("spec", SWEEP_PARTIAL, ids=lambda s: s.id)
def test_every_partial_case_of_the_arch_sweep_has_a_shape(spec: CaseSpec) -> None:
    # 28 of these once skipped (RTX3090, A10, L4, RTX4090, RTX5090, GB10: one block per SM for the
    # largest tiles, two for short ones), e.g. GB10-bwd-onepass-x4p3-fp16-silu-c64g1-partial.
    of = _profile_residency(spec.profile)
    _assert_partial_case(resolve(spec, of, cap_at_residency=True), of)


@pytest.mark.parametrize("regs", [ONEPASS_REGISTERS, 96, 64])
@pytest.mark.parametrize("name", list(BUILTIN_NUMBERS))
def test_every_partial_kind_of_every_builtin_profile_has_a_shape(name: str, regs: int) -> None:
    # every cell with every (C, G) pair, not only the rotation's; other register counts too
    of = _profile_residency(name, regs)
    every = [s for s in specs_from_marker({"rotate": False, "geometries": ("partial",)}, profiles=(name,))
             if s.profile]  # fmt: skip
    assert {s.id for s in SWEEP_PARTIAL if s.profile == name} <= {s.id for s in every}
    for spec in every:
        _assert_partial_case(resolve(spec, of, cap_at_residency=True), of)


def test_a_partial_count_without_a_shape_moves_to_the_nearest_of_its_class() -> None:
    of = _profile_residency("GB10")
    # 4 x 96 + 3 = 387 = 9 x 43 tiles of 16 rows (96 blocks): no sample count gives every sample
    # a partial tile; 4 x 48 + 3 = 195 of the largest (48 blocks): too few for the largest tiles.
    case = resolve(
        _spec("x4p3", "fwd", "fp16", geometry="partial", profile="GB10"), of, cap_at_residency=True
    )
    assert (case.residency, case.tiles, case.tile_rows) == (96, 388, 16)
    assert case.shape[0] == 194 and "388 tiles (x4p4 of residency 96) instead of 387 (x4p3)" in case.notes[0]
    _assert_partial_case(case, of)
    # RTX5090's x1: 340 tiles exist, as 85 samples of 4 (no 1- or 2-sample shape has them)
    exact = resolve(_spec("x1", "bwd", "fp32", geometry="partial"), _profile_residency("RTX5090"))
    assert (exact.tiles, exact.residency, exact.shape[0]) == (340, 340, 85) and "85 samples" in exact.notes[0]


def test_nearby_plus_keeps_the_ratio_class() -> None:
    assert nearby_plus(Ratio(1), 100) == [0] and nearby_plus(Ratio(2), 7) == [0]  # whole waves: exact only
    assert nearby_plus(Ratio(4, 3), 6) == [3, 4, 2, 5, 1]  # nearest first, above first, within 1..r-1
    assert nearby_plus(Ratio(1, 1), 3) == [1, 2]
    assert nearby_plus(Ratio(1, 1), 1) == [1]


def test_batch_overflow_starts_inside_a_sample_when_the_tiles_allow() -> None:
    for tiles, grid in ((265, 264), (529, 264), (15, 3), (4, 3)):
        n = _batches(tiles, grid)[0]
        per = tiles // n
        assert grid % per != 0, (tiles, grid, n)
    assert _batches(7, 3) == [7]  # a prime tile count: one tile per sample


def test_one_tile_cannot_make_a_partial_or_batch_shape() -> None:
    for geometry in ("partial", "batch"):
        with pytest.raises(CaseUnavailable, match=f"no {geometry} shape"):
            resolve(_spec("x1", geometry=geometry), 1)


def test_parse_shapes() -> None:
    assert parse_shapes("128:16, 100:20") == ((128, 16), (100, 20))
    for bad, match in (
        ("128x16", "C:G pairs"),
        ("30:7", "divisible"),
        ("", "at least one"),
        ("8:2,8:2", "repeats"),
    ):
        with pytest.raises(ValueError, match=match):
            parse_shapes(bad)


def test_foreign_cases_are_natural_only_and_overflow_512_row_tiles() -> None:
    specs = specs_from_marker({"dtypes": ("fp16",), "acts": ("silu",)}, profiles=("A100",), foreign=True)
    assert {s.variant for s in specs} == {"natural"} and all(s.profile is None for s in specs)
    assert len(specs) == 8  # 2 directions x 4 ratios: one kind each
    case = resolve_foreign(_spec("x1p1"), sm_count=132, max_blocks_per_sm=32)
    rows = case.shape[2] * case.shape[3]
    assert rows // 512 > 132 * 32  # even a 512-row tile with 32 blocks on every SM overflows
    partial = resolve_foreign(_spec("x2p1", geometry="partial"), sm_count=4, max_blocks_per_sm=2)
    rows = partial.shape[2] * partial.shape[3]
    assert all(rows % r for r in (2, 4, 8, 16, 32, 64, 128, 256, 512))  # partial for any such tile


def test_described_foreign_cases_use_its_tiles_and_residency() -> None:
    calls = []

    def describe(shape):
        calls.append(shape)
        return 32, 10

    case = resolve_foreign(_spec("x2p1"), 132, 32, describe)
    assert (case.tiles, case.residency, case.tile_rows) == (21, 10, 32)
    assert case.shape[0] * case.shape[2] * case.shape[3] == 21 * 32
    assert "description" in case.notes[0] and len(calls) == 2  # asked again for the new shape
    batch = resolve_foreign(_spec("x2p1", geometry="batch"), 132, 32, describe)
    assert batch.shape[0] in (3, 7) and batch.tiles == 21


def test_a_description_that_depends_on_the_shape_settles() -> None:
    def describe(shape):  # small tensors get short tiles and more resident blocks, like ours
        rows = shape[0] * shape[2] * shape[3]
        return (16, 40) if rows < 4096 else (64, 20)

    case = resolve_foreign(_spec("x1p1"), 132, 32, describe)
    assert describe(case.shape) == (case.tile_rows, case.residency)
    assert case.tiles == case.residency + 1


def test_description_none_falls_back_and_not_implemented_propagates() -> None:
    case = resolve_foreign(_spec("x1p1"), 4, 2, lambda shape: None)
    assert case.tile_rows == 512 and "512 rows" in case.notes[0]

    def refuse(shape):
        raise NotImplementedError("C=128 only in fp32")

    with pytest.raises(NotImplementedError, match="fp32"):
        resolve_foreign(_spec("x1p1"), 4, 2, refuse)


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


# ------------------------------------------------------------------ activations (issue 14)
ALL_ACTS = {None, "silu", "relu", "gelu", "gelu_tanh"}


def test_default_acts_rotate_over_every_activation_without_growing_a_scope() -> None:
    names = tuple(p.name for p in profiles.BUILTIN_PROFILES)
    specs = specs_from_marker({}, profiles=names, archs=("tiles", "tasks"))
    scopes: dict = {}
    for s in specs:
        scopes.setdefault((s.profile, s.variant, s.arch), []).append(s)
    for key, scope in scopes.items():
        directions = ("bwd",) if key[2] == "tasks1" else ("fwd", "bwd")  # the one-launch backward's: bwd only
        n = 24 * len(directions)
        assert len(scope) == n, key
        count = {act: sum(s.act == act for s in scope) for act in ALL_ACTS}
        assert count == {None: n // 2, **{act: n // 8 for act in ALL_ACTS - {None}}}, key
        for direction, dtype in product(directions, DTYPES):  # every direction and dtype: every act
            mine = {s.act for s in scope if s.direction == direction and s.dtype == dtype}
            assert mine == ALL_ACTS, (key, direction, dtype)
    # The activation is the only thing the rotation changed: the same cells without it are the old ones.
    plain = specs_from_marker({"acts": ("silu", None)}, profiles=names, archs=("tiles", "tasks"))
    assert [dataclasses.replace(s, act="silu" if s.act else None) for s in specs] == plain
    assert [s for s in specs if s.act in ("silu", None)] == [s for s in plain if s in set(specs)]


def test_acts_values_of_the_marker() -> None:
    ids = [s.id for s in specs_from_marker({"acts": ("relu",), "dtypes": ("fp16",), "variants": ("capped",)})]
    assert len(ids) == 8 and all("-fp16-relu" in i for i in ids)
    # Activations the marker lists run as their own cells; "fused" rotates over the rest.
    mixed = specs_from_marker({"acts": ("fused", "silu", None)})
    assert {s.act for s in mixed} == ALL_ACTS and len(mixed) == 3 * 48
    assert sum(s.act == "silu" for s in mixed) == 48  # the explicit cells only
    every = specs_from_marker({"acts": ("fused", "silu", "relu", "gelu", "gelu_tanh")})
    assert every == specs_from_marker({"acts": ("silu", "relu", "gelu", "gelu_tanh")})  # nothing to rotate
    identity = specs_from_marker({"acts": ("identity", "none")})
    assert {s.act for s in identity} == {"identity", None}
    assert "fwd-onepass-cap3-x1-fp16-identity" in {s.id for s in identity}
    assert {s.act for s in specs_from_marker({"acts": "fused"})} == ALL_ACTS - {None}
    # A foreign implementation's protocol promises SiLU only: its "fused" cells stay SiLU.
    foreign = specs_from_marker({}, foreign=True)
    assert {s.act for s in foreign} == {"silu", None}
    assert {s.act for s in specs_from_marker({"acts": ("gelu", None)}, foreign=True)} == {"gelu", None}
    for bad in (("tanh",), ("silu", "SiLU"), ()):
        with pytest.raises(ValueError, match="overflow_grid acts="):
            specs_from_marker({"acts": bad})


def test_over_2_31_cases_keep_silu_under_the_rotation() -> None:
    big = [s for s in specs_from_marker({"over_2_31": True}, archs=("tiles", "tasks")) if s.big]
    assert {s.act for s in big} == {"silu"} and len(big) == 5  # tiles 2, tasks 2, one-launch backward 1
    relu = [s for s in specs_from_marker({"over_2_31": True, "acts": ("relu", None)}) if s.big]
    assert [s.id for s in relu] == ["fwd-onepass-2_31-bf16-relu", "bwd-onepass-2_31-bf16-relu"]


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("act", sorted(ALL_ACTS | {"identity"}, key=str))
def test_runner_checks_every_act_against_the_fp64_reference(direction: str, act: str | None) -> None:
    """An implementation on the CPU (torch's own GroupNorm + activation) passes the runner's check of a
    case with any activation; one that applies another activation fails it."""
    pytest.importorskip("torch")
    from gn_module.functional import apply_act
    from pytest_gn.cases import GnCase
    from pytest_gn.runner import check_case

    def impl(x, num_groups, weight, bias, eps, act):
        import torch.nn.functional as F

        return apply_act(F.group_norm(x.float(), num_groups, weight, bias, eps), act).to(x.dtype)

    def other(x, num_groups, weight, bias, eps, act):
        return impl(x, num_groups, weight, bias, eps, "silu" if act in ("relu", "gelu") else "relu")

    spec = CaseSpec(direction, Ratio(1, 1), "fp32", act, 8, 4)
    case = GnCase(spec, (2, 8, 6, 5), 4, 5, None, None)
    result = check_case(case, impl, 0, "cpu")
    assert result.ok, result.problems
    wrong = check_case(case, other, 0, "cpu")
    assert not wrong.ok and wrong.problems[0].startswith("y:" if direction == "fwd" else "dx:")


def test_reference_takes_every_act_and_rejects_others() -> None:
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    from gn_module.functional import ACTS
    from pytest_gn.cases import CASE_ACTS
    from pytest_gn.reference import reference

    assert CASE_ACTS == ACTS  # the plugin's list (read without torch) is gn_module's
    x = torch.randn(2, 8, 5)
    base = F.group_norm(x.double(), 4)
    want = {None: base, "identity": base, "silu": F.silu(base), "relu": F.relu(base), "gelu": F.gelu(base),
            "gelu_tanh": F.gelu(base, approximate="tanh")}  # fmt: skip
    for act, y in want.items():
        got = reference(x, 4, act=act).y
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, y, rtol=1e-12, atol=1e-12, msg=str(act))
    with pytest.raises(ValueError, match="unsupported act 'tanh'"):
        reference(x, 4, act="tanh")
