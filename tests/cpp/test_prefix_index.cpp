// PrefixIndex: chained block hashes, longest-prefix match with verification, erase and
// snapshots; and the prefix cache wired to a BlockPool through the eviction listener.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <span>
#include <unordered_set>
#include <vector>

#include "deepinfer/error.h"
#include "error_message.h"
#include "kv/block_pool.h"
#include "kv/cache_geometry.h"
#include "kv/prefix_index.h"
#include "kv/state_pool.h"

namespace deepinfer::kv {
namespace {

constexpr int kBs = 4;  // small blocks keep the scenarios readable

using testing::error_code_of;

std::vector<int32_t> iota_tokens(int n, int32_t start) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

std::span<const int32_t> block_of(const std::vector<int32_t>& tokens, int i, int bs = kBs) {
  return std::span<const int32_t>(tokens).subspan(static_cast<size_t>(i * bs),
                                                  static_cast<size_t>(bs));
}

// Indexes blocks [0, n) of `tokens` as the given physical blocks.
void index_prefix(PrefixIndex& index, const std::vector<int32_t>& tokens,
                  const std::vector<BlockId>& blocks) {
  const std::vector<BlockHash> h = chain_hashes(tokens, kBs);
  for (size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_TRUE(index.insert(h[i], i == 0 ? kRootHash : h[i - 1],
                             block_of(tokens, static_cast<int>(i)), blocks[i]));
  }
}

std::vector<BlockId> match(const PrefixIndex& index, const std::vector<int32_t>& tokens) {
  return index.match(tokens, chain_hashes(tokens, kBs));
}

TEST(ChainHash, DependsOnParentTokensOrderAndLength) {
  const std::vector<int32_t> a = {1, 2, 3, 4};
  EXPECT_EQ(chain_hash(kRootHash, a), chain_hash(kRootHash, a));
  EXPECT_NE(chain_hash(kRootHash, a), chain_hash(kRootHash + 1, a));
  EXPECT_NE(chain_hash(kRootHash, a), chain_hash(kRootHash, std::vector<int32_t>{2, 1, 3, 4}));
  EXPECT_NE(chain_hash(kRootHash, a), chain_hash(kRootHash, std::vector<int32_t>{1, 2, 3, 5}));
  // An odd trailing token is padded to a 64-bit word; the length keeps it from aliasing a 0.
  EXPECT_NE(chain_hash(kRootHash, std::vector<int32_t>{7}),
            chain_hash(kRootHash, std::vector<int32_t>{7, 0}));
  EXPECT_NE(chain_hash(0, std::vector<int32_t>{0, 0}), chain_hash(0, std::vector<int32_t>{0}));
}

TEST(ChainHash, ChainsFullBlocksOnly) {
  const std::vector<int32_t> t = iota_tokens(11, 100);  // two full blocks and a partial one
  const std::vector<BlockHash> h = chain_hashes(t, kBs);
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0], chain_hash(kRootHash, block_of(t, 0)));
  EXPECT_EQ(h[1], chain_hash(h[0], block_of(t, 1)));
  EXPECT_TRUE(chain_hashes(iota_tokens(3, 0), kBs).empty());
  EXPECT_EQ(error_code_of([&] { (void)chain_hashes(t, 0); }), ErrorCode::kInvalidArgument);
}

TEST(ChainHash, NoCollisionsAmongSingleTokenEdits) {
  // Every block that differs from a base block in one token, over full 128-token blocks: a
  // weak hash (e.g. a plain sum or xor of tokens) collides here immediately.
  std::vector<int32_t> base = iota_tokens(kBlockSize, 0);
  std::unordered_set<BlockHash> seen;
  seen.insert(chain_hash(kRootHash, base));
  size_t made = 1;
  for (int pos = 0; pos < kBlockSize; ++pos) {
    for (int32_t delta : {1, -1, 2, 1 << 16, 1 << 30, 129000}) {
      std::vector<int32_t> t = base;
      t[static_cast<size_t>(pos)] += delta;
      seen.insert(chain_hash(kRootHash, t));
      ++made;
    }
  }
  EXPECT_EQ(seen.size(), made);
}

