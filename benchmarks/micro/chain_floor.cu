// The floor of a GroupNorm-shaped launch on small tensors, forward and backward, fp16 or bf16
// (scripts/chain_floor.py builds and times it).
//
// A real fp16 channels_last GroupNorm forward (+ SiLU), stripped to the chain every GroupNorm must run: read x,
// reduce each group, wait for the other blocks of the group, write y. It is a measurement, not a product path:
// no shift for the variance, no bitwise match with gn_module's kernels, 16-bit tensors only.
//
// A task is one sample and a window of W channels (whole groups, 16-byte vectors); K blocks, one thread-block
// cluster, split its rows. Each thread holds its rows in registers from one batch of loads; a block folds its
// per-channel sums into per-group sums in shared memory; the cluster meets at its hardware barrier and every
// block reads the K blocks' group sums over distributed shared memory (DSMEM), in rank order; then it writes y
// from its registers. Nothing goes through global memory but x, the parameters and y.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace {

constexpr int kMaxGroupsPerWindow = 64;

// 16-bit elements (__half or __nv_bfloat16) to and from float
__device__ __forceinline__ float to_f(__half h) { return __half2float(h); }
__device__ __forceinline__ float to_f(__nv_bfloat16 h) { return __bfloat162float(h); }
template <typename T>
__device__ __forceinline__ T from_f(float f);
template <>
__device__ __forceinline__ __half from_f<__half>(float f) { return __float2half_rn(f); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float f) { return __float2bfloat16_rn(f); }
// element e of a 16-byte vector of T
template <typename T>
__device__ __forceinline__ float elem(const uint4& v, int e) { return to_f(reinterpret_cast<const T*>(&v)[e]); }
// elements 2j and 2j + 1 of a 16-byte vector of T, and back (pairs convert in fewer instructions and registers)
template <typename T>
__device__ __forceinline__ float2 pair(const uint4& v, int j) {
  if constexpr (std::is_same_v<T, __half>) return __half22float2(reinterpret_cast<const __half2*>(&v)[j]);
  else return __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(&v)[j]);
}
template <typename T>
__device__ __forceinline__ void set_pair(uint4& v, int j, float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) reinterpret_cast<__half2*>(&v)[j] = __floats2half2_rn(lo, hi);
  else reinterpret_cast<__nv_bfloat162*>(&v)[j] = __floats2bfloat162_rn(lo, hi);
}

struct ChainArgs {
  const void* x;  // T (fp16 or bf16), as y, w and b
  void* y;
  const void* w;
  const void* b;
  int64_t rows;  // rows per sample (H x W)
  int c, cpg, window, cluster;
  int silu;
  float eps;
  // non-null: the blocks exchange their group sums through this global buffer (ld.cg after the barrier)
  // instead of distributed shared memory, as gn_module's cluster teams do: what DSMEM saves
  float2* exchange;
};

__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

// p (this block's shared memory) as seen in block `rank` of the cluster
__device__ __forceinline__ float2 load_peer(const float2* p, unsigned rank) {
  const unsigned local = static_cast<unsigned>(__cvta_generic_to_shared(p));
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  float2 v;
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(remote) : "memory");
  return v;
}

// Most threads a block of R vectors per thread may have without spilling (sm_90): in fp16 the registers of
// 1024 threads hold 4 vectors each (64 registers), 512 threads 8, 256 threads 16; bf16's conversions take
// more, so it halves the block from 4 vectors on.
constexpr int max_threads(int vectors, bool bf16) {
  return vectors <= (bf16 ? 2 : 4) ? 1024 : (bf16 ? 2048 : 4096) / vectors;
}

