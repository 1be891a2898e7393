// The task kernels' device primitives: asynchronous copies and their L2 policies, the
// synchronisation words of a task's barrier, programmatic dependent launch, cluster barriers, and
// the optional profiling points and team stagger (gn_tasks.cuh says what a task is).
#pragma once
#include <climits>

#include "gn_kernels.cuh"

namespace gn {

// ---------------------------------------------------------------- asynchronous copies
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Wait until at most `pending` of this thread's most recent copy groups are still in flight.
__device__ __forceinline__ void cp_async_wait(int pending) {
  switch (pending) {
    case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;\n" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;\n" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;\n" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 7;\n" ::: "memory"); break;
  }
}
// The largest `slots` the pipelines support (cp_async_wait's cases + 1); schedule.MAX_SLOTS.
constexpr int kMaxSlots = 8;

// ---------------------------------------------------------------- L2 eviction priorities
// A one launch re-reads each member's overflow (the chunks beyond its slots) newest first right after the
// team's statistics. Plain loads leave nothing of it in L2 by then (H200, benchmarks/micro measurement 4: a
// re-read of 32 MiB ran x1.03 of the first read's speed), so the one launch's stats load the newest of those
// chunks that GnArgs::l2_keep_bytes hold across the launch's blocks with an L2 evict_last policy and its
// other chunks evict_first, and every re-read loads evict_first (the bytes' last use; a hit also demotes a
// kept line). RESULTS.md sessions 47-48 (H200): the one-launch backward of 32x128x256x256 663-682 -> 616-625
// us (unstaggered), 1x512x256x256's one-launch forward 54.3 -> 52.2 us; 32x128x256x256's one-launch forward
// within its spread (370-405 us either way). The two launches' copies carry no hints: kept there (each team's
// last task, where the apply launch starts), the rows lost 1.5-6 %. The hints change where bytes come from,
// never which.
// On by default since session 48 (the GPU suite, the arch sweep's task cases and the sanitizers passed with
// them; the same bits); -DGN_L2_HINTS=0 builds the one launch without them; -DGN_EXP_L2_KEEP_KB=K with them
// and K KB kept whatever GnArgs says.
#ifndef GN_L2_HINTS
#define GN_L2_HINTS 1
#endif
#ifndef GN_EXP_L2_KEEP_KB
#define GN_EXP_L2_KEEP_KB 0
#endif
constexpr bool kL2Hints = GN_L2_HINTS != 0 || GN_EXP_L2_KEEP_KB > 0;

__device__ __forceinline__ int64_t l2_keep_bytes(const GnArgs& a) {
  return GN_EXP_L2_KEEP_KB > 0 ? static_cast<int64_t>(GN_EXP_L2_KEEP_KB) * 1024 : a.l2_keep_bytes;
}

__device__ __forceinline__ void cp_async16_hinted(void* smem, const void* gmem, uint64_t policy) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "l"(policy)
               : "memory");
}

// The evict_first policy: a re-read's (the last use of its bytes), and that of the chunks that go before the
// kept ones.
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t p;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}

// The L2 policies of one member's chunk loads of one task: chunks [keep_lo, keep_hi) evict_last, the others
// evict_first where some are kept (so that they go before the kept ones), else evict_normal. (The policies
// are made where a copy needs one: held in registers, the backward's stats spilled on sm_120.)
struct L2Hints {
  int keep_lo = 0, keep_hi = 0;
  // Whether any chunk gets a policy other than evict_normal: without, the copies go unhinted (the same
  // caching), so a member that re-reads nothing selects no policy and moves none to uniform registers.
  __device__ bool any() const { return keep_lo < keep_hi; }
  __device__ uint64_t of(int q) const {
    uint64_t p;
    if (q >= keep_lo && q < keep_hi) {
      asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
    } else if (keep_lo < keep_hi) {
      p = l2_evict_first();
    } else {
      asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
    }
    return p;
  }
};

