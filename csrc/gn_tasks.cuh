// The task architecture (GnArgs::arch == 2): device functions shared by its one-pass and two-pass
// kernels.
//
// A task is one sample times one channel window of `window` channels that holds whole groups, so
// statistics never cross tasks. Its rows are cut into tiles, the reduction units (the tiling
// depends on shape and dtype only), and each tile streams through shared memory in chunks of
// `chunk_rows` rows. A block ("member") reduces a contiguous range of a task's tiles into one
// partial per (group, tile); when every tile of the task has its partial, the last arriving
// block combines them in a fixed order into mean and rstd. The one-pass kernel keeps the last
// `slots` chunks of each member in shared memory across that wait and applies them from there,
// re-reading only the chunks it could not keep (the overflow); the two-pass kernels re-read all.
//
// Which block reduces which tile, how many blocks share a task, and which chunks stay on chip
// change nothing in the arithmetic: each tile's partial is the same function of its rows, and
// the combine sums tile partials in tile order. Results are bitwise identical across residency
// caps, devices with other shared-memory sizes, and the two schedules.
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

// ---------------------------------------------------------------- L2 eviction priorities (experiment)
// -DGN_EXP_L2_KEEP_KB=K (0 by default: no cache hints, the default code): the chunks an apply reads
// again soon after a member's stats are loaded with an L2 evict_last policy and every other chunk load
// with evict_first, so that about K KB of them per launch are still in L2 when they are read again.
// Without hints nothing stays: on the H200 a plain re-read of 32 MiB right after the first read ran at
// x1.03 of its speed, against x1.8-1.9 up to 32 MiB read evict_last and re-read evict_first, and x1.79 at
// 24 MiB with as many bytes written in between (RESULTS.md, design measurements; benchmarks/micro
// measurement 4). Which chunks: a one launch re-reads a member's overflow newest first right after the
// team's statistics; two launches re-read everything, the apply launch starting with each team's last
// task and each member's last chunk. The hints change where bytes come from, never which bytes.
#ifndef GN_EXP_L2_KEEP_KB
#define GN_EXP_L2_KEEP_KB 0
#endif
constexpr int kL2KeepKB = GN_EXP_L2_KEEP_KB;

__device__ __forceinline__ void cp_async16_hinted(void* smem, const void* gmem, uint64_t policy) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "l"(policy)
               : "memory");
}

// The evict_first policy: a re-read's (the last use of its bytes; a hit also demotes a kept line, so none
// outlives its re-read), and that of the chunks that go before the kept ones.
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t p = 0;
  if constexpr (kL2KeepKB > 0) asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}

// The L2 policies of one member's chunk loads of one task: chunks [keep_lo, keep_hi) evict_last, the others
// evict_first where some are kept (so that they go before the kept ones), else evict_normal. (The policies
// are made where a copy needs one: held in registers, the backward's stats spilled on sm_120.)
struct L2Hints {
  int keep_lo = 0, keep_hi = 0;
  __device__ uint64_t of(int q) const {
    uint64_t p = 0;
    if constexpr (kL2KeepKB > 0) {
      if (q >= keep_lo && q < keep_hi) {
        asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
      } else if (keep_lo < keep_hi) {
        p = l2_evict_first();
      } else {
        asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
      }
    }
    return p;
  }
};