template <typename T, int R>  // 16-byte vectors per thread
__global__ void __launch_bounds__(max_threads(R, std::is_same_v<T, __nv_bfloat16>), 1) chain_gn(ChainArgs a) {
  const T* x = static_cast<const T*>(a.x);
  const T* w = static_cast<const T*>(a.w);
  const T* b = static_cast<const T*>(a.b);
  T* y = static_cast<T*>(a.y);
  extern __shared__ float2 colsum[];  // [row thread][window channel]
  __shared__ float2 block_sums[kMaxGroupsPerWindow];
  __shared__ float2 stats[kMaxGroupsPerWindow];
  const int vr = a.window / 8, rt_count = blockDim.x / vr;
  const int col = threadIdx.x % vr, rt = threadIdx.x / vr;
  const bool active = rt < rt_count;
  const unsigned rank = cluster_rank();
  const int task = blockIdx.x / a.cluster, windows = a.c / a.window;
  const int64_t n = task / windows;
  const int c0 = (task % windows) * a.window + col * 8;
  const int64_t r0 = rank * a.rows / a.cluster, r1 = (rank + 1) * a.rows / a.cluster;
  const int64_t base = n * a.rows * a.c + c0;
  // the parameters first: their loads must not wait behind x's
  uint4 wv = make_uint4(0, 0, 0, 0), bv = wv;
  if (active) {
    wv = __ldg(reinterpret_cast<const uint4*>(w + c0));
    bv = __ldg(reinterpret_cast<const uint4*>(b + c0));
  }
  uint4 v[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int64_t r = r0 + rt + static_cast<int64_t>(i) * rt_count;
    v[i] = active && r < r1 ? __ldcs(reinterpret_cast<const uint4*>(x + base + r * a.c)) : make_uint4(0, 0, 0, 0);
  }
  float s1[8], s2[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) s1[e] = s2[e] = 0.f;
#pragma unroll
  for (int i = 0; i < R; ++i) {  // (rows past the block's are zeros: they add nothing)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = pair<T>(v[i], j);
      s1[2 * j] += f.x;
      s2[2 * j] = fmaf(f.x, f.x, s2[2 * j]);
      s1[2 * j + 1] += f.y;
      s2[2 * j + 1] = fmaf(f.y, f.y, s2[2 * j + 1]);
    }
  }
  if (active) {
#pragma unroll
    for (int e = 0; e < 8; ++e) colsum[rt * a.window + col * 8 + e] = make_float2(s1[e], s2[e]);
  }
  __syncthreads();
  // a warp per group folds its row threads and channels in a fixed order
  const int groups = a.window / a.cpg, lane = threadIdx.x % 32;
  for (int g = threadIdx.x / 32; g < groups; g += blockDim.x / 32) {
    float2 acc = make_float2(0.f, 0.f);
    for (int i = lane; i < rt_count * a.cpg; i += 32) {
      const int rr = i / a.cpg, cc = i - rr * a.cpg;
      const float2 p = colsum[rr * a.window + g * a.cpg + cc];
      acc.x += p.x;
      acc.y += p.y;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      acc.x += __shfl_xor_sync(0xffffffffu, acc.x, o);
      acc.y += __shfl_xor_sync(0xffffffffu, acc.y, o);
    }
    if (lane == 0) {
      block_sums[g] = acc;
      if (a.exchange != nullptr) a.exchange[static_cast<int64_t>(blockIdx.x) * kMaxGroupsPerWindow + g] = acc;
    }
  }
  cluster_arrive();  // every block's group sums, released to the cluster
  cluster_wait();
  if (static_cast<int>(threadIdx.x) < groups) {
    float2 t = make_float2(0.f, 0.f);
    const int64_t first = static_cast<int64_t>(blockIdx.x - rank) * kMaxGroupsPerWindow + threadIdx.x;
    for (int q = 0; q < a.cluster; ++q) {
      const float2 p = a.exchange != nullptr ? __ldcg(a.exchange + first + q * kMaxGroupsPerWindow)
                                             : load_peer(&block_sums[threadIdx.x], static_cast<unsigned>(q));
      t.x += p.x;
      t.y += p.y;
    }
    const float count = static_cast<float>(a.rows) * static_cast<float>(a.cpg);
    const float mean = t.x / count;
    const float var = fmaxf(t.y / count - mean * mean, 0.f);
    stats[threadIdx.x] = make_float2(mean, rsqrtf(var + a.eps));
  }
  cluster_arrive();  // this block has read the others' sums (they may exit once all have)
  __syncthreads();
  if (active) {
    float scale[8], shift[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float2 st = stats[(col * 8 + e) / a.cpg];
      scale[e] = st.y * elem<T>(wv, e);
      shift[e] = fmaf(-st.x, scale[e], elem<T>(bv, e));
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t r = r0 + rt + static_cast<int64_t>(i) * rt_count;
      if (r < r1) {
        uint4 o;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 f = pair<T>(v[i], j);
          float z0 = fmaf(f.x, scale[2 * j], shift[2 * j]), z1 = fmaf(f.y, scale[2 * j + 1], shift[2 * j + 1]);
          if (a.silu) {
            z0 = __fdividef(z0, 1.f + __expf(-z0));
            z1 = __fdividef(z1, 1.f + __expf(-z1));
          }
          set_pair<T>(o, j, z0, z1);
        }
        __stcs(reinterpret_cast<uint4*>(y + base + r * a.c), o);
      }
    }
  }
  cluster_wait();  // no block leaves while another may still read its sums
}

