#!/usr/bin/env bash
# compute-sanitizer's four tools over scripts/sanitize_workload.py; prints one summary line per tool.
# Usage: [SANITIZE_TOOLS="memcheck ..."] bash scripts/sanitize.sh [LOGDIR]
# GN_ARCH in the environment picks the kernels the workload runs (tasks, tasks+bwd, tasks+bwd1).
set -uo pipefail
out=${1:-sanitize-logs}
mkdir -p "$out"
python3 -c "import torch; from gn_module import build; build.load(None, torch.cuda.get_device_capability())"
status=0
for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}; do
  # Only our kernels are checked (torch's own are not ours to fix), except by initcheck: it must see
  # torch's kernels write the inputs, or it reports every input read as uninitialized.
  filter=(--kernel-name kns=_ZN2gn)
  [ "$tool" = initcheck ] && filter=()
  compute-sanitizer --tool "$tool" "${filter[@]}" --error-exitcode 9 \
    python3 scripts/sanitize_workload.py >"$out/$tool.log" 2>&1
  rc=$?
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/$tool.log" | tail -n 1)
  echo "$tool: exit $rc; ${summary:-no summary line}; $(grep -c 'all results correct' "$out/$tool.log") workload pass"
  [ "$rc" -eq 0 ] || status=1
done
exit $status
