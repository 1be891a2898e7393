#!/usr/bin/env bash
# The experiment -DGN_EXP_BWD_TASK_FLAGS=1 in one GPU call (about 4 minutes): the two-launch backward's apply
# waits for each task's flag instead of for the whole stats launch (csrc await_task_stats). Builds both at
# once, times the two-launch backward rows in alternating rounds, traces both builds, then runs the two-launch
# backward's tests under the experiment, and the same tests with the planting bwd-task-flag-coefs (must go red).
# Logs under OUT, the lines to read in OUT/summary.txt.
#   bash scripts/bwd_task_flags_check.sh OUT
# Environment: FLAGS_ROUNDS (default 4).
set -uo pipefail
# shellcheck source=scripts/gpu_call.sh
source "$(dirname "$0")/gpu_call.sh"
gpu_call_setup bwd_task_flags_check.sh "${1:-}"
E="-DGN_EXP_BWD_TASK_FLAGS=1"
shapes="2x1280x16x16 2x1280x16x16:silu 2x640x32x32:silu 2x320x64x64:silu 4x512x16x16:silu 1x256x512x512:silu"
tests="tests/gpu/test_task_backward.py tests/gpu/test_dependent_launch.py tests/gpu/test_strip_blocks.py"
status=0

step "builds: default, flags"
build_native default
GN_NVCC_FLAGS="$E" build_native flags
wait
builds_done default flags

for round in $(seq "${FLAGS_ROUNDS:-4}"); do
  order="default flags"
  [ $((round % 2)) -eq 0 ] && order="flags default"  # (neither build always runs first)
  for v in $order; do
    step "backward, $v, round $round"
    flags=""
    [ "$v" = flags ] && flags="$E"
    # shellcheck disable=SC2086  # (the shapes are separate arguments)
    GN_NVCC_FLAGS="$flags" timeout 120 python3 scripts/time_shapes.py $shapes --directions bwd \
      --json "$out/bwd_${v}_$round.json" >"$out/bwd_${v}_$round.log" 2>&1 || status=1
    rows "$out/bwd_${v}_$round.log"
  done
done

step "traces of the two launches, default and flags"
export GN_PROFILE_SHAPES=2x1280x16x16:silu,2x640x32x32:silu
for v in default flags; do
  flags=""
  [ "$v" = flags ] && flags="$E"
  GN_NVCC_FLAGS="$flags" timeout 90 python3 scripts/profile_tasks.py --trace-bwd >"$out/trace_$v.log" 2>&1 || status=1
done
unset GN_PROFILE_SHAPES

step "the two-launch backward's tests under the experiment"
# shellcheck disable=SC2086  # (the test paths are separate arguments)
GN_NVCC_FLAGS="$E" timeout 200 python3 -m pytest -q -p no:cacheprovider -p xdist -n 8 $tests \
  >"$out/tests_flags.log" 2>&1 || status=1
tail -n 2 "$out/tests_flags.log" >>"$out/summary.txt"

step "planting bwd-task-flag-coefs under the experiment (must go red)"
GN_NVCC_FLAGS="$E" GN_PLANTING=bwd-task-flag-coefs GN_PLANTED_TESTS="$tests" GN_PLANTED_SELECT="" \
  timeout 200 bash scripts/planted_bug.sh -p xdist -n 8 >"$out/planted.log" 2>&1 || status=1
tail -n 3 "$out/planted.log" >>"$out/summary.txt"
gpu_call_done $status
