#!/usr/bin/env bash
# Kernel experiments in one GPU call, about 8 minutes on an H200 (csrc experiments, off by default but pairedfwd):
# the builds of FUSED_VARIANTS (default "default fused paired"), built at once:
#   oldfwd    -DGN_FWD_FUSED_APPLY=0 -DGN_SILU_PAIRED_RCP=0: the forward's 16-bit apply as before session 66
#             ((x - mean) * scale + beta, one MUFU.RCP per SiLU element; the default since then is pairedfwd's)
#   fwdapply  -DGN_FWD_FUSED_APPLY=1      the forward's z = x * scale + (beta - mean * scale), 16-bit x
#   bwdapply  -DGN_EXP_FUSED_BWD_APPLY=1  the backward's dx and z from x itself, 16-bit x
#   bwdstats  -DGN_EXP_FUSED_BWD_STATS=1  the backward's stats without a per-element rstd multiply
#   fused     all three
#   paired    fused and -DGN_SILU_PAIRED_RCP=1 (16-bit SiLU loops: two sigmoids per MUFU.RCP)
#   pairedfwd fwdapply and -DGN_SILU_PAIRED_RCP=2 (the forward's 16-bit SiLU apply only; the backward's
#             kernels are the default's; the default build since session 66)
#   bf16words -DGN_EXP_BF16_WORDS=1: bfloat16 elements converted from their 32-bit words (the same bits)
#   fullrows  -DGN_EXP_FULL_ROWS=1: a chunk's rows in one straight-line block where all are in range (the
#             backward's stats loop, the forward's apply, the one launch's dx loop; the same bits)
#   fullrows2 -DGN_EXP_FULL_ROWS=2: the same in the two launches' loops only (the one launch's are default's)
#   l2keepM   -DGN_EXP_L2_KEEP_KB=M*1024: the chunks an apply re-reads soon loaded evict_last, about M MiB
#             of them per launch, the one launch's other chunk loads evict_first (gn_task_primitives.cuh
#             l2_hints), whatever GnArgs.l2_keep_bytes (schedule.l2_keep_bytes: a share of the L2) says
#   l2        -DGN_L2_HINTS=1: the one launch's copies with the L2 hints (the default build since session 48)
#   nol2      -DGN_L2_HINTS=0: the copies without L2 hints (the default build until session 48)
#   A+B       the flags of both (e.g. paired+l2keep24)
# In order: times the large, mid and small rows of each, both directions, in alternating rounds (fp16
# FUSED_ROUNDS times, bf16 once); digests the outputs of each variant made of l2keep parts only against
# default's (scripts/bits_digest.py: the same bits); times one launch against two under the l2keep builds;
# writes OUT/compare.md (each build's rounds, its median over the first variant's); runs the forward and
# backward GPU tests under the last variant (fp64 references, bitwise equality across caps and schedules,
# activations, clusters, rounds, autocast), the bundled NaN probes, and the NaN tests against the planted
# act-relu-nan-lost (they must go red); then, with FUSED_NCU=1, Nsight Compute on the 16-bit forward's apply
# launch of default and the last variant (pipe utilization, warp stalls, L2 hit rate). Logs under OUT, the
# lines to read in OUT/summary.txt.
#   bash scripts/fused_apply_check.sh OUT
# Environment: FUSED_VARIANTS, FUSED_SHAPES (time_shapes.py's), FUSED_DIRECTIONS (the timed rounds' directions,
# default fwd,bwd), FUSED_PASSES_SHAPES (the l2keep builds' one launch against two), FUSED_ROUNDS (default 2),
# FUSED_SKIP_TESTS=1, FUSED_BITS_PASSES (bits_digest.py --passes), FUSED_NCU=1,
# FUSED_NCU_SHAPE (default 1x128x1024x1024:silu), FUSED_NCU_FLAGS,
# FUSED_NCU_KERNEL (the profiled kernel's name pattern, default fwd_task_apply),
# FUSED_STAGGERS (default 16000:2: the staggered one launches' GN_TEAM_STAGGER values), FUSED_BUDGET_S (default
# 540: a step that would likely end past it is skipped and says so, so that one GPU call of 600 s keeps its logs).
set -uo pipefail
# shellcheck source=scripts/gpu_call.sh
source "$(dirname "$0")/gpu_call.sh"
gpu_call_setup fused_apply_check.sh "${1:-}"
flag_of() {
  local all="-DGN_FWD_FUSED_APPLY=1 -DGN_EXP_FUSED_BWD_APPLY=1 -DGN_EXP_FUSED_BWD_STATS=1"
  case $1 in
    default) echo "" ;;
    oldfwd) echo "-DGN_FWD_FUSED_APPLY=0 -DGN_SILU_PAIRED_RCP=0" ;;
    fwdapply) echo "-DGN_FWD_FUSED_APPLY=1" ;;
    bwdapply) echo "-DGN_EXP_FUSED_BWD_APPLY=1" ;;
    bwdstats) echo "-DGN_EXP_FUSED_BWD_STATS=1" ;;
    fused) echo "$all" ;;
    paired) echo "$all -DGN_SILU_PAIRED_RCP=1" ;;
    pairedfwd) echo "-DGN_FWD_FUSED_APPLY=1 -DGN_SILU_PAIRED_RCP=2" ;;
    bf16words) echo "-DGN_EXP_BF16_WORDS=1" ;;
    fullrows) echo "-DGN_EXP_FULL_ROWS=1" ;;
    fullrows2) echo "-DGN_EXP_FULL_ROWS=2" ;;
    l2keep[0-9]*) echo "-DGN_EXP_L2_KEEP_KB=$(( ${1#l2keep} * 1024 ))" ;;
    l2) echo "-DGN_L2_HINTS=1" ;;
    nol2) echo "-DGN_L2_HINTS=0" ;;
    *) echo "unknown variant $1" >&2; return 1 ;;
  esac
}
flags_of() {  # a variant's flags; A+B joins two variants'
  local part flags=""
  for part in ${1//+/ }; do
    flags="$flags $(flag_of "$part")" || return 1
  done
  echo "${flags# }"
}
variants=${FUSED_VARIANTS:-default fused paired}
last=${variants##* }
shapes=${FUSED_SHAPES:-"1x128x1024x1024:silu 1x256x512x512:silu 1x128x16x256x256:silu 1x512x256x256:silu 1x128x1024x2048:G16
32x128x256x256 1x512x128x128:silu 2x320x64x64:silu 2x1280x16x16:silu"}
status=0
started=$(date +%s)
# Whether `need` more seconds fit in FUSED_BUDGET_S; else a line in the summary and false.
fits() {
  local left=$(( ${FUSED_BUDGET_S:-540} - ($(date +%s) - started) ))
  [ "$left" -ge "$1" ] && return 0
  step "skipped ($2): ${left} s of the budget left, it needs about $1"
  return 1
}

step "builds: $variants"
for v in $variants; do
  GN_NVCC_FLAGS="$(flags_of "$v")" build_native "$v"
done
wait
# shellcheck disable=SC2086  # (the variants are separate arguments)
builds_done $variants

for round in $(seq "${FUSED_ROUNDS:-2}"); do
  dts=fp16
  [ "$round" = 1 ] && dts="fp16 bf16"
  for dt in $dts; do
    for v in $variants; do
      fits 40 "$dt, $v, round $round" || continue
      step "$dt, $v, round $round"
      # shellcheck disable=SC2086  # (the shapes are separate arguments)
      GN_NVCC_FLAGS="$(flags_of "$v")" timeout 150 python3 scripts/time_shapes.py $shapes --dtype $dt \
        --directions "${FUSED_DIRECTIONS:-fwd,bwd}" --json "$out/${dt}_${v}_$round.json" \
        >"$out/${dt}_${v}_$round.log" 2>&1 || status=1
      rows "$out/${dt}_${v}_$round.log"
    done
  done
done

# The L2 hints choose where bytes come from, never which, bf16words converts exactly and fullrows only
# schedules: the builds that change only those (l2keepM, l2, nol2, bf16words, fullrows, fullrows2) must give
# default's bits (FUSED_BITS_PASSES=2 digests the two-launch schedules instead of auto's pick).
for v in $variants; do
  case "+$v+" in *+l2keep*|*+l2+*|*+nol2+*|*+bf16words+*|*+fullrows+*|*+fullrows2+*) ;; *) continue ;; esac
  [ -n "$(echo "+$v+" | sed -E 's/\+(l2keep[0-9]+|l2|nol2|bf16words|fullrows2?)//g; s/\+//g')" ] && continue  # (other flags change bits)
  fits 60 "bits of $v" || continue
  step "bits: default against $v (scripts/bits_digest.py, 32x128x256x256 included: one launch re-reading)"
  for b in default "$v"; do
    [ -s "$out/bits_$b.log" ] && continue  # (default's, once)
    GN_NVCC_FLAGS="$(flags_of "$b")" timeout 120 python3 scripts/bits_digest.py --passes "${FUSED_BITS_PASSES:-auto}" \
      --shapes 2x320x64x64,2x1280x16x16,1x512x128x128,1x512x256x256,32x128x256x256,3x96x17x19 \
      >"$out/bits_$b.log" 2>"$out/bits_$b.err" || status=1  # (stderr: a first run's build messages)
  done
  if cmp -s "$out/bits_default.log" "$out/bits_$v.log"; then
    step "bits of $v: the same as default ($(tail -n 1 "$out/bits_default.log"))"
  else
    step "bits of $v: DIFFERENT from default"; status=1
    diff "$out/bits_default.log" "$out/bits_$v.log" | head -n 8 >>"$out/summary.txt"
  fi
done

# With the L2 hints a one launch re-reads its overflow from L2 for the most part: the rows whose one launch
# re-reads (1x512x256x256: 10 of 16 chunks a member, 32x128x256x256: rounds; the backward's one launch is
# GN_ARCH=tasks+bwd1's, 2 teams of 128 over 16 rounds there), one launch against two, per variant with l2keep.
passes_builds=""
for v in $variants; do
  case "+$v+" in *+l2keep*|*+l2+*|*+nol2+*) passes_builds="$passes_builds $v" ;; esac
