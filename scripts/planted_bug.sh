#!/usr/bin/env bash
# Proves the GPU tests can fail: copies csrc/, drops every overflow tile from the one-pass
# backward's first phase (the class of bug that shipped on A100), and runs the overflow tests
# against that build. Exit status 0 means the tests went red, as they must.
set -uo pipefail
bad=$(mktemp -d)/csrc
cp -r csrc "$bad"
python3 - "$bad/gn_backward.cu" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
old = "    bwd_tile<T, V>(a, t, is_last ? keep_x : nullptr, is_last ? keep_dy : nullptr, scratch);"
assert old in s, "planting site moved"
s = s.replace(old, "    if (t >= gridDim.x) continue;  // PLANTED BUG: overflow tiles skip the reductions\n" + old)
open(p, "w").write(s)
PY
GN_CSRC_DIR="$bad" python3 -m pytest tests/gpu/test_kernels.py -q -p no:cacheprovider \
  -k "bitwise or matrix_against_fp64" "$@" 2>&1 | tail -n 4
if [ "${PIPESTATUS[0]}" -eq 0 ]; then echo "PLANTED BUG NOT CAUGHT"; exit 1; fi
echo "planted bug caught (tests failed as they must)"