TEST(PrefixIndex, MatchesTheLongestIndexedPrefix) {
  PrefixIndex index(kBs);
  const std::vector<int32_t> a = iota_tokens(12, 0);
  index_prefix(index, a, {7, 8, 9});
  index.check_invariants();
  EXPECT_EQ(index.size(), 3u);
  EXPECT_EQ(match(index, a), (std::vector<BlockId>{7, 8, 9}));

  std::vector<int32_t> b = a;
  b[9] = 999;  // third block differs
  EXPECT_EQ(match(index, b), (std::vector<BlockId>{7, 8}));
  b[0] = 999;  // first block differs: nothing, even though later blocks are identical
  EXPECT_TRUE(match(index, b).empty());

  // A longer prompt matches the indexed part; the caller may also hold back trailing blocks.
  std::vector<int32_t> longer = iota_tokens(20, 0);
  EXPECT_EQ(match(index, longer), (std::vector<BlockId>{7, 8, 9}));
  const std::vector<BlockHash> h = chain_hashes(longer, kBs);
  EXPECT_EQ(index.match(longer, std::span<const BlockHash>(h).first(2)),
            (std::vector<BlockId>{7, 8}));
  EXPECT_TRUE(index.match(longer, {}).empty());
}

TEST(PrefixIndex, StopsAtTheFirstMiss) {
  PrefixIndex index(kBs);
  const std::vector<int32_t> a = iota_tokens(12, 0);
  const std::vector<BlockHash> h = chain_hashes(a, kBs);
  ASSERT_TRUE(index.insert(h[0], kRootHash, block_of(a, 0), 1));
  ASSERT_TRUE(index.insert(h[2], h[1], block_of(a, 2), 3));  // block 1 of the chain is missing
  EXPECT_EQ(match(index, a), (std::vector<BlockId>{1}));
}

TEST(PrefixIndex, PartialLastBlockIsNeverMatched) {
  PrefixIndex index(kBs);
  const std::vector<int32_t> a = iota_tokens(8, 0);
  index_prefix(index, a, {1, 2});
  const std::vector<int32_t> shorter(a.begin(), a.begin() + 7);  // 1 full block + 3 tokens
  EXPECT_EQ(match(index, shorter), (std::vector<BlockId>{1}));
  // Partial blocks cannot be indexed, and hashes beyond the full blocks cannot be verified.
  EXPECT_EQ(error_code_of([&] {
              index.insert(chain_hash(kRootHash, std::span(shorter).subspan(4)), kRootHash,
                           std::span(shorter).subspan(4), 5);
            }),
            ErrorCode::kInvalidArgument);
  const std::vector<BlockHash> h = chain_hashes(a, kBs);
  EXPECT_EQ(error_code_of([&] { (void)index.match(shorter, h); }), ErrorCode::kInvalidArgument);
}

TEST(PrefixIndex, ForcedHashCollisionIsRejectedByVerification) {
  PrefixIndex index(kBs);
  const std::vector<int32_t> a = iota_tokens(8, 0);
  const std::vector<int32_t> other = iota_tokens(8, 500);
  const std::vector<BlockHash> h = chain_hashes(a, kBs);
  // An entry claiming a's first hash but holding other tokens: a must not map onto it.
  ASSERT_TRUE(index.insert(h[0], kRootHash, block_of(other, 0), 4));
  EXPECT_TRUE(match(index, a).empty());
  // The hash is taken, so a's genuine block is not indexed (first holder wins).
  EXPECT_FALSE(index.insert(h[0], kRootHash, block_of(a, 0), 5));
  EXPECT_FALSE(index.contains_block(5));
  index.check_invariants();
}

