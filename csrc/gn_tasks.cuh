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

// ---------------------------------------------------------------- synchronisation words
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
// Word pairs per task: an arrival counter (always left at zero) and a flag (holds an epoch). The
// layout does not depend on the launch's task count, so a counter word is never a flag word of an
// earlier launch with other shapes.
__device__ __forceinline__ unsigned* arrivals(const GnArgs& a, int64_t task) { return a.sync + 2 + 2 * task; }
__device__ __forceinline__ unsigned* flags(const GnArgs& a, int64_t task) { return a.sync + 3 + 2 * task; }

// Every block of the launch reads the launch epoch first; the last block to finish advances it.
// Flags set in this launch carry epoch + 1, so flags left by earlier launches (or by an earlier
// replay of a captured graph) never satisfy a wait, and the words never need zeroing again.
__device__ __forceinline__ unsigned launch_epoch(const GnArgs& a) {
  __shared__ unsigned epoch;
  if (threadIdx.x == 0) epoch = load_acquire(a.sync);
  __syncthreads();
  return epoch;
}
__device__ __forceinline__ void finish_launch(const GnArgs& a) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(a.sync + 1, 1u) == gridDim.x - 1) {
      a.sync[1] = 0;
      __threadfence();
      atomicAdd(a.sync, 1u);
    }
  }
}

// Counts this block in; true (in every thread) for the block that completes `expected` arrivals.
// Everything the block wrote before is visible to that last block. The last block resets the
// counter, so it is zero again for the next launch.
__device__ __forceinline__ bool arrive(unsigned* counter, unsigned expected) {
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1u) == expected - 1;
    if (last) {
      *counter = 0;
      __threadfence();
    }
  }
  __syncthreads();
  return last;
}

// ---------------------------------------------------------------- profiling
// Optional phase timeline (GnArgs::trace, scripts/profile_tasks.py --trace): thread 0 of each block
// records clock64() at numbered points; one null check per point when off.
constexpr int kTracePoints = 16;
__device__ __forceinline__ void trace_point(const GnArgs& a, int point) {
  if (a.trace != nullptr && threadIdx.x == 0 && point < kTracePoints) {
    a.trace[static_cast<int64_t>(blockIdx.x) * kTracePoints + point] = clock64();
  }
}

// ---------------------------------------------------------------- task geometry
struct TaskTile {
  int64_t n, c0;  // sample and first channel of the task's window
  int64_t row0, rows;
};

__device__ __forceinline__ int64_t task_count(const GnArgs& a) { return a.n * (a.c / a.window); }
__device__ __forceinline__ int64_t task_sample(const GnArgs& a, int64_t task) { return task / (a.c / a.window); }
__device__ __forceinline__ int64_t task_c0(const GnArgs& a, int64_t task) {
  return (task % (a.c / a.window)) * a.window;
}

// The `q`-th chunk of the tiles [t0, t1) of a task: tiles have rows_per_tile rows (the last tile of
// the task fewer) and are cut into chunks of chunk_rows; a chunk past the task's end has 0 rows.
struct Chunk {
  int64_t tile, row0;
  int rows;
  bool last_of_tile;
};
__device__ __forceinline__ int chunks_per_tile(const GnArgs& a) {
  return static_cast<int>((a.rows_per_tile + a.chunk_rows - 1) / a.chunk_rows);
}
__device__ __forceinline__ Chunk chunk_at(const GnArgs& a, int64_t t0, int64_t q) {
  const int cpt = chunks_per_tile(a);
  Chunk ch;
  ch.tile = t0 + q / cpt;
  const int k = static_cast<int>(q % cpt);
  ch.row0 = ch.tile * a.rows_per_tile + static_cast<int64_t>(k) * a.chunk_rows;
  const int64_t end = min((ch.tile + 1) * a.rows_per_tile, a.s);
  ch.rows = static_cast<int>(max(static_cast<int64_t>(0), min(static_cast<int64_t>(a.chunk_rows), end - ch.row0)));
  ch.last_of_tile = k == cpt - 1;
  return ch;
}

