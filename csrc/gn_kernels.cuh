// GroupNorm phases shared by the one-pass (cooperative) and two-pass kernels.
//
// Every phase is a device function over "items" (tiles, level sums, groups, channels). The
// one-pass kernel runs the phases back to back with grid barriers and grid-stride loops; the
// two-pass schedule launches one kernel per phase. Both call the same functions on the same
// items, so each item's result does not depend on which block ran it, how many blocks there
// were, or which schedule ran: outputs are bitwise identical across schedules and residency
// caps. No floating-point atomics anywhere; every sum has a fixed order.
#pragma once
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "gn_api.h"

namespace gn {
namespace cg = cooperative_groups;

constexpr int kThreads = 256;
// Register budgets, as blocks of kThreads that must fit on one SM (ptxas then caps registers at
// 64K / (blocks * kThreads)). Chosen as the tightest budgets that compile without spills for
// 16-byte vectors on every arch (tests/test_multiarch_compile.py checks): the forward keeps
// 3 x 8 floats per channel group in registers, the backward 6 x 8.
constexpr int kMinBlocksForward = 2;
constexpr int kMinBlocksBackward = 2;
constexpr int kMinBlocksOnepass = 2;
// GN_OVERFLOW_LOOP=0 compiles the one-pass kernels as if every tile had its own resident block
// (no grid-stride over overflow tiles). Never for use: it exists so that
// tests/test_overflow_cost.py can show what the overflow support costs in registers.
#ifndef GN_OVERFLOW_LOOP
#define GN_OVERFLOW_LOOP 1
#endif
// Tile stride of the one-pass kernels' tile loops.
__device__ __forceinline__ int64_t overflow_stride(int64_t tiles) {
  return GN_OVERFLOW_LOOP ? static_cast<int64_t>(gridDim.x) : tiles;
}

// Partials summed by one level item; must equal gn_module.schedule.FANIN (checked at launch).
constexpr int kFanin = 32;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;

// ---------------------------------------------------------------- element access
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// The experiment -DGN_EXP_BF16_WORDS=1 (off by default): element v of a bfloat16 pack converted from its
// 32-bit word, one instruction each (the even element shifted up, the odd one masked: a bfloat16 is the top
// half of a float32, so both are exact and give __bfloat162float's bits). sm_90 SASS of the default: the
// element is extracted first (a PRMT, then a shift), about 1.4 instructions per value against the fp16
// loops' one HADD2.F32, and the bf16 SiLU backward runs 2.3 % slower than fp16's (RESULTS.md session 63).
// kWords = false: the plain conversion (the wide backward's dx loop spilled 8 bytes on sm_100 and sm_110).
#ifndef GN_EXP_BF16_WORDS
#define GN_EXP_BF16_WORDS 0
#endif
template <typename T>
constexpr bool kBf16 = false;
template <>
constexpr bool kBf16<__nv_bfloat16> = true;
template <bool kWords = true, typename T, int V>
__device__ __forceinline__ float pack_float(const Pack<T, V>& p, int v) {
  if constexpr (GN_EXP_BF16_WORDS != 0 && kWords && kBf16<T> && V % 2 == 0) {
    const uint32_t w = reinterpret_cast<const uint32_t*>(p.v)[v >> 1];
    return __uint_as_float((v & 1) != 0 ? (w & 0xffff0000u) : (w << 16));
  } else {
    return to_float(p.v[v]);
  }
}

template <typename T, int V>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, V>*>(p);
}

// Outputs are written once and not read again by this op: stream them past L2 so the input
// the apply phase re-reads stays cached.
template <typename T, int V>
__device__ __forceinline__ void store_pack_streaming(T* p, const Pack<T, V>& v) {
  if constexpr (sizeof(Pack<T, V>) % 16 == 0) {  // (32 bytes: the wide forward's float32 y)
#pragma unroll
    for (int j = 0; j < static_cast<int>(sizeof(Pack<T, V>)) / 16; ++j) {
      __stcs(reinterpret_cast<uint4*>(p) + j, reinterpret_cast<const uint4*>(&v)[j]);
    }
  } else {
    *reinterpret_cast<Pack<T, V>*>(p) = v;
  }
}

__device__ __forceinline__ float load_param(const void* p, int dtype, int64_t c, float fallback) {
  if (p == nullptr) return fallback;
  if (dtype == 1) return __half2float(static_cast<const __half*>(p)[c]);
  if (dtype == 2) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[c]);
  return static_cast<const float*>(p)[c];
}

