#!/usr/bin/env bash
# One GPU call that decides whether a candidate tree (a `git archive` of a branch) replaces this one
# (about 8 minutes on an H200): builds both trees' default kernels at once, runs the one-launch forward's
# GPU tests from the candidate, then times the forward of both trees in alternating rounds (`auto`, one
# launch and two; time_shapes.py: CUDA events, L2 flushed, medians, SOL against the copy measured in the
# same run; the trees' order alternates by round, so neither always runs first), and last runs the
# candidate's plugin task cases (the overflow cases of its schedule). Optional parts: `suite` (the candidate's
# whole GPU suite) and `bits` (bits_digest.py in both trees: the same lines, or it says DIFFER).
# Logs in OUT/logs.tgz, the lines to read in OUT/summary.txt.
#   git archive exp/streamed-on-chip | tar -x -C .ab/cand   (here, before the call)
#   bash scripts/tree_ab_check.sh OUT .ab/cand
# Environment: AB_TIME_SHAPES (time_shapes.py specs, space-separated), AB_ROUNDS (default 2),
# AB_PARTS (default "tests time cases"; also "suite", "bits"), AB_DIRECTIONS (default fwd; "fwd,bwd" for a
# backward change), AB_PASSES (time_shapes.py --passes; default auto,1,2 in round 1 and auto after).
set -uo pipefail
# shellcheck source=scripts/gpu_call.sh
source "$(dirname "$0")/gpu_call.sh"
gpu_call_setup tree_ab_check.sh "${1:-}"
cand=$(cd "${2:?usage: tree_ab_check.sh OUT CANDIDATE_TREE}" && pwd) || exit 1
here=$(pwd)
# the rows the on-chip tiles and the streamed rounds change, and 1x128x1024x2048 (a single 512 MiB task) as
# the control that neither touches
shapes=${AB_TIME_SHAPES:-"32x128x256x256 1x512x256x256:silu 4x256x256x256:silu 16x256x128x128 4x128x256x256 64x128x128x128 1x128x1024x2048:G16"}
parts=" ${AB_PARTS:-tests time cases} "
want() { [[ $parts == *" $1 "* ]]; }
status=0
in_tree() { (cd "$1" && shift && PYTHONPATH="$(pwd)/src:$(pwd)" "$@"); }

step "builds: this tree ($here) and the candidate ($cand)"
build_native here  # (gpu_call_setup put this tree on PYTHONPATH)
PYTHONPATH="$cand/src:$cand" build_native cand  # (the candidate's package, so its csrc)
wait
builds_done here cand

if want tests; then
  step "the candidate's GPU tests"
  in_tree "$cand" timeout 240 python3 -m pytest -q -p xdist -n 8 tests/gpu/test_onepass_rounds.py \
    tests/gpu/test_kernels.py tests/gpu/test_task_sync.py tests/gpu/test_team_stagger.py \
    >"$out/tests_cand.log" 2>&1 || status=1
  tail -n 2 "$out/tests_cand.log" >>"$out/summary.txt"
fi

if want suite; then
  step "the candidate's GPU suite"
  # shellcheck disable=SC2046  # (plugin_opt: zero or two words)
  in_tree "$cand" timeout 300 python3 -m pytest -q -p no:cacheprovider -p xdist -n 8 $(plugin_opt) tests/gpu \
    >"$out/suite_cand.log" 2>&1 || status=1
  tail -n 2 "$out/suite_cand.log" >>"$out/summary.txt"
  grep -E "^FAILED|^ERROR" "$out/suite_cand.log" | head -20 >>"$out/summary.txt"
fi

if want bits; then
  step "bits: this tree and the candidate"
  digest="--acts silu,none --shapes 2x1280x16x16,2x640x32x32,16x256x16x16,1x512x128x128,3x96x17x19"
  for name in here cand; do
    tree=$here && [ $name = cand ] && tree=$cand
    # (a fresh machine's first run also prints the autograd node's build: not a digest line)
    # shellcheck disable=SC2086  # (separate arguments)
    in_tree "$tree" timeout 120 python3 "$tree/scripts/bits_digest.py" $digest 2>&1 | grep -v "^gn_module:" \
      >"$out/bits_$name.log" || status=1
  done
  if cmp -s "$out/bits_here.log" "$out/bits_cand.log"; then
    echo "bits: the same ($(wc -l <"$out/bits_here.log") lines)" >>"$out/summary.txt"
  else
    echo "bits: DIFFER" >>"$out/summary.txt"
    diff "$out/bits_here.log" "$out/bits_cand.log" | head -20 >>"$out/summary.txt"
    status=1
  fi
fi

for round in $(seq "${AB_ROUNDS:-2}"); do
  want time || break
  order="here cand" && [ $((round % 2)) = 0 ] && order="cand here"
  for name in $order; do
    tree=$here && [ "$name" = cand ] && tree=$cand
    passes=auto && [ "$round" = 1 ] && passes=auto,1,2
    passes=${AB_PASSES:-$passes}
    step "${AB_DIRECTIONS:-fwd}, $name, round $round (--passes $passes)"
    # shellcheck disable=SC2086  # (the shapes are separate arguments)
    in_tree "$tree" timeout 150 python3 "$tree/scripts/time_shapes.py" $shapes --directions "${AB_DIRECTIONS:-fwd}" --passes $passes \
      --json "$out/ts_${name}_$round.json" >"$out/ts_${name}_$round.log" 2>&1 || status=1
    rows "$out/ts_${name}_$round.log"
  done
done

if want cases; then
  step "the candidate's plugin task cases (--gn-arch tasks)"
  # shellcheck disable=SC2046  # (plugin_opt: zero or two words)
  in_tree "$cand" timeout 300 python3 -m pytest -q -p xdist -n 8 $(plugin_opt) --gn-arch tasks --pyargs pytest_gn.suite \
    >"$out/cases_cand.log" 2>&1 || status=1
  tail -n 2 "$out/cases_cand.log" >>"$out/summary.txt"
fi
gpu_call_done $status
