#!/usr/bin/env bash
# The arch sweep's reason to exist, demonstrated: plant a bug that only exists on sm_80 (the first
# overflow tile of the one-pass backward skips every reduction, behind `#if __CUDA_ARCH__ == 800`),
# then show that `pytest --gn-arch-sweep` catches it on the A100 profile (through the compute_80
# PTX build) while the native GPU suite on a newer GPU passes.
set -uo pipefail
bad=$(python3 scripts/plant_bug.py sm80) || exit 1
export GN_CSRC_DIR="$bad" GN_CACHE_DIR=$(mktemp -d)
echo "== native GPU suite with the planted bug (expected: passes, the bug is invisible on this arch)"
python3 -m pytest tests/gpu/test_kernels.py -q -p no:cacheprovider -k "not 2_31" 2>&1 | tail -n 1
echo "== arch sweep with the planted bug (expected: A100 cases fail)"
python3 -m pytest --gn-arch-sweep --gn-profiles A100,H200 -p no:cacheprovider -q -rf "$@" 2>&1 | tail -n 40