// A channel's weight and bias as loaded, not yet converted (a 16-bit dtype's bits in the low half). A
// conversion right after its own load, in load_param's dtype branch, waits for that load before the next
// is issued: SASS of the cluster forward, 2 round trips ahead of its first copy (H100 trace, 1.2 us). Loaded
// here, both loads are in flight at once and the conversion waits until value().
struct ParamBits {
  uint32_t w, b;
  __device__ __forceinline__ static uint32_t raw(const void* p, int dtype, int64_t c) {
    if (p == nullptr) return 0u;
    return dtype == 0 ? static_cast<const uint32_t*>(p)[c] : static_cast<const unsigned short*>(p)[c];
  }
  __device__ __forceinline__ static float value_of(uint32_t bits, int dtype) {
    if (dtype == 1) return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
    if (dtype == 2) return __uint_as_float(bits << 16);  // (bfloat16 -> float32 is exact: its bits shifted)
    return __uint_as_float(bits);
  }
  __device__ __forceinline__ void load(const void* weight, const void* bias, int dtype, int64_t c) {
    w = raw(weight, dtype, c);
    b = raw(bias, dtype, c);
  }
  // (weight, bias) as load_param gives them: 1 and 0 where the module has none
  __device__ __forceinline__ float2 value(const void* weight, const void* bias, int dtype) const {
    return make_float2(weight == nullptr ? 1.f : value_of(w, dtype), bias == nullptr ? 0.f : value_of(b, dtype));
  }
};

// A parameter gradient stored in the parameters' dtype (GnArgs.grad_dtype; rounded once, as torch does).
__device__ __forceinline__ void store_param(void* p, int dtype, int64_t c, float v) {
  if (dtype == 1) {
    static_cast<__half*>(p)[c] = __float2half_rn(v);
  } else if (dtype == 2) {
    static_cast<__nv_bfloat16*>(p)[c] = __float2bfloat16_rn(v);
  } else {
    static_cast<float*>(p)[c] = v;
  }
}

// exp(-z) as __expf(-z) computes it (ex2.approx of z * -log2(e)), but with the result flushed to zero
// where it would be denormal: __expf's ex2.approx.f32 brackets each MUFU.EX2 with a range check and two
// predicated multiplies (sm_90 SASS), 3 of SiLU's 8 instructions per element, in kernels whose element
// loops are issue-bound (H200: a free sigmoid would make SiLU's backward 6-8 % faster). Denormal results
// only arise for z > 87, where 1 + exp(-z) rounds to 1 either way, and a denormal argument gives 1 both
// ways: SiLU's bits do not change.
__device__ __forceinline__ float exp_neg(float z) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(z * -1.4426950408889634f));
  return r;
}

// The fast division: no slow-path branch per element (ncu on the task apply: the precise
// reciprocal's range check serialised SiLU); 1 + exp(-z) overflowing to inf gives 0, the limit.
__device__ __forceinline__ float sigmoid(float z) { return __fdividef(1.f, 1.f + exp_neg(z)); }

// GN_SILU_PAIRED_RCP: 2 (the default since session 66) the forward's 16-bit SiLU apply, 1 also the backward's SiLU
// loops (1-4 % slower there, session 47), 0 none: two elements' sigmoids from one MUFU.RCP. SiLU's element loops issue
// an EX2 and an RCP per element, and the SM's MUFU pipe does 16 of them per clock: 8 SiLU elements per clock per SM,
// about a 16-bit apply's DRAM rate (the H200: 2.1e12 elements/s against 1.0e12 for the apply at 4 TB/s, and a
// one-launch apply writes all at once). r = 1 / (d0 * d1), then 1 / d0 = d1 * r and 1 / d1 = d0 * r: one MUFU for seven
// FMA/ALU-pipe instructions, about 2.5 ulp of float32 against 1.5 for the division (far below a 16-bit output's
// rounding). Each denominator is capped at 2^63 in the product, so that it stays finite and r normal; a denominator
// past the cap (1 + exp(-z) for z < -43.6, where 1 / d < 2^-63) gets 0, as an infinite one does in the division
// (z = -inf then gives NaN, as torch). A NaN denominator (a NaN z) is capped too: its partner's quotient stays exact,
// and its own stays NaN through z.
__device__ __forceinline__ void reciprocal_pair(float d0, float d1, float& r0, float& r1) {
  constexpr float kCap = 0x1p63f;
  const float c0 = fminf(d0, kCap), c1 = fminf(d1, kCap);
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(c0 * c1));
  r0 = d0 > kCap ? 0.f : c1 * r;
  r1 = d1 > kCap ? 0.f : c0 * r;
}
// sigmoid(z0), sigmoid(z1) through reciprocal_pair
__device__ __forceinline__ void sigmoid_pair(float z0, float z1, float& s0, float& s1) {
  reciprocal_pair(1.f + exp_neg(z0), 1.f + exp_neg(z1), s0, s1);
}
// dy * silu'(z) given s = sigmoid(z) (through_act's SiLU)
__device__ __forceinline__ float silu_grad(float dy, float z, float s) { return dy * s * fmaf(z, 1.f - s, 1.f); }
#ifndef GN_SILU_PAIRED_RCP
#define GN_SILU_PAIRED_RCP 2
#endif

