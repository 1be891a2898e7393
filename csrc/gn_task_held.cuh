// A one-launch forward member whose rows stay in registers (the experiment -DGN_FWD_HELD=1, off by default):
// a one-round plan whose members hold few chunks loads them straight into registers, reduces them there and
// applies from them, where the chunk ring copies every row into shared memory and reads it back twice.
// gn_micro's prototype of 1x512x128x128 (H100, RESULTS.md session 68) ran 15.8 us of work with its rows in
// registers against 19.0 us through a shared-memory slab at our geometry; ours took 18.7.
// The same rows in the same order per sum and per element as member_stats and member_apply: the same bits.
#pragma once
#include "gn_task_forward.cuh"

namespace gn {

#ifndef GN_FWD_HELD
#define GN_FWD_HELD 0
#endif

// =2: the apply loops over chunks (kHeldApplyLoop), where =1 unrolls all of a member's rows: one SiLU row is
// about 2 KiB of SASS, and 16 of them in a row ran 1.28x slower than the ring (H100, session 69).
// =3: also the stats a loop over tiles (kHeldTileLoop). Session 69 (H100, ncu on 1x512x128x128 SiLU): =2 ran
// 1.08x the ring's time with 1.3-1.5 warp cycles per issued instruction stalled on instruction fetch, against
// 0.22 for the ring, whose loops run one chunk's code again and again.
constexpr bool kHeldApplyLoop = GN_FWD_HELD >= 2;
constexpr bool kHeldTileLoop = GN_FWD_HELD >= 3;

// Rows a thread holds: 16 vectors of 16 bytes (64 registers), so kHeldChunks chunks of kChunkRowsPerThread
// rows; 0 for the scalar path (its 16 rows a chunk would take 16 registers a chunk per channel).
constexpr int kHeldVectors = 16;
template <typename T, int V>
constexpr int kHeldChunks = sizeof(T) * V == 16 ? kHeldVectors / kChunkRowsPerThread<T, V> : 0;

// Host side: whether the one-launch forward of `a` runs held members: the build asks for them, 16-byte
// vectors, one round (a task per team) and every member's chunks (schedule.member_tiles: at most
// ceil(tiles / team size) tiles) within kHeldChunks.
template <typename T, int V>
inline bool held_fits(const GnArgs& a) {
  if (GN_FWD_HELD == 0 || kHeldChunks<T, V> == 0 || a.schedule != 1 || a.team_size < 1) return false;
  const int64_t tasks = a.n * a.windows_per_sample;
  const int64_t most = (a.tiles_per_task + a.team_size - 1) / a.team_size * a.chunks_per_tile;
  return tasks <= a.teams && most <= kHeldChunks<T, V>;
}

// A member's rows in registers: row k of its chunk q in v[q * R + k] (every index a constant: the loops
// over them unroll), as raw words: held as packs of bfloat16, the array stayed in local memory (sm_90: a
// 248-byte stack frame, 16-bit local stores and 1.5 KB of local loads).
template <typename T, int V>
struct HeldRows {
  static constexpr int R = kChunkRowsPerThread<T, V>;
  static constexpr int kChunks = kHeldChunks<T, V> > 0 ? kHeldChunks<T, V> : 1;
  static_assert(sizeof(Pack<T, V>) == 16 || kHeldChunks<T, V> == 0, "held rows are 16-byte vectors");
  uint4 v[kChunks * R];
  // row i as x's elements
  __device__ __forceinline__ Pack<T, V> row(int i) const {
    Pack<T, V> x;
    memcpy(&x, &v[i], sizeof(x));
    return x;
  }
  // row i from global memory, cached in L2 only (the ring's cp.async.cg path)
  __device__ __forceinline__ void load(int i, const T* p) { v[i] = __ldcg(reinterpret_cast<const uint4*>(p)); }
};

// member_stats with the member's rows loaded into `held`, all at once: the tiles [t0, t1) of `task` reduced
// chunk by chunk in row order, their partials written. `trace`: as member_stats' (copies issued, -, -, all
// done), or -1.
template <typename T, int V>
__device__ __forceinline__ void member_held_stats(const GnArgs& a, int64_t task, int64_t t0, int64_t t1,
                                                  const TaskSmem<T>& sm, HeldRows<T, V>& held, int trace = -1) {
  constexpr int R = HeldRows<T, V>::R, K = HeldRows<T, V>::kChunks;
  const TaskLane lane(a);
  const ThreadChunks<T> tc(a, lane.row, lane.col, V, t0, t1);
  const int64_t n = task_sample(a, task), c0 = task_c0(a, task);
  const T* base = static_cast<const T*>(a.x) + n * a.s * a.c + c0;
  float2* parts = const_cast<float2*>(task_partials(a, task));
  const int cpg = channels_per_group(a);
  const int cpt = chunks_per_tile(a);
  const int chunks = static_cast<int>(t1 - t0) * cpt;
  const int rt = a.rows_threads;
  const int64_t gstep = static_cast<int64_t>(rt) * a.c;
  T raw[V];  // the shifts, ahead of the rows (member_stats says why)
  {
    int g[V];
    column_groups<V>(a, lane.col, g);
#pragma unroll
    for (int v = 0; v < V; ++v) raw[v] = lane.active && lane.col * V + v < a.window ? base[g[v] * cpg] : base[0];
  }
#pragma unroll
  for (int q = 0; q < K; ++q) {
    if (q < chunks && lane.active) {
      const T* g = base + tc.offset(q);
      const int limit = tc.limit(q);
#pragma unroll
      for (int k = 0; k < R; ++k) {
        if (k * rt < limit) held.load(q * R + k, g + k * gstep);
      }
    }
  }
  float shift[V], s1[V], s2[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    shift[v] = lane.active ? to_float(raw[v]) : 0.f;
    s1[v] = s2[v] = 0.f;
  }
  if (trace >= 0) trace_point(a, trace);
  // chunk q's rows, in order
  auto accumulate_chunk = [&](int q) {
    if (!lane.active) return;
    const int limit = tc.limit(q);
#pragma unroll
    for (int k = 0; k < R; ++k) {
      if (k * rt < limit) accumulate_pack<T, V>(held.row(q * R + k), shift, s1, s2);
    }
  };
  if constexpr (kHeldTileLoop) {
    // a loop over tiles, each summing its chunks (all K chunks' code, each run by its tile), then one
    // finish_tile: its code once, where unrolling put a copy after every chunk
#pragma unroll 1
    for (int64_t tile = t0, q0 = 0; tile < t1; ++tile, q0 += cpt) {
#pragma unroll
      for (int q = 0; q < K; ++q) {
        if (q >= q0 && q < q0 + cpt) accumulate_chunk(q);
      }
      finish_tile<T, V>(a, lane, sm, s1, s2, parts + tile, a.tiles_per_task);
    }
  } else {
    int in_tile = 0;
    int64_t tile = t0;
#pragma unroll
    for (int q = 0; q < K; ++q) {
      if (q < chunks) {
        accumulate_chunk(q);
        if (++in_tile == cpt) {
          finish_tile<T, V>(a, lane, sm, s1, s2, parts + tile, a.tiles_per_task);
          in_tile = 0;
          ++tile;
        }
      }
    }
  }
  if (trace >= 0) trace_point(a, trace + 3);
}

// member_apply from `held`: y for the tiles [t0, t1) of `task`, with the group statistics in sm.grp and the
// parameters in sm.param. Ends at a barrier, as member_apply.
template <typename T, int V, typename TY = T>
__device__ __forceinline__ void member_held_apply(const GnArgs& a, int64_t task, int64_t t0, int64_t t1,
                                                  const TaskSmem<T>& sm, HeldRows<T, V>& held) {
  constexpr int R = HeldRows<T, V>::R, K = HeldRows<T, V>::kChunks;
  const TaskLane lane(a);
  const ThreadChunks<T> tc(a, lane.row, lane.col, V, t0, t1);
  const int64_t n = task_sample(a, task), c0 = task_c0(a, task);
  TY* out = static_cast<TY*>(a.out) + n * a.s * a.c + c0;
  const ApplyCoefs<V, kFusedApply<T>> coefs(a, sm.grp, sm.param, lane.col);
  const StorePair pair(a);
  const int chunks = static_cast<int>(t1 - t0) * chunks_per_tile(a);
  const int rt = a.rows_threads;
  const int64_t gstep = static_cast<int64_t>(rt) * a.c;
  if (lane.active) {
    with_act(a.act, [&](auto act) {  // (once: the row loops have no branches on it)
      constexpr int kAct = decltype(act)::value;
      if constexpr (kHeldApplyLoop) {
        // one chunk's rows a step, then the next chunk's moved into their registers: one chunk's code
        HeldRows<T, V>& rows = held;
#pragma unroll 1
        for (int q = 0; q < chunks; ++q) {
          TY* y = out + tc.offset(q);
          const int limit = tc.limit(q);
#pragma unroll
          for (int k = 0; k < R; ++k) {
            if (k * rt < limit) apply_pack<T, V, kAct, TY>(rows.row(k), y + k * gstep, coefs, pair);
          }
#pragma unroll
          for (int i = 0; i + R < K * R; ++i) rows.v[i] = rows.v[i + R];
        }
      } else {
#pragma unroll
        for (int q = 0; q < K; ++q) {
          if (q < chunks) {
            TY* y = out + tc.offset(q);
            const int limit = tc.limit(q);
#pragma unroll
            for (int k = 0; k < R; ++k) {
              if (k * rt < limit) apply_pack<T, V, kAct, TY>(held.row(q * R + k), y + k * gstep, coefs, pair);
            }
          }
        }
      }
    });
  }
  __syncthreads();  // sm.grp and sm.param are rewritten for the next task
}

}  // namespace gn
