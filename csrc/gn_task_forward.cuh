// One member's phases in the forward: the walks of its chunk ring, its statistics and its apply.
#pragma once
#include "gn_task_reduce.cuh"

namespace gn {

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

// The chunks [0, reread) of a one-launch member's range that its apply reads again right after the team's
// statistics (l2_hints): all but the last min(chunks, slots), which stay in their slots.
__device__ __forceinline__ int one_launch_reread(const GnArgs& a, int chunks) {
  return chunks - min(chunks, static_cast<int>(a.slots));
}

// Reduces the tiles [t0, t1) of `task` chunk by chunk through the ring of `slots` chunks (the next
// slots - 1 chunks are in flight while one is summed) and writes their partials. On return the last
// min(slots, chunks) chunks are in their slots. Returns the number of chunks. `ring` > 0 caps the
// slots used (the two-launch stats kernel, which keeps no chunk for an apply). kOneLaunch: this block's own
// apply follows, so the copies carry the L2 hints for its re-reads (l2_hints); the two-launch stats' carry none.
// `trace`: the first of 4 trace points (copies issued, first chunk in, first tile done, all
// done), or -1 for none.
template <typename T, int V, bool kOneLaunch = true>
__device__ int member_stats(const GnArgs& a, int64_t task, int64_t t0, int64_t t1, const TaskSmem<T>& sm,
                            int trace = -1, int ring = 0) {
  constexpr bool kHinted = kL2Hints && kOneLaunch;
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
  L2Hints l2;
  if constexpr (kHinted) l2 = l2_hints(a, one_launch_reread(a, chunks), a.chunk_rows * a.window * sizeof(T));
  walk_ring_forwards(
      chunks, ring > 0 ? min(ring, a.slots) : a.slots,
      [&](int q, int slot) {
        if (!lane.active) return;
        T* to = mine + slot * sm.slot_elems;
        if (kHinted && l2.any()) {
          copy_rows<T, V, kChunkRowsPerThread<T, V>, kHinted>(base + tc.offset(q), gstep, to, sstep, rt, tc.limit(q),
                                                              l2.of(q));
        } else {
          copy_rows<T, V>(base + tc.offset(q), gstep, to, sstep, rt, tc.limit(q));
        }
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
        if (lane.active) {
          accumulate_rows<T, V, kFullRowsIn<kOneLaunch>>(mine + slot * sm.slot_elems, sstep, rt, tc.limit(q), shift, s1,
                                                         s2);
        }
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

// The forward's apply of a 16-bit x computes z = x * scale + (beta - mean * scale), one FFMA per element,
// instead of (x - mean) * scale + beta (an FADD and an FFMA), as torch's own kernel does. The fp32 rounding it
// adds (2^-24 of |x * scale|) is far below the 16-bit x's own (2^-11 of |x|); float32 x keeps the subtraction.
// The 16-bit SiLU apply looked issue-bound (RESULTS.md session 44). The default since session 66, with the
// paired sigmoids (GN_SILU_PAIRED_RCP=2): 1.5-3 % off the mid and small SiLU forwards (H100; session 47's
// H200: 1-4 %); -DGN_FWD_FUSED_APPLY=0 builds the subtraction.
#ifndef GN_FWD_FUSED_APPLY
#define GN_FWD_FUSED_APPLY 1
#endif
template <typename T>
constexpr bool kFusedApply = GN_FWD_FUSED_APPLY != 0 && sizeof(T) == 2;
// Whether a SiLU element loop of this x type and vector takes sigmoids in pairs (gn_kernels.cuh
// reciprocal_pair, -DGN_SILU_PAIRED_RCP=1; =2, the default: the forward's apply only, where the one launch's SiLU apply
// runs on every block at once after the barrier, while the backward lost 1-4 % with pairs, session 47):
// 16-bit x, an even vector. kPairedSiluBwd: the backward's loops.
template <typename T, int V, int kAct>
constexpr bool kPairedSilu = GN_SILU_PAIRED_RCP != 0 && kAct == kActSilu && sizeof(T) == 2 && V % 2 == 0;
template <typename T, int V, int kAct>
constexpr bool kPairedSiluBwd = kPairedSilu<T, V, kAct> && GN_SILU_PAIRED_RCP == 1;

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
template <typename T, int V, int kAct, typename TY = T, bool kStraight = kFullRowsIn<true>>
__device__ __forceinline__ void apply_rows(const T* s, int sstep, TY* y, int64_t ystep, int rows_threads, int limit,
                                           const ApplyCoefs<V, kFusedApply<T>>& k_, const StorePair& pair) {
  constexpr int R = kChunkRowsPerThread<T, V>;
  auto row = [&](const T* px, TY* py) {
    const Pack<T, V> x = *reinterpret_cast<const Pack<T, V>*>(px);
    Pack<TY, V> o;
    if constexpr (kPairedSilu<T, V, kAct>) {
#pragma unroll
      for (int v = 0; v < V; v += 2) {
        const float z0 = k_.z(pack_float(x, v), v), z1 = k_.z(pack_float(x, v + 1), v + 1);
        float r0, r1;
        reciprocal_pair(1.f + exp_neg(z0), 1.f + exp_neg(z1), r0, r1);
        o.v[v] = from_float<TY>(z0 * r0);
        o.v[v + 1] = from_float<TY>(z1 * r1);
      }
    } else {
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const float z = k_.z(pack_float(x, v), v);
        o.v[v] = from_float<TY>(activate<kAct>(z));
      }
    }
    if constexpr (sizeof(Pack<TY, V>) == 32) {
      if (pair.on) {
        store_pair_streaming<TY, V>(py, o, pair.mask, pair.odd);
        return;
      }
    }
    store_pack_streaming<TY, V>(py, o);
  };
  if constexpr (kStraight && R <= 4 && act_row_unroll<kAct>(R) == R) {
    if (R * rows_threads <= limit) {
#pragma unroll
      for (int k = 0; k < R; ++k) row(s + k * sstep, y + k * ystep);
      return;
    }
  }
  int r = 0;
#pragma unroll act_row_unroll<kAct>(R)
  for (int k = 0; k < R; ++k, r += rows_threads, s += sstep, y += ystep) {
    if (r < limit) row(s, y);
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
// (member_stats just read them); the others are read again, each into the slot its successor frees, in a one
// launch (kOneLaunch) with the L2 policy of a last use. Returns the number of chunks re-read.
template <typename T, int V, typename TY = T, bool kOneLaunch = true, typename Step = NoStep>
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
  constexpr bool kHinted = kL2Hints && kOneLaunch;
  const uint64_t last_use = kHinted ? l2_evict_first() : 0;  // (a re-read is the last use)
  auto reread_into = [&](int q, int slot) {  // chunk q (if it is read again) into `slot`
    if (q >= 0 && q < fresh) {
      if (lane.active)
        copy_rows<T, V, kChunkRowsPerThread<T, V>, kHinted>(base + tc.offset(q), gstep, mine + slot * sm.slot_elems,
                                                            sstep, rt, tc.limit(q), last_use);
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
    with_act(a.act, [&](auto act) {
      apply_rows<T, V, decltype(act)::value, TY, kFullRowsIn<kOneLaunch>>(s, sstep, y, gstep, rt, limit, coefs, pair);
    });
  });
  __syncthreads();  // sm.grp and sm.param are rewritten for the next task
  return reread;
}

}  // namespace gn