// ---------------------------------------------------------------- fused activations
// GnArgs.act (gn_module._abi.ACT_CODES): the activation applied to z = xhat * w + b.
enum ActCode : int { kActNone = 0, kActSilu = 1, kActRelu = 2, kActGelu = 3, kActGeluTanh = 4 };
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;  // the standard normal density at 0
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kGeluCubic = 0.044715f;               // tanh GELU: tanh(sqrt(2/pi) (z + 0.044715 z^3))

// max(z, 0) that keeps a NaN z, as torch's ReLU does: fmaxf(NaN, 0) is 0, so a fused ReLU turned a NaN group
// (a diverging model's) into zeros. One FMNMX either way (max.NaN: sm_80 and newer, every arch built).
__device__ __forceinline__ float relu(float z) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(z), "f"(0.f));
  return r;
}

// act(z). SiLU as z / (1 + exp(-z)) with the fast division (exp(-z) overflowing to inf gives -0, the
// limit); the GELUs with the precise erf / tanh, as the fp64 reference is tight in float32.
template <int kAct>
__device__ __forceinline__ float activate(float z) {
  if constexpr (kAct == kActSilu) {
    return __fdividef(z, 1.f + exp_neg(z));
  } else if constexpr (kAct == kActRelu) {
    return relu(z);
  } else if constexpr (kAct == kActGelu) {
    return 0.5f * z * (1.f + erff(z * kInvSqrt2));
  } else if constexpr (kAct == kActGeluTanh) {
    return 0.5f * z * (1.f + tanhf(kSqrt2OverPi * fmaf(kGeluCubic * z, z * z, z)));
  } else {
    return z;
  }
}

