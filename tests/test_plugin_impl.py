"""``--gn-impl``: validating someone else's GroupNorm, seen from the command line (CPU only).

Runs pytest in subprocesses (torch loads there). Where cases must really run, a conftest puts a
fake device with index "cpu" in place of the GPU (`GnState.set_device`), so the foreign
implementation's child processes run on the CPU.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

FAKE_DEVICE = """
import pytest
from gn_module import profiles
from pytest_gn.device import GnDevice
from pytest_gn.plugin import STATE

@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    limits = profiles.limits_for("FakeCPU", (9, 0), 2, max_blocks_per_sm=2)
    device = GnDevice("cpu", "FakeCPU", (9, 0), 2, limits, 4 << 30, "cpu", error="no kernels on the CPU")
    config.stash[STATE].set_device(device)
"""

IMPLS = """
import os, sys
import torch
import torch.nn.functional as F

def gn(x, num_groups, weight, bias, eps, act):
    y = F.group_norm(x.float(), num_groups, weight, bias, eps)
    return (F.silu(y) if act == "silu" else y).to(x.dtype)

class _BadBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y):
        return y.clone()

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("backward kernel failed")

def bwd_raises(x, num_groups, weight, bias, eps, act):
    return _BadBackward.apply(gn(x, num_groups, weight, bias, eps, act))

def fwd_aborts(x, num_groups, weight, bias, eps, act):
    sys.stderr.write("Assertion `tiles <= grid` failed\\n")
    sys.stderr.flush()
    os.abort()

def fp16_only(x, num_groups, weight, bias, eps, act):
    if x.dtype != torch.float16:
        raise NotImplementedError(f"fp16 only, got {x.dtype}")
    return gn(x, num_groups, weight, bias, eps, act)

def described(x, num_groups, weight, bias, eps, act):
    return gn(x, num_groups, weight, bias, eps, act)

described.gn_describe = lambda **kw: {"tile_rows": 8, "resident_blocks": 3}

def badly_described(x, num_groups, weight, bias, eps, act):
    return gn(x, num_groups, weight, bias, eps, act)

badly_described.gn_describe = lambda **kw: {"tile_rows": 0}

def nan_to_zero(x, num_groups, weight, bias, eps, act):
    return torch.nan_to_num(gn(x, num_groups, weight, bias, eps, act), nan=0.0)

def nan_spreads(x, num_groups, weight, bias, eps, act):  # a NaN of a sample reaches all its groups
    whole = x.float().sum(dim=(1, 2, 3), keepdim=True)
    return (gn(x, num_groups, weight, bias, eps, act).float() + 0.0 * whole).to(x.dtype)