done
if [ -n "$passes_builds" ]; then
  for b in default $passes_builds; do
    fits 60 "passes 1 and 2 of $b" || continue
    step "one launch against two, $b (GN_ARCH=tasks+bwd1)"
    # shellcheck disable=SC2086  # (the shapes are separate arguments)
    GN_ARCH=tasks+bwd1 GN_NVCC_FLAGS="$(flags_of "$b")" timeout 120 python3 scripts/time_shapes.py \
      ${FUSED_PASSES_SHAPES:-1x512x256x256:silu 32x128x256x256} --dtype fp16 --directions fwd,bwd --passes 2,1 \
      --json "$out/passes_$b.json" >"$out/passes_$b.log" 2>&1 || status=1
    rows "$out/passes_$b.log"
    # the backward's one launch there has 2 teams, too few for the automatic stagger: half a round of the
    # model's (about 30 us at copy speed), as session 20 found best for the forward's 4 teams (16 us, 2 phases);
    # FUSED_STAGGERS sweeps (session 47: with the L2 hints 16 us beat the automatic 13.8 by 17 us)
    for st in ${FUSED_STAGGERS:-16000:2}; do
      fits 40 "the one launch of $b staggered $st" || continue
      tag=$b; [ "$st" = 16000:2 ] || tag="${b}_${st/:/_}"
      GN_TEAM_STAGGER=$st GN_ARCH=tasks+bwd1 GN_NVCC_FLAGS="$(flags_of "$b")" timeout 90 python3 \
        scripts/time_shapes.py 32x128x256x256 --dtype fp16 --directions fwd,bwd --passes 1 \
        --json "$out/passes_staggered_$tag.json" >"$out/passes_staggered_$tag.log" 2>&1 || status=1
      rows "$out/passes_staggered_$tag.log"
    done
  done
