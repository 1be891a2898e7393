// Where a task's rows are: task and team geometry from GnArgs' precomputed divisors, the
// shared-memory layout of a member's chunk ring, and the copies of rows, weights and statistics.
#pragma once
#include "gn_task_primitives.cuh"

namespace gn {

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

// The experiment -DGN_EXP_FULL_ROWS=1 (off by default): a thread whose rows of a chunk are all in range (every
// chunk but a range's last) runs them as one straight-line block: both directions' stats loops, the forward's
// apply and the one-launch backward's dx loop. Each row's bounds test is a branch with its own reconvergence
// point, so the compiler schedules a row at a time, and a warp has only a row's V independent chains to hide
// the SiLU loop's latency with (ncu, H200, 1x128x1024x1024: the backward's stats issue on 68 % of cycles at 4
// warps per scheduler, 5.3 cycles per issued instruction). The same operations in the same order per sum and
// per element, so the same bits.
#ifndef GN_EXP_FULL_ROWS
#define GN_EXP_FULL_ROWS 0
#endif
// =2: the two launches' loops only (session 65, H100: with =1 the large rows moved by 0.1-0.3 % and the one
// launch's rows were 2-6.5 % slower). kFullRowsIn<kOneLaunch>: whether a loop of that launch kind runs it.
template <bool kOneLaunch>
constexpr bool kFullRowsIn = GN_EXP_FULL_ROWS == 1 || (GN_EXP_FULL_ROWS == 2 && !kOneLaunch);

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

// A thread's place in a chunk: the tile kernels' Lane, one column of V channels, rows `row`,
// `row + rows_threads`, ... The thread copies, reduces and applies exactly these elements of every chunk,
// so the chunk slots need no barriers: each thread waits for its own copies only.
using TaskLane = Lane;

// This thread's rows of one chunk, global memory -> its places in the slot (`s`, this thread's place
// in the slot): 16-byte cp.async where the layout allows (V * sizeof(T) a multiple of 16: two copies
// for the float32 dy of a wide backward; kHinted: with the L2 policy `l2_policy`, the one launch's), plain
// loads otherwise. Unrolled over the R rows (the lane's, i.e. x's, bound) with constant strides.
template <typename T, int V, int R = kChunkRowsPerThread<T, V>, bool kHinted = false>
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
          if constexpr (kHinted) {
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

// Weight and bias of the task's channels from `from` on into shared memory (visible after the next barrier).
__device__ __forceinline__ void load_task_params(const GnArgs& a, int64_t task, float2* param, int from = 0) {
  const int64_t c0 = task_c0(a, task);
  for (int i = from + static_cast<int>(threadIdx.x); i < a.window; i += kThreads) {
    param[i] = make_float2(load_param(a.weight, a.w_dtype, c0 + i, 1.f), load_param(a.bias, a.w_dtype, c0 + i, 0.f));
  }
}

// A thread's share of a task's (weight, bias), loaded into registers early and stored into shared memory
// later (the cluster forward, whose barrier's release waits for every earlier load): the window's elements
// threadIdx.x and threadIdx.x + kThreads, and any beyond (a window wider than 2 * kThreads channels) when
// stored. What load_task_params stores.
struct EarlyParams {
  ParamBits v[2];  // (converted when stored: a conversion here would wait for its load, ahead of the copies)
  __device__ void load(const GnArgs& a, int64_t task) {
    const int64_t c0 = task_c0(a, task);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int i = threadIdx.x + k * kThreads;
      if (i < a.window) v[k].load(a.weight, a.bias, a.w_dtype, c0 + i);
    }
  }
  __device__ void store(const GnArgs& a, int64_t task, float2* param) const {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int i = threadIdx.x + k * kThreads;
      if (i < a.window) param[i] = v[k].value(a.weight, a.bias, a.w_dtype);
    }
    if (2 * kThreads < a.window) load_task_params(a, task, param, 2 * kThreads);
  }
};

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

}  // namespace gn
