#!/usr/bin/env bash
# The task architecture on one GPU in one call (an H200: about 6-8 minutes for steps 1-5, 4 more for 6-8, measured
# before steps 4 and 7 got the backward task cases), logs under OUTDIR:
#   1. warm the caches (native + PTX variants, ptxas reports of the sweep's profiles: scripts/prebuild.py);
#   2. the forward check (correctness, bitwise across caps and schedules, timings against the tile kernels);
#   3. the task backward's GPU tests (GN_ARCH=tasks+bwd, tests/gpu/test_task_backward.py; its opt-in one-pass
#      kernel, GN_ARCH=tasks+bwd1, tests/gpu/test_task_backward_onepass.py, then with the planted
#      task-bwd1-reread-skip: must go red);
#   4. the plugin's task cases (`--gn-arch tasks`: forward and backward), then with the planted task-overflow-drop
#      and task-bwd-overflow-drop bugs (must go red);
#   5. forward and backward benchmarks of the task kernels with eager and torch.compile in the same run;
#   6. the whole GPU suite with GN_ARCH=tasks, then with GN_ARCH=tasks+bwd, then with GN_ARCH=tasks+bwd1;
#   7. the arch sweep's task cases on every profile, then with the planted bugs (must go red);
#   8. compute-sanitizer over the task kernels (then with GN_ARCH=tasks+bwd1: "8b" leaves that out);
#   9. the task kernels' time at team sizes 1, 2, 4, ... (to calibrate schedule.choose_teams);
#  10. host time per call (no-grad and training step, ours and torch's);
#  11. the task backward's phases per block and its two launches' device times (profile_tasks.py --trace-bwd);
#  12. the wide launches under autocast: their GPU tests, the plugin's wide cases (--gn-arch wide) on this GPU,
#      then with the planted task-overflow-drop / task-bwd-overflow-drop (the wide kernels share those sites:
#      must go red), then the sweep's wide cases (every profile; the compute_80 PTX build).
#   bash scripts/tasks_gpu.sh OUTDIR
# Set TASKS_GPU_SKIP="3 5" (step numbers) to leave steps out; "4f" / "7f" leave out only the planted forward
# bug's runs of steps 4 / 7 (the forward's planted runs passed in session 5); "6a" leaves out step 6's
# GN_ARCH=tasks run. Exit 1 when a step that must pass fails,
# or the planted bug is not caught.
set -uo pipefail
out=${1:?usage: tasks_gpu.sh OUTDIR}
mkdir -p "$out" && out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1
status=0
skip() { [[ " ${TASKS_GPU_SKIP:-} " == *" $1 "* ]]; }
step() { echo "== $*" | tee -a "$out/summary.txt"; }
tail_to_summary() { tail -n "$2" "$1" | tee -a "$out/summary.txt"; }
# planted LOG EXPECTED: a run with a planted bug must fail; say what the model expects beside what came
planted() {
  if ! grep -qE '[0-9]+ failed' "$1"; then
    echo "UNEXPECTED: the planted bug passed ($1)" | tee -a "$out/summary.txt"
    status=1
  fi
  echo "   expected (schedule model, H200): $2" | tee -a "$out/summary.txt"
}

step "1 caches"
python3 scripts/prebuild.py 2>&1 | tail -1 | tee -a "$out/summary.txt"

if ! skip 2; then
  step "2 forward check (GN_ARCH=tasks)"
  GN_ARCH=tasks python3 scripts/task_forward_check.py --quick --json "$out/fwd_check.json" >"$out/fwd_check.log" 2>&1 \
    || status=1
  grep -v '^{' "$out/fwd_check.log" | grep -v '^ok' | tail -n 14 | tee -a "$out/summary.txt"
fi

if ! skip 3; then
  step "3 task backward tests (GN_ARCH=tasks+bwd)"
  python3 -m pytest tests/gpu/test_task_backward.py tests/gpu/test_task_backward_onepass.py -q -p no:randomly \
    -p xdist -n 4 >"$out/bwd_tests.log" 2>&1 || status=1
  tail_to_summary "$out/bwd_tests.log" 3
  planted_dir=$(python3 scripts/plant_bug.py task-bwd1-reread-skip)
  GN_CSRC_DIR="$planted_dir" python3 -m pytest tests/gpu/test_task_backward_onepass.py -q -p no:randomly -p xdist \
    -n 4 -k caps >"$out/bwd1_planted.log" 2>&1
  tail_to_summary "$out/bwd1_planted.log" 3
  planted "$out/bwd1_planted.log" "the capped runs whose members re-read chunk pairs (caps 1 and 2 at least) fail"
fi

