// Step 1 of a moe_experts pass: group the (token, slot) pairs by expert, on the device and in
// stream order (no host sync, no host-side routing). One CTA counts the pairs per expert,
// exclusive-scans the counts into row offsets, scatters the pairs into expert order and writes the
// list of row tiles (expert, first sorted row, rows) the expert GEMMs run over, with its length.
// The scatter (shared atomics) puts the pairs of one expert in run-dependent order; the results
// stay deterministic because every output element depends only on its own row.
#include <cstdint>
#include <cub/block/block_scan.cuh>

#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/moe/moe_launch.h"

namespace deepinfer::cuda {

namespace {

// One CTA. sorted_pair[i] = the pair index (t * k + j) of sorted row i; the rows of expert e are
// [offset_e, offset_e + count_e), offsets the exclusive scan of the counts. Pairs with an id
// outside [0, E) are left out. Needs 2 * E ints of dynamic shared memory.
__global__ void __launch_bounds__(kGroupThreads)
    group_pairs_kernel(const int32_t* __restrict__ ids, int pairs, int experts, int tile_rows,
                       int max_tiles, int32_t* __restrict__ sorted_pair,
                       int32_t* __restrict__ tile_expert, int32_t* __restrict__ tile_start,
                       int32_t* __restrict__ tile_count_rows, int32_t* __restrict__ num_tiles) {
  enter_dependent_grid();
  using BlockScan = cub::BlockScan<int, kGroupThreads>;
  __shared__ typename BlockScan::TempStorage scan_tmp;
  extern __shared__ int group_smem[];
  int* counts = group_smem;          // [E]
  int* fill = group_smem + experts;  // [E] next free sorted row of each expert
  const int tid = static_cast<int>(threadIdx.x);
  for (int e = tid; e < experts; e += kGroupThreads) counts[e] = 0;
  __syncthreads();
  for (int p = tid; p < pairs; p += kGroupThreads) {
    const int e = ids[p];
    if (e >= 0 && e < experts) atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  // Row offsets and tile offsets: exclusive scans over experts, a CTA-wide chunk at a time.
  int row_carry = 0;
  int tile_carry = 0;
  for (int base = 0; base < experts; base += kGroupThreads) {
    const int e = base + tid;
    const int c = e < experts ? counts[e] : 0;
    const int nt = (c + tile_rows - 1) / tile_rows;
    int row_off = 0, row_total = 0, tile_off = 0, tile_total = 0;
    BlockScan(scan_tmp).ExclusiveSum(c, row_off, row_total);
    __syncthreads();
    BlockScan(scan_tmp).ExclusiveSum(nt, tile_off, tile_total);
    __syncthreads();
    if (e < experts) {
      const int first_row = row_carry + row_off;
      fill[e] = first_row;
      for (int i = 0; i < nt; ++i) {
        const int tile = tile_carry + tile_off + i;
        if (tile < max_tiles) {  // never false: max_tiles is an upper bound
          tile_expert[tile] = e;
          tile_start[tile] = first_row + i * tile_rows;
          tile_count_rows[tile] = min(tile_rows, c - i * tile_rows);
        }
      }
    }
    row_carry += row_total;
    tile_carry += tile_total;
  }
  if (tid == 0) *num_tiles = min(tile_carry, max_tiles);
  __syncthreads();
  for (int p = tid; p < pairs; p += kGroupThreads) {
    const int e = ids[p];
    if (e >= 0 && e < experts) sorted_pair[atomicAdd(&fill[e], 1)] = p;
  }
}

}  // namespace

void launch_group_pairs(const int32_t* ids, int64_t pairs, int experts, int tile_rows,
                        int64_t max_tiles, int32_t* sorted_pair, int32_t* tile_meta, bool pdl,
                        cudaStream_t stream) {
  int32_t* meta = tile_meta;
  const size_t group_smem = 2 * static_cast<size_t>(experts) * sizeof(int);
  launch_programmatic("moe_experts", dim3(1), dim3(kGroupThreads), group_smem, stream, pdl,
                      group_pairs_kernel, ids, static_cast<int>(pairs), experts, tile_rows,
                      static_cast<int>(max_tiles), sorted_pair, meta, meta + max_tiles,
                      meta + 2 * max_tiles, meta + 3 * max_tiles);
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
}

}  // namespace deepinfer::cuda
