#!/usr/bin/env bash
# Nsight Compute on the task forward kernels (GN_ARCH=tasks), the shapes of scripts/profile_tasks.py:
# one report, its per-kernel details as CSV, and the SASS lines with the most warp stalls per kernel.
#   bash scripts/ncu_tasks.sh OUTDIR [--light]     (--light: no per-instruction source counters)
# NCU_DIRECTION=bwd: the task backward's kernels instead (GN_ARCH=tasks+bwd, profile_tasks.py --once-bwd:
# two backwards per shape, each launch profiled). GN_PROFILE_SHAPES picks the shapes.
set -uo pipefail
out=${1:?usage: ncu_tasks.sh OUTDIR [--light]}
light=${2:-}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ "${NCU_DIRECTION:-fwd}" = bwd ]; then
  export GN_ARCH=tasks+bwd; kernels=regex:bwd_task; run=--once-bwd
else
  export GN_ARCH=tasks; kernels=regex:fwd_task; run=--once
fi
sections=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats
  --section WarpStateStats --section SchedulerStats --section InstructionStats)
[ "$light" = "--light" ] || sections+=(--section SourceCounters)
ncu --clock-control none "${sections[@]}" --import-source yes -k "$kernels" -f -o "$out/tasks" \
  python3 scripts/profile_tasks.py "$run" >"$out/ncu_run.log" 2>&1
ncu -i "$out/tasks.ncu-rep" --page details --csv >"$out/details.csv" 2>&1
[ "$light" = "--light" ] || ncu -i "$out/tasks.ncu-rep" --page source --csv --print-source sass >"$out/source_sass.csv" 2>&1
python3 - "$out" <<'PY'
import csv, sys, collections
out = sys.argv[1]
rows = list(csv.DictReader(open(f"{out}/details.csv")))
keep = ("Duration", "DRAM Throughput", "Memory Throughput", "Achieved Occupancy", "Theoretical Occupancy",
        "Registers Per Thread", "Grid Size", "L2 Hit Rate", "Warp Cycles Per Issued Instruction",
        "Executed Ipc Active", "Dynamic Shared Memory Per Block", "Waves Per SM", "Issued Warp Per Scheduler",
        "Executed Instructions")
per = collections.OrderedDict()
for r in rows:
    k = (r.get("ID"), r.get("Kernel Name", "")[:60])
    if r.get("Metric Name") in keep:
        per.setdefault(k, []).append(f"{r['Metric Name']}={r['Metric Value']}{r.get('Metric Unit','')}")
with open(f"{out}/summary.txt", "w") as f:
    for (i, name), vals in per.items():
        f.write(f"[{i}] {name}\n    " + "; ".join(vals) + "\n")
print(open(f"{out}/summary.txt").read())
PY
head -c 400 "$out/source_sass.csv"; echo
[ "$light" = "--light" ] && exit 0
python3 - "$out" <<'PY'
# the 20 SASS lines with the most stall samples per kernel (the source page lists kernels one after another)
import csv, sys, io
out = sys.argv[1]
text = open(f"{out}/source_sass.csv", errors="replace").read()
blocks, cur = [], []
for line in text.splitlines():
    if line.startswith('"Kernel Name"') or line.startswith("Kernel Name") or line.startswith("==PROF"):
        if cur: blocks.append(cur)
        cur = [line]
    else:
        cur.append(line)
if cur: blocks.append(cur)
# (ncu prints each launch's page twice: keep one)
blocks = [b for i, b in enumerate(blocks) if i == 0 or b != blocks[i - 1]]
with open(f"{out}/sass_top.txt", "w") as f:
    for b in blocks:
        head = [l for l in b if not l.startswith('"#"') and not l.startswith('"Address"')][:2]
        start = next((i for i, l in enumerate(b) if l.startswith('"#"') or l.startswith('"Address"')), None)
        if start is None:
            f.write("\n".join(b[:3]) + "\n"); continue
        rows = list(csv.DictReader(io.StringIO("\n".join(b[start:]))))
        if not rows: continue
        key = next((k for k in rows[0] if "Sampling (All" in k), None) or next((k for k in rows[0] if "Sampling" in k), None)
        src = next((k for k in rows[0] if k in ("Source", "SASS")), list(rows[0])[1])
        f.write("\n".join(head) + f"\n  key={key}\n")
        def val(r):
            try: return float(r.get(key) or 0)
            except ValueError: return 0.0
        tot = sum(val(r) for r in rows) or 1
        for r in sorted(rows, key=val, reverse=True)[:20]:
            f.write(f"  {val(r)/tot*100:5.1f}% {r.get(src,'')[:90]}\n")
print(open(f"{out}/sass_top.txt").read()[:6000])
PY
