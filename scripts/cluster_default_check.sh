#!/usr/bin/env bash
# What a change to the cluster forward must pass before it becomes the default, in one GPU call (about 5 minutes):
#   suite     the whole GPU suite (tests/gpu, 8 workers) built with the experiment's flags;
#   sanitize  compute-sanitizer's four tools on scripts/sanitize_workload.py (which runs fwd_task_cluster),
#             built with the same flags;
#   trace     the cluster forward's phases per block with its prologue (-DGN_TRACE_PROLOGUE=1) on the small
#             shapes, under the experiment and under the default build: where its time goes before the
#             first copy, at the barrier and in the apply.
#   bash scripts/cluster_default_check.sh OUT
# Environment: CLUSTER_FLAGS (an experiment's nvcc flags; default none: the default build),
# CLUSTER_PARTS ("suite sanitize trace"), CLUSTER_TRACE_SHAPES (default
# "2x1280x16x16:silu,2x640x32x32:silu,16x256x16x16:silu").
set -uo pipefail
# shellcheck source=scripts/gpu_call.sh
source "$(dirname "$0")/gpu_call.sh"
gpu_call_setup cluster_default_check.sh "${1:-}"
flags=${CLUSTER_FLAGS-}
parts=" ${CLUSTER_PARTS:-suite sanitize trace} "
status=0
step "flags: ${flags:-(none)}; parts:$parts"

GN_NVCC_FLAGS="$flags" build_native exp
[[ $parts == *" trace "* ]] && GN_NVCC_FLAGS="-DGN_TRACE_PROLOGUE=1" build_native trace_default
# (with no experiment the two traces are one)
traced="default" && [ -n "$flags" ] && traced="default exp"
[[ $parts == *" trace "* && -n $flags ]] && GN_NVCC_FLAGS="$flags -DGN_TRACE_PROLOGUE=1" build_native trace_exp
wait
builds_done exp trace_default trace_exp

if [[ $parts == *" suite "* ]]; then
  step "GPU suite with $flags"
  # shellcheck disable=SC2046  # (plugin_opt prints nothing or two words)
  GN_NVCC_FLAGS="$flags" timeout 300 python3 -m pytest tests/gpu -q -p no:cacheprovider -p xdist -n 8 \
    $(plugin_opt) >"$out/suite.log" 2>&1 || status=1
  tail -n 3 "$out/suite.log" >>"$out/summary.txt"
  grep -E "^FAILED|^ERROR" "$out/suite.log" | head -20 >>"$out/summary.txt"
fi

if [[ $parts == *" sanitize "* ]]; then
  step "sanitizers with $flags"
  GN_NVCC_FLAGS="$flags" timeout 240 bash scripts/sanitize.sh "$out/sanitize" >"$out/sanitize.log" 2>&1 ||
    status=1
  cat "$out/sanitize.log" >>"$out/summary.txt"
  grep -h "cluster teams" "$out/sanitize/memcheck.log" >>"$out/summary.txt" 2>/dev/null
fi

if [[ $parts == *" trace "* ]]; then
  shapes=${CLUSTER_TRACE_SHAPES:-2x1280x16x16:silu,2x640x32x32:silu,16x256x16x16:silu}
  for v in $traced; do
    f="-DGN_TRACE_PROLOGUE=1"
    [ "$v" = exp ] && f="$flags $f"
    step "trace ($v: $f)"
    GN_NVCC_FLAGS="$f" GN_PROFILE_SHAPES="$shapes" timeout 120 python3 scripts/profile_tasks.py --trace \
      >"$out/trace_$v.log" 2>&1 || status=1
    cat "$out/trace_$v.log" >>"$out/summary.txt"
  done
fi
gpu_call_done $status
