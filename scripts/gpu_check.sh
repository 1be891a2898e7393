#!/usr/bin/env bash
# One command for a GPU machine: install without the network, build, run the GPU tests, then time the
# benchmarks against the newest committed run and gate on OUR medians. Logs go to LOGDIR.
#   bash scripts/gpu_check.sh LOGDIR [extra pytest args for the GPU tests]
# Environment:
#   GN_SKIP_TESTS=1 / GN_SKIP_BENCH=1   leave out the GPU tests / the benchmarks
#   GN_BENCH_SELECT="-m quick"          which benchmarks (default the quick subset; "" = all 240)
#   GN_BENCH_STORAGE=.benchmarks        saved runs (any path, relative or absolute)
#   GN_BENCH_SAVE=1                     also save this run, when every benchmark passed: LOGDIR/saved gets it
#                                       under its history name (`python -m gn_module.bench save`: the next
#                                       number, the commit, the date); copy LOGDIR/saved/ into .benchmarks/
#                                       and commit it
#   GN_GATE_THRESHOLD=10                percent slower (median) that fails the gate, ours only
#   GN_BENCH_COMMIT=<sha>               the commit (its full sha: the saved run's name), where the tree was
#                                       copied without (current) git
#   GN_EXPECT_GPU=H200                  stop at once (exit 3, nothing installed or run) unless the first GPU's
#                                       name holds this text: a history run meant for one card, asked for
#                                       where another kind may come, costs seconds instead of a wrong run
#   GN_PACK_LOGS=1                      at the end, every log but summary.txt, gate.txt, bench.json and saved/
#                                       into LOGDIR/logs.tgz (gpu_call_done): with LOGDIR=$OUT a device call
#                                       brings back all of it (at most 8 files, 2 folders down), the saved run
#                                       included, with no wrapper script to keep
set -uo pipefail
out=${1:?usage: gpu_check.sh LOGDIR [pytest args]}
shift
mkdir -p "$out" && out=$(cd "$out" && pwd)  # (absolute: gpu_call_done packs from inside it)
export PYTHONUNBUFFERED=1
status=0
# shellcheck source=scripts/gpu_call.sh
source "$(dirname "$0")/gpu_call.sh"  # (stop_on_unexpected_gpu, gpu_call_done; its step, redefined below)
step() { echo "== $*" | tee -a "$out/summary.txt"; }

stop_on_unexpected_gpu

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

if [ -z "${GN_SKIP_TESTS:-}" ]; then
  step "GPU tests"
  python3 -m pytest tests/gpu -q -p no:cacheprovider "$@" 2>&1 | tee "$out/gpu_tests.log" | tail -n 25 | tee -a "$out/summary.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if [ -d benchmarks ] && [ -z "${GN_SKIP_BENCH:-}" ]; then
  storage=$(realpath "${GN_BENCH_STORAGE:-.benchmarks}")
  # pytest-benchmark's comparison table: against the newest run of this GPU, where one is saved (named as the
  # saved runs' machine_info names it: bench.device.device_info)
  gpu=$(python3 -c 'from gn_module.bench.device import device_info as d; i = d(); print(i["name"] + ":" + str(i["sm_count"]))' \
    2>/dev/null)
  baseline=$(python3 -m gn_module.bench history --storage "$storage" --newest ${gpu:+--gpu "$gpu"}) ||
    { status=1; baseline=""; }
  read -r -a select <<<"${GN_BENCH_SELECT--m quick}"
  step "benchmarks ${select[*]:-(all)} against $baseline"
  if [ -n "$baseline" ]; then
    # pytest-benchmark compares (and saves) in one storage: use a copy, so the committed folder is
    # only read, and outside the working directory (the case pytest-benchmark's formatting trips on).
    rm -rf "$out/storage" && cp -r "$storage" "$out/storage"
    GN_BENCH_REPS=${GN_BENCH_REPS:-30} GN_BENCH_MAX_SECONDS=${GN_BENCH_MAX_SECONDS:-0.15} \
      python3 -m pytest benchmarks "${select[@]}" -q -p no:cacheprovider \
      --benchmark-storage="file://$out/storage" --benchmark-compare="$(basename "$baseline" | cut -d_ -f1)" \
      --benchmark-json="$out/bench.json" --benchmark-columns=median,iqr,rounds --benchmark-sort=name \
      >"$out/bench.log" 2>&1
    bench_rc=$?
    grep -E "machine_info|passed|failed|error" "$out/bench.log" | tail -n 5 | tee -a "$out/summary.txt"
    [ "$bench_rc" -eq 0 ] || status=1
    # (the copy only served the comparison; a GPU call's tool brings back a few files, not the history)
    rm -rf "$out/storage"
    if [ -n "${GN_BENCH_SAVE:-}" ] && [ "$bench_rc" -eq 0 ]; then
      step "saved as (copy $out/saved/ into $storage/)"
      python3 -m gn_module.bench save --storage "$storage" --run "$out/bench.json" --into "$out/saved" 2>&1 |
        tee -a "$out/summary.txt"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    fi
    step "regression gate (ours only, ${GN_GATE_THRESHOLD:-10} %)"
    python3 -m gn_module.bench gate --storage "$storage" --run "$out/bench.json" \
      --threshold "${GN_GATE_THRESHOLD:-10}" 2>&1 | tee "$out/gate.txt" | tee -a "$out/summary.txt"
    gate_rc=${PIPESTATUS[0]}
    # the flagged rows (their pytest ids end the gate's report) timed once more: one burst of slow rounds
    # (sessions 16 and 17 each had one, medians x2 and x20 with the minimum unchanged) is not a regression
    mapfile -t flagged < <(grep -E "^  benchmarks/.*::" "$out/gate.txt" | sed 's/^ *//')
    if [ "$gate_rc" -eq 1 ] && [ "${#flagged[@]}" -gt 0 ]; then
      step "recheck of the ${#flagged[@]} flagged benchmarks"
      GN_BENCH_REPS=${GN_BENCH_REPS:-30} GN_BENCH_MAX_SECONDS=${GN_BENCH_MAX_SECONDS:-0.15} \
        python3 -m pytest "${flagged[@]}" -q -p no:cacheprovider --benchmark-json="$out/recheck.json" \
        --benchmark-columns=median,iqr,min,max,rounds >"$out/recheck.log" 2>&1
      python3 -m gn_module.bench gate --storage "$storage" --run "$out/bench.json" --recheck "$out/recheck.json" \
        --threshold "${GN_GATE_THRESHOLD:-10}" 2>&1 | tee "$out/gate.txt" | tee -a "$out/summary.txt"
      gate_rc=${PIPESTATUS[0]}
    fi
    [ "$gate_rc" -eq 0 ] || status=1
  fi
fi
step "exit status $status"
[ -z "${GN_PACK_LOGS:-}" ] || gpu_call_done "$status" gate.txt bench.json saved
exit $status