// dy * act'(z): the loss gradient of z given the gradient dy of act(z). ReLU passes dy where z > 0 or z is
// NaN (torch's threshold on its output: 0 where it is <= 0, so 0 at z = 0 and dy at NaN).
template <int kAct>
__device__ __forceinline__ float through_act(float dy, float z) {
  if constexpr (kAct == kActSilu) {
    return silu_grad(dy, z, sigmoid(z));
  } else if constexpr (kAct == kActRelu) {
    return z <= 0.f ? 0.f : dy;
  } else if constexpr (kAct == kActGelu) {
    const float cdf = 0.5f * (1.f + erff(z * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * expf(-0.5f * z * z);
    return dy * fmaf(z, pdf, cdf);
  } else if constexpr (kAct == kActGeluTanh) {
    const float z2 = z * z;
    const float t = tanhf(kSqrt2OverPi * fmaf(kGeluCubic * z, z2, z));
    const float dinner = kSqrt2OverPi * fmaf(3.f * kGeluCubic, z2, 1.f);
    return dy * (0.5f * (1.f + t) + 0.5f * z * (1.f - t * t) * dinner);
  } else {
    return dy;
  }
}

// The GELUs' erf / tanh take many registers per element: their row loops are not unrolled, so
// they do not raise the register count (and lower the occupancy) of the kernels every act shares.
template <int kAct>
__host__ __device__ constexpr int act_row_unroll(int light) {
  return kAct == kActGelu || kAct == kActGeluTanh ? 1 : light;
}

// The backward's row loops over a chunk (the apply loop; the stats loop in bwd_task_stats' cold variant):
// a row at a time for packs, `scalar` rows (within act_row_unroll) for scalar rows. A pack row's SASS is about 2 KiB with an activation; on small shapes a
// member runs the loop only a few times, so it runs cold and instruction fetch stalled the apply launch more
// than anything else (ncu: 5.2 warp-cycles per issued instruction on 2x1280x16x16 SiLU, 4.0 a row at a time);
// the rows' x and dy come from shared memory, so unrolling bought little latency. kRowAtATime = false keeps
// act_row_unroll's rows for packs too (the one-launch backward: a row at a time spilled on sm_100 there, its
// stats and apply sharing the registers).
template <int kAct, int V, bool kRowAtATime = true>
__host__ __device__ constexpr int bwd_row_unroll(int scalar) {
  return V > 1 && kRowAtATime ? 1 : act_row_unroll<kAct>(scalar);
}

template <int K>
struct ActTag {
  static constexpr int value = K;
};

// f(ActTag<code>{}) for the runtime code `act`: the activation becomes a template parameter once
// per chunk or row range, so the element loops have no branches.
template <typename F>
__device__ __forceinline__ auto with_act(int act, F&& f) {
  switch (act) {
    case kActSilu:
      return f(ActTag<kActSilu>{});
    case kActRelu:
      return f(ActTag<kActRelu>{});
    case kActGelu:
      return f(ActTag<kActGelu>{});
    case kActGeluTanh:
      return f(ActTag<kActGeluTanh>{});
    default:
      return f(ActTag<kActNone>{});
  }
}

// ---------------------------------------------------------------- tile geometry
struct Tile {
  int64_t n, t, row0, rows;
  __device__ Tile(const GnArgs& a, int64_t tile) {
    n = tile / a.tiles_per_slice;
    t = tile - n * a.tiles_per_slice;
    row0 = t * a.rows_per_tile;
    rows = min(a.rows_per_tile, a.s - row0);
  }
  __device__ int64_t offset(const GnArgs& a) const { return (n * a.s + row0) * a.c; }
};

// Which channels and rows one thread covers in a tile (same map in every phase, so the thread
// that parks a value in shared memory is the one that reads it back).
struct Lane {
  int col, row;
  bool active;
  __device__ explicit Lane(const GnArgs& a)
      : col(threadIdx.x % a.cols_threads), row(threadIdx.x / a.cols_threads),
        active(threadIdx.x / a.cols_threads < a.rows_threads) {}
};

// Group of each of a thread's V channels starting at c0. 32-bit division (channel counts fit),
// and only two divisions when all V channels fall into one group (the common case).
template <int V>
__device__ __forceinline__ void groups_of(const GnArgs& a, int64_t c0, int (&g)[V]) {
  const int d = static_cast<int>(a.c) / static_cast<int>(a.g);
  const int c = static_cast<int>(c0);
  const int first = c / d, last = (c + V - 1) / d;
#pragma unroll
  for (int v = 0; v < V; ++v) g[v] = first == last ? first : (c + v) / d;
}

__device__ __forceinline__ float2* partials(const GnArgs& a) {
  return reinterpret_cast<float2*>(a.workspace + a.off_partials);
}
__device__ __forceinline__ float2* level_buffer(const GnArgs& a) {
  return reinterpret_cast<float2*>(a.workspace + a.off_level);
}
__device__ __forceinline__ float2* channel_sums(const GnArgs& a) {
  return reinterpret_cast<float2*>(a.workspace + a.off_channel_sums);
}
__device__ __forceinline__ float2* group_sums(const GnArgs& a) {
  return reinterpret_cast<float2*>(a.workspace + a.off_group_sums);
}
// Partials left for the combine phase: levels ping-pong between the two buffers.
__device__ __forceinline__ const float2* final_partials(const GnArgs& a) {
  return (a.nlevels % 2) ? level_buffer(a) : partials(a);
}
// Partials per (n, c) after `level` levels. Selecting with constant indices keeps the parameter
// array out of local memory.
__device__ __forceinline__ int64_t tiles_after(const GnArgs& a, int level) {
  int64_t t = a.tiles_per_slice;
#pragma unroll
  for (int i = 0; i < GN_MAX_LEVELS; ++i) t = (i < level) ? a.level_tiles[i] : t;
  return t;
}
__device__ __forceinline__ int64_t final_tiles(const GnArgs& a) { return tiles_after(a, a.nlevels); }

// Rows of a tile that one thread owns, visited in batches of U: the U loads of a batch all issue
// before the first is used, so every thread keeps U (backward: 2U) 16-byte loads in flight.
// `load(r, u)` fills slot u with row r, `use(r, u)` consumes it.
template <int U, typename Load, typename Use>
__device__ __forceinline__ void rows_in_batches(int64_t first, int64_t rows, int step, Load&& load, Use&& use) {
  for (int64_t r0 = first; r0 < rows; r0 += static_cast<int64_t>(step) * U) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t r = r0 + static_cast<int64_t>(u) * step;
      if (r < rows) load(r, u);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t r = r0 + static_cast<int64_t>(u) * step;
      if (r < rows) use(r, u);
    }
  }
}
// Rows per batch: the streaming kernels of the two-pass schedule, and the one-pass kernel (which
// also carries the reduction phases and must stay within 128 registers for 2 blocks per SM).
constexpr int kBatchForward = 4;
constexpr int kBatchBackward = 2;
constexpr int kBatchOnepassForward = 1;
constexpr int kBatchOnepassBackward = 1;

