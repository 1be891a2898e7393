#!/usr/bin/env bash
# Proves the GPU tests can fail: copies csrc/ with one bug planted (scripts/plant_bug.py; by default
# all-archs: every overflow tile dropped from the one-pass backward's first phase, the class of bug that
# shipped on A100) and runs GPU tests against that build. Exit status 0 means the tests went red, as they
# must.
#
#   bash scripts/planted_bug.sh [pytest args]
#   GN_PLANTING=bwd-cold-rows-first-row GN_PLANTED_TESTS=tests/gpu/test_cold_stats.py GN_PLANTED_SELECT= \
#     bash scripts/planted_bug.sh
#
# GN_PLANTING: the planting (python scripts/plant_bug.py --list); GN_PLANTED_TESTS: the test paths
# (default tests/gpu/test_kernels.py); GN_PLANTED_SELECT: their -k expression (default "bitwise or
# matrix_against_fp64"; empty for all of them).
set -uo pipefail
planting=${GN_PLANTING:-all-archs}
read -r -a tests <<<"${GN_PLANTED_TESTS:-tests/gpu/test_kernels.py}"
select=${GN_PLANTED_SELECT-bitwise or matrix_against_fp64}
bad=$(python3 scripts/plant_bug.py "$planting") || exit 1
GN_CSRC_DIR="$bad" python3 -m pytest "${tests[@]}" -q -p no:cacheprovider ${select:+-k "$select"} "$@" 2>&1 |
  tail -n 4
if [ "${PIPESTATUS[0]}" -eq 0 ]; then echo "PLANTED BUG NOT CAUGHT ($planting)"; exit 1; fi
echo "planted bug $planting caught (tests failed as they must)"
