"""The plugin seen from the command line, with pytester (CPU only)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# The report header probes the GPU through torch. pytester's inline runs restore sys.modules
# afterwards, and re-importing torch in one process crashes; importing it here first keeps it.
pytest.importorskip("torch")

OVERFLOW_TEST = """
import pytest

@pytest.mark.overflow_grid(dtypes=("fp16",), acts=("silu",), ratios=("x1p1", "x2p1"), shapes=[(128, 16)],
                           geometries=("even",))
def test_case(gn_case):
    assert gn_case.tiles > gn_case.residency

@pytest.mark.gn_cuda
def test_needs_gpu():
    pass
"""


def test_importing_plugin_does_not_import_torch() -> None:
    code = "import sys, pytest_gn.plugin; assert 'torch' not in sys.modules, 'torch imported'; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_help_lists_option_group(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*GroupNorm validation (pytest-gn)*", "*--gn-arch-sweep*",
                                 "*--gn-profiles=NAME,...*", "*--gn-max-resident=K*",
                                 "*--gn-impl=MODULE:CALLABLE*", "*--gn-shapes=C:G,...*",
                                 "*--gn-seed=N*"])  # fmt: skip
    for ini in (
        "gn_arch_sweep",
        "gn_profiles",
        "gn_max_resident",
        "gn_impl",
        "gn_shapes",
        "gn_seed",
        "gn_profiles_file",
    ):
        result.stdout.fnmatch_lines([f"*{ini} *"])


def test_markers_documented_and_strict(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.overflow_grid(*", "@pytest.mark.gn_cuda*"])
    pytester.makepyfile(OVERFLOW_TEST)
    result = pytester.runpytest("--strict-markers", "--co", "-q")
    assert result.ret == 0, result.stdout.str()


def test_ids_and_skip_reasons_without_gpu(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(OVERFLOW_TEST)
    result = pytester.runpytest("-rs", "-v")
    result.stdout.fnmatch_lines([
        "*test_case?fwd-onepass-cap3-x1p1-fp16-silu? SKIPPED*",
        "*test_case?fwd-onepass-x1p1-fp16-silu? SKIPPED*",
        "*test_case?bwd-onepass-x2p1-fp16-silu? SKIPPED*",
        "*test_case?fwd-tasks-x2p1-fp16-silu? SKIPPED*",  # the default --gn-arch both: task cases too
        "*test_case?bwd-tasks-x2p1-fp16-silu? SKIPPED*",
        "*test_case?bwd-tasks1-x2p1-fp16-silu? SKIPPED*",
        "*gn summary*",
        "overflow cases: 20 collected: 0 passed, 0 failed, 20 skipped",
        "*12 of them task kernel cases (4 forward, 4 backward, 4 one-launch backward)*",
        "skipped 20: no usable CUDA device*",
        "SKIPPED [[]21[]] *no usable CUDA device: *CPU-only build*",
    ])  # fmt: skip
    result.assert_outcomes(skipped=21)


def test_header_and_ini_keys(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(mynorm="def gn(x, num_groups, weight, bias, eps, act):\n    return x\n")
    pytester.syspathinsert()
    pytester.makeini("[pytest]\ngn_seed = 7\ngn_max_resident = 5\ngn_impl = mynorm:gn\ngn_shapes = 64:8\n")
    result = pytester.runpytest("--co")
    result.stdout.fnmatch_lines([
        "gn: impl mynorm:gn, seed 7, one-pass residency capped at 5",
        "gn: overflow shapes (C:G) 64:8",
        "gn: no CUDA device (*); GPU cases will be skipped",
    ])  # fmt: skip
    result = pytester.runpytest("--co", "--gn-seed", "3")  # the command line beats the ini key
    result.stdout.fnmatch_lines(["gn: impl mynorm:gn, seed 3, *"])


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--gn-max-resident", "0"], "--gn-max-resident must be >= 1, got 0"),
     (["--gn-seed", "abc"], "--gn-seed expects an integer, got 'abc'"),
     (["--gn-impl", "no_colon"], "--gn-impl expects module:callable*"),
     (["--gn-shapes", "128x16"], "--gn-shapes expects C:G pairs like 128:16,100:20, got '128x16'"),
     (["--gn-shapes", "30:7"], "--gn-shapes shape (channels=30, groups=7): channels must be divisible*"),
     (["--gn-profiles", "V100"], "--gn-profiles: unknown GPU profile 'V100'; known profiles: A100, *")],
)  # fmt: skip
def test_bad_option_values(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}"])


@pytest.mark.parametrize(
    ("ini", "message"),
    [("gn_max_resident = 0", "gn_max_resident (ini) must be >= 1, got 0"),
     ("gn_shapes = 1:2:3", "gn_shapes (ini) expects C:G pairs*"),
     ("gn_impl = nope", "gn_impl (ini) expects module:callable*")],
)  # fmt: skip
def test_bad_ini_values_name_the_ini_key(pytester: pytest.Pytester, ini: str, message: str) -> None:
    pytester.makeini(f"[pytest]\n{ini}\n")
    result = pytester.runpytest("--co")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}"])


@pytest.mark.parametrize(
    ("marker", "message"),
    [("overflow_grid(colours=1)", "*overflow_grid got unknown argument(s) ?'colours'?*"),
     ("overflow_grid(dtypes=('fp8',))", "*overflow_grid dtypes=?'fp8'?*"),
     ("overflow_grid(ratios=('y2',))", "*overflow ratio must look like*"),
     ("overflow_grid(shapes=[(30, 7)])", "*channels must be divisible by groups*")],
)  # fmt: skip
def test_bad_marker_arguments(pytester: pytest.Pytester, marker: str, message: str) -> None:
    pytester.makepyfile(f"import pytest\n@pytest.mark.{marker}\ndef test_x(gn_case):\n    pass\n")
    result = pytester.runpytest("--co")
    assert result.ret != 0
    result.stdout.fnmatch_lines([message])


def test_marker_needs_gn_case(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("import pytest\n@pytest.mark.overflow_grid\ndef test_x():\n    pass\n")
    result = pytester.runpytest("--co")
    result.stdout.fnmatch_lines(["*a test marked overflow_grid must take the gn_case fixture*"])


def test_user_profiles_from_file_and_hook(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", gpus='[profiles.FileGPU]\ncc = "8.6"\nsm_count = 10\n')
    pytester.makeini("[pytest]\ngn_profiles_file = gpus.toml\n")
    pytester.makeconftest(
        textwrap.dedent("""
        def pytest_gn_add_profiles(config):
            return [{"name": "HookGPU", "cc": "9.0", "sm_count": 4}]
    """)
    )
    args = ("--co", "--gn-arch-sweep", "--gn-profiles", "FileGPU,hookgpu,A100")
    result = pytester.runpytest(*args)
    result.stdout.fnmatch_lines(
        ["gn: arch sweep over FileGPU (sm_86, 10 SMs), HookGPU (sm_90, 4 SMs), A100 (*)"]
    )
    result = pytester.runpytest(*args, "-q")
    result.stdout.fnmatch_lines(["*test_gn_overflow?HookGPU-bwd-onepass-x4p3-fp32-noact?*"])


def test_bad_profiles_file_is_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ngn_profiles_file = missing.toml\n")
    result = pytester.runpytest("--co")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*gn profiles: gn profiles file not found*missing.toml*"])


def test_sweep_selects_suite_and_marked_user_tests(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=OVERFLOW_TEST + "\ndef test_unrelated():\n    pass\n")
    result = pytester.runpytest("--co", "-q", "--gn-arch-sweep", "--gn-profiles", "A100")
    out = result.stdout.str()
    assert "test_unrelated" not in out and "test_needs_gpu" not in out
    assert "test_user.py::test_case[A100-fwd-onepass-x1p1-fp16-silu]" in out
    assert "test_gn_static.py::test_gn_compile[A100]" in out
    assert "test_gn_selfcheck.py::test_gn_model_matches_occupancy_api[fwd_onepass[fp16,vec8]]" in out
    result.stdout.fnmatch_lines(["*deselected*"])


def test_sweep_without_nvcc_says_what_it_skipped(pytester: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.setenv("GN_NVCC", str(pytester.path / "no-nvcc"))
    result = pytester.runpytest_subprocess(
        "--gn-arch-sweep", "--gn-profiles", "A100,Thor", "--gn-arch", "tiles", "-p", "no:cacheprovider"
    )
    result.stdout.fnmatch_lines([
        "*gn summary*",
        "overflow cases: 194 collected: 0 passed, 0 failed, 194 skipped",
        "  this GPU: 98 (48 natural, 48 capped, 2 over 2**31 elements): 0 passed, 0 failed, 98 skipped",
        "  profiles: 96 (2 profiles, 48 each): 0 passed, 0 failed, 96 skipped",
        "arch sweep (*",
        "profile*arch*SMs*regs/smem f,b*residency f,b*cases*arch code exercised",
        "A100*sm_80*108*48*0*0*48*no (no GPU)",
        "Thor*sm_110*20*48*0*0*48*no (no GPU)",
        "this GPU*98*0*0*98*no (no GPU)",
        "cases column total: 194 = the overflow cases collected",
        "static part skipped: nvcc not found, so compiling for each profile's arch*",
        "GPU part skipped (*): none of the 194 overflow cases ran (96 profile cases, 98 cases of this GPU), "
        "and the 12 self-check tests were skipped",
    ])  # fmt: skip
    assert "static part done" not in result.stdout.str()  # the old summary claimed it after skipping it
    assert result.ret == 0, result.stdout.str()  # everything skips: nothing failed


def test_xdist_ids_are_stable(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(OVERFLOW_TEST)
    result = pytester.runpytest_subprocess("-p", "xdist", "-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=21)
    assert "Different tests were collected" not in result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["overflow cases: 20 collected: 0 passed, 0 failed, 20 skipped"])


PROFILES_UNUSED = (
    "*PytestConfigWarning: --gn-profiles A100 has no effect: it picks the GPU profiles of --gn-arch-sweep*"
)


def test_profiles_without_sweep_warn(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest("--gn-profiles", "A100")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines([PROFILES_UNUSED + "; add --gn-arch-sweep"])


@pytest.mark.parametrize(
    ("ini", "args"),
    [("", ("--gn-arch-sweep", "--gn-profiles", "A100")),  # the sweep uses it
     ("", ("--gn-impl", "gn_module:group_norm", "--gn-profiles", "A100")),  # the bundled static tests do
     ("[pytest]\ngn_profiles = A100\n", ())],  # an ini key, set for occasional sweeps: no noise
)  # fmt: skip
def test_profiles_used_or_from_ini_do_not_warn(
    pytester: pytest.Pytester, ini: str, args: tuple[str, ...]
) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    if ini:
        pytester.makeini(ini)
    result = pytester.runpytest("--co", "-q", *args)
    assert result.ret == 0, result.stdout.str()
    assert "has no effect" not in result.stdout.str()
    if "--gn-impl" in args:
        assert "test_gn_static.py::test_gn_compile[A100]" in result.stdout.str()