// Hints for a member of a one launch whose chunks [0, reread) of the task are read again newest first right
// after its stats, chunks of `chunk_bytes` (x's, and dy's in the backward): the newest of them that
// l2_keep_bytes hold across the launch's blocks are kept (schedule.l2_kept_chunks).
__device__ __forceinline__ L2Hints l2_hints(const GnArgs& a, int reread, int64_t chunk_bytes) {
  L2Hints h;
  // Nothing read again (a member's chunks all stay in their slots: the small shapes): no 64-bit division
  // ahead of the first copy (the same hints). Session 48, H200, 2x1280x16x16's forward, medians of alternating
  // rounds without / with the hints: 11.0 / 11.3 us before this return, 11.05 / 11.24 with it.
  if (reread <= 0) return h;
  const int64_t fit = l2_keep_bytes(a) / (static_cast<int64_t>(gridDim.x) * chunk_bytes);
  h.keep_hi = reread;
  h.keep_lo = static_cast<int>(max(static_cast<int64_t>(0), reread - fit));
  return h;
}

// ---------------------------------------------------------------- synchronisation words
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
// Three words per task: an arrival counter, a flag and a column counter (the one-launch backward counts
// its blocks on task 0's; the two-launch apply counts strip column k's strips on task k's, so its buffer
// has max(tasks, strip columns) triples: bwd_param_sums). The layout does not depend on the launch's task
// count, so a counter word is never a flag word of an earlier launch with other shapes.
// schedule.TaskPlan.sync_words.
//
// Counters are never reset. A launch adds its `expected` arrivals to a word, and the last arriver rounds
// the word up to the next multiple of kGeneration, so every launch starts there. The counter's high bits
// (its generation) then number the launches that used the word: a flag carries its task's generation + 1,
// so a flag left by an earlier launch (or an earlier replay of a captured graph) never satisfies a wait.
// No word needs zeroing again, and no launch-wide epoch (with its fence and atomic at every block's end)
// is needed. schedule.GENERATION_BITS: launches stay below 2**16 blocks.
constexpr int kSyncWordsPerTask = 3;
constexpr int kGenerationBits = 16;
constexpr unsigned kGeneration = 1u << kGenerationBits;
__device__ __forceinline__ unsigned* arrivals(const GnArgs& a, int64_t task) {
  return a.sync + kSyncWordsPerTask * task;
}
__device__ __forceinline__ unsigned* flags(const GnArgs& a, int64_t task) {
  return a.sync + 1 + kSyncWordsPerTask * task;
}
__device__ __forceinline__ unsigned* columns(const GnArgs& a, int64_t task) {
  return a.sync + 2 + kSyncWordsPerTask * task;
}

// One block's arrival (thread 0's view): whether it completed the `expected` arrivals, and the flag
// value of this launch's task (its generation + 1).
struct Arrival {
  bool last;
  unsigned flag;
};

// Counts this block in, after the block's barrier (called by thread 0 only): an acquire-release add, so
// the block's writes are ordered before the count and the last block sees everyone's (the bar.sync +
// one-thread release pattern; a sequentially consistent fence costs more). The last block also rounds
// the counter up to the next generation (a reduction: nobody waits for it).
__device__ __forceinline__ Arrival arrive_thread0(unsigned* counter, unsigned expected) {
  unsigned old;
  asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;\n" : "=r"(old) : "l"(counter) : "memory");
  const bool last = (old & (kGeneration - 1)) == expected - 1;
  if (last) asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;\n" ::"l"(counter), "r"(kGeneration - expected) : "memory");
  return {last, (old >> kGenerationBits) + 1};
}

// The same, with `last` in every thread (the flag value in thread 0's `flag`, when given).
__device__ __forceinline__ bool arrive(unsigned* counter, unsigned expected, unsigned* flag = nullptr) {
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {  // after the barrier above
    const Arrival got = arrive_thread0(counter, expected);
    last = got.last;
    if (flag != nullptr) *flag = got.flag;
  }
  __syncthreads();
  return last;
}

