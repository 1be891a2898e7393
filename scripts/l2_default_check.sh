#!/usr/bin/env bash
# Whether the L2 hints (-DGN_L2_HINTS=1) can become the default, one GPU call of about 7 minutes on an H200:
# compute-sanitizer's four tools with the hints on; the one launch's rows (32x128x256x256, fwd and bwd,
# GN_ARCH=tasks+bwd1) without and with the hints in alternating rounds, at the automatic stagger and at
# L2CHECK_STAGGERS; and, with the hints, the backward's one launch against its two launches on the rows where
# `auto` would have to choose. Logs in OUT/logs.tgz, the lines to read in OUT/summary.txt.
#   bash scripts/l2_default_check.sh OUT
# Environment: L2CHECK_ROUNDS (default 2), L2CHECK_STAGGERS (default "16000:2"), L2CHECK_SKIP_SANITIZE=1,
# L2CHECK_BWD_SHAPES (time_shapes.py's).
set -uo pipefail
# shellcheck source=scripts/gpu_call.sh
source "$(dirname "$0")/gpu_call.sh"
gpu_call_setup l2_default_check.sh "${1:-}"
status=0
declare -A flags=([nol2]="-DGN_L2_HINTS=0" [l2]="-DGN_L2_HINTS=1")

step "builds: nol2, l2"
for b in nol2 l2; do GN_NVCC_FLAGS="${flags[$b]}" build_native "$b"; done
wait
builds_done nol2 l2

if [ -z "${L2CHECK_SKIP_SANITIZE:-}" ]; then
  step "compute-sanitizer with the hints (scripts/sanitize.sh, GN_ARCH=tasks+bwd1: the one launch both ways)"
  GN_ARCH=tasks+bwd1 GN_NVCC_FLAGS="${flags[l2]}" timeout 240 bash scripts/sanitize.sh "$out/sanitize" \
    >>"$out/summary.txt" 2>&1 || status=1
fi

for round in $(seq "${L2CHECK_ROUNDS:-2}"); do
  for b in nol2 l2; do
    for st in auto ${L2CHECK_STAGGERS:-16000:2}; do
      step "32x128x256x256 one launch, $b, stagger $st, round $round"
      GN_TEAM_STAGGER=$st GN_ARCH=tasks+bwd1 GN_NVCC_FLAGS="${flags[$b]}" timeout 90 python3 scripts/time_shapes.py \
        32x128x256x256 --dtype fp16 --directions fwd,bwd --passes 1 \
        --json "$out/one_${b}_${st/:/_}_$round.json" >"$out/one_${b}_${st/:/_}_$round.log" 2>&1 || status=1
      rows "$out/one_${b}_${st/:/_}_$round.log"
    done
  done
done

step "the backward's one launch against two with the hints (GN_ARCH=tasks+bwd1)"
# shellcheck disable=SC2086  # (the shapes are separate arguments)
GN_ARCH=tasks+bwd1 GN_NVCC_FLAGS="${flags[l2]}" timeout 150 python3 scripts/time_shapes.py \
  ${L2CHECK_BWD_SHAPES:-1x512x128x128:silu 1x512x256x256:silu 1x256x512x512:silu 32x128x256x256 2x320x64x64:silu} \
  --dtype fp16 --directions bwd --passes 2,1 --json "$out/bwd_passes.json" >"$out/bwd_passes.log" 2>&1 || status=1
rows "$out/bwd_passes.log"
gpu_call_done $status
