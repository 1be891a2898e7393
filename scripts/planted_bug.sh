#!/usr/bin/env bash
# Proves the GPU tests can fail: copies csrc/, drops every overflow tile from the one-pass
# backward's first phase (the class of bug that shipped on A100), and runs the overflow tests
# against that build. Exit status 0 means the tests went red, as they must.
set -uo pipefail
bad=$(python3 scripts/plant_bug.py all-archs) || exit 1
GN_CSRC_DIR="$bad" python3 -m pytest tests/gpu/test_kernels.py -q -p no:cacheprovider \
  -k "bitwise or matrix_against_fp64" "$@" 2>&1 | tail -n 4
if [ "${PIPESTATUS[0]}" -eq 0 ]; then echo "PLANTED BUG NOT CAUGHT"; exit 1; fi
echo "planted bug caught (tests failed as they must)"