TEST(PrefixIndex, ParentMismatchIsRejectedByVerification) {
  PrefixIndex index(kBs);
  const std::vector<int32_t> a = iota_tokens(8, 0);
  const std::vector<BlockHash> h = chain_hashes(a, kBs);
  ASSERT_TRUE(index.insert(h[0], kRootHash, block_of(a, 0), 1));
  // Right tokens and hash for block 1, but computed after a different prefix.
  ASSERT_TRUE(index.insert(h[1], h[0] ^ 1, block_of(a, 1), 2));
  EXPECT_EQ(match(index, a), (std::vector<BlockId>{1}));
}

TEST(PrefixIndex, SecondBlockWithTheSameHashIsNotIndexed) {
  PrefixIndex index(kBs);
  const std::vector<int32_t> a = iota_tokens(4, 0);
  const BlockHash h = chain_hash(kRootHash, a);
  EXPECT_TRUE(index.insert(h, kRootHash, a, 3));
  EXPECT_FALSE(index.insert(h, kRootHash, a, 6));
  EXPECT_FALSE(index.insert(h, kRootHash, a, 3));  // re-inserting the holder is a no-op too
  EXPECT_EQ(index.size(), 1u);
  EXPECT_EQ(match(index, a), (std::vector<BlockId>{3}));
  index.check_invariants();
}

TEST(PrefixIndex, ReindexingABlockWithoutEvictingItIsAnInternalError) {
  PrefixIndex index(kBs);
  const std::vector<int32_t> a = iota_tokens(4, 0), b = iota_tokens(4, 50);
  ASSERT_TRUE(index.insert(chain_hash(kRootHash, a), kRootHash, a, 3));
  EXPECT_EQ(error_code_of([&] { index.insert(chain_hash(kRootHash, b), kRootHash, b, 3); }),
            ErrorCode::kInternal);
  EXPECT_EQ(error_code_of([&] { index.insert(1, kRootHash, b, 0); }), ErrorCode::kInvalidArgument);
  index.check_invariants();
  EXPECT_EQ(match(index, a), (std::vector<BlockId>{3}));
}

TEST(PrefixIndex, EraseBlockForgets) {
  PrefixIndex index(kBs);
  const std::vector<int32_t> a = iota_tokens(8, 0);
  index_prefix(index, a, {1, 2});
  EXPECT_EQ(index.erase_block(2), -1);
  EXPECT_FALSE(index.contains_block(2));
  EXPECT_EQ(index.size(), 1u);
  EXPECT_EQ(match(index, a), (std::vector<BlockId>{1}));
  EXPECT_EQ(index.erase_block(2), -1);  // not indexed: nothing to do
  EXPECT_EQ(index.erase_block(1), -1);
  EXPECT_TRUE(match(index, a).empty());
  EXPECT_EQ(index.size(), 0u);
  index.check_invariants();
  index_prefix(index, a, {5, 6});  // the hashes are free again
  EXPECT_EQ(match(index, a), (std::vector<BlockId>{5, 6}));
}