not_a_function = 3.5
"""

#: Small cases: one shape, the even geometry, fp32 with SiLU, one overflowing ratio.
SMALL = ("--gn-shapes", "16:4", "-k", "x2p1 and fp32 and silu and not 2_31")


@pytest.fixture
def gntester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytester whose subprocesses import the test implementations (and the example)."""
    pytester.makepyfile(impls=IMPLS)
    path = os.pathsep.join([str(pytester.path), str(EXAMPLES), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # the inner session is not an xdist worker
    pytester.makepyfile(test_other="def test_other():\n    pass\n")
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


@pytest.mark.parametrize(
    ("spec", "message"),
    [("nonexistent:thing", "--gn-impl 'nonexistent:thing': cannot import 'nonexistent': ModuleNotFound*"),
     ("os:nope", "--gn-impl 'os:nope': 'os' has no attribute 'nope'*"),
     ("math:pi", "--gn-impl 'math:pi' is not callable (it is a float: 3.14*"),
     ("impls:not_a_function", "--gn-impl 'impls:not_a_function' is not callable (it is a float: 3.5)")],
)  # fmt: skip
def test_a_bad_impl_is_a_usage_error_naming_the_import_error(gntester, spec: str, message: str) -> None:
    result = run(gntester, "--gn-impl", spec)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines([f"*{message}"])


def test_impl_without_test_paths_runs_the_bundled_suite(gntester) -> None:
    result = run(gntester, "--gn-impl", "impls:gn", "--co", "-q")
    out = result.stdout.str()
    assert "test_other" not in out  # the directory's own tests are not what was asked for
    assert "test_gn_static" not in out and "test_gn_selfcheck" not in out  # gn_module's own kernels
    result.stdout.fnmatch_lines(["*test_gn_nan.py::test_gn_nan_stays_in_its_group?bwd-bf16-silu?",
                                 "*test_gn_overflow.py::test_gn_overflow?fwd-onepass-x1-fp16-silu-partial?",
                                 "*test_gn_overflow.py::test_gn_overflow?bwd-onepass-2_31-bf16-silu?",
                                 "62/98 tests collected (36 deselected)*"])  # fmt: skip
    result = run(gntester, "--gn-impl", "impls:gn")
    assert result.ret == pytest.ExitCode.OK  # skipped without a GPU, not "no tests collected" (5)
    result.stdout.fnmatch_lines(["overflow cases: 50 collected: 0 passed, 0 failed, 50 skipped"])


def test_impl_with_test_paths_runs_those_only(gntester) -> None:
    result = run(gntester, "--gn-impl", "impls:gn", "test_other.py", "-q")
    result.assert_outcomes(passed=1)
    assert "test_gn_overflow" not in result.stdout.str()


def test_impl_from_the_ini_file_keeps_the_test_paths(gntester) -> None:
    gntester.makeini("[pytest]\ngn_impl = impls:gn\n")
    result = run(gntester, "-q")
    result.assert_outcomes(passed=1)


def test_impl_without_paths_under_xdist(gntester) -> None:
    result = run(gntester, "-p", "xdist", "-n", "2", "--gn-impl", "impls:gn")
    assert result.ret == pytest.ExitCode.OK
    assert "Different tests were collected" not in result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["overflow cases: 50 collected: 0 passed, 0 failed, 50 skipped"])


IMPL_UNDER_TEST = """
import pytest_gn

def pytest_configure(config):
    found = pytest_gn.impl_under_test(config)
    print("configure:", None if found is None else (found[0], found[1].__name__))

def pytest_collection_modifyitems(config, items):
    found = pytest_gn.impl_under_test(config)
    print("collection:", None if found is None else (found[0], found[1].__name__))
"""


@pytest.mark.parametrize(
    ("args", "expect"),
    [((), "None"), (("--gn-impl", "gn_module:group_norm"), "None"),
     (("--gn-impl", "impls:described"), "('impls:described', 'described')")],
)  # fmt: skip
def test_impl_under_test_for_other_conftests(gntester, args: tuple[str, ...], expect: str) -> None:
    gntester.makeconftest(IMPL_UNDER_TEST)
    result = run(gntester, *args, "test_other.py", "-s", "-q")
    result.stdout.fnmatch_lines([f"configure: {expect}", f"collection: {expect}"])


def test_importing_pytest_gn_imports_no_torch(gntester) -> None:
    gntester.makepyfile(check="import sys, pytest_gn\nassert 'torch' not in sys.modules\nprint('clean')\n")
    result = gntester.runpython(gntester.path / "check.py")
    result.stdout.fnmatch_lines(["clean"])


# ------------------------------------------------------------------ cases that run (fake CPU device)
def test_forward_and_backward_cases_check_their_own_direction(gntester) -> None:
    gntester.makeconftest(FAKE_DEVICE)
    result = run(gntester, "--gn-impl", "impls:bwd_raises", *SMALL, "-rfs")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*the backward raised RuntimeError: backward kernel failed*"])
    result.stdout.fnmatch_lines(["FAILED *bwd-onepass-x2p1-fp32-silu-c16g4*"])
    result = run(gntester, "--gn-impl", "impls:fwd_aborts", *SMALL, "-rf")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert "the child process died" in out and "during the forward" in out
    assert "Assertion `tiles <= grid` failed" in out  # the child's stderr comes with the failure


def test_not_implemented_is_a_skip_with_the_implementations_message(gntester) -> None:
    gntester.makeconftest(FAKE_DEVICE)
    args = ("--gn-shapes", "16:4", "-k", "x2p1 and not 2_31 and silu")
    result = run(gntester, "--gn-impl", "impls:fp16_only", *args, "-rs")
    result.assert_outcomes(passed=2, skipped=4)
    result.stdout.fnmatch_lines(["*not supported by impls:fp16_only: fp16 only, got torch.bfloat16*"])


def test_the_example_passes_and_its_planted_bug_is_reported(gntester) -> None:
    gntester.makeconftest(FAKE_DEVICE)
    select = ("-k", "x2p1 and silu and not 2_31")  # six cases over the default kinds, c30g10 among them
    good = run(gntester, "--gn-impl", "foreign_gn:tiled_group_norm", *select, "-rs")
    # c30g10 is refused by the example's description: skipped with its message, not failed
    good.stdout.fnmatch_lines(
        ["*not supported by foreign_gn:tiled_group_norm: foreign_gn needs a channel count*"]
    )
    assert good.ret == pytest.ExitCode.OK, good.stdout.str()
    outcomes = good.parseoutcomes()
    assert outcomes["passed"] >= 1 and "failed" not in outcomes
    bad = run(gntester, "--gn-impl", "foreign_gn:tiled_group_norm_overflow_bug", *select)
    assert bad.ret == pytest.ExitCode.TESTS_FAILED
    assert bad.parseoutcomes()["failed"] == outcomes["passed"]  # every case that ran overflows: all fail
    bad.stdout.fnmatch_lines(["*y: * elements off*", "failed: *x2p1*"])


def test_cases_are_sized_by_the_implementations_description(gntester) -> None:
    gntester.makeconftest(FAKE_DEVICE)
    gntester.makepyfile(
        test_sizes=textwrap.dedent("""
        import pytest

        @pytest.mark.overflow_grid(dtypes=("fp32",), acts=("silu",), ratios=("x2p1",), shapes=[(16, 4)],
                                   geometries=("even",))
        def test_size(gn_case):
            assert (gn_case.tile_rows, gn_case.residency, gn_case.tiles) == (8, 3, 7), gn_case
            n, c, h, w = gn_case.shape
            assert n * h * w == 7 * 8
        """)
    )
    result = run(gntester, "--gn-impl", "impls:described", "test_sizes.py")
    result.assert_outcomes(passed=2)
    result = run(gntester, "--gn-impl", "impls:gn", "test_sizes.py")  # no description: 512-row rule
    result.assert_outcomes(failed=2)
    result = run(gntester, "--gn-impl", "impls:badly_described", "test_sizes.py")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*badly_described.gn_describe must give tile_rows and resident_blocks*"])


def test_a_conftest_hook_describes_an_implementation_it_cannot_change(gntester) -> None:
    gntester.makeconftest(
        FAKE_DEVICE
        + textwrap.dedent("""
        def pytest_gn_describe_impl(impl, shape, num_groups, dtype, direction, device):
            if impl.__name__ == "gn":
                if shape[1] == 32:
                    raise NotImplementedError("C=32 is not supported")
                return {"tile_rows": 4, "resident_blocks": 5}
        """)
    )
    args = ("--gn-impl", "impls:gn", "--gn-shapes", "16:4,32:4", "-k", "x1p1 and fp32 and not 2_31")
    result = run(gntester, *args, "-rs", "-v")
    result.stdout.fnmatch_lines(["*not supported by impls:gn: C=32 is not supported*"])
    assert result.ret == pytest.ExitCode.OK


def test_over_2_31_cases_skip_when_the_device_is_too_small(gntester) -> None:
    gntester.makeconftest(FAKE_DEVICE)
    result = run(gntester, "--gn-impl", "impls:gn", "-k", "2_31", "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*fwd-onepass-2_31-bf16-silu needs ~* GiB, FakeCPU has 4.0 GiB*"])