// ---------------------------------------------------------------- in-tile channel reduction
// Sums each thread's V per-channel values over the rows of the tile, in a fixed order: first
// across the lanes of a warp that share a column (xor butterfly, symmetric so every lane holds
// the same bits), then sequentially over warps (or row threads) through shared memory.
template <int V>
__device__ void reduce_columns(const GnArgs& a, const Lane& lane, float* scratch, const float (&s1)[V],
                               const float (&s2)[V], float2* out, int64_t chunk_c0) {
  const int ct = a.cols_threads;
  const int width = ct * V;
  const bool fold_warp = (32 % ct) == 0;
  const int warp = threadIdx.x / 32, lane_id = threadIdx.x % 32;
  const int srows = fold_warp ? kWarps : a.rows_threads;
  const int srow = fold_warp ? warp : lane.row;
  const bool writer = fold_warp ? lane_id < ct : lane.active;
  float r1[V];
#pragma unroll
  for (int round = 0; round < 2; ++round) {
#pragma unroll
    for (int v = 0; v < V; ++v) {
      float x = round == 0 ? s1[v] : s2[v];
      if (fold_warp) {
        for (int o = 16; o >= ct; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
      }
      if (writer) scratch[srow * width + lane.col * V + v] = x;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int i = threadIdx.x + k * kThreads;
      if (i < width) {
        float acc = 0.f;
        for (int r = 0; r < srows; ++r) acc += scratch[r * width + i];
        if (round == 0) {
          r1[k] = acc;
        } else if (chunk_c0 + i < a.c) {
          out[chunk_c0 + i] = make_float2(r1[k], acc);
        }
      }
    }
    __syncthreads();
  }
}

// ---------------------------------------------------------------- forward phases
// Per-tile, per-channel sums of (x - K) and (x - K)^2 with K = x[n, row 0, first channel of the
// group]: a shift shared by every tile of the slice keeps the variance exact for large means.
template <typename T, int V, int U>
__device__ void fwd_tile(const GnArgs& a, int64_t tile_id, T* keep, float* scratch) {
  const Tile tile(a, tile_id);
  const Lane lane(a);
  const T* x = static_cast<const T*>(a.x) + tile.offset(a);
  const T* row0 = static_cast<const T*>(a.x) + tile.n * a.s * a.c;
  float2* out = partials(a) + (tile.n * a.tiles_per_slice + tile.t) * a.c;
  for (int chunk = 0; chunk < a.col_chunks; ++chunk) {
    const int64_t j = static_cast<int64_t>(chunk) * a.cols_threads + lane.col;
    const bool valid = lane.active && j * V < a.c;
    float shift[V], s1[V], s2[V];
    int grp[V];
    groups_of<V>(a, j * V, grp);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      s1[v] = 0.f;
      s2[v] = 0.f;
      shift[v] = valid ? to_float(row0[static_cast<int64_t>(grp[v]) * (a.c / a.g)]) : 0.f;
    }
    if (valid) {
      Pack<T, V> buf[U];
      rows_in_batches<U>(
          lane.row, tile.rows, a.rows_threads,
          [&](int64_t r, int u) { buf[u] = load_pack<T, V>(x + r * a.c + j * V); },
          [&](int64_t r, int u) {
            if (keep != nullptr) *reinterpret_cast<Pack<T, V>*>(keep + r * a.c + j * V) = buf[u];
#pragma unroll
            for (int v = 0; v < V; ++v) {
              const float e = to_float(buf[u].v[v]) - shift[v];
              s1[v] += e;
              s2[v] = fmaf(e, e, s2[v]);
            }
          });
    }
    reduce_columns<V>(a, lane, scratch, s1, s2, out, static_cast<int64_t>(chunk) * a.cols_threads * V);
  }
}

// Sum of count <= kFanin partials at stride `stride`, sequential in t. Loads are issued in
// batches before the adds (fixed trip counts, predicated): two memory latencies per item.
__device__ __forceinline__ float2 sum_tiles(const float2* p, int64_t stride, int64_t count) {
  constexpr int kBatch = kFanin / 4;
  float2 acc = make_float2(0.f, 0.f);
#pragma unroll
  for (int b = 0; b < kFanin; b += kBatch) {
    float2 v[kBatch];
#pragma unroll
    for (int t = 0; t < kBatch; ++t) v[t] = b + t < count ? p[(b + t) * stride] : make_float2(0.f, 0.f);
#pragma unroll
    for (int t = 0; t < kBatch; ++t) {
      acc.x += v[t].x;
      acc.y += v[t].y;
    }
  }
  return acc;
}