// Hints for a member whose chunks [0, reread) of the task are read again newest first soon after
// (soon_reread), chunks of `chunk_bytes` (x's, and dy's in the backward): the newest of them that K KB
// hold across the launch's blocks are kept.
__device__ __forceinline__ L2Hints l2_hints(int reread, int64_t chunk_bytes) {
  L2Hints h;
  if constexpr (kL2KeepKB > 0) {
    const int64_t fit = static_cast<int64_t>(kL2KeepKB) * 1024 / (static_cast<int64_t>(gridDim.x) * chunk_bytes);
    h.keep_hi = reread;
    h.keep_lo = static_cast<int>(max(static_cast<int64_t>(0), reread - fit));
  }
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
// Three words per task: an arrival counter, a flag and a column counter (the backward's launches count
// their blocks on task 0's). The layout does not depend on the launch's task count, so a counter word is
// never a flag word of an earlier launch with other shapes. schedule.TaskPlan.sync_words.
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

// ---------------------------------------------------------------- task geometry
// Divisions come precomputed from the schedule (GnArgs' derived fields) or are 32-bit: a 64-bit
// division is a long dependent call, and a block's prologue had several before its first copy
// (schedule.task_tiling keeps tasks, tiles and rows per tile below 2**31, so these fit).
// n / d for 0 <= n < 2**31 and a divisor d whose (mul, shift) GnArgs carries (schedule.fast_divisor).
__device__ __forceinline__ int fast_div(int n, uint32_t mul, uint32_t shift) {
  const unsigned u = static_cast<unsigned>(n);
  return static_cast<int>((__umulhi(u, mul) + u) >> shift);
}
// Whether a warp holds whole rows of a chunk (32 % cols_threads == 0: fold_channels folds its rows first).
__device__ __forceinline__ bool warp_holds_rows(const GnArgs& a) {
  return fast_div(32, a.cols_threads_mul, a.cols_threads_shift) * a.cols_threads == 32;
}
__device__ __forceinline__ int windows_per_sample(const GnArgs& a) { return a.windows_per_sample; }
__device__ __forceinline__ int64_t task_count(const GnArgs& a) { return a.n * windows_per_sample(a); }
__device__ __forceinline__ int64_t task_sample(const GnArgs& a, int64_t task) {
  return fast_div(static_cast<int>(task), a.windows_per_sample_mul, a.windows_per_sample_shift);
}
__device__ __forceinline__ int64_t task_c0(const GnArgs& a, int64_t task) {
  const int t = static_cast<int>(task);
  return static_cast<int64_t>(t - static_cast<int>(task_sample(a, task)) * windows_per_sample(a)) * a.window;
}
__device__ __forceinline__ int channels_per_group(const GnArgs& a) { return a.channels_per_group; }
// c / channels_per_group for a channel offset 0 <= c < 2**31
__device__ __forceinline__ int group_of(const GnArgs& a, int c) {
  return fast_div(c, a.channels_per_group_mul, a.channels_per_group_shift);
}
__device__ __forceinline__ int groups_per_window(const GnArgs& a) { return a.groups_per_window; }
// A block's team and its member number in it (blockIdx.x = team * team_size + member), with GnArgs'
// multiply-high or, kDivide, a division: the backward kernels (stats, apply, one launch) sit at the 128-register
// cap, and the multiply-high's form of this one quotient tipped them into spills on sm_80-sm_121.
template <bool kDivide = false>
struct TeamPlace {
  int team, member;
  __device__ explicit TeamPlace(const GnArgs& a)
      : team(kDivide ? static_cast<int>(blockIdx.x / a.team_size)
                     : fast_div(static_cast<int>(blockIdx.x), a.team_size_mul, a.team_size_shift)),
        member(static_cast<int>(blockIdx.x) - team * a.team_size) {}
};
// The tiles [t0, t1) of member `member` of a team (schedule.member_tiles; tiles per task <= 256 and
// members < 2**16, so the product stays below 2**31).
__device__ __forceinline__ int member_tile(const GnArgs& a, int member) {
  return fast_div(member * static_cast<int>(a.tiles_per_task), a.team_size_mul, a.team_size_shift);
}

// Rows of a chunk per thread, a compile-time bound so the row loops unroll with constant offsets:
// 4 for 16-byte vectors (16 KB chunks when the window's columns divide the block), 16 for the
// scalar path. schedule.chunk_rows_per_thread; the launcher checks chunk_rows against it.
template <typename T, int V>
constexpr int kChunkRowsPerThread = sizeof(T) * V == 16 ? 4 : 16;

// Host side, before a task launch: a.chunk_rows is within the row loops' compile-time bound (the launcher
// checks what schedule.task_tiling promised).
template <typename T, int V>
inline bool task_rows_fit(const GnArgs& a) {
  return a.rows_threads >= 1 && a.chunk_rows <= kChunkRowsPerThread<T, V> * a.rows_threads;
}
__device__ __forceinline__ int chunks_per_tile(const GnArgs& a) { return a.chunks_per_tile; }

// One thread's view of the chunks of a member's tiles [t0, t1) of a task. Tiles are whole chunks
// (schedule.task_tiling), so chunk q starts at row t0 * rows_per_tile + q * chunk_rows; chunks past
// the task's last row are empty. The thread's rows of chunk q are k * rows_threads (k < R) from
// its first row, those below limit(q). No divisions per chunk.
template <typename T>
struct ThreadChunks {
  int64_t first;  // this thread's element offset (from the task's base) in chunk 0
  int64_t cstep;  // elements from one chunk to the next
  int64_t left;   // rows of the range from this thread's row of chunk 0
  int chunk_rows;
  int full;  // chunks [0, full) hold all R of this thread's rows
  __device__ ThreadChunks(const GnArgs& a, int row, int col, int V, int64_t t0, int64_t t1) {
    const int64_t row_begin = t0 * a.rows_per_tile;
    const int64_t row_end = min(t1 * a.rows_per_tile, a.s);
    first = (row_begin + row) * a.c + static_cast<int64_t>(col) * V;
    cstep = a.chunk_rows * a.c;
    left = row_end - row_begin - row;
    chunk_rows = static_cast<int>(a.chunk_rows);
    full = left <= 0          ? 0
           : left <= INT_MAX ? fast_div(static_cast<int>(left), a.chunk_rows_mul, a.chunk_rows_shift)
                             : static_cast<int>(min(left / chunk_rows, static_cast<int64_t>(INT_MAX)));
  }
  __device__ int64_t offset(int q) const { return first + q * cstep; }
  // this thread has row k of chunk q iff k * rows_threads < limit(q)
  __device__ int limit(int q) const {
    if (q < full) return chunk_rows;
    const int64_t l = left - static_cast<int64_t>(q) * chunk_rows;
    return static_cast<int>(max(static_cast<int64_t>(0), min(static_cast<int64_t>(chunk_rows), l)));
  }
};

// ---------------------------------------------------------------- shared-memory layout
// [slots x chunk (x, then dy in the backward)][column scratch, float2][per-channel totals, float2]
// [per-channel (weight, bias)][per-group (mean, rstd)][per-group backward coefficients]; the same
// formula as schedule.task_smem_bytes. The backward's dy chunk holds TW elements: T, or float32 for
// the wide backward under autocast (x half/bfloat16, dy float32: schedule.TaskTiling.wide_itemsize).
template <typename T, typename TW = T>
struct TaskSmem {
  T* slot0;
  int slot_elems;  // T elements from one slot to the next
  int dy_bytes;    // from a slot's x chunk to its dy chunk (the backward)
  float2* scratch;
  float2* chan;
  float2* param;
  float2* grp;
  float2* coef;
  __device__ TaskSmem(const GnArgs& a, int tensors = 1) {
    // 128-byte aligned (gn_kernels.cuh declares it the same): after a kernel's static __shared__ words
    // (arrive's `last`) the region began 16 bytes in, so each warp's 16-byte cp.async rows straddled
    // two 128-byte shared-memory wavefronts, and L2 served every sector of x twice (ncu: 50 % hits).
    extern __shared__ __align__(128) unsigned char smem[];
    const int64_t chunk_bytes = (a.chunk_rows * a.window * static_cast<int64_t>(sizeof(T)) + 15) / 16 * 16;
    const int64_t dy_chunk_bytes =
        tensors == 2 ? (a.chunk_rows * a.window * static_cast<int64_t>(sizeof(TW)) + 15) / 16 * 16 : 0;
    const int64_t slot_bytes = chunk_bytes + dy_chunk_bytes;
    const int width = a.cols_threads * a.vec;
    const int srows = warp_holds_rows(a) ? kWarps : a.rows_threads;  // fold_channels' rows
    // the backward's apply launch also folds its warps' dweight/dbias strips there (bwd_param_strip)
    const int scratch_pairs = tensors == 2 ? max(srows * width, kThreads) : srows * width;
    slot0 = reinterpret_cast<T*>(smem);
    slot_elems = static_cast<int>(slot_bytes / static_cast<int64_t>(sizeof(T)));
    dy_bytes = static_cast<int>(chunk_bytes);
    unsigned char* p = smem + a.slots * slot_bytes;
    scratch = reinterpret_cast<float2*>(p);
    p += static_cast<int64_t>(scratch_pairs) * 8;
    chan = reinterpret_cast<float2*>(p);
    p += static_cast<int64_t>(width) * 8;
    param = reinterpret_cast<float2*>(p);
    p += static_cast<int64_t>(width) * 8;
    grp = reinterpret_cast<float2*>(p);
    p += static_cast<int64_t>(a.groups_per_window) * 8;
    coef = reinterpret_cast<float2*>(p);
  }
};

// A thread's dy in a slot, from its x there: one byte offset per thread (x's place in the slot plus
// the x chunk, then its place again at dy's element size), so the pair costs the row loops no more
// registers than the x pointer.
template <typename T, typename TW>
__device__ __forceinline__ int dy_delta(const TaskSmem<T, TW>& sm, int place) {
  return sm.dy_bytes + place * static_cast<int>(sizeof(TW) - sizeof(T));
}
template <typename T, typename TW>
__device__ __forceinline__ const TW* dy_at(const T* x_place, int delta) {
  return reinterpret_cast<const TW*>(reinterpret_cast<const unsigned char*>(x_place) + delta);
}

// A thread's place in a chunk: one column of V channels, rows `row`, `row + rows_threads`, ... The
// thread copies, reduces and applies exactly these elements of every chunk, so the chunk slots
// need no barriers: each thread waits for its own copies only.
struct TaskLane {
  int col, row;
  bool active;
  __device__ explicit TaskLane(const GnArgs& a)
      : col(threadIdx.x % a.cols_threads), row(threadIdx.x / a.cols_threads),
        active(threadIdx.x / a.cols_threads < a.rows_threads) {}
};

// This thread's rows of one chunk, global memory -> its places in the slot (`s`, this thread's place
// in the slot): 16-byte cp.async where the layout allows (V * sizeof(T) a multiple of 16: two copies
// for the float32 dy of a wide backward; with `l2_policy` under GN_EXP_L2_KEEP_KB), plain loads otherwise.
// Unrolled over the R rows (the lane's, i.e. x's, bound) with constant strides.
template <typename T, int V, int R = kChunkRowsPerThread<T, V>>
__device__ __forceinline__ void copy_rows(const T* g, int64_t gstep, T* s, int sstep, int rows_threads, int limit,
                                          uint64_t l2_policy = 0) {
  constexpr int kBytes = static_cast<int>(sizeof(T)) * V;
  int r = 0;  // k * rows_threads, stepped (no multiplies per row)
#pragma unroll 4  // all of R = 4 vector rows; groups of 4 of the 16 scalar ones (registers)
  for (int k = 0; k < R; ++k, r += rows_threads, g += gstep, s += sstep) {
    if (r < limit) {
      if constexpr (kBytes % 16 == 0) {
#pragma unroll
        for (int j = 0; j < kBytes / 16; ++j) {
          void* to = reinterpret_cast<unsigned char*>(s) + 16 * j;
          const void* from = reinterpret_cast<const unsigned char*>(g) + 16 * j;
          if constexpr (kL2KeepKB > 0) {
            cp_async16_hinted(to, from, l2_policy);
          } else {
            cp_async16(to, from);
          }
        }
      } else {
        *reinterpret_cast<Pack<T, V>*>(s) = load_pack<T, V>(g);
      }
    }
  }
}

// Weight and bias of the task's channels into shared memory (visible after the next barrier).
__device__ __forceinline__ void load_task_params(const GnArgs& a, int64_t task, float2* param) {
  const int64_t c0 = task_c0(a, task);
  for (int i = threadIdx.x; i < a.window; i += kThreads) {
    param[i] = make_float2(load_param(a.weight, a.w_dtype, c0 + i, 1.f), load_param(a.bias, a.w_dtype, c0 + i, 0.f));
  }
}

// The task's weight and bias lines into L2, ahead of load_task_params after the task's barrier (after the
// benchmark's L2 flush, and in a model after other layers' traffic, they would come from DRAM there, on
// the critical path). A hint: a few threads, no registers held.
__device__ __forceinline__ void prefetch_task_params(const GnArgs& a, int64_t task) {
  static_assert(kThreads == 256, "threads 0-127 take the weight's lines, 128-255 the bias'");
  const void* p = threadIdx.x < 128 ? a.weight : a.bias;
  if (p == nullptr) return;
  const int size = a.w_dtype == 1 || a.w_dtype == 2 ? 2 : 4;
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(task_c0(a, task) * size);
  const uintptr_t last = first + static_cast<uintptr_t>(a.window * size) - 1;  // the window's last byte
  const int lines = static_cast<int>((last >> 7) - (first >> 7)) + 1;  // at most 65 (2048 float32)
  const int i = threadIdx.x & 127;  // (no division ahead of the first copies)
  if (i >= lines) return;
  // every address inside the window's bytes: the first line from the window's start
  const uintptr_t at = i == 0 ? first : ((first >> 7) + i) << 7;
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(at));
}

// The first (sample, group) index of a task's window in mean/rstd.
__device__ __forceinline__ int64_t task_group0(const GnArgs& a, int64_t task) {
  return task_sample(a, task) * a.g + group_of(a, static_cast<int>(task_c0(a, task)));
}