// ---------------------------------------------------------------- shared-memory layout
// [slots x chunk][column scratch][per-channel totals][per-group accumulators]; the same formula as
// schedule.task_smem_bytes.
template <typename T>
struct TaskSmem {
  T* slot0;
  int64_t slot_elems;
  float* scratch;
  float2* chan;
  float2* grp;
  __device__ explicit TaskSmem(const GnArgs& a) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int64_t slot_bytes = (a.chunk_rows * a.window * static_cast<int64_t>(sizeof(T)) + 15) / 16 * 16;
    const int width = a.cols_threads * a.vec;
    const int srows = max(kWarps, a.rows_threads);
    slot0 = reinterpret_cast<T*>(smem);
    slot_elems = slot_bytes / static_cast<int64_t>(sizeof(T));
    unsigned char* p = smem + a.slots * slot_bytes;
    scratch = reinterpret_cast<float*>(p);
    p += (static_cast<int64_t>(srows) * width * 4 + 15) / 16 * 16;
    chan = reinterpret_cast<float2*>(p);
    p += static_cast<int64_t>(width) * 8;
    grp = reinterpret_cast<float2*>(p);
  }
  __device__ T* slot(int64_t q, int slots) const { return slot0 + (q % slots) * slot_elems; }
};

// A thread's place in a chunk: one column of V channels, rows `row`, `row + rows_threads`, ...
struct TaskLane {
  int col, row;
  bool active;
  __device__ explicit TaskLane(const GnArgs& a)
      : col(threadIdx.x % a.cols_threads), row(threadIdx.x / a.cols_threads),
        active(threadIdx.x / a.cols_threads < a.rows_threads) {}
};

// Copy one chunk of a task (rows x window) from global memory into a shared-memory slot: 16-byte
// cp.async where the layout allows (V * sizeof(T) == 16), plain loads otherwise.
template <typename T, int V>
__device__ __forceinline__ void load_chunk(const GnArgs& a, const T* task_base, const Chunk& ch, T* slot) {
  const int vpr = static_cast<int>(a.window / V);
  const int total = ch.rows * vpr;
  for (int i = threadIdx.x; i < total; i += kThreads) {
    const int r = i / vpr, v = i - r * vpr;
    const T* g = task_base + (ch.row0 + r) * a.c + v * V;
    T* s = slot + static_cast<int64_t>(r) * a.window + v * V;
    if constexpr (sizeof(T) * V == 16) {
      cp_async16(s, g);
    } else {
      *reinterpret_cast<Pack<T, V>*>(s) = load_pack<T, V>(g);
    }
  }
}

// ---------------------------------------------------------------- reductions
// Per-thread sums of (x - K) and (x - K)^2 over the chunk's rows, in row order.
template <typename T, int V>
__device__ __forceinline__ void accumulate_chunk(const GnArgs& a, const TaskLane& lane, const T* slot, int rows,
                                                 const float (&shift)[V], float (&s1)[V], float (&s2)[V]) {
  if (!lane.active) return;
  const T* p = slot + lane.col * V;
#pragma unroll 4
  for (int r = lane.row; r < rows; r += a.rows_threads) {
    const Pack<T, V> x = *reinterpret_cast<const Pack<T, V>*>(p + static_cast<int64_t>(r) * a.window);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const float e = to_float(x.v[v]) - shift[v];
      s1[v] += e;
      s2[v] = fmaf(e, e, s2[v]);
    }
  }
}

