// The host-memory KV tier: round trip with key verification, LRU eviction within a byte
// capacity, metadata-only prefix match, the allocator interface (failure, no leaks) and the
// eviction listener.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "kv/host_block_cache.h"
#include "kv/prefix_index.h"

namespace deepinfer::kv {
namespace {

struct Blocks {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<BlockHash> hashes, parents;
  explicit Blocks(int n) {
    BlockHash parent = kRootHash;
    for (int b = 0; b < n; ++b) {
      std::vector<int32_t> t(16);
      std::iota(t.begin(), t.end(), b * 16);
      hashes.push_back(chain_hash(parent, t));
      parents.push_back(parent);
      tokens.push_back(std::move(t));
      parent = hashes.back();
    }
  }
  BlockKey key(int b) const {
    const auto i = static_cast<size_t>(b);
    return {hashes[i], parents[i], tokens[i]};
  }
};

std::vector<uint8_t> bytes_of(int b, size_t n = 100) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(b * 31 + static_cast<int>(i));
  return v;
}

// Counts live allocations and can be told to refuse.
class CountingAllocator final : public HostAllocator {
 public:
  void* allocate(size_t bytes) noexcept override {
    if (refuse) return nullptr;
    ++live;
    return inner_.allocate(bytes);
  }
  void deallocate(void* ptr, size_t bytes) noexcept override {
    --live;
    inner_.deallocate(ptr, bytes);
  }
  int live = 0;
  bool refuse = false;

 private:
  AlignedHostAllocator inner_;
};

TEST(HostTierCache, InsertLookupRoundTripVerifiesTheKey) {
  HostBlockCache cache(1000);
  const Blocks blocks(2);
  EXPECT_EQ(cache.insert(blocks.key(0), bytes_of(0)), HostInsertResult::kInserted);
  EXPECT_EQ(cache.insert(blocks.key(0), bytes_of(9)), HostInsertResult::kAlreadyPresent);
  auto got = cache.lookup(blocks.key(0));
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(std::vector<uint8_t>(got->bytes().begin(), got->bytes().end()), bytes_of(0));
  EXPECT_EQ(got->hash(), blocks.hashes[0]);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(got->bytes().data()) % 4096, 0u);
  EXPECT_EQ(cache.lookup(blocks.key(1)), nullptr);
  // Same hash, other tokens or parent: a miss (a collision never returns wrong KV).
  std::vector<int32_t> other = blocks.tokens[0];
  other[3] = -1;
  EXPECT_EQ(cache.lookup({blocks.hashes[0], blocks.parents[0], other}), nullptr);
  EXPECT_EQ(cache.lookup({blocks.hashes[0], 42, blocks.tokens[0]}), nullptr);
  const HostBlockCacheStats s = cache.stats();
  EXPECT_EQ(s.inserts, 1u);
  EXPECT_EQ(s.inserts_existing, 1u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 3u);
  EXPECT_EQ(s.size_bytes, 100u);
  EXPECT_EQ(s.blocks, 1u);
}

TEST(HostTierCache, EvictsLeastRecentlyUsedWithinCapacity) {
  HostBlockCache cache(300);
  const Blocks blocks(5);
  for (int b = 0; b < 3; ++b) cache.insert(blocks.key(b), bytes_of(b));
  ASSERT_NE(cache.lookup(blocks.key(0)), nullptr);  // order now 1, 2, 0
  cache.insert(blocks.key(3), bytes_of(3));         // evicts 1
  EXPECT_EQ(cache.lookup(blocks.key(1)), nullptr);
  cache.insert(blocks.key(2), bytes_of(2));  // re-insert marks 2 used: order 0, 3, 2
  cache.insert(blocks.key(4), bytes_of(4));  // evicts 0
  EXPECT_EQ(cache.lookup(blocks.key(0)), nullptr);
  EXPECT_NE(cache.lookup(blocks.key(2)), nullptr);
  EXPECT_NE(cache.lookup(blocks.key(3)), nullptr);
  EXPECT_NE(cache.lookup(blocks.key(4)), nullptr);
  const HostBlockCacheStats s = cache.stats();
  EXPECT_EQ(s.evictions, 2u);
  EXPECT_EQ(s.evicted_bytes, 200u);
  EXPECT_EQ(s.size_bytes, 300u);
  EXPECT_EQ(s.blocks, 3u);
  // A bigger block evicts as many as it needs.
  EXPECT_EQ(cache.insert(blocks.key(0), bytes_of(0, 250)), HostInsertResult::kInserted);
  EXPECT_EQ(cache.stats().blocks, 1u);
  EXPECT_EQ(cache.stats().size_bytes, 250u);
}