// A task's mean and rstd from global memory (published by another block) into shared memory.
__device__ __forceinline__ void load_group_stats(const GnArgs& a, int64_t task, float2* grp) {
  const int64_t ng0 = task_group0(a, task);
  for (int gl = threadIdx.x; gl < groups_per_window(a); gl += kThreads) {
    grp[gl] = make_float2(__ldcg(a.mean + ng0 + gl), __ldcg(a.rstd + ng0 + gl));
  }
}

// ---------------------------------------------------------------- reductions
// Per-thread sums of (x - K) and (x - K)^2 over this thread's rows of one chunk, in row order.
template <typename T, int V>
__device__ __forceinline__ void accumulate_rows(const T* s, int sstep, int rows_threads, int limit,
                                                const float (&shift)[V], float (&s1)[V], float (&s2)[V]) {
  constexpr int R = kChunkRowsPerThread<T, V>;
  int r = 0;
#pragma unroll
  for (int k = 0; k < R; ++k, r += rows_threads, s += sstep) {
    if (r < limit) {
      const Pack<T, V> x = *reinterpret_cast<const Pack<T, V>*>(s);
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const float e = to_float(x.v[v]) - shift[v];
        s1[v] += e;
        s2[v] = fmaf(e, e, s2[v]);
      }
    }
  }
}

// Sums the threads' (s1, s2) per channel of the window into sm.chan (visible to all threads on
// return), in a fixed order: across the lanes of a warp that share a column by an xor butterfly,
// then over warps or row threads in order. Zeroes s1 and s2 for the next tile.
template <typename Sm, int V>
__device__ void fold_channels(const GnArgs& a, const TaskLane& lane, const Sm& sm, float (&s1)[V],
                              float (&s2)[V]) {
  const int ct = a.cols_threads;
  const int width = ct * V;
  const bool fold_warp = (32 % ct) == 0;  // (not warp_holds_rows: it spilled the wide backward stats)
  const int warp = threadIdx.x / 32, lane_id = threadIdx.x % 32;
  const int srows = fold_warp ? kWarps : a.rows_threads;
  const int srow = fold_warp ? warp : lane.row;
  const bool writer = fold_warp ? lane_id < ct : lane.active;
#pragma unroll
  for (int v = 0; v < V; ++v) {
    float x1 = s1[v], x2 = s2[v];
    if (fold_warp) {
      for (int o = 16; o >= ct; o >>= 1) {
        x1 += __shfl_xor_sync(kFull, x1, o);
        x2 += __shfl_xor_sync(kFull, x2, o);
      }
    }
    if (writer) sm.scratch[srow * width + lane.col * V + v] = make_float2(x1, x2);
    s1[v] = s2[v] = 0.f;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < width; i += kThreads) {
    float2 acc = make_float2(0.f, 0.f);
#pragma unroll 8
    for (int r = 0; r < srows; ++r) {
      const float2 p = sm.scratch[r * width + i];
      acc.x += p.x;
      acc.y += p.y;
    }
    sm.chan[i] = acc;
  }
  __syncthreads();
}

// fold_channels out of line: the wide backward's stats kernel (float32 dy) spilled on sm_120 with it
// inlined. The call gets copies of the sums: passing the accumulators themselves takes their address,
// which put them on the stack for the whole row loop (a local load and store per sum per chunk, 514 local
// accesses in sm_90's kernel, which ran at half the bandwidth of the other backward); copied, they stay
// in registers and only the copies pass through the stack, once per tile.
template <typename Sm, int V>
__device__ __noinline__ void fold_channels_call(const GnArgs& a, const TaskLane& lane, const Sm& sm, float (&s1)[V],
                                                float (&s2)[V]) {
  fold_channels(a, lane, sm, s1, s2);
}
template <typename Sm, int V>
__device__ __forceinline__ void fold_channels_outlined(const GnArgs& a, const TaskLane& lane, const Sm& sm,
                                                       float (&s1)[V], float (&s2)[V]) {
  float c1[V], c2[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    c1[v] = s1[v];
    c2[v] = s2[v];
    s1[v] = s2[v] = 0.f;
  }
  fold_channels_call(a, lane, sm, c1, c2);
}

// Ends a forward tile: the per-channel sums (fold_channels), then per group over its channels in
// order, written as the tile's partial of each of the window's groups.
template <typename T, int V>
__device__ void finish_tile(const GnArgs& a, const TaskLane& lane, const TaskSmem<T>& sm, float (&s1)[V],
                            float (&s2)[V], float2* out, int64_t tiles) {
  fold_channels(a, lane, sm, s1, s2);
  const int cpg = channels_per_group(a);
  for (int gl = threadIdx.x; gl < groups_per_window(a); gl += kThreads) {
    float2 acc = make_float2(0.f, 0.f);
#pragma unroll 8  // the loads go ahead of the chain of additions
    for (int k = 0; k < cpg; ++k) {
      const float2 c = sm.chan[gl * cpg + k];
      acc.x += c.x;
      acc.y += c.y;
    }
    out[static_cast<int64_t>(gl) * tiles] = acc;
  }
}

// Threads that share one group in the combine: a power of two <= 32 (one warp's butterfly), as its log2
// (the lane index and the tile bounds are then shifts and masks, not divisions).
__device__ __forceinline__ int combine_lanes_log2(int gw) {
  int t = 5;
  while (t > 0 && (gw << t) > kThreads) --t;
  return t;
}

// Partials of a task: [group of the window][tile].
__device__ __forceinline__ const float2* task_partials(const GnArgs& a, int64_t task) {
  return reinterpret_cast<const float2*>(a.workspace + a.off_partials) +
         task * groups_per_window(a) * a.tiles_per_task;
}

// Mean and rstd of each group of a task from its tile partials [group][tile], in a fixed order:
// lane j of a group sums the tiles j, j + L, j + 2L, ... in order, then the L lanes fold by xor.
// `emit(gl, mean, rstd)` runs once per group of the window. Every caller (the one-pass members,
// the two-pass stats launch, the cluster members) computes the same bits.
// p[lo * stride] + ... + p[(hi - 1) * stride] in order, with a batch of loads in flight at once (one
// L2 round trip per batch instead of one per eight). Not inlined: its registers then do not add to
// the kernels' hot loops (ptxas sizes a kernel by its worst point).
static __device__ __noinline__ float2 sum_partials(const float2* p, int lo, int hi, int stride = 1) {
  constexpr int kBatch = 16;  // (32 spilled on sm_100)
  float2 acc = make_float2(0.f, 0.f);
  for (int t0 = lo; t0 < hi; t0 += kBatch) {
    float2 v[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      v[i] = t0 + i < hi ? __ldcg(p + static_cast<int64_t>(t0 + i) * stride) : make_float2(0.f, 0.f);
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (t0 + i < hi) {
        acc.x += v[i].x;
        acc.y += v[i].y;
      }
    }
  }
  return acc;
}

template <typename T, typename Emit>
__device__ __forceinline__ void group_stats(const GnArgs& a, int64_t task, Emit&& emit) {
  const float2* parts = task_partials(a, task);
  const int64_t n = task_sample(a, task), c0 = task_c0(a, task);
  const int cpg = channels_per_group(a);
  const int gw = groups_per_window(a);
  const int tiles = static_cast<int>(a.tiles_per_task);
  const int log2_lanes = combine_lanes_log2(gw), lanes = 1 << log2_lanes;
  const int j = threadIdx.x & (lanes - 1);
  // Interleaved, so a warp's lanes of one group read adjacent partials: one or two lines per group
  // and load, where runs of P/L tiles per lane touched a line per lane (32 per load, one L1 wavefront
  // each: a 256-tile combine took 5.4 us, RESULTS.md session 19).
  const int per_lane = (tiles - j + lanes - 1) >> log2_lanes;  // tiles j, j + L, ... below `tiles`
  for (int base = 0; base < gw; base += kThreads >> log2_lanes) {
    const int gl = base + (threadIdx.x >> log2_lanes);
    float2 acc = make_float2(0.f, 0.f);
    float shift = 0.f;
    if (gl < gw) {
      shift = to_float(static_cast<const T*>(a.x)[n * a.s * a.c + c0 + gl * cpg]);
      acc = sum_partials(parts + static_cast<int64_t>(gl) * tiles + j, 0, per_lane, lanes);
    }
    for (int o = lanes / 2; o > 0; o >>= 1) {
      acc.x += __shfl_xor_sync(kFull, acc.x, o);
      acc.y += __shfl_xor_sync(kFull, acc.y, o);
    }
    if (gl < gw && j == 0) {
      const float count = static_cast<float>(a.s) * static_cast<float>(cpg);
      const float m = acc.x / count;
      const float v = acc.y / count - m * m;
      const float var = v < 0.f ? 0.f : v;  // rounding can go below 0; NaN stays NaN
      emit(gl, shift + m, rsqrtf(var + a.eps));
    }
  }
}

