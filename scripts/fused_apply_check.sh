#!/usr/bin/env bash
# The fused element loops in one GPU call, about 8 minutes on an H200 (csrc/gn_tasks.cuh's experiments, each
# off by default): -DGN_EXP_FUSED_APPLY=1 (the forward's z = x * scale + (beta - mean * scale) for a 16-bit x)
# and -DGN_EXP_FUSED_BWD_APPLY=1 (the backward's dx and z from x itself), built together as "fused" (each
# flag changes one direction's kernels only); "fusedstats" adds -DGN_EXP_FUSED_BWD_STATS=1 (the backward's
# stats without the per-element rstd multiply). Builds the three at once; times the large, mid and small rows
# in alternating rounds (fp16 FUSED_ROUNDS times, bf16 once; default and fused both directions, fusedstats the
# backward); runs the forward and backward GPU tests under fusedstats (fp64 references, bitwise equality
# across caps and schedules, activations, clusters, rounds, autocast); then, with FUSED_NCU=1, Nsight Compute
# on the 16-bit SiLU forward apply launch of default and fused (pipe utilization and warp stalls). Logs under
# OUT, the lines to read in OUT/summary.txt.
#   bash scripts/fused_apply_check.sh OUT
# Environment: FUSED_ROUNDS (default 2), FUSED_SKIP_TESTS=1, FUSED_NCU=1.
set -uo pipefail
# shellcheck source=scripts/gpu_call.sh
source "$(dirname "$0")/gpu_call.sh"
gpu_call_setup fused_apply_check.sh "${1:-}"
F="-DGN_EXP_FUSED_APPLY=1 -DGN_EXP_FUSED_BWD_APPLY=1"
S="$F -DGN_EXP_FUSED_BWD_STATS=1"
shapes="1x128x1024x1024:silu 1x256x512x512:silu 1x128x16x256x256:silu 1x512x256x256:silu 1x128x1024x2048:G16
32x128x256x256 1x512x128x128:silu 2x320x64x64:silu 2x1280x16x16:silu"
status=0

step "builds: default, fused, fusedstats"
build_native default
GN_NVCC_FLAGS="$F" build_native fused
GN_NVCC_FLAGS="$S" build_native fusedstats
wait
builds_done default fused fusedstats

for round in $(seq "${FUSED_ROUNDS:-2}"); do
  dts=fp16
  [ "$round" = 1 ] && dts="fp16 bf16"
  for dt in $dts; do
    for v in default fused fusedstats; do
      step "$dt, $v, round $round"
      flags="" dirs=fwd,bwd
      [ $v = fused ] && flags="$F"
      [ $v = fusedstats ] && flags="$S" dirs=bwd
      # shellcheck disable=SC2086  # (the shapes are separate arguments)
      GN_NVCC_FLAGS="$flags" timeout 150 python3 scripts/time_shapes.py $shapes --dtype $dt --directions $dirs \
        --json "$out/${dt}_${v}_$round.json" >"$out/${dt}_${v}_$round.log" 2>&1 || status=1
      rows "$out/${dt}_${v}_$round.log"
    done
  done
done

if [ -z "${FUSED_SKIP_TESTS:-}" ]; then
  step "the forward's and backward's GPU tests under fusedstats"
  GN_NVCC_FLAGS="$S" timeout 180 python3 -m pytest -q -p xdist -n 8 tests/gpu/test_kernels.py tests/gpu/test_acts.py \
    tests/gpu/test_cluster_teams.py tests/gpu/test_onepass_rounds.py tests/gpu/test_autocast_wide.py \
    tests/gpu/test_task_backward.py tests/gpu/test_task_backward_onepass.py \
    >"$out/tests_fused.log" 2>&1 || status=1
  tail -n 3 "$out/tests_fused.log" >>"$out/summary.txt"
fi

if [ -n "${FUSED_NCU:-}" ] && command -v ncu >/dev/null; then
  export GN_PROFILE_SHAPES=1x128x1024x1024:silu
  for v in default fused; do
    step "ncu: the fp16 SiLU apply launch, $v"
    flags=""
    [ $v = fused ] && flags="$F"
    GN_NVCC_FLAGS="$flags" timeout 150 ncu --clock-control none -k regex:fwd_task_apply --section SpeedOfLight \
      --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section InstructionStats \
      --csv --page details python3 scripts/profile_tasks.py --once >"$out/ncu_$v.csv" 2>"$out/ncu_$v.err" || status=1
    grep -E '"(Duration|DRAM Throughput|Issue Slots Busy|Issued Warp Per Scheduler|Executed Ipc Active|Warp Cycles Per Issued Instruction|Executed Instructions|Achieved Occupancy)"' \
      "$out/ncu_$v.csv" | awk -F'","' '{print $(NF-2), $(NF-1), $NF}' >>"$out/summary.txt"
  done
  unset GN_PROFILE_SHAPES
fi
step "done (status $status)"
exit $status
