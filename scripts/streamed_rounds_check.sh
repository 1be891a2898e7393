#!/usr/bin/env bash
# The streamed rounds' first GPU call (benchmarks/RESULTS.md, sessions 42-43; about 7 minutes on an H200):
# builds the default kernels, -DGN_EXP_STREAMED_ROUNDS=1 (streamed), the same with
# -DGN_EXP_STREAMED_PUBLISH=1 (publish) and the streamed build of a copy with the planting
# streamed-reader-stuck, all at once; runs the one-launch forward's GPU tests under the streamed build and
# the planted copy's (which must go red); then times the plans whose members keep all their chunks for
# several rounds with each build, one launch (--passes 1) against two (--passes 2), including
# 32x128x256x256 at a launch budget of 8192 tiles and 1x512x256x256 at a sample budget of 1024 (one team of
# 256 for 32 and 4 rounds); traces the rounds' phases per block; and times the one-launch backward
# (GN_ARCH=tasks+bwd1) on the same tilings. Logs in OUT/logs.tgz, the lines to read in OUT/summary.txt.
#   bash scripts/streamed_rounds_check.sh OUT
# Environment: STREAMED_SHAPES (time_shapes.py specs, space-separated); STREAMED_PARTS, the parts to run
# (default "tests fwd bwd"; "suite", about 10 minutes and so a call of its own, is what making the streamed
# rounds the default needs: the GPU suite, the sweep's task cases and compute-sanitizer, all under the
# streamed build).
set -uo pipefail
# shellcheck source=scripts/gpu_call.sh
source "$(dirname "$0")/gpu_call.sh"
gpu_call_setup streamed_rounds_check.sh "${1:-}"
S="-DGN_EXP_STREAMED_ROUNDS=1"
P="-DGN_EXP_STREAMED_ROUNDS=1 -DGN_EXP_STREAMED_PUBLISH=1"
shapes=${STREAMED_SHAPES:-"16x256x128x128 8x512x128x128 16x512x64x64 4x256x128x128 4x128x256x256 32x128x256x256"}
status=0
parts=" ${STREAMED_PARTS:-tests fwd bwd} "
want() { [[ $parts == *" $1 "* ]]; }
flags_of() { case $1 in default) echo "" ;; streamed) echo "$S" ;; publish) echo "$P" ;; esac; }

step "builds: default, streamed, publish, streamed + streamed-reader-stuck"
planted=$(python3 scripts/plant_bug.py streamed-reader-stuck) || { echo "planting failed"; exit 1; }
for v in default streamed publish; do GN_NVCC_FLAGS="$(flags_of $v)" build_native $v; done
GN_NVCC_FLAGS="$S" GN_CSRC_DIR="$planted" build_native planted
wait
builds_done default streamed publish planted

if want tests; then
  step "GPU tests under the streamed build"
  GN_NVCC_FLAGS="$S" timeout 240 python3 -m pytest -q -p xdist -n 8 tests/gpu/test_onepass_rounds.py \
    tests/gpu/test_kernels.py tests/gpu/test_task_sync.py tests/gpu/test_team_stagger.py \
    >"$out/tests_streamed.log" 2>&1 || status=1
  tail -n 2 "$out/tests_streamed.log" >>"$out/summary.txt"
  step "the planted copy under the streamed build (must fail)"
  if GN_NVCC_FLAGS="$S" GN_CSRC_DIR="$planted" timeout 120 python3 -m pytest -q -p xdist -n 8 \
    tests/gpu/test_onepass_rounds.py >"$out/tests_planted.log" 2>&1; then
    status=1
    echo "PLANTED BUG NOT CAUGHT (streamed-reader-stuck)" >>"$out/summary.txt"
  else
    tail -n 1 "$out/tests_planted.log" >>"$out/summary.txt"
  fi
fi

