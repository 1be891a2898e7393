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
//
// The device code is in five headers, each including the one before:
//   gn_task_primitives.cuh  copies and their L2 policies, synchronisation words, PDL, clusters, tracing
//   gn_task_layout.cuh      task and team geometry, shared-memory layout, row and parameter copies
//   gn_task_reduce.cuh      per-tile sums and the combine in tile order (both directions)
//   gn_task_forward.cuh     a member's forward phases: the chunk ring, statistics, apply
//   gn_task_backward.cuh    a member's backward phases: tile partials, their sums, dx
#pragma once
#include "gn_task_backward.cuh"
