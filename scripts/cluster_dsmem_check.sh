#!/usr/bin/env bash
# The small shapes' chain floors and the cluster forward's experiments in one or two GPU calls: builds the
# default kernels and the experiments' variants, then (DSMEM_PARTS, default all: about 11 minutes on an H100,
# so two calls):
#   floor  scripts/chain_floor.py: the floors of a read -> cluster reduction -> write GroupNorm, forward and
#          backward, fp16 and bf16, on the small shapes beside ours (default build), about 5 minutes;
#   bits   bits_digest.py with the default build and with the DSMEM exchange: the same lines, or it says DIFFER;
#   tests  tests/gpu/test_cluster_teams.py and test_task_sync.py under each experiment build (the cluster
#          kernel's bits against the cooperative teams'), and the DSMEM build with a planted bug (must fail);
#   time   the shapes whose forward runs as clusters, every variant in alternating rounds.
# Variants: default (weight, bias and the combine's shifts load with the chunk copies, since session 52);
# dsmem = -DGN_EXP_CLUSTER_DSMEM=1 (the members' tile partials over distributed shared memory instead of the
# workspace). Logs under OUT, the lines to read in OUT/summary.txt.
#   bash scripts/cluster_dsmem_check.sh OUT
# Environment: DSMEM_PARTS ("floor bits tests time"), DSMEM_ROUNDS (default 2).
set -uo pipefail
# shellcheck source=scripts/gpu_call.sh
source "$(dirname "$0")/gpu_call.sh"
gpu_call_setup cluster_dsmem_check.sh "${1:-}"
parts=" ${DSMEM_PARTS:-floor bits tests time} "
declare -A FLAGS=(
  [default]=""
  [dsmem]="-DGN_EXP_CLUSTER_DSMEM=1"
)
variants="default dsmem"
# the benchmark's cluster row, and the cluster plans of session 29 (teams of 2-7, one chunk a member)
shapes="2x1280x16x16:silu 4x512x16x16:silu 8x640x16x16:silu 16x768x8x8:silu 16x1280x8x8:silu 16x256x16x16:silu"
status=0

# the floor part needs only the default build (ours); the others every variant
built=$variants
[[ $parts == " floor " ]] && built=default
step "builds: $built"
for v in $built; do
  GN_NVCC_FLAGS="${FLAGS[$v]}" build_native "$v"
done
wait
# shellcheck disable=SC2086  # (the names are separate arguments)
builds_done $built

if [[ $parts == *" floor "* ]]; then
  step "chain floors (default build for ours)"
  timeout 420 python3 scripts/chain_floor.py --dtypes fp16,bf16 --json "$out/chain_floor.json" \
    >"$out/chain_floor.log" 2>&1 || status=1
  grep -E "^==|WRONG|WARNING|rror" "$out/chain_floor.log" >>"$out/summary.txt"
fi

if [[ $parts == *" bits "* ]]; then
  step "bits: default, dsmem"
  acts="--acts silu,none --shapes 2x1280x16x16,4x512x16x16,16x768x8x8,16x256x16x16,3x96x17x19"
  for v in default dsmem; do
    # shellcheck disable=SC2086
    GN_NVCC_FLAGS="${FLAGS[$v]}" timeout 120 python3 scripts/bits_digest.py $acts >"$out/bits_$v.log" 2>&1 ||
      status=1
  done
  if cmp -s "$out/bits_default.log" "$out/bits_dsmem.log"; then
    echo "bits: the same ($(wc -l <"$out/bits_default.log") lines)" >>"$out/summary.txt"
  else
    echo "bits: DIFFER" >>"$out/summary.txt"
    diff "$out/bits_default.log" "$out/bits_dsmem.log" | head -20 >>"$out/summary.txt"
    status=1
  fi
fi

if [[ $parts == *" tests "* ]]; then
  for v in dsmem; do
    step "cluster tests, $v"
    GN_NVCC_FLAGS="${FLAGS[$v]}" timeout 150 python3 -m pytest -q -p xdist -n 8 tests/gpu/test_cluster_teams.py \
      tests/gpu/test_task_sync.py >"$out/tests_$v.log" 2>&1 || status=1
    tail -n 2 "$out/tests_$v.log" >>"$out/summary.txt"
  done
  step "cluster tests, dsmem with plant_bug.py cluster-dsmem-owner (must fail)"
  planted=$(python3 scripts/plant_bug.py cluster-dsmem-owner)
  if GN_CSRC_DIR="$planted" GN_NVCC_FLAGS="${FLAGS[dsmem]}" timeout 200 python3 -m pytest -q -p xdist -n 8 \
    tests/gpu/test_cluster_teams.py >"$out/tests_dsmem_planted.log" 2>&1; then
    echo "planted cluster-dsmem-owner: NOT caught" >>"$out/summary.txt"
    status=1
  else
    echo "planted cluster-dsmem-owner: caught ($(tail -n 1 "$out/tests_dsmem_planted.log"))" >>"$out/summary.txt"
  fi
  rm -rf "$(dirname "$planted")"
fi

if [[ $parts == *" time "* ]]; then
  for round in $(seq "${DSMEM_ROUNDS:-2}"); do
    for v in $variants; do
      step "cluster shapes, $v, round $round"
      # shellcheck disable=SC2086  # (the shapes are separate arguments)
      GN_NVCC_FLAGS="${FLAGS[$v]}" timeout 120 python3 scripts/time_shapes.py $shapes --passes auto \
        --json "$out/time_${v}_$round.json" >"$out/time_${v}_$round.log" 2>&1 || status=1
      rows "$out/time_${v}_$round.log"
    done
  done
fi
step "done (status $status)"
exit $status