for v in default streamed publish; do
  want fwd || break
  F=$(flags_of $v)
  step "forward, $v: one launch against two"
  # shellcheck disable=SC2086  # (the shapes are separate arguments)
  GN_NVCC_FLAGS="$F" timeout 200 python3 scripts/time_shapes.py $shapes --directions fwd --passes 1,2 \
    --json "$out/ts_$v.json" >"$out/ts_$v.log" 2>&1 || status=1
  rows "$out/ts_$v.log"
  GN_NVCC_FLAGS="$F" timeout 60 python3 scripts/time_shapes.py 32x128x256x256 --launch-tiles 8192 \
    --directions fwd --passes 1,2 --json "$out/ts_launch8192_$v.json" >"$out/ts_launch8192_$v.log" 2>&1 || status=1
  rows "$out/ts_launch8192_$v.log"
  GN_NVCC_FLAGS="$F" timeout 60 python3 scripts/time_shapes.py 1x512x256x256:silu --sample-tiles 1024 \
    --directions fwd --passes 1,2 --json "$out/ts_sample1024_$v.json" >"$out/ts_sample1024_$v.log" 2>&1 || status=1
  rows "$out/ts_sample1024_$v.log"
  # more plans the candidate tiling (tiles of at most 4 chunks in tasks of up to 16 MiB) turns from re-reading
  # into keeping every chunk: an AutoencoderKL decoder's 4x256x256x256, and 64x128x128x128
  GN_NVCC_FLAGS="$F" timeout 60 python3 scripts/time_shapes.py 4x256x256x256:silu --sample-tiles 512 \
    --directions fwd --passes 1,2 --json "$out/ts_vae_$v.json" >"$out/ts_vae_$v.log" 2>&1 || status=1
  rows "$out/ts_vae_$v.log"
  GN_NVCC_FLAGS="$F" timeout 60 python3 scripts/time_shapes.py 64x128x128x128 --launch-tiles 4096 \
    --directions fwd --passes 1,2 --json "$out/ts_b64_$v.json" >"$out/ts_b64_$v.log" 2>&1 || status=1
  rows "$out/ts_b64_$v.log"
  step "traces, $v"
  GN_NVCC_FLAGS="$F" GN_PROFILE_SHAPES=16x256x128x128,4x128x256x256 timeout 90 python3 scripts/profile_tasks.py \
    --trace >"$out/trace_$v.log" 2>&1 || status=1
  GN_NVCC_FLAGS="$F" GN_PROFILE_SHAPES=1x512x256x256:silu GN_PROFILE_SAMPLE_TILES=1024 timeout 60 \
    python3 scripts/profile_tasks.py --trace >"$out/trace_sample1024_$v.log" 2>&1 || status=1
done

want bwd && step "backward, one launch (GN_ARCH=tasks+bwd1) against two, default build"
for lt in 4096 8192; do  # (4096: the backward's default launch budget)
  want bwd || break
  GN_ARCH=tasks+bwd1 timeout 150 python3 scripts/time_shapes.py 32x128x256x256 4x128x256x256 --launch-tiles $lt \
    --directions bwd --passes 1,2 --json "$out/bwd1_launch$lt.json" >"$out/bwd1_launch$lt.log" 2>&1 || status=1
  rows "$out/bwd1_launch$lt.log"
done
if want bwd; then
  GN_ARCH=tasks+bwd1 timeout 60 python3 scripts/time_shapes.py 1x512x256x256:silu --sample-tiles 1024 \
    --directions bwd --passes 1,2 --json "$out/bwd1_sample1024.json" >"$out/bwd1_sample1024.log" 2>&1 || status=1
  rows "$out/bwd1_sample1024.log"
fi
rm -rf "$(dirname "$planted")"
if want suite; then
  step "the GPU suite under the streamed build"
  GN_NVCC_FLAGS="$S" timeout 400 python3 -m pytest -q -p xdist -n 8 tests/gpu >"$out/suite.log" 2>&1 || status=1
  tail -n 2 "$out/suite.log" >>"$out/summary.txt"
  step "the sweep's task cases under the streamed build"
  GN_NVCC_FLAGS="$S" timeout 300 python3 scripts/prebuild.py >"$out/prebuild.log" 2>&1 || status=1
  # shellcheck disable=SC2046  # (plugin_opt: zero or two words)
  GN_NVCC_FLAGS="$S" timeout 500 python3 -m pytest -q -p xdist -n 8 $(plugin_opt) --gn-arch-sweep --gn-arch tasks \
    >"$out/sweep.log" 2>&1 || status=1
  tail -n 2 "$out/sweep.log" >>"$out/summary.txt"
  step "compute-sanitizer under the streamed build"
  GN_NVCC_FLAGS="$S" timeout 500 bash scripts/sanitize.sh "$out/san" >"$out/sanitize.log" 2>&1 || status=1
  tail -n 6 "$out/sanitize.log" >>"$out/summary.txt"
fi
gpu_call_done $status
