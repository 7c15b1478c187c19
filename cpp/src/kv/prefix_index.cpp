#include "kv/prefix_index.h"

#include <algorithm>
#include <string>
#include <utility>

#include "deepinfer/error.h"

namespace deepinfer::kv {

namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;  // 2^64 / golden ratio, odd

// The splitmix64 finalizer: a bijection on 64 bits in which every input bit affects every output
// bit with probability close to 1/2.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

inline uint64_t absorb(uint64_t state, uint64_t word) {
  // Adding an odd constant after the mix keeps an all-zero input from sitting at the fixed point
  // mix64(0) == 0.
  return mix64(state ^ word) + kGolden;
}

[[noreturn]] void fail(const std::string& msg) {
  throw Error(ErrorCode::kInternal, "PrefixIndex invariant broken: " + msg);
}

}  // namespace

// H(parent, tokens): the parent hash seeds the state, tokens are absorbed two per 64-bit word
// (half the dependent mix steps of one per token), and the token count is folded into the final
// mix so that an odd trailing token (padded with 0) cannot alias a longer block. For non-
// adversarial inputs two different (parent, tokens) pairs collide with probability about 2^-64.
// The function is unkeyed and invertible, so collisions can be constructed on purpose; that is
// acceptable because every hit is verified against the stored parent hash and tokens, so a
// collision costs a cache miss, never a wrong answer.
BlockHash chain_hash(BlockHash parent, std::span<const int32_t> block_tokens) {
  uint64_t h = parent;
  const size_t n = block_tokens.size();
  size_t i = 0;
  for (; i + 1 < n; i += 2) {
    const uint64_t lo = static_cast<uint32_t>(block_tokens[i]);
    const uint64_t hi = static_cast<uint32_t>(block_tokens[i + 1]);
    h = absorb(h, lo | (hi << 32));
  }
  if (i < n) h = absorb(h, static_cast<uint32_t>(block_tokens[i]));
  return mix64(h ^ (static_cast<uint64_t>(n) * kGolden));
}

std::vector<BlockHash> chain_hashes(std::span<const int32_t> tokens, int block_size) {
  if (block_size < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "chain_hashes: block_size must be >= 1, got " + std::to_string(block_size));
  }
  const auto bs = static_cast<size_t>(block_size);
  const size_t full = tokens.size() / bs;  // the partial tail block is never hashed
  std::vector<BlockHash> hashes;
  hashes.reserve(full);
  BlockHash parent = kRootHash;
  for (size_t i = 0; i < full; ++i) {
    parent = chain_hash(parent, tokens.subspan(i * bs, bs));
    hashes.push_back(parent);
  }
  return hashes;
}

PrefixIndex::PrefixIndex(int block_size) : block_size_(block_size) {
  if (block_size < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "PrefixIndex: block_size must be >= 1, got " + std::to_string(block_size));
  }
}

std::vector<BlockId> PrefixIndex::match(std::span<const int32_t> tokens,
                                        std::span<const BlockHash> hashes) const {
  const auto bs = static_cast<size_t>(block_size_);
  const size_t full = tokens.size() / bs;
  // Fewer hashes than full blocks is allowed (a caller may hold back the last block so that at
  // least one prompt token is computed); more would ask to match tokens we cannot verify.
  if (hashes.size() > full) {
    throw Error(ErrorCode::kInvalidArgument,
                "PrefixIndex::match: " + std::to_string(hashes.size()) + " hashes for " +
                    std::to_string(tokens.size()) + " tokens (" + std::to_string(full) +
                    " full blocks of " + std::to_string(block_size_) + ")");
  }
  std::vector<BlockId> blocks;
  if (hashes.empty()) return blocks;
  blocks.reserve(hashes.size());
  BlockHash parent = kRootHash;
  for (size_t i = 0; i < hashes.size(); ++i) {
    const auto hit = by_hash_.find(hashes[i]);
    if (hit == by_hash_.end()) break;
    const auto entry_it = by_block_.find(hit->second);
    DEEPINFER_CHECK(entry_it != by_block_.end(),
                    "hash maps to block " + std::to_string(hit->second) + " with no entry");
    const Entry& entry = entry_it->second;
    // Verification: the entry must continue the very chain we have matched so far and hold these
    // exact tokens; a hash collision fails here and ends the match like a miss.
    const auto block_tokens = tokens.subspan(i * bs, bs);
    if (entry.parent != parent || !std::equal(block_tokens.begin(), block_tokens.end(),
                                              entry.tokens.begin(), entry.tokens.end())) {
      break;
    }
    blocks.push_back(hit->second);
    parent = hashes[i];
  }
  return blocks;
}