// The statistics of a task, written to a.mean / a.rstd (the two-pass stats launch's last block).
template <typename T>
__device__ void combine_task(const GnArgs& a, int64_t task) {
  const int64_t ng0 = task_group0(a, task);
  group_stats<T>(a, task, [&](int gl, float mean, float rstd) {
    a.mean[ng0 + gl] = mean;
    a.rstd[ng0 + gl] = rstd;
  });
}

// The window-local group of each of a thread's V channels (column `col`; the last group for
// channels past the window): one division, then stepped.
template <int V>
__device__ __forceinline__ void column_groups(const GnArgs& a, int col, int (&g)[V]) {
  const int cpg = channels_per_group(a), last = groups_per_window(a) - 1;
  const int c = col * V;
  int q = group_of(a, c), in_group = c - q * cpg;
#pragma unroll
  for (int v = 0; v < V; ++v, ++in_group) {
    if (in_group == cpg) {
      ++q;
      in_group = 0;
    }
    g[v] = min(q, last);
  }
}

// ---------------------------------------------------------------- one member's phases
// The next slot of a ring of `slots`, forwards and backwards (chunk q lives in slot q % slots).
__device__ __forceinline__ int next_slot(int i, int slots) { return i + 1 == slots ? 0 : i + 1; }
__device__ __forceinline__ int prev_slot(int i, int slots) { return i == 0 ? slots - 1 : i - 1; }

// Walks the chunks [0, chunks) of a member's range oldest first through the ring of `slots` (chunk q
// lives in slot q % slots): the first slots - 1 are read ahead (`read(q, slot)`, one copy group each),
// `started()` runs once they are in flight, then each step reads the chunk slots - 1 ahead into the
// slot this thread has just used, waits for this thread's copies of chunk q and calls `use(q, slot)`.
template <typename Read, typename Started, typename Use>
__device__ __forceinline__ void walk_ring_forwards(int chunks, int slots, Read&& read, Started&& started, Use&& use) {
  const int ahead = slots - 1;
  int load_q = 0, load_slot = 0;
  auto issue = [&]() {
    if (load_q < chunks) read(load_q, load_slot);
    cp_async_commit();  // (empty past the range: the wait below counts groups)
    ++load_q;
    load_slot = next_slot(load_slot, slots);
  };
  for (int i = 0; i < ahead; ++i) issue();
  started();
  int slot = 0;
  for (int q = 0; q < chunks; ++q) {
    issue();
    cp_async_wait(ahead);
    use(q, slot);
    slot = next_slot(slot, slots);
  }
}

// The chunks [0, reread) of a member's range of `task` that its apply reads again soon after its stats
// (l2_hints): in one launch, all but the last min(chunks, slots), which stay in their slots; in two,
// all of the team's last task, where the apply launch starts (its chunks newest first), else none.
__device__ __forceinline__ int soon_reread(const GnArgs& a, int64_t task, int chunks, bool one_launch) {
  if (one_launch) return chunks - min(chunks, static_cast<int>(a.slots));
  return task + a.teams >= task_count(a) ? chunks : 0;
}

// Reduces the tiles [t0, t1) of `task` chunk by chunk through the ring of `slots` chunks (the next
// slots - 1 chunks are in flight while one is summed) and writes their partials. On return the last
// min(slots, chunks) chunks are in their slots. Returns the number of chunks. `ring` > 0 caps the
// slots used (the two-launch stats kernel, which keeps no chunk for an apply). `one_launch`: whether
// this block's own apply follows (else the apply launch's: soon_reread).
// `trace`: the first of 4 trace points (copies issued, first chunk in, first tile done, all
// done), or -1 for none.
template <typename T, int V>
__device__ int member_stats(const GnArgs& a, int64_t task, int64_t t0, int64_t t1, const TaskSmem<T>& sm,
                            int trace = -1, int ring = 0, bool one_launch = true) {
  const TaskLane lane(a);
  const ThreadChunks<T> tc(a, lane.row, lane.col, V, t0, t1);
  const int64_t n = task_sample(a, task), c0 = task_c0(a, task);
  const T* base = static_cast<const T*>(a.x) + n * a.s * a.c + c0;
  const int64_t tiles = a.tiles_per_task;
  float2* parts = const_cast<float2*>(task_partials(a, task));
  const int cpg = channels_per_group(a);
  const int cpt = chunks_per_tile(a);
  const int chunks = static_cast<int>(t1 - t0) * cpt;
  const int rt = a.rows_threads;
  const int sstep = rt * static_cast<int>(a.window);
  const int64_t gstep = static_cast<int64_t>(rt) * a.c;
  T* mine = sm.slot0 + lane.row * static_cast<int>(a.window) + lane.col * V;  // this thread's place in slot 0
  // The shifts (x[n, row 0, group's first channel]) are loaded ahead of the chunk copies, so they
  // return before the first chunk instead of queueing behind all of them, and converted after the
  // copies are issued (a conversion here would wait for the load and hold the copies up).
  T raw[V];
  {
    int g[V];
    column_groups<V>(a, lane.col, g);
#pragma unroll
    for (int v = 0; v < V; ++v) raw[v] = lane.active && lane.col * V + v < a.window ? base[g[v] * cpg] : base[0];
  }
  if (kTracePrologue && !kTimeline && trace >= 0) trace_point(a, 10);
  float shift[V], s1[V], s2[V];
  int in_tile = 0;
  int64_t tile = t0;
  const L2Hints l2 = l2_hints(soon_reread(a, task, chunks, one_launch), a.chunk_rows * a.window * sizeof(T));
  walk_ring_forwards(
      chunks, ring > 0 ? min(ring, a.slots) : a.slots,
      [&](int q, int slot) {
        if (lane.active)
          copy_rows<T, V>(base + tc.offset(q), gstep, mine + slot * sm.slot_elems, sstep, rt, tc.limit(q), l2.of(q));
      },
      [&]() {
#pragma unroll
        for (int v = 0; v < V; ++v) {
          shift[v] = lane.active ? to_float(raw[v]) : 0.f;
          s1[v] = s2[v] = 0.f;
        }
        if (trace >= 0) trace_point(a, trace);
      },
      [&](int q, int slot) {
        if (trace >= 0 && q == 0) trace_point(a, trace + 1);
        if (lane.active) accumulate_rows<T, V>(mine + slot * sm.slot_elems, sstep, rt, tc.limit(q), shift, s1, s2);
        if (++in_tile == cpt) {
          finish_tile<T, V>(a, lane, sm, s1, s2, parts + tile, tiles);
          if (trace >= 0 && tile == t0) trace_point(a, trace + 2);
          in_tile = 0;
          ++tile;
        }
      });
  if (trace >= 0) trace_point(a, trace + 3);
  return chunks;
}

// A step with nothing to do (the default of member_apply's and member_bwd_apply's hooks).
struct NoStep {
  __device__ void operator()() const {}
};

// The experiment -DGN_EXP_FUSED_APPLY=1 (off by default): the forward's apply of a 16-bit x computes
// z = x * scale + (beta - mean * scale), one FFMA per element, instead of (x - mean) * scale + beta (an
// FADD and an FFMA), as torch's own kernel does. The fp32 rounding it adds (2^-24 of |x * scale|) is far
// below the 16-bit x's own (2^-11 of |x|); float32 x keeps the subtraction. The 16-bit SiLU apply looked
// issue-bound (RESULTS.md session 44: 0.58-0.59 of SOL against 0.62 without SiLU; fp32 SiLU 0.63-0.64).
#ifndef GN_EXP_FUSED_APPLY
#define GN_EXP_FUSED_APPLY 0
#endif
template <typename T>
constexpr bool kFusedApply = GN_EXP_FUSED_APPLY != 0 && sizeof(T) == 2;
// Whether a SiLU element loop of this x type and vector takes sigmoids in pairs (gn_kernels.cuh
// reciprocal_pair, -DGN_EXP_SILU_PAIRED_RCP=1): 16-bit x, an even vector.
template <typename T, int V, int kAct>
constexpr bool kPairedSilu = GN_EXP_SILU_PAIRED_RCP != 0 && kAct == kActSilu && sizeof(T) == 2 && V % 2 == 0;

// The per-thread (mean, scale, beta) of a task's statistics and parameters in shared memory; kFused:
// beta holds beta - mean * scale and mean is unused (kFusedApply).
template <int V, bool kFused = false>
struct ApplyCoefs {
  float mean[V], scale[V], beta[V];
  ApplyCoefs() = default;
  __device__ ApplyCoefs(const GnArgs& a, const float2* grp, const float2* param, int col) {
    int g[V];
    column_groups<V>(a, col, g);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const float2 st = grp[g[v]], pr = param[min(col * V + v, static_cast<int>(a.window) - 1)];
      mean[v] = kFused ? 0.f : st.x;
      scale[v] = st.y * pr.x;
      beta[v] = kFused ? fmaf(-st.x, scale[v], pr.y) : pr.y;
    }
  }
  // z = (x - mean) * scale + beta for channel v of this thread's column
  __device__ __forceinline__ float z(float x, int v) const {
    return kFused ? fmaf(x, scale[v], beta[v]) : fmaf(x - mean[v], scale[v], beta[v]);
  }
};

