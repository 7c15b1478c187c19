// Arithmetic of the KV layout shared by the engine and the model graph
// (docs/model.md#kv-and-state-layout).
//
//  - Paged blocks hold kBlockSize (128) tokens. A compressed layer of ratio m stores one entry per
//    m tokens, so a block holds 128 / m of that layer's entries; entry j of a sequence lives in
//    its logical block j / (128/m), slot j % (128/m).
//  - Each sequence owns a state slot. Sliding-window layers keep a ring of W + backtrack keys
//    (position p at p % ring length). Compressors keep a ring of per-token projections long enough
//    to rebuild the window(s) an entry pools, plus backtrack - 1 positions so that rolling back
//    up to `backtrack` speculative tokens never loses a row that is still needed.
#pragma once

#include <cstdint>
#include <span>

#include "deepinfer/error.h"

namespace deepinfer::kv {

inline constexpr int kBlockSize = 128;
// Positions a verification step may roll back (1 + 5 MTP drafts), as in the reference engine.
inline constexpr int kDefaultBacktrack = 6;

inline int swa_ring_len(int window, int backtrack) {
  return window + backtrack;
}

// Tokens a compressor ring holds: m (or 2m with the CSA overlap) + backtrack - 1.
inline int compressor_ring_len(int ratio, bool overlap, int backtrack) {
  return (overlap ? 2 * ratio : ratio) + backtrack - 1;
}

inline int ring_index(int64_t position, int ring_len) {
  return static_cast<int>(position % ring_len);
}

inline int entries_per_block(int ratio, int block_size = kBlockSize) {
  if (ratio <= 0 || block_size % ratio != 0) {
    throw Error(ErrorCode::kInvalidArgument, "compression ratio " + std::to_string(ratio) +
                                                 " does not divide the block size " +
                                                 std::to_string(block_size));
  }
  return block_size / ratio;
}

// Entries that exist once `num_tokens` tokens are in the cache (windows that have closed).
inline int64_t num_entries(int64_t num_tokens, int ratio) {
  return num_tokens / ratio;
}

// Entries query position p may see: the windows wholly at or before p.
inline int64_t visible_entries(int64_t position, int ratio) {
  return (position + 1) / ratio;
}

inline int64_t blocks_for_tokens(int64_t num_tokens, int block_size = kBlockSize) {
  return (num_tokens + block_size - 1) / block_size;
}

// Physical row of entry `entry` in a paged entry cache of `epb` entries per block.
inline int64_t entry_row(std::span<const int32_t> block_table, int64_t entry, int epb) {
  int64_t logical_block = entry / epb;
  if (logical_block >= static_cast<int64_t>(block_table.size())) {
    throw Error(ErrorCode::kInvalidArgument,
                "entry " + std::to_string(entry) + " needs logical block " +
                    std::to_string(logical_block) + " but the block table has only " +
                    std::to_string(block_table.size()) + " blocks");
  }
  return static_cast<int64_t>(block_table[static_cast<size_t>(logical_block)]) * epb + entry % epb;
}

}  // namespace deepinfer::kv
