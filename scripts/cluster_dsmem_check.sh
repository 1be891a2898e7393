#!/usr/bin/env bash
# The small shapes' chain floors and the cluster forward's DSMEM experiment in one GPU call (about 8 minutes):
# builds the default kernels and -DGN_EXP_CLUSTER_DSMEM=1 (the cluster members' tile partials exchanged over
# distributed shared memory instead of the workspace), runs scripts/chain_floor.py (the floors of a read ->
# cluster reduction -> write GroupNorm on the small shapes, beside ours), shows that both builds give the same
# bits (bits_digest.py) and that the cluster tests pass under the experiment, then times the shapes whose
# forward runs as clusters with both builds in alternating rounds. Logs under OUT, the lines to read in
# OUT/summary.txt.
#   bash scripts/cluster_dsmem_check.sh OUT
# Environment: DSMEM_ROUNDS (default 2), DSMEM_SKIP_FLOOR=1.
set -uo pipefail
# shellcheck source=scripts/gpu_call.sh
source "$(dirname "$0")/gpu_call.sh"
gpu_call_setup cluster_dsmem_check.sh "${1:-}"
D="-DGN_EXP_CLUSTER_DSMEM=1"
# the benchmark's cluster row, and the cluster plans of session 29 (teams of 2-7, one chunk a member)
shapes="2x1280x16x16:silu 4x512x16x16:silu 8x640x16x16:silu 16x768x8x8:silu 16x1280x8x8:silu 16x256x16x16:silu"
status=0

step "builds: default, dsmem"
build_native default
GN_NVCC_FLAGS="$D" build_native dsmem
wait
builds_done default dsmem

if [ -z "${DSMEM_SKIP_FLOOR:-}" ]; then
  step "chain floor (default build for ours)"
  timeout 330 python3 scripts/chain_floor.py --json "$out/chain_floor.json" >"$out/chain_floor.log" 2>&1 || status=1
  grep -E "^==|WRONG|WARNING|rror" "$out/chain_floor.log" >>"$out/summary.txt"
fi

step "bits: default, dsmem"
acts="--acts silu,none --shapes 2x1280x16x16,4x512x16x16,16x768x8x8,16x256x16x16,3x96x17x19"
# shellcheck disable=SC2086
timeout 120 python3 scripts/bits_digest.py $acts >"$out/bits_default.log" 2>&1 || status=1
# shellcheck disable=SC2086
GN_NVCC_FLAGS="$D" timeout 120 python3 scripts/bits_digest.py $acts >"$out/bits_dsmem.log" 2>&1 || status=1
if cmp -s "$out/bits_default.log" "$out/bits_dsmem.log"; then
  echo "bits: the same ($(wc -l <"$out/bits_default.log") lines)" >>"$out/summary.txt"
else
  echo "bits: DIFFER" >>"$out/summary.txt"
  diff "$out/bits_default.log" "$out/bits_dsmem.log" | head -20 >>"$out/summary.txt"
  status=1
fi

step "cluster tests under dsmem"
GN_NVCC_FLAGS="$D" timeout 200 python3 -m pytest -q -p xdist -n 8 tests/gpu/test_cluster_teams.py \
  tests/gpu/test_task_sync.py >"$out/tests_dsmem.log" 2>&1 || status=1
tail -n 2 "$out/tests_dsmem.log" >>"$out/summary.txt"

for round in $(seq "${DSMEM_ROUNDS:-2}"); do
  for v in default dsmem; do
    step "cluster shapes, $v, round $round"
    flags=""
    [ $v = dsmem ] && flags="$D"
    # shellcheck disable=SC2086  # (the shapes are separate arguments)
    GN_NVCC_FLAGS="$flags" timeout 120 python3 scripts/time_shapes.py $shapes --passes auto \
      --json "$out/time_${v}_$round.json" >"$out/time_${v}_$round.log" 2>&1 || status=1
    rows "$out/time_${v}_$round.log"
  done
done
step "done (status $status)"
exit $status
