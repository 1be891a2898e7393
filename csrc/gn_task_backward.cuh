// One member's phases in the backward: its tile partials, their sums, and dx from the group terms.
#pragma once
#include "gn_task_forward.cuh"

namespace gn {

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

// dy * silu'(z) of channels v and v + 1, z = u * w + b, their sigmoids from one MUFU.RCP (kPairedSiluBwd)
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
template <typename T, int V, int kAct, typename TW, bool kRowAtATime = false, bool kStraight = kFullRowsIn<true>>
__device__ __forceinline__ void accumulate_rows_bwd(const T* sx, const TW* sd, int sstep, int rows_threads, int limit,
                                                    const BwdCoefs<V>& k, float (&s1)[V], float (&s2)[V]) {
  constexpr int R = kChunkRowsPerThread<T, V>;
  auto row = [&](const T* px, const TW* pd) {
    const Pack<T, V> x = *reinterpret_cast<const Pack<T, V>*>(px);
    const Pack<TW, V> d = *reinterpret_cast<const Pack<TW, V>*>(pd);
    // xhat, or x - mean under kFusedBwdStats (k.w then holds rstd * w; write_tile_partials scales s2)
    auto xhat_of = [&](int v) {
      const float xc = pack_float(x, v) - k.mean[v];
      return kFusedBwdStats ? xc : xc * k.rstd[v];
    };
    if constexpr (kPairedSiluBwd<T, V, kAct>) {
#pragma unroll
      for (int v = 0; v < V; v += 2) {
        const float h0 = xhat_of(v), h1 = xhat_of(v + 1);
        const float2 dz = silu_grads_pair(k, v, h0, h1, pack_float(d, v), pack_float(d, v + 1));
        s1[v] += dz.x;
        s2[v] = fmaf(dz.x, h0, s2[v]);
        s1[v + 1] += dz.y;
        s2[v + 1] = fmaf(dz.y, h1, s2[v + 1]);
      }
    } else {
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const float xhat = xhat_of(v);
        const float dz = grad_of_z<kAct>(pack_float(d, v), xhat, k.w[v], k.b[v]);
        s1[v] += dz;
        s2[v] = fmaf(dz, xhat, s2[v]);
      }
    }
  };
  if constexpr (kStraight && !kRowAtATime && R <= 4 && act_row_unroll<kAct>(R) == R) {
    if (R * rows_threads <= limit) {
#pragma unroll
      for (int i = 0; i < R; ++i) row(sx + i * sstep, sd + i * sstep);
      return;
    }
  }
  int r = 0;
#pragma unroll bwd_row_unroll<kAct, V, kRowAtATime>(4)  // (16 scalar rows fully unrolled with x and dy spilled on sm_100)
  for (int i = 0; i < R; ++i, r += rows_threads, sx += sstep, sd += sstep) {
    if (r < limit) row(sx, sd);
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
// kColdRows: the row loop a row at a time (bwd_task_stats' cold variant: cold_stats_rows). kOneLaunch:
// this block's own apply follows (bwd_task_onepass), so the copies carry the L2 hints for its re-reads.
template <typename T, int V, typename TW = T, bool kColdRows = false, bool kOneLaunch = false>
__device__ int member_bwd_stats(const GnArgs& a, int64_t task, int64_t t0, int64_t t1, const TaskSmem<T, TW>& sm) {
  constexpr int R = kChunkRowsPerThread<T, V>;
  constexpr bool kHinted = kL2Hints && kOneLaunch;
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
  L2Hints l2;
  if constexpr (kHinted) {
    l2 = l2_hints(a, one_launch_reread(a, chunks), a.chunk_rows * a.window * (sizeof(T) + sizeof(TW)));
  }
  walk_ring_forwards(
      chunks, a.slots,
      [&](int q, int slot) {  // the x and dy chunks of a pair in one copy group
        if (!lane.active) return;
        const int64_t off = tc.offset(q);
        const int limit = tc.limit(q);
        T* s = mine + slot * sm.slot_elems;
        copy_rows<T, V, R, kHinted>(x + off, gstep, s, sstep, rt, limit, kHinted ? l2.of(q) : 0);
        copy_rows<TW, V, R, kHinted>(dy + off, gstep, const_cast<TW*>(dy_at<T, TW>(s, dd)), sstep, rt, limit,
                                     kHinted ? l2.of(q) : 0);
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
            accumulate_rows_bwd<T, V, decltype(act)::value, TW, kColdRows, kFullRowsIn<kOneLaunch>>(
                s, dy_at<T, TW>(s, dd), sstep, rt, tc.limit(q), k, s1, s2);
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
__device__ __forceinline__ int bwd_strips_per_task(const GnArgs& a) {
  return static_cast<int>((a.window + 31) / 32);
}
__device__ __forceinline__ int64_t bwd_param_strips(const GnArgs& a) {
  return task_count(a) * ((a.window + 31) / 32);  // (bwd_strips_per_task, in 64 bits)
}

// One strip, the `j`th of `task`: the channel sums [n][c] of 32 channels of a task over its tiles. Warp
// w sums the tiles [w*P/8, (w+1)*P/8) in order (lane = channel, coalesced), then warp 0 adds the eighths
// in order (through `fold`, kThreads float2 of shared memory).
static __device__ void bwd_param_strip(const GnArgs& a, int64_t task, int j, float2* fold) {
  const int width = static_cast<int>(a.window);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int cl = j * 32 + lane;
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

// A strip's column: its 32 channels' place among a sample's strips (strip j of `task`, `per_task`
// strips a task). The column's strips, one per sample, sum the same channels (schedule.strip_columns).
__device__ __forceinline__ int64_t bwd_strip_column(const GnArgs& a, int64_t task, int j, int per_task) {
  return (task - task_sample(a, task) * windows_per_sample(a)) * per_task + j;
}

// dweight and dbias of one column's channels (warp 0, lane = channel): the same sums over samples, in the
// same order, as bwd_param_totals_now's, so the same bits.
static __device__ void bwd_param_column_total(const GnArgs& a, int64_t task, int j) {
  const int cl = j * 32 + static_cast<int>(threadIdx.x);
  if (threadIdx.x >= 32 || cl >= a.window) return;
  const int64_t c = task_c0(a, task) + cl;
  const float2 acc = sum_partials(channel_sums(a) + c, 0, static_cast<int>(a.n), static_cast<int>(a.c));
  if (a.dbias != nullptr) store_param(a.dbias, a.grad_dtype, c, acc.x);
  if (a.dweight != nullptr) store_param(a.dweight, a.grad_dtype, c, acc.y);
}

// The apply launch's strips (bwd_task_apply): the stats launch finished every tile partial, so a block
// sums its strips before its dx, behind its first copies. (After the dx, as before, the strips and the
// totals were a chain at the launch's end: 2x1280x16x16's apply launch 14.1 us with them, 7.3 without;
// RESULTS.md session 9.) With GnArgs::strip_blocks, the blocks [grid, grid + strip_blocks) take the
// strips instead (one each), and the dx blocks none: then no dx waits for a strip or for the totals.
// The totals go by column: the last of a column's strips (its word counts them) sums that column's
// channels over the samples, so they end one L2 round trip after the column's last strip instead of
// after one block's loop over every channel (2x1280x16x16: 40 columns, 2.8 us; RESULTS.md session 60).
// Batches of 2**16 samples or more (schedule.column_totals) count every strip's block on one word, and
// the last block sums every channel.
static __device__ void bwd_param_sums(const GnArgs& a, float2* fold) {
  if (a.dweight == nullptr && a.dbias == nullptr) return;
  const int64_t strips = bwd_param_strips(a);
  const int first = a.strip_blocks > 0 ? a.grid : 0;  // this launch's strip blocks
  const int count = a.strip_blocks > 0 ? a.strip_blocks : static_cast<int>(gridDim.x);
  const int i = static_cast<int>(blockIdx.x) - first;
  if (i < 0 || i >= strips) return;  // (uniform in the block)
  const bool by_column = a.n < kGeneration;  // (schedule.column_totals)
  const int per_task = bwd_strips_per_task(a);
  for (int64_t strip = i; strip < strips; strip += count) {
    // (task and j once here: recomputed in each helper, the wide bwd_task_apply spilled on sm_80-89)
    const int64_t task = strip / per_task;
    const int j = static_cast<int>(strip % per_task);
    bwd_param_strip(a, task, j, fold);
    if (by_column && arrive(columns(a, bwd_strip_column(a, task, j, per_task)), static_cast<unsigned>(a.n))) {
      bwd_param_column_total(a, task, j);
    }
  }
  if (by_column) return;
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
  constexpr bool kWords = sizeof(TW) == sizeof(T);  // (pack_float: not for the wide dy's loop)
  auto row = [&](const T* px, const TW* pd, T* po) {
    const Pack<T, V> x = *reinterpret_cast<const Pack<T, V>*>(px);
    const Pack<TW, V> d = *reinterpret_cast<const Pack<TW, V>*>(pd);
    Pack<T, V> o;
    if constexpr (kPairedSiluBwd<T, V, kAct>) {
      // u: x (kFusedBwdApply: k.w, k.b, ka, kb are fuse_bwd_coefs') or xhat; z = u * w + b
      auto u_of = [&](int v) {
        return kFusedBwdApply<T> ? pack_float<kWords>(x, v) : (pack_float<kWords>(x, v) - k.mean[v]) * k.rstd[v];
      };
      auto dx_of = [&](int v, float u, float dz) {
        return kFusedBwdApply<T> ? fmaf(k.w[v], dz, fmaf(kb[v], u, ka[v]))
                                 : k.rstd[v] * (dz * k.w[v] - fmaf(u, kb[v], ka[v]));
      };
#pragma unroll
      for (int v = 0; v < V; v += 2) {
        const float u0 = u_of(v), u1 = u_of(v + 1);
        const float2 dz = silu_grads_pair(k, v, u0, u1, pack_float(d, v), pack_float(d, v + 1));
        o.v[v] = from_float<T>(dx_of(v, u0, dz.x));
        o.v[v + 1] = from_float<T>(dx_of(v + 1, u1, dz.y));
      }
    } else {
#pragma unroll
      for (int v = 0; v < V; ++v) {
        if constexpr (kFusedBwdApply<T>) {
          const float xf = pack_float<kWords>(x, v);
          const float dz = grad_of_z<kAct>(pack_float(d, v), xf, k.w[v], k.b[v]);
          o.v[v] = from_float<T>(fmaf(k.w[v], dz, fmaf(kb[v], xf, ka[v])));
        } else {
          const float xhat = (pack_float<kWords>(x, v) - k.mean[v]) * k.rstd[v];
          const float dz = grad_of_z<kAct>(pack_float(d, v), xhat, k.w[v], k.b[v]);
          o.v[v] = from_float<T>(k.rstd[v] * (dz * k.w[v] - fmaf(xhat, kb[v], ka[v])));
        }
      }
    }
    store_pack_streaming<T, V>(po, o);
  };
  // (the one launch's loop only, so =1 only; the two launches' runs cold, a row at a time)
  if constexpr (kFullRowsIn<true> && !kRowAtATime && R <= 4 && act_row_unroll<kAct>(R) == R) {
    if (R * rows_threads <= limit) {
#pragma unroll
      for (int i = 0; i < R; ++i) row(sx + i * sstep, sd + i * sstep, out + i * ystep);
      return;
    }
  }
  int r = 0;
#pragma unroll bwd_row_unroll<kAct, V, kRowAtATime>(2)  // (scalar rows: six coefficient arrays live, more at once spilled on sm_100 / sm_120)
  for (int i = 0; i < R; ++i, r += rows_threads, sx += sstep, sd += sstep, out += ystep) {
    if (r < limit) row(sx, sd, out);
  }
}

// Writes dx for the tiles [t0, t1) of `task`, chunk pairs in reverse order through the ring: the last
// `kept` are still in their slots (the one-pass kernel: member_bwd_stats just read them), the others are
// read again (the activation a template parameter: one set of live coefficients per instantiation). Behind
// the first copies: the task's parameters, statistics and per-group (A / M, B / M) into sm.param,
// sm.grp and sm.coef, after `behind_copies()` (every thread). kOneLaunch: the re-reads carry the L2 policy
// of a last use (bwd_task_onepass). Returns the number of chunks read.


template <typename T, int V, int kAct, typename TW = T, typename Step = NoStep, bool kRowAtATime = true,
          bool kOneLaunch = false>
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
    if constexpr (kOneLaunch) {
      // sm.param and sm.grp still hold this task's: member_bwd_stats loaded them and nothing since writes
      // them. Loaded again, they were two more L2 round trips with no copy in flight to hide them (the
      // kept chunks come first).
      __syncthreads();
      k.load(a, sm.grp, sm.param, lane.col);
    } else {
      load_bwd_coefs(a, task, sm, lane.col, k);
    }
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
  constexpr bool kHinted = kL2Hints && kOneLaunch;
  const uint64_t last_use = kHinted ? l2_evict_first() : 0;  // (a re-read is the last use)
  auto read_into = [&](int q, int slot) {
    if (q < 0 || q >= fresh) return 0;
    if (lane.active) {
      const int64_t off = tc.offset(q);
      const int limit = tc.limit(q);
      T* s = mine + slot * sm.slot_elems;
      copy_rows<T, V, R, kHinted>(x + off, gstep, s, sstep, rt, limit, last_use);
      copy_rows<TW, V, R, kHinted>(dy + off, gstep, const_cast<TW*>(dy_at<T, TW>(s, dd)), sstep, rt, limit, last_use);
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
