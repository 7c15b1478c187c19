// A key's address in two steps, for the Hopper kernels that resolve keys ahead of their loads
// (sm90/attention_wgmma_prefetch.cu, sm90/attention_wgmma_overlap.cu): pending_key reads what
// needs no dependent load (a sliding key's row, a compressed key's entry index: the top-k column),
// resolve_key the block table (AttentionKeys::key's keys and masks). Each step's loads land while
// the tensor cores run.
#pragma once

#include <cstdint>

#include "cuda/attention/attention_args.h"
#include "cuda/attention/attention_keys.cuh"
#include "cuda/common/layout.cuh"

namespace deepinfer::cuda::attention_wgmma {

struct PendingKey {
  const uint8_t* row;  // the row when entry < 0 (null: masked or past the split)
  int64_t entry;       // >= 0: a visible compressed entry, its row still to look up
};

__device__ __forceinline__ PendingKey pending_key(const AttentionArgs& a, const DeviceLayout& l,
                                                  const AttentionKeys& keys, int64_t i,
                                                  int64_t end) {
  if (i >= end) return {nullptr, -1};
  if (i < keys.n_sliding) return {keys.key(a, l, i), -1};
  const int64_t c = i - keys.n_sliding;
  const int64_t j = a.sparse ? a.topk[static_cast<int64_t>(keys.t) * a.topk_cols + c] : c;
  return {nullptr, j >= 0 && j < keys.visible ? j : -1};
}

__device__ __forceinline__ const uint8_t* resolve_key(const AttentionArgs& a, const DeviceLayout& l,
                                                      const AttentionKeys& keys, PendingKey k) {
  if (k.entry < 0) return k.row;
  const int64_t row = entry_row(l, keys.b, k.entry, a.epb, a.entry_rows);
  return row >= 0 ? a.entries + row * a.entf.row_bytes : nullptr;
}

}  // namespace deepinfer::cuda::attention_wgmma