// One level: out[n, t', c] = sum of in[n, t'*F .. t'*F+F-1, c], sequential over t.
__device__ inline void level_items(const GnArgs& a, int level, int64_t first, int64_t stride) {
  const float2* in = (level % 2) ? level_buffer(a) : partials(a);
  float2* out = (level % 2) ? partials(a) : level_buffer(a);
  const int64_t t_in = tiles_after(a, level);
  const int64_t t_out = tiles_after(a, level + 1);
  const int64_t items = a.n * t_out * a.c;
  for (int64_t i = first; i < items; i += stride) {
    const int64_t c = i % a.c;
    const int64_t rest = i / a.c;
    const int64_t to = rest % t_out, n = rest / t_out;
    out[(n * t_out + to) * a.c + c] = sum_tiles(in + (n * t_in + to * kFanin) * a.c + c, a.c,
                                                 min(t_in - to * kFanin, static_cast<int64_t>(kFanin)));
  }
}

// Sums of one (n, c) over the partials left after the levels, sequential over t.
__device__ __forceinline__ float2 channel_total(const GnArgs& a, int64_t n, int64_t c) {
  const int64_t tiles = final_tiles(a);  // <= kFanin after the levels
  return sum_tiles(final_partials(a) + n * tiles * a.c + c, a.c, tiles);
}

__device__ __forceinline__ float2 warp_sum(float2 v) {
  for (int o = 16; o > 0; o >>= 1) {
    v.x += __shfl_down_sync(kFull, v.x, o);
    v.y += __shfl_down_sync(kFull, v.y, o);
  }
  return v;  // lane 0 holds the fixed-order total
}

// One warp per (n, g): mean and rstd of the group.
template <typename T>
__device__ void fwd_combine_items(const GnArgs& a, int64_t first_warp, int64_t warp_stride) {
  const int lane = threadIdx.x % 32;
  const int64_t d = a.c / a.g;
  for (int64_t item = first_warp; item < a.n * a.g; item += warp_stride) {
    const int64_t n = item / a.g, g = item - n * a.g;
    float2 acc = make_float2(0.f, 0.f);
    for (int64_t c = g * d + lane; c < (g + 1) * d; c += 32) {
      const float2 s = channel_total(a, n, c);
      acc.x += s.x;
      acc.y += s.y;
    }
    acc = warp_sum(acc);
    if (lane == 0) {
      const float count = static_cast<float>(a.s) * static_cast<float>(d);
      const float shift = to_float(static_cast<const T*>(a.x)[n * a.s * a.c + g * d]);
      const float m = acc.x / count;
      const float v = acc.y / count - m * m;
      const float var = v < 0.f ? 0.f : v;  // rounding can go below 0; NaN (from NaN/Inf input) stays NaN
      a.mean[item] = shift + m;
      a.rstd[item] = rsqrtf(var + a.eps);
    }
  }
}

template <typename T, int V, int U>
__device__ void fwd_apply_tile(const GnArgs& a, int64_t tile_id, const T* keep) {
  const Tile tile(a, tile_id);
  const Lane lane(a);
  if (!lane.active) return;
  const T* x = static_cast<const T*>(a.x) + tile.offset(a);
  T* y = static_cast<T*>(a.out) + tile.offset(a);
  for (int chunk = 0; chunk < a.col_chunks; ++chunk) {
    const int64_t j = static_cast<int64_t>(chunk) * a.cols_threads + lane.col;
    if (j * V >= a.c) continue;
    float mean[V], scale[V], beta[V];
    int grp[V];
    groups_of<V>(a, j * V, grp);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int64_t c = j * V + v;
      const int64_t ng = tile.n * a.g + grp[v];
      mean[v] = a.mean[ng];
      scale[v] = a.rstd[ng] * load_param(a.weight, a.w_dtype, c, 1.f);
      beta[v] = load_param(a.bias, a.w_dtype, c, 0.f);
    }
    Pack<T, V> buf[U];
    with_act(a.act, [&](auto act) {
      rows_in_batches<U>(
          lane.row, tile.rows, a.rows_threads,
          [&](int64_t r, int u) {
            const int64_t off = r * a.c + j * V;
            buf[u] = keep != nullptr ? *reinterpret_cast<const Pack<T, V>*>(keep + off) : load_pack<T, V>(x + off);
          },
          [&](int64_t r, int u) {
            Pack<T, V> q;
#pragma unroll
            for (int v = 0; v < V; ++v) {
              const float z = fmaf(to_float(buf[u].v[v]) - mean[v], scale[v], beta[v]);
              q.v[v] = from_float<T>(activate<decltype(act)::value>(z));
            }
            store_pack_streaming<T, V>(y + r * a.c + j * V, q);
          });
    });
  }
}

