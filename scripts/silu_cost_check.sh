#!/usr/bin/env bash
# One GPU call: what a fused SiLU costs the large rows. Each shape is timed with and without SiLU (the
# benchmark's timer, `auto`), then per-block timelines and ncu of both directions' launches.
#   bash scripts/silu_cost_check.sh OUT
# SILU_SHAPES: shapes without an activation (time_shapes.py's specs; each also runs with :silu)
# SILU_DTYPES (fp16), SILU_PARTS ("time timeline ncu"), SILU_PROFILE_SHAPE (the timeline's and ncu's shape,
# 1x128x1024x1024), GN_EXPECT_GPU (or its older name SILU_GPU): a name nvidia-smi must report (e.g. H200), else
# exit 3 before any work;
# SILU_NCU_FULL=1: ncu with its per-instruction stall samples too (the SASS lines that stall most).
# Session 63 (H100): 1x128x1024x1024 forward 276 -> 284 us with SiLU, backward 460 -> 473 (RESULTS.md).
set -uo pipefail
source scripts/gpu_call.sh
export GN_EXPECT_GPU=${GN_EXPECT_GPU:-${SILU_GPU:-}}
gpu_call_setup silu_cost_check.sh "${1:?usage: silu_cost_check.sh OUT}"
shapes=${SILU_SHAPES:-1x128x1024x1024 1x256x512x512 1x128x16x256x256 1x512x256x256 1x512x128x128}
parts=${SILU_PARTS:-time timeline ncu}
profile=${SILU_PROFILE_SHAPE:-1x128x1024x1024}
gpu=$(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | head -n 1)
step "device: $gpu"
step build
build_native default
wait
builds_done default
specs=()
for s in $shapes; do specs+=("$s:silu" "$s"); done
for dt in ${SILU_DTYPES:-fp16}; do
  [[ " $parts " == *" time "* ]] || break
  step "time $dt"
  python3 scripts/time_shapes.py "${specs[@]}" --dtype "$dt" --directions fwd,bwd --passes auto \
    >"$out/time_$dt.log" 2>&1
  rows "$out/time_$dt.log"
done
if [[ " $parts " == *" timeline "* ]]; then
  step "timeline $profile"
  GN_NVCC_FLAGS=-DGN_TRACE_TIMELINE GN_PROFILE_SHAPES="$profile:silu,$profile" timeout 240 \
    python3 scripts/launch_timeline.py --reps 2 >"$out/timeline.log" 2>&1
fi
if [[ " $parts " == *" ncu "* ]]; then
  light=--light
  [ "${SILU_NCU_FULL:-0}" = 1 ] && light=
  for dir in bwd fwd; do
    step "ncu $dir $profile"
    NCU_DIRECTION=$dir GN_PROFILE_SHAPES="$profile:silu,$profile" timeout 240 \
      bash scripts/ncu_tasks.sh "$out/ncu_$dir" $light >"$out/ncu_$dir.log" 2>&1
    cat "$out/ncu_$dir/summary.txt" "$out/ncu_$dir/sass_top.txt" >"$out/ncu_${dir}_summary.txt" 2>/dev/null
  done
fi
gpu_call_done 0 time_fp16.log time_bf16.log timeline.log ncu_bwd_summary.txt ncu_fwd_summary.txt
