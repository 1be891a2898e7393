#!/usr/bin/env bash
# The experiment -DGN_EXP_BWD1_COLUMN_TOTALS=1 in one GPU call (about 3 minutes): the one-launch backward's
# dweight/dbias totals by strip column (csrc bwd_param_totals), against the default build's last block.
# Builds both at once, times the one-launch backward rows (and 2x1280x16x16, two launches: the control)
# in alternating rounds, traces the dx phase of both builds, then runs tests/gpu/test_task_backward_onepass.py
# under the experiment and the same tests with the planting bwd1-column-count under it (must go red).
# Logs under OUT, the lines to read in OUT/summary.txt.
#   bash scripts/bwd1_column_totals_check.sh OUT
# Environment: COLUMNS_ROUNDS (default 4).
set -uo pipefail
# shellcheck source=scripts/gpu_call.sh
source "$(dirname "$0")/gpu_call.sh"
gpu_call_setup bwd1_column_totals_check.sh "${1:-}"
E="-DGN_EXP_BWD1_COLUMN_TOTALS=1"
shapes="1x512x128x128:silu 4x512x64x64:silu 8x256x56x56:silu 32x256x28x28 32x128x256x256 2x1280x16x16"
status=0

step "builds: default, columns"
build_native default
GN_NVCC_FLAGS="$E" build_native columns
wait
builds_done default columns

for round in $(seq "${COLUMNS_ROUNDS:-4}"); do
  order="default columns"
  [ $((round % 2)) -eq 0 ] && order="columns default"  # (neither build always runs first)
  for v in $order; do
    step "backward, $v, round $round"
    flags=""
    [ "$v" = columns ] && flags="$E"
    # shellcheck disable=SC2086  # (the shapes are separate arguments)
    GN_NVCC_FLAGS="$flags" timeout 120 python3 scripts/time_shapes.py $shapes --directions bwd \
      --json "$out/bwd_${v}_$round.json" >"$out/bwd_${v}_$round.log" 2>&1 || status=1
    rows "$out/bwd_${v}_$round.log"
  done
done

step "traces of the one launch (dx phase, totals), default and columns"
export GN_PROFILE_SHAPES=1x512x128x128:silu,4x512x64x64:silu
for v in default columns; do
  flags=""
  [ "$v" = columns ] && flags="$E"
  GN_NVCC_FLAGS="$flags" timeout 90 python3 scripts/profile_tasks.py --trace-bwd >"$out/trace_$v.log" 2>&1 || status=1
done
unset GN_PROFILE_SHAPES

step "the one-launch tests under the experiment"
GN_NVCC_FLAGS="$E" timeout 150 python3 -m pytest -q -p no:cacheprovider -p xdist -n 8 \
  tests/gpu/test_task_backward_onepass.py >"$out/tests_columns.log" 2>&1 || status=1
tail -n 2 "$out/tests_columns.log" >>"$out/summary.txt"

step "planting bwd1-column-count under the experiment (must go red)"
GN_NVCC_FLAGS="$E" GN_PLANTING=bwd1-column-count GN_PLANTED_TESTS=tests/gpu/test_task_backward_onepass.py \
  GN_PLANTED_SELECT=fp64 timeout 150 bash scripts/planted_bug.sh -p xdist -n 8 >"$out/planted.log" 2>&1 ||
  status=1
tail -n 3 "$out/planted.log" >>"$out/summary.txt"
gpu_call_done $status