// A lane's 32 bytes of a row (the wide forward's 8 float32 y), stored together with its neighbour's by
// a pair of lanes that hold neighbouring pieces of one row: each of the two store instructions then
// writes whole 32-byte sectors (the even lane the first half of a sector, the odd lane the second).
// Stored by its own lane in two 16-byte halves, every sector was half written per instruction: ncu on
// 32x128x256x256 bf16 showed 18.6 % L1 hits and 52 % DRAM throughput, 628 us against 291 us for a bf16
// y. Branch-free, so both halves of a sector leave in one instruction. `mask`: the pair's lanes.
template <typename TY, int V>
__device__ __forceinline__ void store_pair_streaming(TY* y, const Pack<TY, V>& o, unsigned mask, bool odd) {
  static_assert(sizeof(Pack<TY, V>) == 32, "a pair stores two 32-byte pieces");
  const uint4 lo = reinterpret_cast<const uint4*>(&o)[0], hi = reinterpret_cast<const uint4*>(&o)[1];
  uint4 send = odd ? lo : hi, got;  // the even lane passes its second half, the odd lane its first
  got.x = __shfl_xor_sync(mask, send.x, 1);
  got.y = __shfl_xor_sync(mask, send.y, 1);
  got.z = __shfl_xor_sync(mask, send.z, 1);
  got.w = __shfl_xor_sync(mask, send.w, 1);
  uint4* p = reinterpret_cast<uint4*>(y);
  // even lane: its first half, then the odd lane's first half; odd lane: the even lane's second half, then its own
  __stcs(odd ? p - 1 : p, odd ? got : lo);
  __stcs(odd ? p + 1 : p + 2, odd ? hi : got);
}

// Whether store_pair_streaming may pair this thread with its xor-1 lane: they hold neighbouring
// columns of one row when a row has an even number of column threads.
struct StorePair {
  bool on, odd;
  unsigned mask;
  __device__ explicit StorePair(const GnArgs& a)
      : on(a.cols_threads % 2 == 0), odd(threadIdx.x & 1), mask(3u << (threadIdx.x % 32 & ~1u)) {}
};

// y = act((x - mean) * scale + beta) for this thread's rows of one chunk held in shared memory; y in
// TY (x's type, or float32 under autocast: the wide forward, stored by lane pairs where `pair` allows).
template <typename T, int V, int kAct, typename TY = T>
__device__ __forceinline__ void apply_rows(const T* s, int sstep, TY* y, int64_t ystep, int rows_threads, int limit,
                                           const ApplyCoefs<V, kFusedApply<T>>& k_, const StorePair& pair) {
  constexpr int R = kChunkRowsPerThread<T, V>;
  int r = 0;
#pragma unroll act_row_unroll<kAct>(R)
  for (int k = 0; k < R; ++k, r += rows_threads, s += sstep, y += ystep) {
    if (r < limit) {
      const Pack<T, V> x = *reinterpret_cast<const Pack<T, V>*>(s);
      Pack<TY, V> o;
      if constexpr (kPairedSilu<T, V, kAct>) {
#pragma unroll
        for (int v = 0; v < V; v += 2) {
          const float z0 = k_.z(to_float(x.v[v]), v), z1 = k_.z(to_float(x.v[v + 1]), v + 1);
          float r0, r1;
          reciprocal_pair(1.f + exp_neg(z0), 1.f + exp_neg(z1), r0, r1);
          o.v[v] = from_float<TY>(z0 * r0);
          o.v[v + 1] = from_float<TY>(z1 * r1);
        }
      } else {
#pragma unroll
        for (int v = 0; v < V; ++v) {
          const float z = k_.z(to_float(x.v[v]), v);
          o.v[v] = from_float<TY>(activate<kAct>(z));
        }
      }
      if constexpr (sizeof(Pack<TY, V>) == 32) {
        if (pair.on) {
          store_pair_streaming<TY, V>(y, o, pair.mask, pair.odd);
          continue;
        }
      }
      store_pack_streaming<TY, V>(y, o);
    }
  }
}

// Walks the chunks [0, chunks) of a member's range newest first through the ring of `slots` (chunk q
// lives in slot q % slots): `read(q, slot)` fills a slot if chunk q is to be read (returns 1 then,
// else 0; q may be negative), `started()` runs once the first `slots` reads are in flight, `use(q,
// slot)` consumes one, and each slot is refilled with the chunk `slots` older as soon as this thread
// has used it. Returns the reads.
template <typename Read, typename Started, typename Use>
__device__ __forceinline__ int walk_ring_backwards(int chunks, int slots, Read&& read, Started&& started, Use&& use) {
  int last_slot = chunks > 0 ? chunks - 1 : 0;  // (chunks - 1) % slots: a short loop once per range, no division
  while (last_slot >= slots) last_slot -= slots;
  int reads = 0;
  for (int i = 0, slot = last_slot; i < slots; ++i, slot = prev_slot(slot, slots)) {
    reads += read(chunks - 1 - i, slot);
    cp_async_commit();
  }
  started();
  int slot = last_slot;
  for (int q = chunks - 1; q >= 0; --q) {
    cp_async_wait(slots - 1);
    use(q, slot);
    reads += read(q - slots, slot);  // this thread's elements of the slot are consumed: refill it
    cp_async_commit();
    slot = prev_slot(slot, slots);
  }
  return reads;
}

// Writes y for the tiles [t0, t1) of `task`, chunks in reverse order, with the group statistics in
// sm.grp and the parameters in sm.param, visible once `behind_copies()` (every thread; it may hold a
// barrier) has run behind the first copies. The last `kept` chunks are already in their slots
// (member_stats just read them); the others are read again, each into the slot its successor frees.
// Returns the number of chunks re-read.
template <typename T, int V, typename TY = T, typename Step = NoStep>
__device__ int member_apply(const GnArgs& a, int64_t task, int64_t t0, int64_t t1, const TaskSmem<T>& sm,
                            int kept, Step behind_copies = Step{}) {
  const TaskLane lane(a);
  const ThreadChunks<T> tc(a, lane.row, lane.col, V, t0, t1);
  const int64_t n = task_sample(a, task), c0 = task_c0(a, task);
  const T* base = static_cast<const T*>(a.x) + n * a.s * a.c + c0;
  TY* out = static_cast<TY*>(a.out) + n * a.s * a.c + c0;
  ApplyCoefs<V, kFusedApply<T>> coefs;  // behind the first copies: the statistics may still be on their way
  const StorePair pair(a);
  const int slots = a.slots;
  const int chunks = static_cast<int>(t1 - t0) * chunks_per_tile(a);
  const int fresh = chunks - kept;  // chunks [0, fresh) are read again
  const int rt = a.rows_threads;
  const int sstep = rt * static_cast<int>(a.window);
  const int64_t gstep = static_cast<int64_t>(rt) * a.c;
  T* mine = sm.slot0 + lane.row * static_cast<int>(a.window) + lane.col * V;
  const uint64_t last_use = l2_evict_first();  // (a re-read is the last use)
  auto reread_into = [&](int q, int slot) {  // chunk q (if it is read again) into `slot`
    if (q >= 0 && q < fresh) {
      if (lane.active)
        copy_rows<T, V>(base + tc.offset(q), gstep, mine + slot * sm.slot_elems, sstep, rt, tc.limit(q), last_use);
      return 1;
    }
    return 0;
  };
  auto started = [&] {
    behind_copies();
    coefs = ApplyCoefs<V, kFusedApply<T>>(a, sm.grp, sm.param, lane.col);
  };
  const int reread = walk_ring_backwards(chunks, slots, reread_into, started, [&](int q, int slot) {
    if (!lane.active) return;
    const T* s = mine + slot * sm.slot_elems;
    TY* y = out + tc.offset(q);
    const int limit = tc.limit(q);
    // the activation is chosen once per chunk, so the row loop has no branches
    with_act(a.act, [&](auto act) { apply_rows<T, V, decltype(act)::value, TY>(s, sstep, y, gstep, rt, limit, coefs, pair); });
  });
  __syncthreads();  // sm.grp and sm.param are rewritten for the next task
  return reread;
}