fi

step "the builds side by side (scripts/compare_timings.py: rounds, median / default's)"
python3 scripts/compare_timings.py --dir "$out" --baseline "${variants%% *}" >"$out/compare.md" 2>&1 || status=1
cat "$out/compare.md" >>"$out/summary.txt"

if [ -z "${FUSED_SKIP_TESTS:-}" ] && fits 180 "the GPU tests"; then
  step "the forward's and backward's GPU tests under $last"
  GN_NVCC_FLAGS="$(flags_of "$last")" timeout 170 python3 -m pytest -q -p xdist -n 8 tests/gpu/test_kernels.py tests/gpu/test_acts.py \
    tests/gpu/test_cluster_teams.py tests/gpu/test_onepass_rounds.py tests/gpu/test_autocast_wide.py \
    tests/gpu/test_task_backward.py tests/gpu/test_task_backward_onepass.py \
    >"$out/tests_fused.log" 2>&1 || status=1
  tail -n 3 "$out/tests_fused.log" >>"$out/summary.txt"
fi
if [ -z "${FUSED_SKIP_TESTS:-}" ] && fits 30 "the NaN probes"; then
  step "the bundled suite's NaN probes under $last"
  # shellcheck disable=SC2046  # (plugin_opt: zero or two words; a fresh machine has no entry point: session 65)
  GN_NVCC_FLAGS="$(flags_of "$last")" timeout 120 python3 -m pytest -q -p xdist -n 8 $(plugin_opt) \
    --pyargs pytest_gn.suite -k nan \
    >"$out/tests_nan.log" 2>&1 || status=1
  tail -n 2 "$out/tests_nan.log" >>"$out/summary.txt"