// Ends a tile: sums the threads' values per channel (across the lanes of a warp that share a
// column by an xor butterfly, then over warps or row threads in order), then per group over its
// channels in order, and writes the tile's partial of each of the window's groups.
template <typename T, int V>
__device__ void finish_tile(const GnArgs& a, const TaskLane& lane, const TaskSmem<T>& sm, float (&s1)[V],
                            float (&s2)[V], float2* out, int64_t tiles) {
  const int ct = a.cols_threads;
  const int width = ct * V;
  const bool fold_warp = (32 % ct) == 0;
  const int warp = threadIdx.x / 32, lane_id = threadIdx.x % 32;
  const int srows = fold_warp ? kWarps : a.rows_threads;
  const int srow = fold_warp ? warp : lane.row;
  const bool writer = fold_warp ? lane_id < ct : lane.active;
#pragma unroll
  for (int round = 0; round < 2; ++round) {
#pragma unroll
    for (int v = 0; v < V; ++v) {
      float x = round == 0 ? s1[v] : s2[v];
      if (fold_warp) {
        for (int o = 16; o >= ct; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
      }
      if (writer) sm.scratch[srow * width + lane.col * V + v] = x;
      if (round == 1) s1[v] = s2[v] = 0.f;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < width; i += kThreads) {
      float acc = 0.f;
      for (int r = 0; r < srows; ++r) acc += sm.scratch[r * width + i];
      if (round == 0) {
        sm.chan[i].x = acc;
      } else {
        sm.chan[i].y = acc;
      }
    }
    __syncthreads();
  }
  const int cpg = static_cast<int>(a.c / a.g);
  const int gw = static_cast<int>(a.window) / cpg;
  for (int gl = threadIdx.x; gl < gw; gl += kThreads) {
    float2 acc = make_float2(0.f, 0.f);
    for (int k = 0; k < cpg; ++k) {
      const float2 c = sm.chan[gl * cpg + k];
      acc.x += c.x;
      acc.y += c.y;
    }
    out[static_cast<int64_t>(gl) * tiles] = acc;
  }
}

// Threads that share one group in the combine: a power of two <= 32 (one warp's butterfly).
__device__ __forceinline__ int combine_lanes(int gw) {
  int t = 32;
  while (t > 1 && t * gw > kThreads) t >>= 1;
  return t;
}

// Mean and rstd of each group of a task from its tile partials [group][tile], in a fixed order:
// lane j of a group sums the tiles [j*P/L, (j+1)*P/L) in order, then the L lanes fold by xor.
template <typename T>
__device__ void combine_task(const GnArgs& a, int64_t task, const float2* parts) {
  const int64_t n = task_sample(a, task), c0 = task_c0(a, task);
  const int cpg = static_cast<int>(a.c / a.g);
  const int gw = static_cast<int>(a.window) / cpg;
  const int64_t tiles = a.tiles_per_task;
  const int lanes = combine_lanes(gw);
  const int j = threadIdx.x % lanes;
  const int64_t lo = j * tiles / lanes, hi = (j + 1) * tiles / lanes;
  for (int base = 0; base < gw; base += kThreads / lanes) {
    const int gl = base + threadIdx.x / lanes;
    float2 acc = make_float2(0.f, 0.f);
    if (gl < gw) {
      const float2* p = parts + static_cast<int64_t>(gl) * tiles;
#pragma unroll 8
      for (int64_t t = lo; t < hi; ++t) {
        const float2 v = __ldcg(p + t);
        acc.x += v.x;
        acc.y += v.y;
      }
    }
    for (int o = lanes / 2; o > 0; o >>= 1) {
      acc.x += __shfl_xor_sync(kFull, acc.x, o);
      acc.y += __shfl_xor_sync(kFull, acc.y, o);
    }
    if (gl < gw && j == 0) {
      const int64_t g = c0 / cpg + gl;
      const float count = static_cast<float>(a.s) * static_cast<float>(cpg);
      const float shift = to_float(static_cast<const T*>(a.x)[n * a.s * a.c + g * cpg]);
      const float m = acc.x / count;
      const float v = acc.y / count - m * m;
      const float var = v < 0.f ? 0.f : v;  // rounding can go below 0; NaN stays NaN
      a.mean[n * a.g + g] = shift + m;
      a.rstd[n * a.g + g] = rsqrtf(var + a.eps);
    }
  }
  __threadfence();
  __syncthreads();
}

// ---------------------------------------------------------------- one member's phases
// Reduces the tiles [t0, t1) of `task` chunk by chunk through the ring of `slots` chunks (the next
// slots - 1 chunks are in flight while one is summed) and writes their partials. On return the
// last min(slots, chunks) chunks are in their slots. Returns the number of chunks.
template <typename T, int V>
__device__ int64_t member_stats(const GnArgs& a, int64_t task, int64_t t0, int64_t t1, const TaskSmem<T>& sm) {
  const TaskLane lane(a);
  const int64_t n = task_sample(a, task), c0 = task_c0(a, task);
  const T* base = static_cast<const T*>(a.x) + n * a.s * a.c + c0;
  const int64_t tiles = a.tiles_per_task;
  float2* parts = reinterpret_cast<float2*>(a.workspace + a.off_partials) + task * (a.window / (a.c / a.g)) * tiles;
  const int cpg = static_cast<int>(a.c / a.g);
  float shift[V], s1[V], s2[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int cl = lane.col * V + v;
    const int64_t first = cl < a.window ? c0 + cl / cpg * cpg : c0;
    shift[v] = lane.active ? to_float(base[first - c0]) : 0.f;  // x[n, row 0, group's first channel]
    s1[v] = s2[v] = 0.f;
  }
  const int slots = a.slots;
  const int ahead = slots - 1;
  const int64_t chunks = (t1 - t0) * chunks_per_tile(a);
  for (int64_t q = 0; q < ahead; ++q) {
    if (q < chunks) load_chunk<T, V>(a, base, chunk_at(a, t0, q), sm.slot(q, slots));
    cp_async_commit();
  }
  for (int64_t q = 0; q < chunks; ++q) {
    const int64_t next = q + ahead;
    if (next < chunks) load_chunk<T, V>(a, base, chunk_at(a, t0, next), sm.slot(next, slots));
    cp_async_commit();
    cp_async_wait(ahead);
    __syncthreads();
    const Chunk ch = chunk_at(a, t0, q);
    accumulate_chunk<T, V>(a, lane, sm.slot(q, slots), ch.rows, shift, s1, s2);
    if (ch.last_of_tile) finish_tile<T, V>(a, lane, sm, s1, s2, parts + ch.tile, tiles);
    __syncthreads();  // the slot is refilled next iteration
  }
  return chunks;
}

// Writes y for the tiles [t0, t1) of `task`, chunks in reverse order. With `kept`, the last
// min(slots, chunks) chunks are already in their slots (member_stats just read them); the others
// are read again, each into the slot its successor frees. Returns the number of chunks re-read.
template <typename T, int V>
__device__ int64_t member_apply(const GnArgs& a, int64_t task, int64_t t0, int64_t t1, const TaskSmem<T>& sm,
                                bool kept) {
  const TaskLane lane(a);
  const int64_t n = task_sample(a, task), c0 = task_c0(a, task);
  const T* base = static_cast<const T*>(a.x) + n * a.s * a.c + c0;
  T* out = static_cast<T*>(a.out) + n * a.s * a.c + c0;
  const int cpg = static_cast<int>(a.c / a.g);
  float mean[V], scale[V], beta[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int cl = min(lane.col * V + v, static_cast<int>(a.window) - 1);
    const int64_t c = c0 + cl, ng = n * a.g + c / cpg;
    mean[v] = __ldcg(a.mean + ng);
    scale[v] = __ldcg(a.rstd + ng) * load_param(a.weight, a.w_dtype, c, 1.f);
    beta[v] = load_param(a.bias, a.w_dtype, c, 0.f);
  }
  const int slots = a.slots;
  const int64_t chunks = (t1 - t0) * chunks_per_tile(a);
  int64_t reread = 0;
  for (int i = 0; i < slots; ++i) {
    const int64_t q = chunks - 1 - i;
    if (!kept && q >= 0) {
      load_chunk<T, V>(a, base, chunk_at(a, t0, q), sm.slot(q, slots));
      ++reread;
    }
    cp_async_commit();
  }
  for (int64_t q = chunks - 1; q >= 0; --q) {
    cp_async_wait(slots - 1);
    __syncthreads();
    const Chunk ch = chunk_at(a, t0, q);
    if (lane.active) {
      const T* s = sm.slot(q, slots) + lane.col * V;
      T* y = out + ch.row0 * a.c + lane.col * V;
#pragma unroll 4
      for (int r = lane.row; r < ch.rows; r += a.rows_threads) {
        const Pack<T, V> x = *reinterpret_cast<const Pack<T, V>*>(s + static_cast<int64_t>(r) * a.window);
        Pack<T, V> o;
#pragma unroll
        for (int v = 0; v < V; ++v) {
          float z = fmaf(to_float(x.v[v]) - mean[v], scale[v], beta[v]);
          if (a.act == 1) z *= sigmoid(z);
          o.v[v] = from_float<T>(z);
        }
        store_pack_streaming<T, V>(y + static_cast<int64_t>(r) * a.c, o);
      }
    }
    __syncthreads();  // the slot is refilled below
    const int64_t older = q - slots;
    if (older >= 0) {
      load_chunk<T, V>(a, base, chunk_at(a, t0, older), sm.slot(older, slots));
      ++reread;
    }
    cp_async_commit();
  }
  return reread;
}

// Partials of a task: [group of the window][tile].
__device__ __forceinline__ const float2* task_partials(const GnArgs& a, int64_t task) {
  return reinterpret_cast<const float2*>(a.workspace + a.off_partials) +
         task * (a.window / (a.c / a.g)) * a.tiles_per_task;
}

}  // namespace gn
