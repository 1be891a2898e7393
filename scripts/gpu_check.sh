#!/usr/bin/env bash
# One command for a GPU machine: install without the network, build, run the GPU tests and the
# quick benchmarks, and write logs to the folder given as the first argument.
#   bash scripts/gpu_check.sh LOGDIR [extra pytest args for the GPU tests]
set -uo pipefail
out=${1:?usage: gpu_check.sh LOGDIR [pytest args]}
shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1
status=0
step() { echo "== $*" | tee -a "$out/summary.txt"; }

step "install (no network)"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }

step "device"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv | tee -a "$out/summary.txt"

step "build"
python3 - <<'PY' 2>&1 | tee "$out/build.log" | tee -a "$out/summary.txt"
import time, torch
from gn_module import build
t = time.perf_counter()
build.load(None, torch.cuda.get_device_capability())
print(f"native build ready in {time.perf_counter() - t:.1f} s")
PY

step "GPU tests"
python3 -m pytest tests/gpu -q -p no:cacheprovider "$@" 2>&1 | tee "$out/gpu_tests.log" | tail -n 25 | tee -a "$out/summary.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

if [ -d benchmarks ] && [ -z "${GN_SKIP_BENCH:-}" ]; then
  step "quick benchmarks"
  python3 -m gn_module.bench --quick 2>&1 | tee "$out/bench_quick.log" | tail -n 40 | tee -a "$out/summary.txt"
fi
step "exit status $status"
exit $status
