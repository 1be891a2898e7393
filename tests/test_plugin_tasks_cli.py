"""``--gn-arch``: the task architecture's cases seen from the command line, with pytester (CPU only:
every case skips with the reason, and nothing needs a GPU to be collected)."""

from __future__ import annotations

import pytest

# Inline pytester runs restore sys.modules afterwards, and re-importing torch in one process crashes;
# importing it here first keeps it (as in test_plugin_cli.py).
pytest.importorskip("torch")

MARKED = """
import pytest

@pytest.mark.overflow_grid(dtypes=("fp16",), acts=("silu",), ratios=("x1", "x2p1"), shapes=[(128, 16)],
                           geometries=("even",))
def test_case(gn_case):
    pass
"""

TILES = ["fwd-onepass-cap3-x1-fp16-silu", "fwd-onepass-cap3-x2p1-fp16-silu", "bwd-onepass-cap3-x1-fp16-silu",
         "bwd-onepass-cap3-x2p1-fp16-silu", "fwd-onepass-x1-fp16-silu", "fwd-onepass-x2p1-fp16-silu",
         "bwd-onepass-x1-fp16-silu", "bwd-onepass-x2p1-fp16-silu"]  # fmt: skip
TASKS = ["fwd-tasks-cap1-x1-fp16-silu", "fwd-tasks-cap2-x2p1-fp16-silu", "bwd-tasks-cap3-x1-fp16-silu",
         "bwd-tasks-cap1-x2p1-fp16-silu", "bwd-tasks1-cap2-x1-fp16-silu", "bwd-tasks1-cap3-x2p1-fp16-silu",
         "fwd-tasks-x1-fp16-silu", "fwd-tasks-x2p1-fp16-silu", "bwd-tasks-x1-fp16-silu",
         "bwd-tasks-x2p1-fp16-silu", "bwd-tasks1-x1-fp16-silu", "bwd-tasks1-x2p1-fp16-silu"]  # fmt: skip


def _ids(result: pytest.RunResult) -> list[str]:
    return [line.split("[", 1)[1].rsplit("]", 1)[0] for line in result.stdout.lines if "::test_case[" in line]