// ---------------------------------------------------------------- programmatic dependent launch
// The two-launch schedules' apply launch may start while its stats launch still runs (GnArgs::
// dependent_launch, sm_90): each stats block lets it in as it starts, and the apply waits for the
// stats launch's completion (and its writes) before it reads anything that launch wrote. Without the
// launch attribute both are no-ops; builds below sm_90 (the compute_80 PTX too) never set it.
__device__ __forceinline__ void let_dependents_in() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_prerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// ---------------------------------------------------------------- thread-block clusters
// Every thread of the cluster arrives (releasing its writes, global memory included, at cluster scope)
// and waits for all of them (acquiring theirs): the hardware barrier of a cluster team (sm_90 code only;
// GnArgs::cluster_teams is never set for builds below sm_90).
__device__ __forceinline__ void cluster_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}


// ---------------------------------------------------------------- profiling
// Optional phase timeline (GnArgs::trace, scripts/profile_tasks.py --trace): thread 0 of each block
// records clock64() at numbered points; one null check per point when off. Built with
// -DGN_TRACE_TIMELINE (scripts/launch_timeline.py) it records %globaltimer instead (ns, one clock for
// every SM, so blocks compare), and the two-launch forward's kernels trace their launch's timeline.
constexpr int kTracePoints = 16;
// The GPU's global timer in ns (the same clock on every SM; any arch has it).
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}
__device__ __forceinline__ void trace_point(const GnArgs& a, int point) {
  if (a.trace != nullptr && threadIdx.x == 0 && point < kTracePoints) {
#ifdef GN_TRACE_TIMELINE
    const int64_t now = static_cast<int64_t>(global_ns());
#else
    const int64_t now = clock64();
#endif
    a.trace[static_cast<int64_t>(blockIdx.x) * kTracePoints + point] = now;
  }
}
#ifdef GN_TRACE_TIMELINE
constexpr bool kTimeline = true;
#else
constexpr bool kTimeline = false;
#endif
// Built with -DGN_TRACE_PROLOGUE, a one-round one-launch forward also traces its prologue (scripts/
// profile_tasks.py --trace): 9 its team, member and tiles known, 10 its shift loads issued (then 5, its
// first copies issued). Several-round launches use 9 and 10 for round 2.
#ifdef GN_TRACE_PROLOGUE
constexpr bool kTracePrologue = true;
#else
constexpr bool kTracePrologue = false;
#endif

// The one-launch kernels' team stagger (GnArgs::stagger_ns; schedule.team_stagger): a team's late start,
// a sleep on the global timer (ns), which any arch has. Thread 0 sleeps, the block waits at the barrier.
__device__ __forceinline__ void stagger_start(const GnArgs& a, int team) {
  if (a.stagger_ns <= 0 || a.stagger_phases <= 1) return;
  const int64_t delay = static_cast<int64_t>(team % a.stagger_phases) * a.stagger_ns;
  if (delay > 0 && threadIdx.x == 0) {
    const uint64_t start = global_ns();
    do {
      __nanosleep(256);
    } while (global_ns() - start < static_cast<uint64_t>(delay));
  }
  __syncthreads();
}

// The experiment -DGN_EXP_WARM_PARAMS=1 (off by default): each task kernel first loads one field of every
// 64-byte line of GnArgs its prologue reads, all at once, so their constant-cache misses overlap. The
// default sm_90 prologue of fwd_task_onepass first touches two of its six lines after the stagger's
// barrier, behind loads of the others (RESULTS.md session 42): the small shapes spend 1.2-2.0 us before
// their first copy. The fields meet in a condition the compiler cannot decide (x is never null, the others
// are not negative, so the sum is never 0), which keeps the loads. H200, session 44: no measurable gain.
#ifndef GN_EXP_WARM_PARAMS
#define GN_EXP_WARM_PARAMS 0
#endif
__device__ __forceinline__ void warm_params(const GnArgs& a) {
  if constexpr (GN_EXP_WARM_PARAMS != 0) {
    const uint64_t sum = reinterpret_cast<uintptr_t>(a.x) + static_cast<uint64_t>(a.s) +
                         static_cast<uint64_t>(a.rows_per_tile) + static_cast<uint64_t>(a.slots) +
                         static_cast<uint64_t>(a.window) + a.team_size_mul;
    if (sum == 0) asm volatile("membar.cta;" ::: "memory");
  }
}

}  // namespace gn
