// The key list of a query row (docs/model.md#keys-a-query-sees), shared by the f32 and the
// tensor-core kernels so that both read the same keys: the sliding keys max(0, p-W+1,
// swa_start[b]) .. p (this
// call's kv rows from ctx_len on, the ring before), then the compressed entries (dense: j <
// visible; sparse: the topk columns of row t, -1 masked).
#pragma once

#include <cstdint>

#include "cuda/attention/attention_args.h"
#include "cuda/common/layout.cuh"

namespace deepinfer::cuda {

struct AttentionKeys {
  int t;
  int b;
  int64_t ctx, row0, slot, lo, n_sliding, visible, n_keys;

  __device__ AttentionKeys(const AttentionArgs& a, const DeviceLayout& l, int row)
      : AttentionKeys(a, l, row, seq_of_row(l, row)) {}

  // With the row's sequence `seq` already known (seq_of_row or seq_of_row_warp).
  __device__ AttentionKeys(const AttentionArgs& a, const DeviceLayout& l, int row, int seq)
      : t(row), b(seq) {
    const int64_t p = l.positions[t];
    ctx = l.ctx_len[b];
    row0 = l.q_start[b];
    slot = l.slot[b];
    lo = p - a.window + 1 > 0 ? p - a.window + 1 : 0;
    if (a.swa_start != nullptr && a.swa_start[b] > lo) lo = a.swa_start[b];
    n_sliding = p >= lo ? p - lo + 1 : 0;
    visible = a.ratio > 0 ? visible_entries(p, a.ratio, a.entry_bound) : 0;
    const int64_t n_comp = a.ratio == 0 ? 0 : (a.sparse ? a.topk_cols : visible);
    n_keys = n_sliding + n_comp;
  }

  // Key i (< n_keys) of the list (a row of a.kvf.row_bytes bytes for i < n_sliding, of
  // a.entf.row_bytes after), or null when it is masked.
  __device__ const uint8_t* key(const AttentionArgs& a, const DeviceLayout& l, int64_t i) const {
    const int64_t rb = a.kvf.row_bytes;
    if (i < n_sliding) {
      const int64_t j = lo + i;
      if (j >= ctx) {
        const int64_t row = row0 + j - ctx;
        return row >= 0 && row < l.num_tokens ? a.kv + row * rb : nullptr;
      }
      if (slot < 0 || slot >= a.slots || a.ring_len <= 0) return nullptr;
      return a.ring + (slot * a.ring_len + j % a.ring_len) * rb;
    }
    const int64_t c = i - n_sliding;
    return entry(a, l, a.sparse ? a.topk[static_cast<int64_t>(t) * a.topk_cols + c] : c);
  }

  // Compressed entry j of the sequence (a top-k value, or a dense index), or null when it is
  // masked or not visible.
  __device__ const uint8_t* entry(const AttentionArgs& a, const DeviceLayout& l, int64_t j) const {
    return entry_in(a, l.block_table + static_cast<int64_t>(b) * l.max_blocks, l.max_blocks, j);
  }

  // entry, by the sequence's block-table row `table` of `max_blocks` entries (a copy of it in
  // shared memory, say).
  __device__ const uint8_t* entry_in(const AttentionArgs& a, const int32_t* table, int max_blocks,
                                     int64_t j) const {
    if (j < 0 || j >= visible) return nullptr;
    const int64_t row = entry_row_in(table, max_blocks, j, a.epb, a.entry_rows);
    return row >= 0 ? a.entries + row * a.entf.row_bytes : nullptr;
  }
};

// The keys [begin, end) of the list that split `split` of `splits` walks: whole tiles of kTile.
struct KeyRange {
  int64_t begin;
  int64_t end;
};

template <int kTile>
__device__ __forceinline__ KeyRange split_key_range(int64_t n_keys, int split, int splits) {
  const int64_t per_split = ((n_keys + splits - 1) / splits + kTile - 1) / kTile * kTile;
  const int64_t begin = min(n_keys, per_split * split);
  return {begin, min(n_keys, begin + per_split)};
}

}  // namespace deepinfer::cuda
