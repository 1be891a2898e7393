#!/usr/bin/env bash
# The small shapes' experiments in one GPU call (benchmarks/RESULTS.md, sessions 41-43; about 5 minutes on an
# H200): builds the default kernels, -DGN_EXP_WARM_PARAMS=1 (warm: each task kernel loads its GnArgs lines at
# once), -DGN_TRACE_PROLOGUE (trace), both, and -DGN_EXP_BWD_GROUP_MAJOR=1 (group-major backward partials),
# all at once. Then it times the small forwards and backwards with and without the warmed parameters in
# alternating rounds, traces the one-launch forward's prologue with and without them, runs the backward's
# GPU tests under the group-major build and times the backward with it, and runs the micro-benchmark's bulk
# store section (k_stream_bulkstore against st.global.cs, for branch exp/bulk-store-apply). Logs under OUT,
# the lines to read in OUT/summary.txt.
#   bash scripts/small_latency_check.sh OUT
# Environment: SMALL_ROUNDS (default 2), SMALL_SKIP_MICRO=1.
set -uo pipefail
# shellcheck source=scripts/gpu_call.sh
source "$(dirname "$0")/gpu_call.sh"
gpu_call_setup small_latency_check.sh "${1:-}"
W="-DGN_EXP_WARM_PARAMS=1"
T="-DGN_TRACE_PROLOGUE"
G="-DGN_EXP_BWD_GROUP_MAJOR=1"
small="2x1280x16x16:silu 2x640x32x32:silu 2x320x64x64:silu 1x512x128x128:silu"
bwd="1x128x1024x2048:G16 1x128x1024x1024:silu 32x128x256x256 1x512x128x128:silu 2x320x64x64:silu"
status=0

step "builds: default, warm, trace, trace + warm, group-major"
build_native default
GN_NVCC_FLAGS="$W" build_native warm
GN_NVCC_FLAGS="$T" build_native trace
GN_NVCC_FLAGS="$T $W" build_native trace_warm
GN_NVCC_FLAGS="$G" build_native group_major
wait
builds_done default warm trace trace_warm group_major

for round in $(seq "${SMALL_ROUNDS:-2}"); do
  for v in default warm; do
    step "small shapes, $v, round $round"
    flags=""
    [ $v = warm ] && flags="$W"
    # shellcheck disable=SC2086  # (the shapes are separate arguments)
    GN_NVCC_FLAGS="$flags" timeout 120 python3 scripts/time_shapes.py $small \
      --json "$out/small_${v}_$round.json" >"$out/small_${v}_$round.log" 2>&1 || status=1
    rows "$out/small_${v}_$round.log"
  done
done

step "prologue traces, without and with the warmed parameters"
export GN_PROFILE_SHAPES=2x640x32x32:silu,2x320x64x64:silu,1x512x128x128:silu
GN_NVCC_FLAGS="$T" timeout 90 python3 scripts/profile_tasks.py --trace >"$out/trace_prologue.log" 2>&1 || status=1
GN_NVCC_FLAGS="$T $W" timeout 90 python3 scripts/profile_tasks.py --trace >"$out/trace_prologue_warm.log" 2>&1 ||
  status=1
unset GN_PROFILE_SHAPES

step "the backward's tests under the group-major build"
GN_NVCC_FLAGS="$G" timeout 200 python3 -m pytest -q -p xdist -n 8 tests/gpu/test_task_backward.py \
  tests/gpu/test_task_backward_onepass.py >"$out/tests_group_major.log" 2>&1 || status=1
tail -n 2 "$out/tests_group_major.log" >>"$out/summary.txt"
for round in $(seq "${SMALL_ROUNDS:-2}"); do
  for v in default group_major; do
    step "backward, $v, round $round"
    flags=""
    [ $v = group_major ] && flags="$G"
    # shellcheck disable=SC2086
    GN_NVCC_FLAGS="$flags" timeout 150 python3 scripts/time_shapes.py $bwd --directions bwd \
      --json "$out/bwd_${v}_$round.json" >"$out/bwd_${v}_$round.log" 2>&1 || status=1
    rows "$out/bwd_${v}_$round.log"
  done
done

if [ -z "${SMALL_SKIP_MICRO:-}" ]; then
  step "micro: bulk store"
  GN_MICRO_SECTIONS=bulkstore timeout 150 bash benchmarks/micro/run.sh "$out/micro" >"$out/micro.log" 2>&1 ||
    status=1
  tail -n 30 "$out/micro.log" >>"$out/summary.txt"
fi
gpu_call_done $status
