// PrefixIndex: which physical block holds the KV of which token prefix.
//
// Keys live in token space and are chained over full kBlockSize-token blocks:
//   h_0 = H(kRootHash, tokens of block 0), h_i = H(h_{i-1}, tokens of block i).
// Only full blocks are indexed. A lookup walks a prompt's chain and stops at the first block that
// is not indexed; every hit is verified against the stored parent hash and tokens, so a 64-bit
// hash collision can never map a prompt onto another prompt's KV.
//
// An entry may carry a state snapshot id: the id of a state slot holding the sequence state
// (sliding-window rings, compressor rings) right after that block, which a hit needs to resume
// computation at the block boundary.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"

namespace deepinfer::kv {

using BlockHash = uint64_t;
inline constexpr BlockHash kRootHash = 0x6a09e667f3bcc909ULL;

// Hash of one full block given its parent's hash.
BlockHash chain_hash(BlockHash parent, std::span<const int32_t> block_tokens);
// Hashes of every full block of `tokens` (block_size tokens each), chained from kRootHash.
std::vector<BlockHash> chain_hashes(std::span<const int32_t> tokens, int block_size);

class PrefixIndex {
 public:
  explicit PrefixIndex(int block_size);

  // Blocks holding the longest indexed prefix of `tokens`, given their chain `hashes`
  // (chain_hashes(tokens)). Stops at the first miss or failed verification. Does not acquire.
  std::vector<BlockId> match(std::span<const int32_t> tokens,
                             std::span<const BlockHash> hashes) const;

  // Indexes `block` as holding the block whose chain hash is `hash`. If the hash is already
  // indexed (another block holds the same prefix) nothing changes and false is returned.
  bool insert(BlockHash hash, BlockHash parent, std::span<const int32_t> block_tokens,
              BlockId block);
  // Forgets `block` (it is being reused). Returns the snapshot id it carried, or -1.
  int32_t erase_block(BlockId block);
  bool contains_block(BlockId block) const;
  std::size_t size() const { return by_hash_.size(); }

  // State snapshot carried by an indexed block (-1: none). set_snapshot returns the id it replaced.
  int32_t snapshot(BlockId block) const;
  int32_t set_snapshot(BlockId block, int32_t snapshot_id);

  void check_invariants() const;

 private:
  struct Entry {
    BlockHash hash;
    BlockHash parent;
    std::vector<int32_t> tokens;
    int32_t snapshot = -1;
  };
  int block_size_;
  std::unordered_map<BlockHash, BlockId> by_hash_;
  std::unordered_map<BlockId, Entry> by_block_;
};

}  // namespace deepinfer::kv
