#!/usr/bin/env bash
# The one-launch backward (GN_ARCH=tasks+bwd1) with its teams staggered, against the two launches, on
# tensors larger than the chip, whose one-launch teams run several rounds (benchmarks/RESULTS.md,
# sessions 21-22). Alternating rounds of: the two launches, then the one launch at each stagger. Then the
# stagger's GPU tests (with the staggered one-launch backward's) and the one-launch backward's. Logs under OUT.
#   bash scripts/bwd_stagger_check.sh OUT
# Environment: BWD_STAGGER_SHAPES (time_shapes.py specs), BWD_STAGGER_NS (default "0 8000 16000 32000",
# or "auto"), BWD_STAGGER_ROUNDS (default 2), BWD_STAGGER_DTYPES (default fp16), BWD_STAGGER_TESTS=0 skips the tests.
set -uo pipefail
out=${1:?usage: bwd_stagger_check.sh OUT}
mkdir -p "$out" && out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1
export PYTHONPATH="$(pwd)/src:$(pwd)${PYTHONPATH:+:$PYTHONPATH}"  # (a fresh machine has no install)
shapes=${BWD_STAGGER_SHAPES:-"32x128x256x256 64x128x128x128 128x128x128x128 16x128x256x256 32x320x128x128 \
1x128x1024x2048:G16 1x256x512x512:silu"}
status=0
step() { echo "== $(date +%T) $*" | tee -a "$out/summary.txt"; }
for dtype in ${BWD_STAGGER_DTYPES:-fp16}; do
  for round in $(seq "${BWD_STAGGER_ROUNDS:-2}"); do
    step "$dtype two launches $round"
    log="$out/${dtype}_two_${round}"
    # shellcheck disable=SC2086  # (the shapes are separate arguments)
    GN_ARCH=tasks+bwd python3 scripts/time_shapes.py $shapes --dtype "$dtype" --directions bwd --passes 2 \
      --json "$log.json" >"$log.log" 2>&1 || status=1
    grep -E " us " "$log.log" >>"$out/summary.txt"
    for ns in ${BWD_STAGGER_NS:-0 8000 16000 32000}; do
      step "$dtype one launch, stagger $ns, $round"
      log="$out/${dtype}_one_${ns}_${round}"
      # shellcheck disable=SC2086
      GN_ARCH=tasks+bwd1 GN_TEAM_STAGGER=$ns python3 scripts/time_shapes.py $shapes --dtype "$dtype" \
        --directions bwd --passes 1 --json "$log.json" >"$log.log" 2>&1 || status=1
      grep -E " us " "$log.log" >>"$out/summary.txt"
    done
  done
done
if [ "${BWD_STAGGER_TESTS:-1}" != 0 ]; then
  step "tests: the stagger, the one-launch backward"
  python3 -m pytest -q -p no:randomly tests/gpu/test_team_stagger.py tests/gpu/test_task_backward_onepass.py \
    >"$out/tests.log" 2>&1 || status=1
  tail -n 3 "$out/tests.log" >>"$out/summary.txt"
fi
exit $status