def test_summary_rows_add_up_for_a_foreign_implementation(gntester, monkeypatch) -> None:
    gntester.makeconftest(FAKE_DEVICE)
    monkeypatch.setenv("GN_NVCC", str(gntester.path / "no-nvcc"))  # the static part is not the point
    result = run(
        gntester, "--gn-impl", "impls:bwd_raises", "--gn-arch-sweep", "--gn-profiles", "A100", *SMALL
    )
    result.stdout.fnmatch_lines([
        "overflow cases: 2 collected: 1 passed, 1 failed, 0 skipped",
        "  this GPU: 2 (2 natural): 1 passed, 1 failed, 0 skipped",
        "A100*sm_80*108*-*-*-*-*",
        "this GPU*sm_90*2*2*1*1*0*foreign impl",
        "cases column total: 2 = the overflow cases collected",
        "profile rows: gn_module's own kernels (static part only)*its cases are the 'this GPU' row",
    ])  # fmt: skip


def test_nan_probes_pass_torch_and_catch_a_lost_or_spreading_nan(gntester) -> None:
    gntester.makeconftest(FAKE_DEVICE)
    select = ("-k", "nan and fp32")  # fwd and bwd, without an activation and with SiLU
    good = run(gntester, "--gn-impl", "impls:gn", *select, "-v")
    good.assert_outcomes(passed=4)
    good.stdout.fnmatch_lines(["*test_gn_nan.py::test_gn_nan_stays_in_its_group?fwd-fp32-silu? PASSED*"])
    # The forward probes see y. Backward, nan_to_num zeroes the gradient at the NaN group: its dbias misses
    # those terms without an activation (with SiLU, silu'(NaN) keeps them NaN, as torch's).
    # nan_spreads' backward is torch's.
    lost = run(gntester, "--gn-impl", "impls:nan_to_zero", *select, "-rf")
    lost.assert_outcomes(passed=1, failed=3)
    head = "*nan-fwd-fp32-noact: shape [[]2, 48, 6, 7[]], 16 groups, x[[]0, 3, 2, 2[]] = NaN*"
    lost.stdout.fnmatch_lines([head, "*y: * elements off*: 0.0 vs reference nan*"])
    spread = run(gntester, "--gn-impl", "impls:nan_spreads", *select, "-rf")
    spread.assert_outcomes(passed=2, failed=2)
    spread.stdout.fnmatch_lines(["*y: * elements off*: nan vs reference *"])


def test_nan_probe_cases() -> None:
    from pytest_gn import cases
    from pytest_gn.runner import case_from_json, case_to_json

    probe = cases.nan_probe("bwd", "bf16", "silu")
    assert probe.id == "nan-bwd-bf16-silu" and probe.nan_at == cases.NAN_AT and probe.dtype == "bfloat16"
    c = probe.shape[1]
    assert c // probe.num_groups == 3 and probe.nan_at[1] // 3 == 1  # group 1 of 3-channel groups
    assert case_from_json(case_to_json(probe)) == probe  # what a foreign run's child process receives
    with pytest.raises(ValueError, match="no NaN probe"):
        cases.nan_probe("fwd", "fp8", None)
