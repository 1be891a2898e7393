#!/usr/bin/env bash
# The small shapes' chain floors in one GPU call (about 95 s on an H100): builds the default kernels, then
# scripts/chain_floor.py times the floors of a read -> cluster reduction -> write GroupNorm, forward and
# backward, fp16 and bf16, on the small shapes beside ours, and writes OUT/chain_floor.json for
# `python -m gn_module.bench --chain-floors`. Logs in OUT/logs.tgz, the lines to read in OUT/summary.txt.
#   bash scripts/chain_floor_check.sh OUT
set -uo pipefail
# shellcheck source=scripts/gpu_call.sh
source "$(dirname "$0")/gpu_call.sh"
gpu_call_setup chain_floor_check.sh "${1:-}"
status=0
step "build (ours: the default kernels)"
build_native default
wait
builds_done default

step "chain floors"
timeout 420 python3 scripts/chain_floor.py --dtypes fp16,bf16 --json "$out/chain_floor.json" \
  >"$out/chain_floor.log" 2>&1 || status=1
grep -E "^==|WRONG|WARNING|rror" "$out/chain_floor.log" >>"$out/summary.txt"
gpu_call_done $status chain_floor.json