// ---------------------------------------------------------------- backward phases
// Per channel, what the loss gradient dz of the normalized output z = xhat*gamma + beta is
// (through the fused activation), and the two sums every reduction needs: dz*xhat and dz.
struct ChannelCoef {
  float mean, rstd, gamma, beta;
};

template <int V>
__device__ __forceinline__ void load_coefs(const GnArgs& a, int64_t n, int64_t c0, ChannelCoef (&k)[V]) {
  int grp[V];
  groups_of<V>(a, c0, grp);
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int64_t c = c0 + v;
    const int64_t ng = n * a.g + grp[v];
    k[v].mean = a.mean[ng];
    k[v].rstd = a.rstd[ng];
    k[v].gamma = load_param(a.weight, a.w_dtype, c, 1.f);
    k[v].beta = load_param(a.bias, a.w_dtype, c, 0.f);
  }
}

// (A warp-uniform switch per element: the tile kernels are no longer the default.)
__device__ __forceinline__ float grad_z(const GnArgs& a, float dy, float xhat, const ChannelCoef& k) {
  if (a.act == kActNone) return dy;
  const float z = fmaf(xhat, k.gamma, k.beta);
  return with_act(a.act, [&](auto act) { return through_act<decltype(act)::value>(dy, z); });
}

template <typename T, int V, int U>
__device__ void bwd_tile(const GnArgs& a, int64_t tile_id, T* keep_x, T* keep_dy, float* scratch) {
  const Tile tile(a, tile_id);
  const Lane lane(a);
  const T* x = static_cast<const T*>(a.x) + tile.offset(a);
  const T* dy = static_cast<const T*>(a.dy) + tile.offset(a);
  float2* out = partials(a) + (tile.n * a.tiles_per_slice + tile.t) * a.c;
  for (int chunk = 0; chunk < a.col_chunks; ++chunk) {
    const int64_t j = static_cast<int64_t>(chunk) * a.cols_threads + lane.col;
    const bool valid = lane.active && j * V < a.c;
    float s1[V], s2[V];
    ChannelCoef k[V];
#pragma unroll
    for (int v = 0; v < V; ++v) s1[v] = s2[v] = 0.f;
    if (valid) {
      load_coefs<V>(a, tile.n, j * V, k);
      Pack<T, V> bx[U], bd[U];
      rows_in_batches<U>(
          lane.row, tile.rows, a.rows_threads,
          [&](int64_t r, int u) {
            bx[u] = load_pack<T, V>(x + r * a.c + j * V);
            bd[u] = load_pack<T, V>(dy + r * a.c + j * V);
          },
          [&](int64_t r, int u) {
            if (keep_x != nullptr) {
              *reinterpret_cast<Pack<T, V>*>(keep_x + r * a.c + j * V) = bx[u];
              *reinterpret_cast<Pack<T, V>*>(keep_dy + r * a.c + j * V) = bd[u];
            }
#pragma unroll
            for (int v = 0; v < V; ++v) {
              const float xhat = (to_float(bx[u].v[v]) - k[v].mean) * k[v].rstd;
              const float dz = grad_z(a, to_float(bd[u].v[v]), xhat, k[v]);
              s1[v] = fmaf(dz, xhat, s1[v]);
              s2[v] += dz;
            }
          });
    }
    reduce_columns<V>(a, lane, scratch, s1, s2, out, static_cast<int64_t>(chunk) * a.cols_threads * V);
  }
}

// One warp per (n, g): per-channel totals A = sum dz*xhat, B = sum dz (kept for dgamma and
// dbeta), and the group's gamma-weighted totals that dx needs.
__device__ inline void bwd_combine_items(const GnArgs& a, int64_t first_warp, int64_t warp_stride) {
  const int lane = threadIdx.x % 32;
  const int64_t d = a.c / a.g;
  for (int64_t item = first_warp; item < a.n * a.g; item += warp_stride) {
    const int64_t n = item / a.g, g = item - n * a.g;
    float2 acc = make_float2(0.f, 0.f);
    for (int64_t c = g * d + lane; c < (g + 1) * d; c += 32) {
      const float2 s = channel_total(a, n, c);
      channel_sums(a)[n * a.c + c] = s;
      const float gamma = load_param(a.weight, a.w_dtype, c, 1.f);
      acc.x = fmaf(gamma, s.x, acc.x);
      acc.y = fmaf(gamma, s.y, acc.y);
    }
    acc = warp_sum(acc);
    if (lane == 0) group_sums(a)[item] = acc;
  }
}

