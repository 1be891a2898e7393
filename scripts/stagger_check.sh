#!/usr/bin/env bash
# The team stagger's GPU checks in one call (benchmarks/RESULTS.md, sessions 20-21): time passes="auto"
# with the stagger off (GN_TEAM_STAGGER=0) and with GN_TEAM_STAGGER=auto (the default since session 21),
# alternating, on shapes the automatic rule takes and on controls it leaves alone; then its GPU tests, and
# (STAGGER_SUITE=1) the GPU suite and the plugin's task cases with GN_TEAM_STAGGER=auto in force (what
# made it the default). Logs under OUT.
#   bash scripts/stagger_check.sh OUT
# Environment: STAGGER_SHAPES (time_shapes.py specs, space-separated), STAGGER_ROUNDS (default 2),
# STAGGER_DTYPES (default "fp16 bf16"), STAGGER_SUITE=1.
set -uo pipefail
out=${1:?usage: stagger_check.sh OUT}
mkdir -p "$out" && out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1
shapes=${STAGGER_SHAPES:-"8x1024x128x128 96x128x128x128 32x320x128x128 64x128x256x128 128x128x128x128 \
32x512x64x128 64x256x128x64 32x128x256x256 64x128x128x128 16x256x128x256 1x512x256x256:silu 8x512x128x128"}
status=0
step() { echo "== $(date +%T) $*" | tee -a "$out/summary.txt"; }
for dtype in ${STAGGER_DTYPES:-fp16 bf16}; do
  for round in $(seq "${STAGGER_ROUNDS:-2}"); do
    for setting in off auto; do
      step "$dtype $setting $round"
      log="$out/${dtype}_${setting}_${round}"
      # shellcheck disable=SC2086  # (the shapes are separate arguments)
      if [ "$setting" = auto ]; then
        GN_TEAM_STAGGER=auto python3 scripts/time_shapes.py $shapes --dtype "$dtype" --directions fwd \
          --json "$log.json" >"$log.log" 2>&1 || status=1
      else
        GN_TEAM_STAGGER=0 python3 scripts/time_shapes.py $shapes --dtype "$dtype" --directions fwd \
          --json "$log.json" >"$log.log" 2>&1 || status=1
      fi
      grep -E " us " "$log.log" >>"$out/summary.txt"
    done
  done
done
step "tests/gpu/test_team_stagger.py"
python3 -m pytest -q -p no:randomly tests/gpu/test_team_stagger.py >"$out/tests.log" 2>&1 || status=1
tail -n 3 "$out/tests.log" >>"$out/summary.txt"
if [ -n "${STAGGER_SUITE:-}" ]; then
  step "GPU suite with GN_TEAM_STAGGER=auto"
  GN_TEAM_STAGGER=auto python3 -m pytest -q -p xdist -n 8 tests/gpu >"$out/suite.log" 2>&1 || status=1
  tail -n 3 "$out/suite.log" >>"$out/summary.txt"
  step "the plugin's task cases with GN_TEAM_STAGGER=auto"
  GN_TEAM_STAGGER=auto python3 -m pytest -q -p xdist -n 8 --gn-arch-sweep --gn-arch tasks \
    >"$out/sweep.log" 2>&1 || status=1
  tail -n 3 "$out/sweep.log" >>"$out/summary.txt"
fi
exit $status
