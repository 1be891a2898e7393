// C ABI of the GroupNorm kernels. Plain C types only: Python fills this struct through ctypes
// (gn_module/_abi.py mirrors it field by field), so no torch or pybind header is needed anywhere.
// Every number that shapes a launch comes from gn_module/schedule.py; the launcher derives none.
#pragma once
#include <stdint.h>

#define GN_MAX_LEVELS 8

#ifdef __cplusplus
extern "C" {
#endif

typedef struct GnArgs {
  const void* x;       // (N, S, C) contiguous
  const void* dy;      // backward only, same layout as x
  void* out;           // y (forward) or dx (backward), same layout as x
  const void* weight;  // (C,) or NULL (affine=False)
  const void* bias;    // (C,) or NULL
  float* mean;         // (N, G): written by forward, read by backward
  float* rstd;         // (N, G)
  float* workspace;    // float scratch laid out by schedule.workspace_layout
  float* dweight;      // (C,) float32, backward only (may be NULL when weight is NULL)
  float* dbias;        // (C,) float32, backward only
  int32_t* record;     // optional launch record: grid, tiles in phase 1, tiles applied, blocks
  int64_t n, s, c, g;  // batch, rows per slice, channels, groups
  int64_t rows_per_tile;
  int64_t tiles_per_slice;
  int64_t off_partials, off_level, off_channel_sums, off_group_sums;  // float offsets in workspace
  int64_t level_tiles[GN_MAX_LEVELS];
  int32_t nlevels;
  int32_t fanin;    // partials summed per level item
  int32_t dtype;    // 0 float32, 1 float16, 2 bfloat16
  int32_t w_dtype;  // dtype code of weight and bias
  int32_t vec;      // channels per thread access
  int32_t cols_threads, col_chunks, rows_threads;
  int32_t act;      // 0 none, 1 silu, 2 relu, 3 gelu (erf), 4 gelu (tanh): gn_kernels.cuh ActCode
  float eps;
  int32_t schedule;  // 1 one-pass (cooperative), 2 two-pass
  int32_t grid;      // one-pass grid
  int32_t smem;      // dynamic shared memory bytes of the kernel that runs the tiles
  int32_t device;    // CUDA device ordinal the tensors live on
  // ---- task architecture (arch == 2; schedule.TaskTiling / TaskPlan). A task is one sample times
  // one window of `window` channels holding whole groups; its rows are cut into tiles (the
  // reduction units) and each tile streams through shared memory in chunks of `chunk_rows` rows.
  int32_t arch;          // 1: tiles + levels (legacy), 2: tasks
  int32_t slots;         // chunks one block holds in shared memory
  int32_t team_size;     // blocks that share one task (one-pass)
  int32_t teams;         // teams of the one-pass grid; team j runs tasks j, j + teams, ...
  int64_t window;        // channels per task
  int64_t tiles_per_task;
  int64_t chunk_rows;    // rows per shared-memory chunk, a multiple of rows_threads
  uint32_t* sync;        // persistent words, zeroed once: (arrivals, flag, column count) per task
  int64_t* trace;        // optional (profiling): per block, clock64() at phase boundaries (gn_task_primitives.cuh)
  // Derived task geometry, from the schedule (divisions a block's prologue would otherwise wait on).
  int32_t channels_per_group;
  int32_t groups_per_window;
  int32_t windows_per_sample;
  int32_t chunks_per_tile;
  int64_t off_group_partials;  // task backward: float offset of the per-(tile, group) partials
  int32_t grad_dtype;          // dtype code dweight and dbias are stored in (the task backward: w_dtype)
  // dtype code of the forward's y / the backward's dy: `dtype`, or 0 (float32) for a float16/bfloat16
  // x under autocast (the wide launches: task kernels, 16-byte vectors, two-launch backward)
  int32_t wide_dtype;
  // 1: the two-launch task schedules start their apply launch as a programmatic dependent launch (sm_90
  // builds only: the stats launch lets it in at once, the apply waits for the stats launch's writes);
  // 0: the apply launch starts after the stats launch ends (ops.dependent_launches; on by default)
  int32_t dependent_launch;
  // 1: the one-launch forward (schedule 1, one round, teams of at most 8 blocks: schedule.cluster_teams_fit)
  // runs each team as a thread-block cluster that meets at the cluster barrier (sm_90 builds only;
  // ops.cluster_teams, opt-in); 0: a cooperative launch whose teams meet at counters in global memory
  int32_t cluster_teams;
  // n / d == (umulhi(n, mul) + n) >> shift for 0 <= n < 2**31 and d each of team_size,
  // windows_per_sample, cols_threads, chunk_rows and channels_per_group (schedule.fast_divisor; task
  // kernels: gn_task_layout.cuh fast_div): a division's chain of dependent instructions, ten of them ahead of
  // a one-launch block's first copy, becomes a multiply-high and a shift.
  uint32_t team_size_mul, team_size_shift;
  uint32_t windows_per_sample_mul, windows_per_sample_shift;
  uint32_t cols_threads_mul, cols_threads_shift;
  uint32_t chunk_rows_mul, chunk_rows_shift;
  uint32_t channels_per_group_mul, channels_per_group_shift;
  // The one-launch kernels' team stagger (schedule.team_stagger; 0: off): team j starts its first task
  // (j % stagger_phases) * stagger_ns nanoseconds late, so teams that would stream, wait and apply in
  // lockstep (DRAM idle while they all wait) take turns. Timing only: the same tiles, the same bits.
  int32_t stagger_ns;
  int32_t stagger_phases;
  // The two-launch task backward's dweight/dbias strips (schedule.TaskPlan.strip_blocks; 0: none): the
  // apply launch adds this many blocks after its `grid`, one per strip, and its dx blocks leave the strips
  // to them (they only wait for the stats launch). 0: every block sums its share of the strips behind its
  // first dx copies. Which block sums a strip changes no bits.
  int32_t strip_blocks;
  // Bytes of a one launch's overflow chunks (re-read by its apply) that its copies ask L2 to keep
  // (evict_last), over the launch's blocks, in builds with the L2 hints (schedule.l2_keep_bytes: a share of
  // the device's L2; 0: none kept). Timing only: where bytes come from, never which.
  int64_t l2_keep_bytes;
} GnArgs;

// Each returns a cudaError_t value (0 = success); gn_error_string turns it into text.
int gn_forward(const GnArgs* args, void* stream);
int gn_backward(const GnArgs* args, void* stream);
// Co-resident blocks per SM of the one-pass kernel for (direction 0 fwd / 1 bwd, dtype, vec, smem).
int gn_onepass_occupancy(int device, int direction, int dtype, int vec, int smem, int* blocks_per_sm);
// The same for the task architecture (arch 2): the forward one-pass kernel, the backward stats kernel.
int gn_task_occupancy(int device, int direction, int dtype, int vec, int smem, int* blocks_per_sm);
// The same for a wide launch (y / dy of dtype `wide_dtype`: GnArgs.wide_dtype).
int gn_task_occupancy_wide(int device, int direction, int dtype, int wide_dtype, int vec, int smem,
                           int* blocks_per_sm);
// Registers, static shared memory and local memory of one kernel (kind: see gn_kernels.cuh).
int gn_kernel_attributes(int device, int kind, int dtype, int vec, int* regs, int* static_smem,
                         int* local_bytes);
// The __CUDA_ARCH__ value this build runs with on the current device.
int gn_runtime_arch(int device, int* arch);
const char* gn_error_string(int code);
int gn_abi_size(void);

#ifdef __cplusplus
}
#endif