// ---------------------------------------------------------------- backward
// The backward's chain: read x and dy, reduce per channel, wait for the cluster, write dx. A task is one
// window of W channels over ALL samples (so dweight and dbias need no second level: the cluster holds every
// sample of its channels; batch x per_sample <= 16 blocks). Block `rank` takes sample rank / per_sample and
// a 1 / per_sample share of its rows. From the forward's saved mean and rstd each thread forms
// xhat = (x - mean) rstd, z = xhat w + b, dz = dy act'(z), and sums dz and dz xhat per channel. The cluster
// exchanges those per-channel sums over DSMEM: a sample's per-group terms are the w-weighted sums over its
// blocks and its group's channels, dweight / dbias the sums over all blocks (rank 0 stores them, float32).
// dx = rstd (dz w - mean(dz w) - xhat mean(dz w xhat)), from the registers.
constexpr int kMaxWindow = 512;

struct ChainBwdArgs {
  const void* x;  // T (fp16 or bf16), as dy, dx, w and b
  const void* dy;
  void* dx;
  const void* w;
  const void* b;
  const float* mean;  // [batch, groups]
  const float* rstd;
  float* dw;  // [C]
  float* db;
  int64_t rows;
  int c, cpg, groups, window, cluster, per_sample;
  int silu;
};

// Most threads of a backward block of R vectors of x (and R of dy) per thread, without spills (sm_90).
constexpr int max_threads_bwd(int vectors, bool bf16) {
  return vectors <= 1 ? 1024 : vectors <= (bf16 ? 4 : 6) ? 512 : 256;
}

__device__ __forceinline__ float silu_grad_of(float dy, float z) {
  const float s = __fdividef(1.f, 1.f + __expf(-z));
  return dy * s * fmaf(z, 1.f - s, 1.f);
}