TEST(HostTierCache, MatchPrefixStopsAtTheFirstMissAndDoesNotTouchLru) {
  HostBlockCache cache(300);
  const Blocks blocks(4);
  for (int b : {0, 1, 3}) cache.insert(blocks.key(b), bytes_of(b));
  EXPECT_EQ(cache.match_prefix(blocks.hashes), 2);
  EXPECT_EQ(cache.match_prefix(std::span(blocks.hashes).subspan(3)), 1);
  EXPECT_EQ(cache.match_prefix({}), 0);
  // match_prefix did not make block 0 recent: it is still the first to go.
  cache.insert(blocks.key(2), bytes_of(2));
  EXPECT_EQ(cache.match_prefix(blocks.hashes), 0);
  EXPECT_EQ(cache.stats().hits, 0u);
}

TEST(HostTierCache, RejectsOversizedBlocksAndAllocatorFailures) {
  auto alloc = std::make_shared<CountingAllocator>();
  {
    HostBlockCache cache(150, alloc);
    const Blocks blocks(3);
    EXPECT_EQ(cache.insert(blocks.key(0), bytes_of(0, 151)), HostInsertResult::kRejected);
    EXPECT_EQ(cache.insert(blocks.key(0), bytes_of(0)), HostInsertResult::kInserted);
    alloc->refuse = true;
    EXPECT_EQ(cache.insert(blocks.key(1), bytes_of(1)), HostInsertResult::kRejected);
    alloc->refuse = false;
    EXPECT_EQ(cache.stats().rejected, 2u);
    EXPECT_EQ(cache.match_prefix(blocks.hashes), 0);  // block 0 made room for the refused one
    EXPECT_TRUE(cache.insert(blocks.key(2), bytes_of(2)) == HostInsertResult::kInserted);
    EXPECT_TRUE(cache.erase(blocks.hashes[2]));
    EXPECT_FALSE(cache.erase(blocks.hashes[2]));
    EXPECT_EQ(cache.stats().size_bytes, 0u);
    cache.insert(blocks.key(1), bytes_of(1));
    EXPECT_EQ(alloc->live, 1);
  }
  EXPECT_EQ(alloc->live, 0);  // the cache frees everything it allocated
}

TEST(HostTierCache, EvictedBlocksGoToTheListenerAndOutliveEviction) {
  auto alloc = std::make_shared<CountingAllocator>();
  HostBlockCache cache(200, alloc);
  const Blocks blocks(4);
  std::vector<std::shared_ptr<const HostBlock>> evicted;
  cache.set_eviction_listener([&](std::shared_ptr<const HostBlock> b) {
    // Runs outside the cache's lock: calling back in must not deadlock.
    const BlockHash h = b->hash();
    EXPECT_EQ(cache.match_prefix(std::span(&h, 1)), 0) << "already gone";
    evicted.push_back(std::move(b));
  });
  cache.insert(blocks.key(0), bytes_of(0));
  auto held = cache.lookup(blocks.key(0));
  cache.insert(blocks.key(1), bytes_of(1));
  cache.insert(blocks.key(2), bytes_of(2));  // evicts 0
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(evicted[0]->hash(), blocks.hashes[0]);
  EXPECT_EQ(std::vector<uint8_t>(held->bytes().begin(), held->bytes().end()), bytes_of(0));
  evicted.clear();
  EXPECT_EQ(alloc->live, 3);  // block 0 lives while `held` does
  held.reset();
  EXPECT_EQ(alloc->live, 2);
}

TEST(HostTierCache, AlignedAllocatorRejectsBadAlignment) {
  EXPECT_ANY_THROW(AlignedHostAllocator(3));
  AlignedHostAllocator a(256);
  void* p = a.allocate(1000);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
  a.deallocate(p, 1000);
}

}  // namespace
}  // namespace deepinfer::kv