bool PrefixIndex::insert(BlockHash hash, BlockHash parent, std::span<const int32_t> block_tokens,
                         BlockId block) {
  if (block < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "PrefixIndex::insert: block " + std::to_string(block) +
                    " cannot be indexed (block 0 is the placeholder; ids start at 1)");
  }
  if (block_tokens.size() != static_cast<size_t>(block_size_)) {
    throw Error(ErrorCode::kInvalidArgument, "PrefixIndex::insert: block " + std::to_string(block) +
                                                 " has " + std::to_string(block_tokens.size()) +
                                                 " tokens; only full blocks of " +
                                                 std::to_string(block_size_) + " are indexed");
  }
  // First holder wins: a second block with the same prefix stays private to its sequence and is
  // simply freed (not cached) when that sequence ends.
  if (by_hash_.contains(hash)) return false;

  auto [entry_it, inserted] = by_block_.try_emplace(
      block,
      Entry{hash, parent, std::vector<int32_t>(block_tokens.begin(), block_tokens.end()), -1});
  if (!inserted) {
    // A block's contents change only after BlockPool::allocate reuses it, which must erase it
    // from the index first; reaching here means that eviction was skipped.
    throw Error(ErrorCode::kInternal, "PrefixIndex::insert: block " + std::to_string(block) +
                                          " is already indexed under hash " +
                                          std::to_string(entry_it->second.hash) +
                                          "; it was reused without being erased from the index");
  }
  try {
    by_hash_.emplace(hash, block);
  } catch (...) {
    by_block_.erase(entry_it);  // keep the two maps in agreement if the node allocation fails
    throw;
  }
  return true;
}

int32_t PrefixIndex::erase_block(BlockId block) {
  const auto it = by_block_.find(block);
  if (it == by_block_.end()) return -1;  // the common case: most reused blocks were never indexed
  const auto hit = by_hash_.find(it->second.hash);
  DEEPINFER_CHECK(hit != by_hash_.end() && hit->second == block,
                  "block " + std::to_string(block) + " is indexed but its hash does not map back");
  const int32_t snapshot = it->second.snapshot;
  by_hash_.erase(hit);
  by_block_.erase(it);
  return snapshot;
}

bool PrefixIndex::contains_block(BlockId block) const {
  return by_block_.contains(block);
}

int32_t PrefixIndex::snapshot(BlockId block) const {
  const auto it = by_block_.find(block);
  return it == by_block_.end() ? -1 : it->second.snapshot;
}

int32_t PrefixIndex::set_snapshot(BlockId block, int32_t snapshot_id) {
  if (snapshot_id < -1) {
    throw Error(ErrorCode::kInvalidArgument, "PrefixIndex::set_snapshot: snapshot id " +
                                                 std::to_string(snapshot_id) + " for block " +
                                                 std::to_string(block) + " must be >= -1");
  }
  const auto it = by_block_.find(block);
  if (it == by_block_.end()) {
    throw Error(ErrorCode::kInvalidArgument, "PrefixIndex::set_snapshot: block " +
                                                 std::to_string(block) +
                                                 " is not indexed, so it cannot carry a snapshot");
  }
  return std::exchange(it->second.snapshot, snapshot_id);
}

void PrefixIndex::check_invariants() const {
  if (by_hash_.size() != by_block_.size()) {
    fail(std::to_string(by_hash_.size()) + " hashes but " + std::to_string(by_block_.size()) +
         " indexed blocks");
  }
  // Each entry's hash maps back to its own block; entries have distinct blocks, so they use
  // distinct hashes, and with equal sizes the two maps are exact inverses.
  for (const auto& [block, entry] : by_block_) {
    if (block < 1) fail("indexed block id " + std::to_string(block) + " < 1");
    const auto hit = by_hash_.find(entry.hash);
    if (hit == by_hash_.end() || hit->second != block) {
      fail("block " + std::to_string(block) + " has hash " + std::to_string(entry.hash) +
           " which maps to " + (hit == by_hash_.end() ? "nothing" : std::to_string(hit->second)));
    }
    if (entry.tokens.size() != static_cast<size_t>(block_size_)) {
      fail("block " + std::to_string(block) + " stores " + std::to_string(entry.tokens.size()) +
           " tokens, expected " + std::to_string(block_size_));
    }
    if (entry.snapshot < -1) {
      fail("block " + std::to_string(block) + " carries snapshot id " +
           std::to_string(entry.snapshot));
    }
  }
}

}  // namespace deepinfer::kv