template <typename T, int R>
__global__ void __launch_bounds__(max_threads_bwd(R, std::is_same_v<T, __nv_bfloat16>), 1) chain_bwd(ChainBwdArgs a) {
  const T* x = static_cast<const T*>(a.x);
  const T* dy = static_cast<const T*>(a.dy);
  const T* w = static_cast<const T*>(a.w);
  const T* b = static_cast<const T*>(a.b);
  T* dx = static_cast<T*>(a.dx);
  extern __shared__ float2 colsum[];  // [row thread][window channel]
  __shared__ float2 chan[kMaxWindow];  // this block's per-channel (sum dz, sum dz xhat)
  __shared__ float2 weighted[kMaxWindow];  // this sample's, times w
  __shared__ float2 terms[kMaxGroupsPerWindow];  // this sample's per-group means of dz w and dz w xhat
  const int vr = a.window / 8, rt_count = blockDim.x / vr;
  const int col = threadIdx.x % vr, rt = threadIdx.x / vr;
  const bool active = rt < rt_count;
  const int rank = static_cast<int>(cluster_rank());
  const int n = rank / a.per_sample, part = rank % a.per_sample;
  const int cw = (blockIdx.x / a.cluster) * a.window;  // the window's first channel
  const int c0 = cw + col * 8;
  const int64_t r0 = part * a.rows / a.per_sample, r1 = (part + 1) * a.rows / a.per_sample;
  const int64_t base = n * a.rows * a.c + c0;
  __shared__ float2 saved[kMaxGroupsPerWindow];  // the forward's (mean, rstd) of this sample's window groups
  const int groups = a.window / a.cpg;
  for (int g = threadIdx.x; g < groups; g += blockDim.x) {
    const int at = n * a.groups + cw / a.cpg + g;
    saved[g] = make_float2(__ldg(a.mean + at), __ldg(a.rstd + at));
  }
  uint4 wv = make_uint4(0, 0, 0, 0), bv = wv;
  if (active) {
    wv = __ldg(reinterpret_cast<const uint4*>(w + c0));
    bv = __ldg(reinterpret_cast<const uint4*>(b + c0));
  }
  uint4 xv[R], gv[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int64_t r = r0 + rt + static_cast<int64_t>(i) * rt_count;
    const bool in = active && r < r1;
    xv[i] = in ? __ldcs(reinterpret_cast<const uint4*>(x + base + r * a.c)) : make_uint4(0, 0, 0, 0);
    gv[i] = in ? __ldcs(reinterpret_cast<const uint4*>(dy + base + r * a.c)) : make_uint4(0, 0, 0, 0);
  }
  __syncthreads();  // saved
  const float2* own = saved + (col * 8) / a.cpg;  // element e's group: own + (col * 8 % cpg + e) / cpg
  const int lead = col * 8 % a.cpg;
  // dz and xhat of element e of vector i (rows past the block's have dy = 0: they add nothing)
  auto dz_xhat = [&](int i, int e, float& dz, float& xhat) {
    const float xf = elem<T>(xv[i], e);
    const float df = elem<T>(gv[i], e);
    const float2 st = own[(lead + e) / a.cpg];
    xhat = (xf - st.x) * st.y;
    dz = a.silu ? silu_grad_of(df, fmaf(xhat, elem<T>(wv, e), elem<T>(bv, e))) : df;
  };
  float s1[8], s2[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) s1[e] = s2[e] = 0.f;
#pragma unroll
  for (int i = 0; i < R; ++i) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float dz, xhat;
      dz_xhat(i, e, dz, xhat);
      s1[e] += dz;
      s2[e] = fmaf(dz, xhat, s2[e]);
    }
  }
  if (active) {
#pragma unroll
    for (int e = 0; e < 8; ++e) colsum[rt * a.window + col * 8 + e] = make_float2(s1[e], s2[e]);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < a.window; i += blockDim.x) {  // over the row threads, in order
    float2 acc = make_float2(0.f, 0.f);
    for (int r = 0; r < rt_count; ++r) {
      const float2 p = colsum[r * a.window + i];
      acc.x += p.x;
      acc.y += p.y;
    }
    chan[i] = acc;
  }
  cluster_arrive();  // every block's per-channel sums, released to the cluster
  cluster_wait();
  for (int i = threadIdx.x; i < a.window; i += blockDim.x) {
    float2 t = make_float2(0.f, 0.f);
    for (int q = n * a.per_sample; q < (n + 1) * a.per_sample; ++q) {
      const float2 p = load_peer(&chan[i], static_cast<unsigned>(q));
      t.x += p.x;
      t.y += p.y;
    }
    const float wf = to_f(w[cw + i]);
    weighted[i] = make_float2(t.x * wf, t.y * wf);
  }
  if (rank == 0) {
    for (int i = threadIdx.x; i < a.window; i += blockDim.x) {
      float2 t = make_float2(0.f, 0.f);
      for (int q = 0; q < a.cluster; ++q) {
        const float2 p = load_peer(&chan[i], static_cast<unsigned>(q));
        t.x += p.x;
        t.y += p.y;
      }
      a.db[cw + i] = t.x;
      a.dw[cw + i] = t.y;
    }
  }
  cluster_arrive();  // this block has read the others' sums
  __syncthreads();
  for (int g = threadIdx.x; g < groups; g += blockDim.x) {
    float2 t = make_float2(0.f, 0.f);
    for (int k = 0; k < a.cpg; ++k) {
      t.x += weighted[g * a.cpg + k].x;
      t.y += weighted[g * a.cpg + k].y;
    }
    const float count = static_cast<float>(a.rows) * static_cast<float>(a.cpg);
    terms[g] = make_float2(t.x / count, t.y / count);
  }
  __syncthreads();
  if (active) {
    float ta[8], tb[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float2 t = terms[(col * 8 + e) / a.cpg];
      ta[e] = t.x;
      tb[e] = t.y;
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t r = r0 + rt + static_cast<int64_t>(i) * rt_count;
      if (r < r1) {
        uint4 o;
        T* oh = reinterpret_cast<T*>(&o);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          float dz, xhat;
          dz_xhat(i, e, dz, xhat);
          const float g = dz * elem<T>(wv, e);
          oh[e] = from_f<T>(own[(lead + e) / a.cpg].y * (g - ta[e] - xhat * tb[e]));
        }
        __stcs(reinterpret_cast<uint4*>(dx + base + r * a.c), o);
      }
    }
  }
  cluster_wait();  // no block leaves while another may still read its sums
}

__global__ void chain_empty() {}

template <typename... Args>
int launch(void (*kernel)(Args...), int grid, int threads, int cluster, int smem, cudaStream_t stream, Args... args) {
  cudaError_t err;
  if (cluster > 8 && (err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1)))
    return static_cast<int>(err);
  if (smem > 48 * 1024 && (err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)))
    return static_cast<int>(err);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = static_cast<size_t>(smem);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = static_cast<unsigned>(cluster);
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  err = cudaLaunchKernelEx(&config, kernel, args...);
  return static_cast<int>(err != cudaSuccess ? err : cudaGetLastError());
}

// f(std::integral_constant<int, V>{}) for the built vector count V == vectors (one of Vs); -1 for none.
template <int... Vs, typename F>
int with_vectors(int vectors, F&& f) {
  int rc = -1;
  (void)((vectors == Vs ? (rc = f(std::integral_constant<int, Vs>{}), true) : false) || ...);
  return rc;
}

}  // namespace