if ! skip 4; then
  step "4 plugin task cases (49 forward + 49 backward + 49 one-launch backward on this GPU, and self-check), then with the planted bugs"
  python3 -m pytest -p xdist -n 8 -q --gn-arch tasks --pyargs pytest_gn.suite >"$out/plugin_tasks.log" 2>&1 || status=1
  tail_to_summary "$out/plugin_tasks.log" 4
  if ! skip 4f; then
    planted_dir=$(python3 scripts/plant_bug.py task-overflow-drop)
    GN_CSRC_DIR="$planted_dir" python3 -m pytest -p xdist -n 8 -q --gn-arch tasks --pyargs pytest_gn.suite \
      -k "fwd-tasks" >"$out/plugin_tasks_planted.log" 2>&1
    tail_to_summary "$out/plugin_tasks_planted.log" 3
    planted "$out/plugin_tasks_planted.log" "45 failed, 4 passed (session 5: the x1 cases that re-read nothing)"
  fi
  # a member with several tiles of a task loses its last tile's partial: every backward case whose runs
  # (its cap, then caps 1 and 2 below it) give a member two tiles, i.e. all but the x1 cases of one-tile tasks
  planted_dir=$(python3 scripts/plant_bug.py task-bwd-overflow-drop)
  GN_CSRC_DIR="$planted_dir" python3 -m pytest -p xdist -n 8 -q --gn-arch tasks --pyargs pytest_gn.suite -k "bwd-tasks" \
    >"$out/plugin_tasks_bwd_planted.log" 2>&1
  tail_to_summary "$out/plugin_tasks_bwd_planted.log" 3
  planted "$out/plugin_tasks_bwd_planted.log" "45 failed, 4 passed (bwd-tasks-cap1-x1-fp16-silu-c64g1, \
bwd-tasks-cap3-x1-bf16-relu-c64g1-batch, bwd-tasks-cap1-x1-bf16-noact-c32g32, bwd-tasks-cap3-x1-fp32-noact-c32g32-batch)"
  # the apply launch awaits one strip too many per dweight/dbias strip column (session 60: the totals go by
  # column), so nobody writes dweight/dbias: red wherever the cases take parameter gradients
  planted_dir=$(python3 scripts/plant_bug.py task-bwd-strips-count)
  GN_CSRC_DIR="$planted_dir" python3 -m pytest -p xdist -n 8 -q --gn-arch tasks --pyargs pytest_gn.suite \
    -k "bwd-tasks and not bwd-tasks1" >"$out/plugin_tasks_strips_planted.log" 2>&1
  tail_to_summary "$out/plugin_tasks_strips_planted.log" 3
  planted "$out/plugin_tasks_strips_planted.log" "the two-launch backward cases with parameter gradients"
  # the one-launch backward never reads again what a member could not keep: red wherever a one-launch
  # run reads chunk pairs again (tests/test_plugin_tasks_bwd1.py names the two that stay green)
  planted_dir=$(python3 scripts/plant_bug.py task-bwd1-reread-skip)
  GN_CSRC_DIR="$planted_dir" python3 -m pytest -p xdist -n 8 -q -rA --gn-arch tasks --pyargs pytest_gn.suite \
    -k "bwd-tasks1" >"$out/plugin_tasks_bwd1_planted.log" 2>&1
  tail_to_summary "$out/plugin_tasks_bwd1_planted.log" 3
  planted "$out/plugin_tasks_bwd1_planted.log" "47 failed, 2 passed (bwd-tasks1-cap1-x1-fp16-silu-c100g20, \
bwd-tasks1-cap1-x1-bf16-noact-c30g10)"
fi

if ! skip 5; then
  step "5 benchmarks (GN_ARCH=tasks+bwd), fp16, with eager and torch.compile"
  GN_ARCH=tasks+bwd python3 -m gn_module.bench --dtypes fp16 \
    --impls ours-auto,ours-1pass,ours-2pass,eager,compile-cl,compile-nchw --reps 25 --max-seconds 0.1 \
    --json "$out/tasks_bench.json" --markdown "$out/tasks_bench.md" >"$out/tasks_bench.log" 2>&1 || status=1
  tail_to_summary "$out/tasks_bench.log" 4
fi
if ! skip 6; then
  step "6 the GPU suite with GN_ARCH=tasks, then tasks+bwd, then tasks+bwd1 (the one-pass backward)"
  if ! skip 6a; then  # the forward's run (the task backward is not in it)
    GN_ARCH=tasks python3 -m pytest tests/gpu -q -p no:randomly -p xdist -n 8 >"$out/gpu_suite_tasks.log" 2>&1 \
      || status=1
    tail_to_summary "$out/gpu_suite_tasks.log" 2
  fi
  GN_ARCH=tasks+bwd python3 -m pytest tests/gpu -q -p no:randomly -p xdist -n 8 >"$out/gpu_suite_tasks_bwd.log" 2>&1 \
    || status=1
  tail_to_summary "$out/gpu_suite_tasks_bwd.log" 2
  GN_ARCH=tasks+bwd1 python3 -m pytest tests/gpu -q -p no:randomly -p xdist -n 8 >"$out/gpu_suite_tasks_bwd1.log" \
    2>&1 || status=1
  tail_to_summary "$out/gpu_suite_tasks_bwd1.log" 2
fi