// ---------------------------------------------------------------- backward (GN_ARCH=tasks+bwd)
// Per channel of a task: s1 = sum of dz and s2 = sum of dz * xhat over the task's rows, where
// xhat = (x - mean) * rstd and dz = dy * act'(z), z = xhat * w + b (the tile kernels' grad_z).
// Each tile writes two partials: per channel [task][tile][channel of the window] (s1, s2), and per
// group [task][tile][group of the window] (sum w * s1, sum w * s2) over the group's channels in order.
// dx needs only the group sums: the last member of a task to arrive sums the group partials over
// tiles in order into [n][g] (a few KB: the critical path between the launches stays short).
// dweight and dbias need the channel sums, which nothing waits for: the apply launch's blocks sum
// the channel partials over tiles in strips of 32 channels into [n][c], and its last block to finish
// sums those over samples in order. dx = rstd * (w * dz - (A + xhat * B) / M) with M the group's
// element count. Every sum has a fixed order: bitwise equal across grids.

__device__ __forceinline__ float2* bwd_partials(const GnArgs& a, int64_t task) {
  return reinterpret_cast<float2*>(a.workspace + a.off_partials) + task * a.tiles_per_task * a.window;
}
__device__ __forceinline__ float2* bwd_group_partials(const GnArgs& a, int64_t task) {
  return reinterpret_cast<float2*>(a.workspace + a.off_group_partials) +
         task * a.tiles_per_task * groups_per_window(a);
}
// (gn_kernels.cuh's channel_sums [n][c] hold (sum dz, sum dz * xhat) here, group_sums [n][g]
// (sum w * dz, sum w * dz * xhat).)

// Where a tile's group partials go: [tile][group] (the default), or [group][tile] under the experiment
// -DGN_EXP_BWD_GROUP_MAJOR=1, whose combine reads each group's tiles as the forward's does (a warp's lanes
// of one group on adjacent partials, tiles j, j + L, ...: a new sum order, so other bits).
#ifndef GN_EXP_BWD_GROUP_MAJOR
#define GN_EXP_BWD_GROUP_MAJOR 0
#endif
constexpr bool kBwdGroupMajor = GN_EXP_BWD_GROUP_MAJOR != 0;

// The experiment -DGN_EXP_FUSED_BWD_STATS=1 (off by default): the backward's stats sum dz * (x - mean) per
// channel, and a tile's sums are scaled by rstd once per channel (write_tile_partials), instead of
// forming xhat = (x - mean) * rstd per element (one FMUL per element less; z = (x - mean) * (rstd * w) + b).
// The same sums up to rounding, for every dtype; a new order of roundings, so other bits (the same in every
// schedule: every caller runs member_bwd_stats).
#ifndef GN_EXP_FUSED_BWD_STATS
#define GN_EXP_FUSED_BWD_STATS 0
#endif
constexpr bool kFusedBwdStats = GN_EXP_FUSED_BWD_STATS != 0;

// A finished tile's partials from sm.chan (fold_channels): per channel, and per group weighted by w
// (per_group[gl * group_stride]). kFusedBwdStats: the second sums times their group's rstd (grp[gl].y) first.
__device__ __forceinline__ void write_tile_partials(const GnArgs& a, const float2* chan, const float2* param,
                                                    const float2* grp, float2* per_channel, float2* per_group,
                                                    int64_t group_stride) {
  for (int i = threadIdx.x; i < a.window; i += kThreads) {
    float2 c = chan[i];
    if constexpr (kFusedBwdStats) c.y *= grp[group_of(a, i)].y;
    per_channel[i] = c;
  }
  const int cpg = channels_per_group(a);
  for (int gl = threadIdx.x; gl < groups_per_window(a); gl += kThreads) {
    float2 acc = make_float2(0.f, 0.f);
    for (int k = 0; k < cpg; ++k) {
      const float w = param[gl * cpg + k].x;
      const float2 s = chan[gl * cpg + k];
      acc.x = fmaf(w, s.x, acc.x);
      acc.y = fmaf(w, kFusedBwdStats ? s.y * grp[gl].y : s.y, acc.y);
    }
    per_group[gl * group_stride] = acc;
  }
}

// A thread's V channels: its groups' (mean, rstd) from sm.grp, (w, b) from sm.param.
template <int V>
struct BwdCoefs {
  float mean[V], rstd[V], w[V], b[V];
  __device__ void load(const GnArgs& a, const float2* grp, const float2* param, int col) {
    int g[V];
    column_groups<V>(a, col, g);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const float2 st = grp[g[v]];
      const float2 pr = param[min(col * V + v, static_cast<int>(a.window) - 1)];
      mean[v] = st.x;
      rstd[v] = st.y;
      w[v] = pr.x;
      b[v] = pr.y;
    }
  }
};

// dy * silu'(z) of channels v and v + 1, z = u * w + b, their sigmoids from one MUFU.RCP (kPairedSilu)
template <int V>
__device__ __forceinline__ float2 silu_grads_pair(const BwdCoefs<V>& k, int v, float u0, float u1, float dy0,
                                                  float dy1) {
  const float z0 = fmaf(u0, k.w[v], k.b[v]), z1 = fmaf(u1, k.w[v + 1], k.b[v + 1]);
  float g0, g1;
  sigmoid_pair(z0, z1, g0, g1);
  return make_float2(silu_grad(dy0, z0, g0), silu_grad(dy1, z1, g1));
}

template <int kAct>
__device__ __forceinline__ float grad_of_z(float dy, float xhat, float w, float b) {
  if constexpr (kAct == kActNone) {
    return dy;
  } else {
    return through_act<kAct>(dy, fmaf(xhat, w, b));
  }
}

// (s1, s2) += (dz, dz * xhat) over this thread's rows of one chunk (x and dy slots), in row order.
// kRowAtATime: packs a row at a time (bwd_row_unroll), where the loop runs cold (cold_stats_rows).
template <typename T, int V, int kAct, typename TW, bool kRowAtATime = false>
__device__ __forceinline__ void accumulate_rows_bwd(const T* sx, const TW* sd, int sstep, int rows_threads, int limit,
                                                    const BwdCoefs<V>& k, float (&s1)[V], float (&s2)[V]) {
  constexpr int R = kChunkRowsPerThread<T, V>;
  int r = 0;
#pragma unroll bwd_row_unroll<kAct, V, kRowAtATime>(4)  // (16 scalar rows fully unrolled with x and dy spilled on sm_100)
  for (int i = 0; i < R; ++i, r += rows_threads, sx += sstep, sd += sstep) {
    if (r < limit) {
      const Pack<T, V> x = *reinterpret_cast<const Pack<T, V>*>(sx);
      const Pack<TW, V> d = *reinterpret_cast<const Pack<TW, V>*>(sd);
      // xhat, or x - mean under kFusedBwdStats (k.w then holds rstd * w; write_tile_partials scales s2)
      auto xhat_of = [&](int v) {
        const float xc = to_float(x.v[v]) - k.mean[v];
        return kFusedBwdStats ? xc : xc * k.rstd[v];
      };
      if constexpr (kPairedSilu<T, V, kAct>) {
#pragma unroll
        for (int v = 0; v < V; v += 2) {
          const float h0 = xhat_of(v), h1 = xhat_of(v + 1);
          const float2 dz = silu_grads_pair(k, v, h0, h1, to_float(d.v[v]), to_float(d.v[v + 1]));
          s1[v] += dz.x;
          s2[v] = fmaf(dz.x, h0, s2[v]);
          s1[v + 1] += dz.y;
          s2[v + 1] = fmaf(dz.y, h1, s2[v + 1]);
        }
      } else {
#pragma unroll
        for (int v = 0; v < V; ++v) {
          const float xhat = xhat_of(v);
          const float dz = grad_of_z<kAct>(to_float(d.v[v]), xhat, k.w[v], k.b[v]);
          s1[v] += dz;
          s2[v] = fmaf(dz, xhat, s2[v]);
        }
      }
    }
  }
}

// The task's weight and bias into sm.param and its mean and rstd into sm.grp, then this thread's
// coefficients from them: run while a member's first chunk copies are in flight (their latency
// hides these loads'; a barrier inside: every thread calls it).
template <typename Sm, int V>
__device__ __forceinline__ void load_bwd_coefs(const GnArgs& a, int64_t task, const Sm& sm, int col,
                                               BwdCoefs<V>& k) {
  load_task_params(a, task, sm.param);
  load_group_stats(a, task, sm.grp);
  __syncthreads();
  k.load(a, sm.grp, sm.param, col);
}

