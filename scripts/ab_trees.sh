#!/usr/bin/env bash
# A/B of kernel trees on the same GPU in one call: for each exported tree (git archive of a commit or
# branch), the backward benchmark of the small shapes and the backward trace, logs under OUT/<name>.
# AB_DIRECTION=fwd: the forward benchmark and the two-launch forward's launch times instead.
#   bash scripts/ab_trees.sh OUT main=.clean exp=.clean_exp exp1=.clean_exp@tasks+bwd1
# TREE@ARCH runs that tree under GN_ARCH=ARCH (else the environment's). Under tasks+bwd1 the trace shows
# the one-launch kernel's phases for the shapes that take it. TREE%PLANTING (after
# any @ARCH) runs that tree's kernels with a planting of its scripts/plant_bug.py (GN_CSRC_DIR), e.g.
# the timing experiment timing-bwd-no-param-sums. TREE+VAR=VALUE (last, repeatable) runs that tree with
# the variable set, e.g. off=.clean+GN_CLUSTER_TEAMS=0 (a launch option turned off).
# Each tree builds its own library (the build cache is keyed by the sources), and runs from its own
# src/ (PYTHONPATH), so the trees may differ in csrc/ and in Python.
set -uo pipefail
out=${1:?usage: ab_trees.sh OUT NAME=TREE [NAME=TREE ...]}
shift
mkdir -p "$out" && out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1
# AB_SHAPES: names of `gn_module.bench`'s shapes (substrings); a shape it does not have is an error.
SHAPES=${AB_SHAPES:-2x320x64x64,2x640x32x32,2x1280x16x16,1x512x128x128}
DIRECTION=${AB_DIRECTION:-bwd}
case $DIRECTION in
  bwd) profile=--trace-bwd ;;
  fwd) profile=--launches-fwd ;;
  *) echo "AB_DIRECTION must be fwd or bwd, got $DIRECTION" >&2; exit 2 ;;
esac
status=0
env_arch=${GN_ARCH-}
for pair in "$@"; do
  name=${pair%%=*}
  spec=${pair#*=}
  arch= planting=
  envs=()
  if [[ $spec == *+* ]]; then
    IFS='+' read -r -a parts <<<"$spec"
    spec=${parts[0]}
    envs=("${parts[@]:1}")
  fi
  if [[ $spec == *%* ]]; then planting=${spec#*%}; spec=${spec%%\%*}; fi
  if [[ $spec == *@* ]]; then arch=${spec#*@}; spec=${spec%%@*}; fi
  tree=$(cd "$spec" && pwd) || exit 1
  unset GN_CSRC_DIR
  if [ -n "$planting" ]; then
    GN_CSRC_DIR=$(python3 "$tree/scripts/plant_bug.py" "$planting") || exit 1
    export GN_CSRC_DIR
  fi
  arch=${arch:-$env_arch}
  if [ -n "$arch" ]; then export GN_ARCH=$arch; else unset GN_ARCH; fi
  mkdir -p "$out/$name"
  echo "== $name ($tree${arch:+, GN_ARCH=$arch}${planting:+, planted $planting}${envs[*]:+, ${envs[*]}})" \
    | tee -a "$out/summary.txt"
  (cd "$tree" && env "${envs[@]}" PYTHONPATH="$tree/src:$tree" python3 -m gn_module.bench --shapes "$SHAPES" --dtypes fp16 \
    --directions "$DIRECTION" --impls ours-auto --reps 50 --max-seconds 0.2 --json "$out/$name/bench.json" \
    --markdown "$out/$name/bench.md" >"$out/$name/bench.log" 2>&1) || status=1
  grep -E "^\| " "$out/$name/bench.md" | tee -a "$out/summary.txt"
  (cd "$tree" && env "${envs[@]}" PYTHONPATH="$tree/src:$tree" python3 scripts/profile_tasks.py "$profile" \
    >"$out/$name/profile.log" 2>&1) || status=1
  cat "$out/$name/profile.log" >>"$out/summary.txt"
done
exit $status
