#!/usr/bin/env bash
# Build and run the GroupNorm design microbenchmarks (gn_micro.cu) on one sm_90 GPU.
#
#   bash benchmarks/micro/run.sh OUTDIR
#
# Writes OUTDIR/micro.md (all tables), OUTDIR/micro.csv (every value, long format), OUTDIR/log.txt (the
# program's full output) and OUTDIR/build.txt (nvcc and the ptxas resource report). Prints the build
# summary, the GPU's clocks before and after, and the program's compact summary last.
set -euo pipefail

out=${1:?usage: bash benchmarks/micro/run.sh OUTDIR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)

nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT

# sm_90 machine code (not sm_90a: nothing here needs wgmma/setmaxnreg; the bulk and tensor copies are sm_90).
t0=$(date +%s)
if ! "$nvcc" -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -lineinfo -Xptxas -v \
    "$here/gn_micro.cu" -o "$build/gn_micro" >"$out/build.txt" 2>&1; then
  cat "$out/build.txt"
  echo "BUILD FAILED"
  exit 1
fi
t1=$(date +%s)
"$nvcc" --version | tail -1 >>"$out/build.txt"

# Registers and spills per kernel, from the ptxas report.
demangle=cat
for f in "$(dirname "$nvcc")/cu++filt" c++filt; do
  if command -v "$f" >/dev/null 2>&1; then demangle=$f; break; fi
done
echo "== build: $(( t1 - t0 )) s with $nvcc ($("$nvcc" --version | tail -1))"
awk '
  /Compiling entry function/ { match($0, /'"'"'[^'"'"']+'"'"'/); fn = substr($0, RSTART + 1, RLENGTH - 2) }
  /bytes stack frame/ { sf = $0; sub(/^[ \t]+/, "", sf) }
  /Used [0-9]+ registers/ { match($0, /Used [0-9]+ registers/); printf "%4s regs | %s | %s\n", substr($0, RSTART + 5, RLENGTH - 15), sf, fn }
' "$out/build.txt" | "$demangle" | grep -E "k_copy|k_stream|k_onchip|k_l2_|k_barrier|k_gridsync" | sed -E 's/\((ProtoArgs|StreamArgs[^)]*|L2Args)\)//; s/\(unsigned.*|\(uint4.*|\(int\)//' || true
if grep "bytes stack frame" "$out/build.txt" | grep -qv "^ *0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"; then
  echo "WARNING: ptxas reports a stack frame or spills (see build.txt)"
else
  echo "ptxas: every kernel has 0 bytes stack frame, 0 spill stores, 0 spill loads"
fi

smi() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw,utilization.gpu --format=csv,noheader || true; }
echo "== GPU before: $(smi)"

t2=$(date +%s)
set +e
# A watchdog: a broken barrier would spin forever. GN_MICRO_TIMEOUT (seconds) overrides it.
timeout "${GN_MICRO_TIMEOUT:-100}" "$build/gn_micro" "$out" >"$out/log.txt" 2>&1
rc=$?
set -e
t3=$(date +%s)
echo "== GPU after:  $(smi)"
echo "== run: $(( t3 - t2 )) s, exit code $rc"
grep -E "^\(.* took .*\)$" "$out/log.txt" | tr '\n' ' ' || true
echo
# Anything that failed a check.
grep -E "FAIL|WRONG|UNWRITTEN|CUDA error|skipping|cannot" "$out/log.txt" | head -20 || true
if [ $rc -ne 0 ]; then
  echo "== last lines of log.txt"
  tail -40 "$out/log.txt"
  exit $rc
fi
echo
sed -n '/^## Summary/,$p' "$out/log.txt"
echo
echo "files: $(ls "$out" | tr '\n' ' ')"