// The backward stats of the tiles [t0, t1) of `task`: x and dy chunk by chunk through the ring of
// `slots` chunk pairs, one per-channel and one per-group partial per tile. The task's statistics and
// parameters are loaded into sm.grp and sm.param behind the first copies. Returns the number of chunks.
// kColdRows: the row loop a row at a time (bwd_task_stats' cold variant: cold_stats_rows).
template <typename T, int V, typename TW = T, bool kColdRows = false>
__device__ int member_bwd_stats(const GnArgs& a, int64_t task, int64_t t0, int64_t t1, const TaskSmem<T, TW>& sm,
                                bool one_launch = false) {
  constexpr int R = kChunkRowsPerThread<T, V>;
  const TaskLane lane(a);
  const ThreadChunks<T> tc(a, lane.row, lane.col, V, t0, t1);
  const int64_t base = task_sample(a, task) * a.s * a.c + task_c0(a, task);
  const T* x = static_cast<const T*>(a.x) + base;
  const TW* dy = static_cast<const TW*>(a.dy) + base;
  float2* parts = bwd_partials(a, task);
  float2* gparts = bwd_group_partials(a, task);
  const int gw = groups_per_window(a);
  const int cpt = chunks_per_tile(a);
  const int chunks = static_cast<int>(t1 - t0) * cpt;
  const int rt = a.rows_threads;
  const int sstep = rt * static_cast<int>(a.window);
  const int64_t gstep = static_cast<int64_t>(rt) * a.c;
  const int place = lane.row * static_cast<int>(a.window) + lane.col * V;  // this thread's, in a chunk
  T* mine = sm.slot0 + place;
  const int dd = dy_delta(sm, place);
  BwdCoefs<V> k;
  float s1[V], s2[V];
#pragma unroll
  for (int v = 0; v < V; ++v) s1[v] = s2[v] = 0.f;
  int in_tile = 0;
  int64_t tile = t0;
  const L2Hints l2 =
      l2_hints(soon_reread(a, task, chunks, one_launch), a.chunk_rows * a.window * (sizeof(T) + sizeof(TW)));
  walk_ring_forwards(
      chunks, a.slots,
      [&](int q, int slot) {  // the x and dy chunks of a pair in one copy group
        if (!lane.active) return;
        const int64_t off = tc.offset(q);
        const int limit = tc.limit(q);
        T* s = mine + slot * sm.slot_elems;
        copy_rows<T, V>(x + off, gstep, s, sstep, rt, limit, l2.of(q));
        copy_rows<TW, V, R>(dy + off, gstep, const_cast<TW*>(dy_at<T, TW>(s, dd)), sstep, rt, limit, l2.of(q));
      },
      [&] {
        load_bwd_coefs(a, task, sm, lane.col, k);
        if constexpr (kFusedBwdStats) {
#pragma unroll
          for (int v = 0; v < V; ++v) k.w[v] *= k.rstd[v];  // z = (x - mean) * (rstd * w) + b
        }
      },
      [&](int q, int slot) {
        if (lane.active) {
          const T* s = mine + slot * sm.slot_elems;
          with_act(a.act, [&](auto act) {
            accumulate_rows_bwd<T, V, decltype(act)::value, TW, kColdRows>(s, dy_at<T, TW>(s, dd), sstep, rt,
                                                                          tc.limit(q), k, s1, s2);
          });
        }
        if (++in_tile == cpt) {
          if constexpr (sizeof(TW) == sizeof(T)) {
            fold_channels(a, lane, sm, s1, s2);
          } else {
            fold_channels_outlined(a, lane, sm, s1, s2);
          }
          write_tile_partials(a, sm.chan, sm.param, sm.grp, parts + tile * a.window,
                              gparts + (kBwdGroupMajor ? tile : tile * gw), kBwdGroupMajor ? a.tiles_per_task : 1);
          in_tile = 0;
          ++tile;
        }
      });
  return chunks;
}

// The last member of a task: the groups' sums over the task's tiles, from the tiles' group partials
// [tile][group] (lane j of a group sums the tiles [j*P/L, (j+1)*P/L) in order, then the L lanes fold by
// xor: each lane of a load on its own tile's row of partials; GN_EXP_BWD_GROUP_MAJOR: [group][tile], lane
// j the tiles j, j + L, ..., as group_stats).
static __device__ void bwd_combine_task(const GnArgs& a, int64_t task) {
  const int gw = groups_per_window(a);
  const int tiles = static_cast<int>(a.tiles_per_task);
  const int log2_lanes = combine_lanes_log2(gw), lanes = 1 << log2_lanes;
  const int j = threadIdx.x & (lanes - 1);
  const int lo = (j * tiles) >> log2_lanes, hi = ((j + 1) * tiles) >> log2_lanes;
  const float2* parts = bwd_group_partials(a, task);
  float2* out = group_sums(a) + task_group0(a, task);
  for (int base = 0; base < gw; base += kThreads >> log2_lanes) {
    const int gl = base + (threadIdx.x >> log2_lanes);
    float2 acc = make_float2(0.f, 0.f);
    if (gl < gw) {
      acc = kBwdGroupMajor
                ? sum_partials(parts + static_cast<int64_t>(gl) * tiles + j, 0, (tiles - j + lanes - 1) >> log2_lanes, lanes)
                : sum_partials(parts + gl, lo, hi, gw);
    }
    for (int o = lanes / 2; o > 0; o >>= 1) {
      acc.x += __shfl_xor_sync(kFull, acc.x, o);
      acc.y += __shfl_xor_sync(kFull, acc.y, o);
    }
    if (gl < gw && j == 0) out[gl] = acc;
  }
}

// Strips of dweight/dbias work: 32 channels of one task's window each (apply launch, bwd_param_sums).
__device__ __forceinline__ int64_t bwd_param_strips(const GnArgs& a) {
  return task_count(a) * ((a.window + 31) / 32);
}

// One strip: the channel sums [n][c] of 32 channels of a task over its tiles. Warp w sums the tiles
// [w*P/8, (w+1)*P/8) in order (lane = channel, coalesced), then warp 0 adds the eighths in order
// (through `fold`, kThreads float2 of shared memory).
static __device__ void bwd_param_strip(const GnArgs& a, int64_t strip, float2* fold) {
  const int per_task = static_cast<int>((a.window + 31) / 32);
  const int64_t task = strip / per_task;
  const int width = static_cast<int>(a.window);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int cl = static_cast<int>(strip % per_task) * 32 + lane;
  const int tiles = static_cast<int>(a.tiles_per_task);
  const int lo = warp * tiles / kWarps, hi = (warp + 1) * tiles / kWarps;
  fold[threadIdx.x] = cl < width ? sum_partials(bwd_partials(a, task) + cl, lo, hi, width) : make_float2(0.f, 0.f);
  __syncthreads();
  if (warp == 0 && cl < width) {
    float2 acc = fold[lane];
    for (int w = 1; w < kWarps; ++w) {
      acc.x += fold[w * 32 + lane].x;
      acc.y += fold[w * 32 + lane].y;
    }
    channel_sums(a)[task_sample(a, task) * a.c + task_c0(a, task) + cl] = acc;
  }
  __syncthreads();  // fold is reused
}

// dweight and dbias: strip i of the launch goes to block i % grid (which block sums a strip changes no
// bits); once every strip is summed, one block sums the channel sums over samples in order and stores
// them in the parameters' dtype (no cast kernels after the launch).
static __device__ void bwd_param_totals_now(const GnArgs& a) {
  for (int c = threadIdx.x; c < a.c; c += kThreads) {
    const float2 acc = sum_partials(channel_sums(a) + c, 0, static_cast<int>(a.n), static_cast<int>(a.c));
    if (a.dbias != nullptr) store_param(a.dbias, a.grad_dtype, c, acc.x);
    if (a.dweight != nullptr) store_param(a.dweight, a.grad_dtype, c, acc.y);
  }
}

// The apply launch's strips (bwd_task_apply): the stats launch finished every tile partial, so a block
// sums its strips before its dx, behind its first copies, and the last of the blocks that have strips
// writes the totals. (After the dx, as before, the strips and the last block's totals were a chain at
// the launch's end: 2x1280x16x16's apply launch 14.1 us with them, 7.3 without; RESULTS.md session 9.)
// With GnArgs::strip_blocks, the blocks [grid, grid + strip_blocks) take the strips instead (one each),
// and the dx blocks none: then no dx waits for a strip or for the totals.
static __device__ void bwd_param_sums(const GnArgs& a, float2* fold) {
  if (a.dweight == nullptr && a.dbias == nullptr) return;
  const int64_t strips = bwd_param_strips(a);
  const int first = a.strip_blocks > 0 ? a.grid : 0;  // this launch's strip blocks
  const int count = a.strip_blocks > 0 ? a.strip_blocks : static_cast<int>(gridDim.x);
  const int i = static_cast<int>(blockIdx.x) - first;
  if (i < 0 || i >= strips) return;  // (uniform in the block)
  for (int64_t strip = i; strip < strips; strip += count) bwd_param_strip(a, strip, fold);
  const unsigned with_strips = static_cast<unsigned>(strips < count ? strips : count);
  if (arrive(columns(a, 0), with_strips)) bwd_param_totals_now(a);  // (task 0's column word)
}

// The one-launch backward's totals (bwd_task_onepass): every block calls it after its strips and dx;
// the launch's last block to arrive writes dweight and dbias.
static __device__ void bwd_param_totals(const GnArgs& a) {
  if (a.dweight == nullptr && a.dbias == nullptr) return;
  if (!arrive(columns(a, 0), gridDim.x)) return;  // (task 0's column word: the launch's block count)
  bwd_param_totals_now(a);
}

