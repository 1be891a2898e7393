// The task reductions both directions share: a chunk's per-thread sums, their fold across a
// tile's threads, the per-tile partials, and the combine of a task's partials in tile order.
#pragma once
#include "gn_task_layout.cuh"

namespace gn {

// ---------------------------------------------------------------- reductions
// Per-thread sums of (x - K) and (x - K)^2 over this thread's rows of one chunk, in row order.
template <typename T, int V, bool kStraight = kFullRowsIn<true>>
__device__ __forceinline__ void accumulate_rows(const T* s, int sstep, int rows_threads, int limit,
                                                const float (&shift)[V], float (&s1)[V], float (&s2)[V]) {
  constexpr int R = kChunkRowsPerThread<T, V>;
  auto row = [&](const T* p) {
    const Pack<T, V> x = *reinterpret_cast<const Pack<T, V>*>(p);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const float e = pack_float(x, v) - shift[v];
      s1[v] += e;
      s2[v] = fmaf(e, e, s2[v]);
    }
  };
  if constexpr (kStraight && R <= 4) {
    if (R * rows_threads <= limit) {
#pragma unroll
      for (int k = 0; k < R; ++k) row(s + k * sstep);
      return;
    }
  }
  int r = 0;
#pragma unroll
  for (int k = 0; k < R; ++k, r += rows_threads, s += sstep) {
    if (r < limit) row(s);
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

// x's first element of the group this thread combines in group_stats' first pass (of the window's first
// group where it has none), as loaded: its callers load it with the task's first copies, so its round trip
// overlaps theirs. Loaded in group_stats, it sat between the barrier and the partials' loads (sm_90 SASS:
// the conversion waits for it ahead of sum_partials' call).
template <typename T>
struct FirstShift {
  T raw;
  __device__ __forceinline__ void load(const GnArgs& a, int64_t task) {
    const int gw = groups_per_window(a);
    const int gl = threadIdx.x >> combine_lanes_log2(gw);
    const int64_t n = task_sample(a, task), c0 = task_c0(a, task);
    raw = static_cast<const T*>(a.x)[n * a.s * a.c + c0 + (gl < gw ? gl * channels_per_group(a) : 0)];
  }
};

// The task's per-group mean and rstd from its tile partials, in tile order (the same bits in every block
// that runs it); `first`: this thread's first-pass shift, loaded ahead (FirstShift).
template <typename T, typename Emit>
__device__ __forceinline__ void group_stats(const GnArgs& a, int64_t task, Emit&& emit, const FirstShift<T>& first) {
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
      shift = to_float(base == 0 ? first.raw : static_cast<const T*>(a.x)[n * a.s * a.c + c0 + gl * cpg]);
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

// The statistics of a task, written to a.mean / a.rstd (the two-pass stats launch's last block). Its shift
// loads here, not with the stats' first copies: there it made the two-launch forward 0.2 us slower (H100,
// sessions 53 and 54), where the one launch gained up to 0.5 us.
template <typename T>
__device__ void combine_task(const GnArgs& a, int64_t task) {
  const int64_t ng0 = task_group0(a, task);
  FirstShift<T> first;
  first.load(a, task);
  group_stats<T>(
      a, task,
      [&](int gl, float mean, float rstd) {
        a.mean[ng0 + gl] = mean;
        a.rstd[ng0 + gl] = rstd;
      },
      first);
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

}  // namespace gn