if ! skip 7; then
  step "7 the arch sweep's task cases (every profile: 337 forward, 337 backward), then with the planted bugs"
  python3 -m pytest -p xdist -n 8 -q --gn-arch-sweep --gn-arch tasks >"$out/sweep_tasks.log" 2>&1 || status=1
  tail_to_summary "$out/sweep_tasks.log" 2
  if ! skip 7f; then
    planted_dir=$(python3 scripts/plant_bug.py task-overflow-drop)
    GN_CSRC_DIR="$planted_dir" python3 -m pytest -p xdist -n 8 -q --gn-arch-sweep --gn-arch tasks -k "fwd-tasks" \
      >"$out/sweep_tasks_planted.log" 2>&1
    tail_to_summary "$out/sweep_tasks_planted.log" 1
    planted "$out/sweep_tasks_planted.log" "333 failed, 4 passed (session 5)"
  fi
  planted_dir=$(python3 scripts/plant_bug.py task-bwd-overflow-drop)
  GN_CSRC_DIR="$planted_dir" python3 -m pytest -p xdist -n 8 -q --gn-arch-sweep --gn-arch tasks -k "bwd-tasks" \
    >"$out/sweep_tasks_bwd_planted.log" 2>&1
  tail_to_summary "$out/sweep_tasks_bwd_planted.log" 1
  planted "$out/sweep_tasks_bwd_planted.log" "327 failed, 10 passed (the x1 cases of one-tile tasks: this GPU's 4 of \
step 4 and 6 profiles' x1 batch cases; tests/test_plugin_tasks_bwd.py)"
fi

if ! skip 8; then
  step "8 compute-sanitizer (memcheck, racecheck, synccheck) over the task kernels (GN_ARCH=tasks+bwd)"
  GN_ARCH=tasks+bwd SANITIZE_TOOLS="memcheck racecheck synccheck" bash scripts/sanitize.sh "$out/sanitize" \
    2>&1 | tee -a "$out/summary.txt" || status=1
  if ! skip 8b; then  # the one-pass backward (opt-in)
    GN_ARCH=tasks+bwd1 SANITIZE_TOOLS="memcheck racecheck synccheck" bash scripts/sanitize.sh "$out/sanitize_bwd1" \
      2>&1 | tee -a "$out/summary.txt" || status=1
  fi
fi

if ! skip 9; then
  step "9 team sizes of the task kernels, forward and backward (scripts/task_team_sweep.py), fp16"
  python3 scripts/task_team_sweep.py --json "$out/team_sweep.json" >"$out/team_sweep.log" 2>&1 || status=1
  tail_to_summary "$out/team_sweep.log" 60
fi

if ! skip 10; then
  step "10 host time per call, no-grad and training step (scripts/host_overhead.py)"
  python3 scripts/host_overhead.py --json "$out/host.json" >"$out/host.log" 2>&1 || status=1
  tail_to_summary "$out/host.log" 30
fi
if ! skip 11; then
  step "11 the task backward's phases (scripts/profile_tasks.py --trace-bwd), fp16"
  python3 scripts/profile_tasks.py --trace-bwd >"$out/trace_bwd.log" 2>&1 || status=1
  tail_to_summary "$out/trace_bwd.log" 60
fi
if ! skip 12; then
  step "12 the wide launches (fp16/bf16 x under autocast, float32 y and dy): tests, plugin cases, planted, sweep"
  python3 -m pytest tests/gpu/test_autocast_wide.py -q -p no:randomly -p xdist -n 4 >"$out/wide_tests.log" 2>&1 \
    || status=1
  tail_to_summary "$out/wide_tests.log" 2
  python3 -m pytest -p xdist -n 8 -q --gn-arch wide --pyargs pytest_gn.suite >"$out/plugin_wide.log" 2>&1 || status=1
  tail_to_summary "$out/plugin_wide.log" 4
  planted_dir=$(python3 scripts/plant_bug.py task-overflow-drop)
  GN_CSRC_DIR="$planted_dir" python3 -m pytest -p xdist -n 8 -q --gn-arch wide --pyargs pytest_gn.suite \
    -k "fwd-tasksw" >"$out/plugin_wide_planted.log" 2>&1
  tail_to_summary "$out/plugin_wide_planted.log" 3
  planted "$out/plugin_wide_planted.log" "the forward wide cases that re-read chunks (all but the x1 ones)"
  planted_dir=$(python3 scripts/plant_bug.py task-bwd-overflow-drop)
  GN_CSRC_DIR="$planted_dir" python3 -m pytest -p xdist -n 8 -q --gn-arch wide --pyargs pytest_gn.suite \
    -k "bwd-tasksw" >"$out/plugin_wide_bwd_planted.log" 2>&1
  tail_to_summary "$out/plugin_wide_bwd_planted.log" 3
  planted "$out/plugin_wide_bwd_planted.log" "the backward wide cases whose members hold several tiles of a task"
  python3 -m pytest -p xdist -n 8 -q --gn-arch-sweep --gn-arch wide >"$out/sweep_wide.log" 2>&1 || status=1
  tail_to_summary "$out/sweep_wide.log" 2
fi
exit $status
