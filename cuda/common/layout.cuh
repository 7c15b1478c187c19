// The paged KV layout on the device (docs/model.md#kv-and-state-layout): the device view of a
// BatchLayout and the lookups every family over the caches uses (cache, indexer, attention).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "deepinfer/backend.h"

namespace deepinfer::cuda {

struct DeviceLayout {
  const int32_t* positions;    // [T]
  const int32_t* q_start;      // [B + 1]
  const int32_t* ctx_len;      // [B]
  const int32_t* slot;         // [B]
  const int32_t* block_table;  // [B, max_blocks] or null
  int num_tokens;
  int num_seqs;
  int max_blocks;
};

inline DeviceLayout device_layout(const BatchLayout& layout) {
  return {layout.positions.data<int32_t>(),
          layout.seq_q_start.data<int32_t>(),
          layout.seq_ctx_len.data<int32_t>(),
          layout.seq_slot.data<int32_t>(),
          layout.block_table.defined() ? layout.block_table.data<int32_t>() : nullptr,
          layout.num_tokens,
          layout.num_seqs,
          layout.max_blocks_per_seq};
}

// Sequence of row t: the last b in [0, B) with q_start[b] <= t (the CPU's seq_of_rows). B >= 1.
__device__ __forceinline__ int seq_of_row(const DeviceLayout& l, int t) {
  int lo = 0;
  int hi = l.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (l.q_start[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// seq_of_row with a whole warp (all 32 lanes, converged, the same t): each step reads 32 spread
// entries of q_start at once and narrows the range 32-fold, so a row's sequence takes
// ceil(log32(B)) dependent loads instead of log2(B) (B = 256: 2 instead of 8).
// `q_start` may be a copy of l.q_start (in shared memory: no load leaves the SM).
__device__ __forceinline__ int seq_of_row_warp(const int32_t* q_start, int num_seqs, int t) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  int lo = 0;  // q_start[lo] <= t (q_start[0] = 0)
  int n = num_seqs;
  while (n > 1) {
    const int step = (n + 31) / 32;
    const int idx = lo + lane * step;
    const bool le = lane * step < n && q_start[idx] <= t;
    // q_start is nondecreasing: the lanes with q_start[idx] <= t are a prefix, lane 0 one of
    // them for a valid row (none: 0, as seq_of_row answers for t < q_start[0]).
    const unsigned mask = __ballot_sync(0xffffffffu, le);
    const int k = mask == 0 ? 0 : 31 - __clz(static_cast<int>(mask));
    lo += k * step;
    n = min(step, n - k * step);
  }
  return lo;
}

__device__ __forceinline__ int seq_of_row_warp(const DeviceLayout& l, int t) {
  return seq_of_row_warp(l.q_start, l.num_seqs, t);
}

// Entries visible at position p: (p + 1) / ratio, at most `bound` (the block table's reach).
__device__ __forceinline__ int64_t visible_entries(int64_t pos, int ratio, int64_t bound) {
  const int64_t v = pos < 0 ? 0 : (pos + 1) / ratio;
  return v < bound ? v : bound;
}

// Row of entry j in a paged cache of `rows` rows with `epb` entries per block, by a sequence's
// block-table row `table` of `max_blocks` entries (in global or shared memory), or -1 when the
// table does not map it inside the cache. A power-of-two epb (V4's: 32 at ratio 4, 1 at 128) takes
// a shift and a mask: j is often a top-k value just loaded, and the 64-bit division's software
// sequence (~20 dependent instructions) stood between it and its record's address. The test of
// epb does not depend on j, so it is done while j's load is in flight.
__device__ __forceinline__ int64_t entry_row_in(const int32_t* table, int max_blocks, int64_t j,
                                                int epb, int64_t rows) {
  if (j < 0) return -1;
  const bool pow2 = epb > 0 && (epb & (epb - 1)) == 0;
  const int64_t logical = pow2 ? j >> (__ffs(epb) - 1) : j / epb;
  if (logical >= max_blocks) return -1;
  const int64_t block = table[logical];
  const int64_t row = block * epb + (pow2 ? j & (epb - 1) : j % epb);
  if (block < 0 || row >= rows) return -1;
  return row;
}

// entry_row_in over sequence b's row of the layout's block table.
__device__ __forceinline__ int64_t entry_row(const DeviceLayout& l, int b, int64_t j, int epb,
                                             int64_t rows) {
  return entry_row_in(l.block_table + static_cast<int64_t>(b) * l.max_blocks, l.max_blocks, j, epb,
                      rows);
}

}  // namespace deepinfer::cuda