// One warp per channel: dgamma = sum over n of A, dbeta = sum over n of B.
__device__ inline void bwd_param_items(const GnArgs& a, int64_t first_warp, int64_t warp_stride) {
  if (a.dweight == nullptr && a.dbias == nullptr) return;
  const int lane = threadIdx.x % 32;
  for (int64_t c = first_warp; c < a.c; c += warp_stride) {
    float2 acc = make_float2(0.f, 0.f);
    for (int64_t n = lane; n < a.n; n += 32) {
      const float2 s = channel_sums(a)[n * a.c + c];
      acc.x += s.x;
      acc.y += s.y;
    }
    acc = warp_sum(acc);
    if (lane == 0) {
      if (a.dweight != nullptr) a.dweight[c] = acc.x;
      if (a.dbias != nullptr) a.dbias[c] = acc.y;
    }
  }
}

template <typename T, int V, int U>
__device__ void bwd_apply_tile(const GnArgs& a, int64_t tile_id, const T* keep_x, const T* keep_dy) {
  const Tile tile(a, tile_id);
  const Lane lane(a);
  if (!lane.active) return;
  const int64_t d = a.c / a.g;
  const float inv_count = 1.f / (static_cast<float>(a.s) * static_cast<float>(d));
  const T* x = static_cast<const T*>(a.x) + tile.offset(a);
  const T* dy = static_cast<const T*>(a.dy) + tile.offset(a);
  T* dx = static_cast<T*>(a.out) + tile.offset(a);
  for (int chunk = 0; chunk < a.col_chunks; ++chunk) {
    const int64_t j = static_cast<int64_t>(chunk) * a.cols_threads + lane.col;
    if (j * V >= a.c) continue;
    ChannelCoef k[V];
    float ga[V], gb[V];
    int grp[V];
    load_coefs<V>(a, tile.n, j * V, k);
    groups_of<V>(a, j * V, grp);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const float2 gs = group_sums(a)[tile.n * a.g + grp[v]];
      ga[v] = gs.x * inv_count;
      gb[v] = gs.y * inv_count;
    }
    Pack<T, V> bx[U], bd[U];
    rows_in_batches<U>(
        lane.row, tile.rows, a.rows_threads,
        [&](int64_t r, int u) {
          const int64_t off = r * a.c + j * V;
          bx[u] = keep_x != nullptr ? *reinterpret_cast<const Pack<T, V>*>(keep_x + off) : load_pack<T, V>(x + off);
          bd[u] = keep_dy != nullptr ? *reinterpret_cast<const Pack<T, V>*>(keep_dy + off) : load_pack<T, V>(dy + off);
        },
        [&](int64_t r, int u) {
          Pack<T, V> q;
#pragma unroll
          for (int v = 0; v < V; ++v) {
            const float xhat = (to_float(bx[u].v[v]) - k[v].mean) * k[v].rstd;
            const float dz = grad_z(a, to_float(bd[u].v[v]), xhat, k[v]);
            q.v[v] = from_float<T>(k[v].rstd * (dz * k[v].gamma - fmaf(xhat, ga[v], gb[v])));
          }
          store_pack_streaming<T, V>(dx + r * a.c + j * V, q);
        });
  }
}

// ---------------------------------------------------------------- shared-memory layout
template <typename T>
__device__ __forceinline__ T* keep_region(int tensor, const GnArgs& a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int64_t tile_bytes = (a.rows_per_tile * a.c * static_cast<int64_t>(sizeof(T)) + 15) / 16 * 16;
  return reinterpret_cast<T*>(smem + tensor * tile_bytes);
}
__device__ __forceinline__ float* scratch_region(int tensors_kept, int64_t tile_bytes_each) {
  extern __shared__ __align__(128) unsigned char smem[];
  return reinterpret_cast<float*>(smem + tensors_kept * ((tile_bytes_each + 15) / 16 * 16));
}

__device__ __forceinline__ void record(const GnArgs& a, int slot, int value) {
  if (a.record != nullptr && threadIdx.x == 0) atomicAdd(a.record + slot, value);
}

}  // namespace gn
