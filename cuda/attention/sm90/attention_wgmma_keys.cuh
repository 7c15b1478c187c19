// A key's address in three steps, for the Hopper kernels that resolve keys ahead of their loads
// (sm90/attention_wgmma_prefetch.cu, sm90/attention_wgmma_overlap.cu), with AttentionKeys::key's
// keys and masks. Each step only issues its load: a loaded value is first looked at by the next
// step, which the kernels take a tile later, so no step waits for memory (a check right after its
// load waited a whole L2 round trip per step, twice per tile, on the overlap kernel's producer):
//   key_index   a sliding key's row, or a compressed key's entry index (the top-k column's load)
//   key_lookup  checks the entry index and starts the block-table load
//   key_row     the entry's row from the block-table entry
#pragma once

#include <cstdint>

#include "cuda/attention/attention_args.h"
#include "cuda/attention/attention_keys.cuh"
#include "cuda/common/layout.cuh"

namespace deepinfer::cuda::attention_wgmma {

// Loaded values stay 32-bit until the next step looks at them: widening one right after its load
// would wait for it there. (Entry indices are the top-k list's int32 values; a dense list's
// position is one too.)
struct KeyIndex {
  const uint8_t* row;  // a sliding key's row (null: masked or past the split)
  int32_t entry;       // compressed: the entry index as loaded, unchecked
  bool compressed;
};

struct KeyLookup {
  const uint8_t* row;  // not compressed: the row (null: masked)
  int32_t block;       // compressed: the block-table entry as loaded, unchecked
  int32_t offset;      // the entry's row within its block
  bool compressed;
};

__device__ __forceinline__ KeyIndex key_index(const AttentionArgs& a, const DeviceLayout& l,
                                              const AttentionKeys& keys, int64_t i, int64_t end) {
  if (i >= end) return {nullptr, 0, false};
  if (i < keys.n_sliding) return {keys.key(a, l, i), 0, false};
  const int64_t c = i - keys.n_sliding;
  return {
      nullptr,
      a.sparse ? a.topk[static_cast<int64_t>(keys.t) * a.topk_cols + c] : static_cast<int32_t>(c),
      true};
}

// As entry_row's first half: an entry outside the visible ones or the block table is masked.
__device__ __forceinline__ KeyLookup key_lookup(const AttentionArgs& a, const DeviceLayout& l,
                                                const AttentionKeys& keys, KeyIndex k) {
  if (!k.compressed) return {k.row, 0, 0, false};
  const int32_t j = k.entry;
  if (j < 0 || j >= keys.visible || j / a.epb >= l.max_blocks) return {nullptr, 0, 0, false};
  return {nullptr, l.block_table[static_cast<int64_t>(keys.b) * l.max_blocks + j / a.epb],
          j % a.epb, true};
}

// As entry_row's second half: an unmapped block or a row past the cache is masked.
__device__ __forceinline__ const uint8_t* key_row(const AttentionArgs& a, KeyLookup k) {
  if (!k.compressed) return k.row;
  const int64_t row = static_cast<int64_t>(k.block) * a.epb + k.offset;
  return k.block >= 0 && row < a.entry_rows ? a.entries + row * a.entf.row_bytes : nullptr;
}

}  // namespace deepinfer::cuda::attention_wgmma
