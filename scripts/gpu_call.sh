# Shared by the scripts that are one GPU call each (streamed_rounds_check.sh, small_latency_check.sh); they
# source it after `set -uo pipefail`:
#   gpu_call_setup NAME OUT    $out (absolute, created), PYTHONUNBUFFERED, GN_CACHE_DIR (default /tmp/gncache),
#                              PYTHONPATH (this tree first); first it exits 3, before any work, where
#                              GN_EXPECT_GPU names another card (stop_on_unexpected_gpu)
#   step TEXT...               a timestamped line on stdout and in $out/summary.txt
#   rows LOG [PATTERN]         a timing log's rows (time_shapes.py's timings and tile budgets, or PATTERN)
#                              into the summary
#   build_native NAME          the native library of this environment (GN_NVCC_FLAGS, GN_CSRC_DIR) in the
#                              background, logged to $out/build_NAME.log; `wait`, then `builds_done NAMES...`
#   builds_done NAME...        each failed build's last lines into the summary
#   plugin_opt                 `-p pytest_gn.plugin` where no installed entry point loads the plugin (a tree on
#                              PYTHONPATH only), else nothing (naming it twice would register it twice)
#   gpu_call_done STATUS [KEEP...]  the last step: every file under $out but summary.txt and KEEP (names in
#                              $out) into $out/logs.tgz, then exit STATUS. The device tool brings back at most 8
#                              files of OUT: session 54 lost tree_ab_check.sh's summary among its 20 logs

# GN_EXPECT_GPU=TEXT (e.g. H200): exit 3 (a step says why) unless the first GPU's name holds TEXT, case aside; no
# GPU is not it either. Nothing where GN_EXPECT_GPU is unset. A device call meant for one card that gets another
# (the H200 kinds may start an H100) stops in seconds instead of timing the wrong card. gpu_check.sh shares it;
# python -m gn_module.bench (and its models) reads the same variable (bench.device.unexpected_gpu).
stop_on_unexpected_gpu() {
  [ -n "${GN_EXPECT_GPU:-}" ] || return 0
  local card
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  [[ "${card,,}" == *"${GN_EXPECT_GPU,,}"* ]] && return 0
  step "stop: the GPU is '${card:-none}', not $GN_EXPECT_GPU (GN_EXPECT_GPU)"
  exit 3
}

gpu_call_setup() {
  out=${2:?usage: $1 OUT}
  mkdir -p "$out" && out=$(cd "$out" && pwd)
  stop_on_unexpected_gpu
  export PYTHONUNBUFFERED=1
  export GN_CACHE_DIR=${GN_CACHE_DIR:-/tmp/gncache}
  # this tree importable without an install (a fresh machine has none: session 49's first build failed)
  export PYTHONPATH="$(pwd)/src:$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
}

step() { echo "== $(date +%T) $*" | tee -a "$out/summary.txt"; }

rows() { grep -E "${2:- us |tile budget}" "$1" >>"$out/summary.txt"; }

build_native() {
  timeout 300 python3 -c 'import torch; from gn_module import build
build.build(None, torch.cuda.get_device_capability(), quiet=True)' >"$out/build_$1.log" 2>&1 &
}

builds_done() {
  local name
  for name in "$@"; do
    if [ -s "$out/build_$name.log" ]; then
      { echo "build $name:"; tail -n 3 "$out/build_$name.log"; } >>"$out/summary.txt"
    fi
  done
}

plugin_opt() {
  python3 - <<'PY'
from importlib.metadata import entry_points
if not any(ep.value == "pytest_gn.plugin" for ep in entry_points(group="pytest11")):
    print("-p pytest_gn.plugin")
PY
}

gpu_call_done() {
  local status=$1
  shift
  step "done (status $status)"
  local keep=(--exclude=./summary.txt --exclude=./logs.tgz) name
  for name in "$@"; do keep+=("--exclude=./$name"); done
  # (packed and removed: the logs stay together in one file, and OUT keeps what a reader opens first)
  # (written beside OUT first: a tarball growing inside the folder it packs makes tar fail, "file changed")
  local packed="$out.logs.$$.tgz"
  (cd "$out" && tar czf "$packed" "${keep[@]}" . && mv "$packed" logs.tgz &&
    find . -mindepth 1 -maxdepth 1 ! -name summary.txt ! -name logs.tgz \
      $(for name in "$@"; do printf '! -name %s ' "$name"; done) -exec rm -rf {} +)
  exit "$status"
}