def test_help_documents_the_option_and_its_ini_key(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*--gn-arch=tiles|tasks|both*", "*gn_arch *"])
    text = " ".join(result.stdout.str().split())
    for words in ("GN_ARCH=tasks", "gn_module's default forward", "over the chunks it keeps in shared memory",
                  "backward cases under GN_ARCH=tasks+bwd", "a task's tiles over its team's members",
                  "caps 1, 2, 3", "Default: both"):  # fmt: skip
        assert words in text, words


@pytest.mark.parametrize(
    ("args", "ids"),
    [((), TILES + TASKS), (("--gn-arch", "tiles"), TILES), (("--gn-arch", "tasks"), TASKS),
     (("--gn-arch", "both"), TILES + TASKS), (("--gn-arch", " Both "), TILES + TASKS)],
)  # fmt: skip
def test_the_option_picks_the_architectures_cases(pytester: pytest.Pytester, args, ids) -> None:
    pytester.makepyfile(MARKED)
    result = pytester.runpytest("--co", "-q", *args)
    assert result.ret == 0, result.stdout.str()
    assert sorted(_ids(result)) == sorted(ids)  # (scope by scope: capped, then natural)


def test_the_ini_key_and_the_command_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(MARKED)
    pytester.makeini("[pytest]\ngn_arch = tasks\n")
    assert sorted(_ids(pytester.runpytest("--co", "-q"))) == sorted(TASKS)
    assert _ids(pytester.runpytest("--co", "-q", "--gn-arch", "tiles")) == TILES  # the command line wins


def test_task_cases_skip_with_the_reason_without_a_gpu(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(MARKED)
    result = pytester.runpytest("-rs", "-v", "--gn-arch", "tasks")
    result.stdout.fnmatch_lines([
        "gn: --gn-arch=tasks: task kernel cases, forward (GN_ARCH=tasks) and backward (GN_ARCH=tasks+bwd; "
        "its one-launch kernel: tasks+bwd1); no tile kernel cases",
        "*test_case?fwd-tasks-cap1-x1-fp16-silu? SKIPPED*",
        "*test_case?bwd-tasks-cap1-x2p1-fp16-silu? SKIPPED*",
        "*test_case?fwd-tasks-x2p1-fp16-silu? SKIPPED*",
        "*test_case?bwd-tasks-x2p1-fp16-silu? SKIPPED*",
        "*test_case?bwd-tasks1-x2p1-fp16-silu? SKIPPED*",
        "*gn summary*",
        "overflow cases: 12 collected: 0 passed, 0 failed, 12 skipped",
        "  this GPU: 12 (6 natural, 6 capped; 12 of them task kernel cases (4 forward, 4 backward, 4 "
        "one-launch backward)): 0 passed, 0 failed, 12 skipped",
        "skipped 12: no usable CUDA device*",
    ])  # fmt: skip
    result.assert_outcomes(skipped=12)


@pytest.mark.parametrize(
    ("args", "ini", "message"),
    [(("--gn-arch", "gpu"), "", "--gn-arch expects one of tiles, tasks, both, wide, all, got 'gpu'"),
     ((), "gn_arch = warp\n", "gn_arch (ini) expects one of tiles, tasks, both, wide, all, got 'warp'"),
     (("--gn-arch", "tasks", "--gn-impl", "impls:gn"), "",
      "--gn-arch tasks selects gn_module's task kernels, which do not apply to --gn-impl impls:gn*")],
)  # fmt: skip
def test_bad_values_are_usage_errors_naming_their_source(
    pytester: pytest.Pytester, args, ini, message
) -> None:
    pytester.makepyfile(impls="def gn(x, num_groups, weight, bias, eps, act):\n    return x\n")
    pytester.syspathinsert()
    if ini:
        pytester.makeini(f"[pytest]\n{ini}")
    result = pytester.runpytest("--co", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}"])


def test_the_sweep_has_task_cases_and_the_task_model_checks_only_when_asked(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_user=MARKED)
    plain = pytester.runpytest(
        "--co", "-q", "--gn-arch-sweep", "--gn-profiles", "A100,RTX3090", "--gn-arch", "tiles"
    )
    assert plain.ret == 0
    assert "-tasks-" not in plain.stdout.str() and "test_gn_tasks.py" not in plain.stdout.str()
    result = pytester.runpytest("--co", "-q", "--gn-arch-sweep", "--gn-profiles", "A100,RTX3090",
                                "--gn-arch", "tasks")  # fmt: skip
    out = result.stdout.str()
    assert result.ret == 0, out
    assert "-onepass-" not in out  # the tile cases are left to --gn-arch tiles (or both)
    for line in ("test_gn_overflow.py::test_gn_overflow[fwd-tasks-cap1-x1-fp16-silu]",
                 "test_gn_overflow.py::test_gn_overflow[fwd-tasks-2_31-bf16-silu-c1024g32]",
                 "test_gn_overflow.py::test_gn_overflow[A100-fwd-tasks-x2p1-bf16-relu-partial]",
                 "test_gn_overflow.py::test_gn_overflow[RTX3090-fwd-tasks-x4p3-fp32-noact-c64g1-batch]",
                 "test_user.py::test_case[RTX3090-fwd-tasks-x2p1-fp16-silu]",
                 "test_gn_overflow.py::test_gn_overflow[bwd-tasks-cap1-x1-fp16-silu-c64g1]",
                 "test_gn_overflow.py::test_gn_overflow[bwd-tasks-2_31-bf16-silu-c1024g32]",
                 "test_gn_overflow.py::test_gn_overflow[A100-bwd-tasks-x2p1-bf16-relu-c64g1-partial]",
                 "test_gn_overflow.py::test_gn_overflow[RTX3090-bwd-tasks-x4p3-bf16-relu-batch]",
                 "test_user.py::test_case[RTX3090-bwd-tasks-x2p1-fp16-silu]",
                 "test_user.py::test_case[RTX3090-bwd-tasks1-x2p1-fp16-silu]",
                 "test_gn_overflow.py::test_gn_overflow[bwd-tasks1-2_31-bf16-silu-c1024g32]",
                 "test_gn_tasks.py::test_gn_task_model_matches_occupancy_api[bwd_task_onepass[fp16,vec8]]",
                 "test_gn_tasks.py::test_gn_task_residency_model[RTX3090]",
                 "test_gn_tasks.py::test_gn_task_model_matches_occupancy_api[fwd_task_onepass[fp32,vec1]]",
                 "test_gn_tasks.py::test_gn_task_model_matches_occupancy_api[bwd_task_stats[fp16,vec8]]",
                 "test_gn_static.py::test_gn_compile[A100]"):  # fmt: skip
        assert line in out, line
    overflow = [line for line in out.splitlines() if "test_gn_overflow[" in line]
    # forward, backward, one-launch backward: capped, natural, 2 profiles, 2**31
    assert len(overflow) == 3 * (24 * 4 + 1)
    both = pytester.runpytest("--co", "-q", "--gn-arch-sweep", "--gn-profiles", "A100", "--gn-arch", "both")
    cases = [line for line in both.stdout.str().splitlines() if "test_gn_overflow[" in line]
    assert len(cases) == 48 * 3 + 2 + 3 * (24 * 3 + 1)
    default = pytester.runpytest("--co", "-q", "--gn-arch-sweep", "--gn-profiles", "A100")
    assert [line for line in default.stdout.str().splitlines() if "test_gn_overflow[" in line] == cases


def test_the_planted_bugs_selection_picks_the_task_cases_that_overflow(pytester: pytest.Pytester) -> None:
    # scripts/plant_bug.py --select task-overflow-drop: the cases whose members have more chunks than
    # slots (every ratio but x1), where the planted bug fires
    pytester.makepyfile(MARKED)
    result = pytester.runpytest("--co", "-q", "--gn-arch", "both", "-k", "tasks and fwd and not x1-")
    assert _ids(result) == ["fwd-tasks-cap2-x2p1-fp16-silu", "fwd-tasks-x2p1-fp16-silu"]
    # --select task-bwd-overflow-drop: every backward task case (its runs at caps 1 and 2 give members
    # several tiles wherever a task has more than one)
    result = pytester.runpytest("--co", "-q", "--gn-arch", "both", "-k", "bwd-tasks-")
    assert _ids(result) == ["bwd-tasks-cap3-x1-fp16-silu", "bwd-tasks-cap1-x2p1-fp16-silu",
                            "bwd-tasks-x1-fp16-silu", "bwd-tasks-x2p1-fp16-silu"]  # fmt: skip
    # task-bwd1-reread-skip: the one-launch backward's cases (tasks_gpu.sh step 4)
    result = pytester.runpytest("--co", "-q", "--gn-arch", "both", "-k", "bwd-tasks1")
    assert _ids(result) == ["bwd-tasks1-cap2-x1-fp16-silu", "bwd-tasks1-cap3-x2p1-fp16-silu",
                            "bwd-tasks1-x1-fp16-silu", "bwd-tasks1-x2p1-fp16-silu"]  # fmt: skip


def test_xdist_workers_collect_the_same_task_cases(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(MARKED)
    result = pytester.runpytest_subprocess(
        "-p", "xdist", "-n", "2", "-p", "no:cacheprovider", "--gn-arch", "both"
    )
    result.assert_outcomes(skipped=20)
    assert "Different tests were collected" not in result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["overflow cases: 20 collected: 0 passed, 0 failed, 20 skipped"])


def test_the_sweep_summary_without_nvcc_or_gpu(pytester: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.setenv("GN_NVCC", str(pytester.path / "no-nvcc"))
    result = pytester.runpytest_subprocess(
        "--gn-arch-sweep", "--gn-profiles", "A100", "--gn-arch", "both", "-p", "no:cacheprovider"
    )
    result.stdout.fnmatch_lines([
        "*gn summary*",
        "overflow cases: 365 collected: 0 passed, 0 failed, 365 skipped",
        "  this GPU: 245 (120 natural, 120 capped, 5 over 2**31 elements; 147 of them task kernel cases (49 "
        "forward, 49 backward, 49 one-launch backward)): *",
        "  profiles: 120 (1 profiles, 120 each): *",
        "arch sweep (*; tasks f,b = the task kernels, forward (one-pass) and backward (stats): chunks a *",
        "profile*residency f,b*tasks slots,res f,b*cases*",
        "A100*sm_80*108*120*0*0*120*no (no GPU)",
        "cases column total: 365 = the overflow cases collected",
        "GPU part skipped (*): none of the 365 overflow cases ran (120 profile cases, 245 cases of this "
        "GPU), and the 34 self-check tests were skipped",
    ])  # fmt: skip
    assert result.ret == 0, result.stdout.str()