// Vectors per thread the launch needs (0: more than chain_gn is built for); -1 for a bad geometry. `bf16`: the
// tensors are bf16 (else fp16).
extern "C" int chain_vectors(long long rows, int c, int cpg, int window, int cluster, int threads, int bf16) {
  if (window % 8 || window % cpg || c % window || window / cpg > kMaxGroupsPerWindow || threads % 32 ||
      threads > 1024 || window / 8 > threads || cluster < 1 || cluster > 16)
    return -1;
  const long long block_rows = (rows + cluster - 1) / cluster;
  const long long per_pass = threads / (window / 8);
  const long long r = (block_rows + per_pass - 1) / per_pass;
  for (int v = 1; v <= 16; v *= 2)
    if (r <= v) return threads <= max_threads(v, bf16) ? v : 0;
  return 0;
}

// `exchange`: null (DSMEM), or chain_exchange_per_block() float2 per block of the grid (global memory).
extern "C" int chain_exchange_per_block() { return kMaxGroupsPerWindow; }

// x, y, w, b: fp16, or bf16 where `bf16`.
extern "C" int chain_launch(const void* x, void* y, const void* w, const void* b, long long batch, long long rows,
                            int c, int cpg, int window, int cluster, int threads, int silu, float eps, void* exchange,
                            int bf16, void* stream) {
  const int vectors = chain_vectors(rows, c, cpg, window, cluster, threads, bf16);
  if (vectors <= 0) return -1;
  const ChainArgs a{x, y, w, b, rows, c, cpg, window, cluster, silu, eps, static_cast<float2*>(exchange)};
  const int grid = static_cast<int>(batch * (c / window) * cluster);
  const int smem = (threads / (window / 8)) * window * static_cast<int>(sizeof(float2));
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return with_vectors<1, 2, 4, 8, 16>(vectors, [&](auto r) {
    constexpr int R = decltype(r)::value;
    return bf16 ? launch(chain_gn<__nv_bfloat16, R>, grid, threads, cluster, smem, s, a)
                : launch(chain_gn<__half, R>, grid, threads, cluster, smem, s, a);
  });
}

// Vectors of x (and of dy) per thread a backward launch needs (0: more than chain_bwd is built for); -1 for a
// bad geometry. `per_sample` blocks per sample, batch x per_sample per cluster; `bf16` as chain_vectors'.
extern "C" int chain_bwd_vectors(long long batch, long long rows, int c, int cpg, int window, int per_sample,
                                 int threads, int bf16) {
  if (window % 8 || window % cpg || c % window || window > kMaxWindow || window / cpg > kMaxGroupsPerWindow ||
      threads % 32 || threads > 1024 || window / 8 > threads || per_sample < 1 || batch * per_sample > 16)
    return -1;
  const long long block_rows = (rows + per_sample - 1) / per_sample;
  const long long per_pass = threads / (window / 8);
  const long long r = (block_rows + per_pass - 1) / per_pass;
  for (const int v : {1, 2, 3, 4, 6, 8})
    if (r <= v) return threads <= max_threads_bwd(v, bf16) ? v : 0;
  return 0;
}

// x, dy, dx, w, b: fp16, or bf16 where `bf16`; mean, rstd, dw, db: float32.
extern "C" int chain_bwd_launch(const void* x, const void* dy, void* dx, const void* w, const void* b,
                                const float* mean, const float* rstd, float* dw, float* db, long long batch,
                                long long rows, int c, int cpg, int window, int per_sample, int threads, int silu,
                                int bf16, void* stream) {
  const int vectors = chain_bwd_vectors(batch, rows, c, cpg, window, per_sample, threads, bf16);
  if (vectors <= 0) return -1;
  const int cluster = static_cast<int>(batch) * per_sample;
  const ChainBwdArgs a{x, dy, dx, w, b, mean, rstd, dw, db, rows, c, cpg, c / cpg, window, cluster, per_sample, silu};
  const int grid = (c / window) * cluster;
  const int smem = (threads / (window / 8)) * window * static_cast<int>(sizeof(float2));
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return with_vectors<1, 2, 3, 4, 6, 8>(vectors, [&](auto r) {
    constexpr int R = decltype(r)::value;
    return bf16 ? launch(chain_bwd<__nv_bfloat16, R>, grid, threads, cluster, smem, s, a)
                : launch(chain_bwd<__half, R>, grid, threads, cluster, smem, s, a);
  });
}

// An empty kernel on the same grid of clusters: the launch's own share of the chain.
extern "C" int chain_empty_launch(int grid, int threads, int cluster, void* stream) {
  return launch(chain_empty, grid, threads, cluster, 0, static_cast<cudaStream_t>(stream));
}
