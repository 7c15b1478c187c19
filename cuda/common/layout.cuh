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

// Entries visible at position p: (p + 1) / ratio, at most `bound` (the block table's reach).
__device__ __forceinline__ int64_t visible_entries(int64_t pos, int ratio, int64_t bound) {
  const int64_t v = pos < 0 ? 0 : (pos + 1) / ratio;
  return v < bound ? v : bound;
}

// Row of entry j of sequence b in a paged cache of `rows` rows with `epb` entries per block, or
// -1 when the block table does not map it inside the cache.
__device__ __forceinline__ int64_t entry_row(const DeviceLayout& l, int b, int64_t j, int epb,
                                             int64_t rows) {
  const int64_t logical = j / epb;
  if (j < 0 || logical >= l.max_blocks) return -1;
  const int64_t block = l.block_table[static_cast<int64_t>(b) * l.max_blocks + logical];
  const int64_t row = block * epb + j % epb;
  if (block < 0 || row >= rows) return -1;
  return row;
}

}  // namespace deepinfer::cuda