fi

if [ -z "${FUSED_SKIP_TESTS:-}" ] && fits 60 "the planted ReLU"; then
  step "planted act-relu-nan-lost (fmaxf: a NaN becomes 0): the NaN tests must go red"
  GN_CSRC_DIR="$(python3 scripts/plant_bug.py act-relu-nan-lost)" timeout 90 python3 -m pytest -q -p xdist -n 8 \
    tests/gpu/test_acts.py -k "relu and (nan or extreme)" >"$out/tests_planted_relu.log" 2>&1
  tail -n 2 "$out/tests_planted_relu.log" >>"$out/summary.txt"
fi

if [ -n "${FUSED_NCU:-}" ] && command -v ncu >/dev/null && fits 120 "ncu"; then
  # For the l2keep builds' L2 hit rate: FUSED_NCU_SHAPE=1x512x256x256:silu and FUSED_NCU_FLAGS="--cache-control
  # none --replay-mode application" (ncu flushes the caches before each kernel and replays it by default, which
  # would hide what the stats launch left in L2)
  export GN_PROFILE_SHAPES=${FUSED_NCU_SHAPE:-1x128x1024x1024:silu}
  # warp cycles per issued instruction by stall reason (the WarpStateStats section's chart, as numbers)
  stall_metrics=$(printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' no_instruction long_scoreboard \
    short_scoreboard barrier wait math_pipe_throttle mio_throttle lg_throttle branch_resolving not_selected selected \
    dispatch_stall membar sleeping drain imc_miss)
  stall_metrics=${stall_metrics%,}
  kernel=${FUSED_NCU_KERNEL:-fwd_task_apply}
  for v in default "$last"; do
    step "ncu: the fp16 forward's $kernel launch ($GN_PROFILE_SHAPES), $v"
    # shellcheck disable=SC2086  # (FUSED_NCU_FLAGS: separate options)
    GN_NVCC_FLAGS="$(flags_of "$v")" timeout 150 ncu --clock-control none ${FUSED_NCU_FLAGS:-} -k "regex:$kernel" --section SpeedOfLight \
      --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section InstructionStats \
      --section MemoryWorkloadAnalysis --metrics "$stall_metrics" \
      --csv --page details python3 scripts/profile_tasks.py --once >"$out/ncu_$v.csv" 2>"$out/ncu_$v.err" || status=1
    grep -E '"(Duration|DRAM Throughput|L2 Hit Rate|Issue Slots Busy|Issued Warp Per Scheduler|Executed Ipc Active|Warp Cycles Per Issued Instruction|Executed Instructions|Achieved Occupancy|smsp__average_warps_issue_stalled_[a-z_]+_per_issue_active.ratio)"' \
      "$out/ncu_$v.csv" | awk -F'","' '{print $(NF-2), $(NF-1), $NF}' >>"$out/summary.txt"
  done
  unset GN_PROFILE_SHAPES
fi
gpu_call_done $status
