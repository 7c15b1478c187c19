// BlockKey: what names one full block's KV outside the GPU (host tier, persistent store).
//
// The chain hash alone is the lookup key; the parent hash and the block's tokens travel with it
// so that a tier can verify a hit the way PrefixIndex does: chain_hash is unkeyed and invertible,
// so a collision can be built on purpose, and verifying costs a miss instead of wrong KV.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "kv/prefix_index.h"

namespace deepinfer::kv {

struct BlockKey {
  BlockHash hash = 0;
  BlockHash parent = 0;
  std::span<const int32_t> tokens;  // the block's tokens (not owned)

  // True when a stored (parent, tokens) describes the same block as this key.
  bool same_block(BlockHash stored_parent, std::span<const int32_t> stored_tokens) const {
    return stored_parent == parent && std::ranges::equal(stored_tokens, tokens);
  }
};

}  // namespace deepinfer::kv