TEST(PrefixIndex, SnapshotsRoundTrip) {
  PrefixIndex index(kBs);
  const std::vector<int32_t> a = iota_tokens(8, 0);
  index_prefix(index, a, {1, 2});
  EXPECT_EQ(index.snapshot(2), -1);
  EXPECT_EQ(index.set_snapshot(2, 11), -1);
  EXPECT_EQ(index.snapshot(2), 11);
  EXPECT_EQ(index.set_snapshot(2, 12), 11);  // the replaced id comes back to be freed
  EXPECT_EQ(index.snapshot(1), -1);
  EXPECT_EQ(index.snapshot(9), -1);  // not indexed
  EXPECT_EQ(error_code_of([&] { index.set_snapshot(9, 3); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_code_of([&] { index.set_snapshot(1, -2); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(index.erase_block(2), 12);
  EXPECT_EQ(index.snapshot(2), -1);
  index.check_invariants();
}

TEST(PrefixIndex, WorksAtTheRealBlockSize) {
  PrefixIndex index(kBlockSize);
  std::mt19937 rng(3);
  std::vector<int32_t> prompt(1000);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 129280);
  const std::vector<BlockHash> h = chain_hashes(prompt, kBlockSize);
  ASSERT_EQ(h.size(), 7u);
  for (size_t i = 0; i < h.size(); ++i) {
    ASSERT_TRUE(index.insert(h[i], i == 0 ? kRootHash : h[i - 1],
                             std::span(prompt).subspan(i * kBlockSize, kBlockSize),
                             static_cast<BlockId>(i + 1)));
  }
  EXPECT_EQ(index.match(prompt, h).size(), 7u);
  prompt[640] ^= 1;  // inside block 5
  EXPECT_EQ(index.match(prompt, chain_hashes(prompt, kBlockSize)).size(), 5u);
}

// The prefix cache as the engine wires it: released blocks (count 0) stay matchable until
// allocate() reuses them, and the eviction listener then drops their entries and snapshots.
struct Cache {
  BlockPool blocks;
  PrefixIndex index;
  StatePool snapshots;
  std::vector<BlockId> evicted;

  Cache(int num_blocks, int num_snapshots)
      : blocks(num_blocks), index(kBs), snapshots(1, num_snapshots) {
    blocks.set_eviction_listener([this](BlockId b) {
      evicted.push_back(b);
      const int32_t snap = index.erase_block(b);
      if (snap >= 0) snapshots.release(snap);
    });
  }
  void check() const {
    blocks.check_invariants();
    index.check_invariants();
    snapshots.check_invariants();
  }
};

TEST(PrefixCache, ReleasedBlocksStayMatchableUntilEvicted) {
  Cache c(5, 2);                                           // usable blocks 1..4
  const std::vector<int32_t> prompt = iota_tokens(10, 0);  // 2 full blocks + 2 tokens
  const std::vector<BlockHash> h = chain_hashes(prompt, kBs);

  // Sequence 1 computes the prompt in blocks 1, 2, 3 and indexes its two full blocks, with a
  // state snapshot after block 2.
  std::vector<BlockId> table;
  for (int i = 0; i < 3; ++i) table.push_back(*c.blocks.allocate());
  EXPECT_EQ(table, (std::vector<BlockId>{1, 2, 3}));
  ASSERT_TRUE(c.index.insert(h[0], kRootHash, block_of(prompt, 0), table[0]));
  ASSERT_TRUE(c.index.insert(h[1], h[0], block_of(prompt, 1), table[1]));
  EXPECT_EQ(c.index.set_snapshot(table[1], *c.snapshots.allocate()), -1);
  c.evicted.clear();

  // It finishes: the table is freed in reverse, so its prefix blocks are evicted last.
  for (auto it = table.rbegin(); it != table.rend(); ++it) c.blocks.release(*it);
  EXPECT_EQ(c.blocks.num_free(), 4);
  EXPECT_EQ(c.index.match(prompt, h), (std::vector<BlockId>{1, 2}));
  c.check();

  // Sequence 2 hits the cached prefix and revives blocks 1 and 2 in place.
  for (BlockId b : c.index.match(prompt, h)) c.blocks.acquire(b);
  EXPECT_EQ(c.blocks.num_free(), 2);
  EXPECT_EQ(c.blocks.ref_count(1), 1);
  c.blocks.release(2);
  c.blocks.release(1);
  EXPECT_TRUE(c.evicted.empty());
  c.check();

  // Allocations now walk the free list 4, 3, 2, 1; only indexed blocks lose their entries.
  EXPECT_EQ(c.blocks.allocate(), 4);
  EXPECT_EQ(c.blocks.allocate(), 3);
  EXPECT_EQ(c.index.match(prompt, h), (std::vector<BlockId>{1, 2}));
  EXPECT_EQ(c.snapshots.num_free(), 1);
  EXPECT_EQ(c.blocks.allocate(), 2);
  EXPECT_EQ(c.index.match(prompt, h), (std::vector<BlockId>{1}));
  EXPECT_EQ(c.snapshots.num_free(), 2);  // block 2's snapshot went back with it
  EXPECT_EQ(c.blocks.allocate(), 1);
  EXPECT_TRUE(c.index.match(prompt, h).empty());
  EXPECT_EQ(c.index.size(), 0u);
  EXPECT_EQ(c.evicted, (std::vector<BlockId>{4, 3, 2, 1}));
  c.check();
}

// Random requests over prompts that share prefixes, run the way the engine runs them. Each block
// remembers the full token prefix its KV was computed for; every hit must hand back blocks whose
// remembered prefix is exactly the prompt's. At the end every pool is full again.
TEST(PrefixCache, RandomRequestsOnlyEverHitTheirOwnPrefix) {
  constexpr int kBlocks = 24;
  Cache c(kBlocks, kBlocks);
  std::vector<std::vector<int32_t>> computed_for(kBlocks);
  std::mt19937 rng(2024);
  std::vector<std::vector<int32_t>> bases(4);
  for (auto& b : bases) {
    b.resize(40);
    for (int32_t& t : b) t = static_cast<int32_t>(rng() % 3);  // small alphabet: many shares
  }
  std::vector<std::vector<BlockId>> running;
  size_t hit_blocks = 0;

  auto finish = [&](size_t i) {
    for (auto it = running[i].rbegin(); it != running[i].rend(); ++it) c.blocks.release(*it);
    running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
  };

  for (int step = 0; step < 3000; ++step) {
    if (!running.empty() && (running.size() >= 3 || rng() % 2 == 0)) {
      finish(rng() % running.size());
      ASSERT_NO_THROW(c.check()) << "step " << step;
      continue;
    }
    std::vector<int32_t> prompt = bases[rng() % bases.size()];
    prompt.resize(1 + rng() % prompt.size());
    if (rng() % 2 == 0) prompt[rng() % prompt.size()] = static_cast<int32_t>(rng() % 3);
    const std::vector<BlockHash> h = chain_hashes(prompt, kBs);

    const std::vector<BlockId> hits = c.index.match(prompt, h);
    for (size_t j = 0; j < hits.size(); ++j) {
      const std::vector<int32_t> want(prompt.begin(),
                                      prompt.begin() + static_cast<std::ptrdiff_t>((j + 1) * kBs));
      ASSERT_EQ(computed_for[static_cast<size_t>(hits[j])], want) << "step " << step;
    }
    hit_blocks += hits.size();

    std::vector<BlockId> table;
    for (BlockId b : hits) {
      c.blocks.acquire(b);
      table.push_back(b);
    }
    const size_t need = (prompt.size() + kBs - 1) / kBs;
    bool ok = true;
    while (table.size() < need) {
      const std::optional<BlockId> b = c.blocks.allocate();
      if (!b) {
        ok = false;
        break;
      }
      const size_t end = std::min(prompt.size(), (table.size() + 1) * kBs);
      computed_for[static_cast<size_t>(*b)].assign(
          prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(end));
      table.push_back(*b);
    }
    if (ok) {
      for (size_t i = hits.size(); i < h.size(); ++i) {
        const bool inserted = c.index.insert(h[i], i == 0 ? kRootHash : h[i - 1],
                                             block_of(prompt, static_cast<int>(i)), table[i]);
        if (inserted && rng() % 4 == 0) {
          const std::optional<int32_t> snap = c.snapshots.allocate();
          ASSERT_TRUE(snap.has_value());  // one snapshot slot per block: never short
          ASSERT_EQ(c.index.set_snapshot(table[i], *snap), -1);
        }
      }
    }
    running.push_back(std::move(table));
    if (!ok) finish(running.size() - 1);  // out of blocks: the request gives up what it took
    ASSERT_NO_THROW(c.check()) << "step " << step;
  }
  while (!running.empty()) finish(running.size() - 1);
  EXPECT_GT(hit_blocks, 100u);
  EXPECT_EQ(c.blocks.num_free(), c.blocks.num_usable());
  // Reusing every block evicts every entry and returns every snapshot.
  while (c.blocks.allocate()) {
  }
  EXPECT_EQ(c.index.size(), 0u);
  EXPECT_EQ(c.snapshots.num_free(), c.snapshots.capacity());
  c.check();
}

}  // namespace
}  // namespace deepinfer::kv