// The experiment -DGN_EXP_FUSED_BWD_APPLY=1 (off by default): the backward's apply of a 16-bit x computes
// dx from x itself, dx = P * dz + (Q * x + R) and z = P * x + Bz (two or three FFMA per element), with
// P = rstd * w, Q = -rstd^2 * B / M, R = -rstd * A / M - Q * mean, Bz = b - mean * P (fuse_bwd_coefs), instead
// of xhat = (x - mean) * rstd and dx = rstd * (w * dz - (A + xhat * B) / M) (six or seven). As in the
// forward's kFusedApply, the fp32 rounding it adds is far below the 16-bit x's own.
#ifndef GN_EXP_FUSED_BWD_APPLY
#define GN_EXP_FUSED_BWD_APPLY 0
#endif
template <typename T>
constexpr bool kFusedBwdApply = GN_EXP_FUSED_BWD_APPLY != 0 && sizeof(T) == 2;

// kFusedBwdApply's coefficients in place: k.w <- P, k.b <- Bz, ka <- R, kb <- Q (k.mean, k.rstd unused after).
template <int V>
__device__ __forceinline__ void fuse_bwd_coefs(BwdCoefs<V>& k, float (&ka)[V], float (&kb)[V]) {
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const float p = k.rstd[v] * k.w[v];
    const float q = -(k.rstd[v] * k.rstd[v]) * kb[v];
    ka[v] = fmaf(-q, k.mean[v], -k.rstd[v] * ka[v]);
    kb[v] = q;
    k.b[v] = fmaf(-k.mean[v], p, k.b[v]);
    k.w[v] = p;
  }
}

// dx = rstd * (w * dz - (A + xhat * B) / M) for this thread's rows of one chunk pair (kFusedBwdApply: the
// same from fuse_bwd_coefs' coefficients).
template <typename T, int V, int kAct, typename TW, bool kRowAtATime = true>
__device__ __forceinline__ void apply_rows_bwd(const T* sx, const TW* sd, int sstep, T* out, int64_t ystep,
                                               int rows_threads, int limit, const BwdCoefs<V>& k,
                                               const float (&ka)[V], const float (&kb)[V]) {
  constexpr int R = kChunkRowsPerThread<T, V>;
  int r = 0;
#pragma unroll bwd_row_unroll<kAct, V, kRowAtATime>(2)  // (scalar rows: six coefficient arrays live, more at once spilled on sm_100 / sm_120)
  for (int i = 0; i < R; ++i, r += rows_threads, sx += sstep, sd += sstep, out += ystep) {
    if (r < limit) {
      const Pack<T, V> x = *reinterpret_cast<const Pack<T, V>*>(sx);
      const Pack<TW, V> d = *reinterpret_cast<const Pack<TW, V>*>(sd);
      Pack<T, V> o;
      if constexpr (kPairedSilu<T, V, kAct>) {
        // u: x (kFusedBwdApply: k.w, k.b, ka, kb are fuse_bwd_coefs') or xhat; z = u * w + b
        auto u_of = [&](int v) {
          return kFusedBwdApply<T> ? to_float(x.v[v]) : (to_float(x.v[v]) - k.mean[v]) * k.rstd[v];
        };
        auto dx_of = [&](int v, float u, float dz) {
          return kFusedBwdApply<T> ? fmaf(k.w[v], dz, fmaf(kb[v], u, ka[v]))
                                   : k.rstd[v] * (dz * k.w[v] - fmaf(u, kb[v], ka[v]));
        };
#pragma unroll
        for (int v = 0; v < V; v += 2) {
          const float u0 = u_of(v), u1 = u_of(v + 1);
          const float2 dz = silu_grads_pair(k, v, u0, u1, to_float(d.v[v]), to_float(d.v[v + 1]));
          o.v[v] = from_float<T>(dx_of(v, u0, dz.x));
          o.v[v + 1] = from_float<T>(dx_of(v + 1, u1, dz.y));
        }
        store_pack_streaming<T, V>(out, o);
        continue;
      }
#pragma unroll
      for (int v = 0; v < V; ++v) {
        if constexpr (kFusedBwdApply<T>) {
          const float xf = to_float(x.v[v]);
          const float dz = grad_of_z<kAct>(to_float(d.v[v]), xf, k.w[v], k.b[v]);
          o.v[v] = from_float<T>(fmaf(k.w[v], dz, fmaf(kb[v], xf, ka[v])));
        } else {
          const float xhat = (to_float(x.v[v]) - k.mean[v]) * k.rstd[v];
          const float dz = grad_of_z<kAct>(to_float(d.v[v]), xhat, k.w[v], k.b[v]);
          o.v[v] = from_float<T>(k.rstd[v] * (dz * k.w[v] - fmaf(xhat, kb[v], ka[v])));
        }
      }
      store_pack_streaming<T, V>(out, o);
    }
  }
}

// Writes dx for the tiles [t0, t1) of `task`, chunk pairs in reverse order through the ring: the last
// `kept` are still in their slots (the one-pass kernel: member_bwd_stats just read them), the others are
// read again (the activation a template parameter: one set of live coefficients per instantiation). Behind
// the first copies: the task's parameters, statistics and per-group (A / M, B / M) into sm.param,
// sm.grp and sm.coef, after `behind_copies()` (every thread). Returns the number of chunks read.


template <typename T, int V, int kAct, typename TW = T, typename Step = NoStep, bool kRowAtATime = true>
__device__ int member_bwd_apply(const GnArgs& a, int64_t task, int64_t t0, int64_t t1, const TaskSmem<T, TW>& sm,
                                int kept = 0, Step behind_copies = Step{}) {
  constexpr int R = kChunkRowsPerThread<T, V>;
  const TaskLane lane(a);
  const ThreadChunks<T> tc(a, lane.row, lane.col, V, t0, t1);
  const int64_t base = task_sample(a, task) * a.s * a.c + task_c0(a, task);
  const T* x = static_cast<const T*>(a.x) + base;
  const TW* dy = static_cast<const TW*>(a.dy) + base;
  T* dx = static_cast<T*>(a.out) + base;
  BwdCoefs<V> k;
  float ka[V], kb[V];
  auto load_coefs = [&] {  // (a barrier inside: every thread runs it)
    const float count = static_cast<float>(a.s) * static_cast<float>(channels_per_group(a));
    const int64_t ng0 = task_group0(a, task);
    for (int gl = threadIdx.x; gl < groups_per_window(a); gl += kThreads) {
      const float2 q = __ldcg(group_sums(a) + ng0 + gl);
      sm.coef[gl] = make_float2(q.x / count, q.y / count);
    }
    load_bwd_coefs(a, task, sm, lane.col, k);
    int g[V];
    column_groups<V>(a, lane.col, g);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      ka[v] = sm.coef[g[v]].x;
      kb[v] = sm.coef[g[v]].y;
    }
    if constexpr (kFusedBwdApply<T>) fuse_bwd_coefs<V>(k, ka, kb);
  };
  const int slots = a.slots;
  const int chunks = static_cast<int>(t1 - t0) * chunks_per_tile(a);
  const int rt = a.rows_threads;
  const int sstep = rt * static_cast<int>(a.window);
  const int64_t gstep = static_cast<int64_t>(rt) * a.c;
  const int place = lane.row * static_cast<int>(a.window) + lane.col * V;  // this thread's, in a chunk
  T* mine = sm.slot0 + place;
  const int dd = dy_delta(sm, place);
  const int fresh = chunks - kept;  // chunk pairs [0, fresh) are read again; the last `kept` are in their slots
  const uint64_t last_use = l2_evict_first();  // (a re-read is the last use)
  auto read_into = [&](int q, int slot) {
    if (q < 0 || q >= fresh) return 0;
    if (lane.active) {
      const int64_t off = tc.offset(q);
      const int limit = tc.limit(q);
      T* s = mine + slot * sm.slot_elems;
      copy_rows<T, V>(x + off, gstep, s, sstep, rt, limit, last_use);
      copy_rows<TW, V, R>(dy + off, gstep, const_cast<TW*>(dy_at<T, TW>(s, dd)), sstep, rt, limit, last_use);
    }
    return 1;
  };
  auto started = [&] {
    behind_copies();  // (every thread; before the coefficients are live in registers)
    load_coefs();
  };
  const int reads = walk_ring_backwards(chunks, slots, read_into, started, [&](int q, int slot) {
    if (!lane.active) return;
    const T* s = mine + slot * sm.slot_elems;
    apply_rows_bwd<T, V, kAct, TW, kRowAtATime>(s, dy_at<T, TW>(s, dd), sstep, dx + tc.offset(q), gstep, rt, tc.limit(q),
                                                k, ka, kb);
  });
  __syncthreads();  // sm.* are rewritten for the next task
  return reads;
}

}  // namespace gn
