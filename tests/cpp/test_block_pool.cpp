// BlockPool: free-list order, reference counts, eviction listener, and a randomized comparison
// against a plain reference model.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <random>
#include <vector>

#include "deepinfer/error.h"
#include "error_message.h"
#include "kv/block_pool.h"

namespace deepinfer::kv {
namespace {

using testing::error_code_of;

std::vector<BlockId> drain(BlockPool& pool) {
  std::vector<BlockId> out;
  while (auto b = pool.allocate()) out.push_back(*b);
  return out;
}

TEST(BlockPool, RejectsPoolsWithoutAUsableBlock) {
  EXPECT_EQ(error_code_of([] { BlockPool p(1); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_code_of([] { BlockPool p(0); }), ErrorCode::kInvalidArgument);
  BlockPool p(2);
  EXPECT_EQ(p.num_usable(), 1);
  EXPECT_EQ(p.allocate(), 1);
  EXPECT_EQ(p.allocate(), std::nullopt);
}

TEST(BlockPool, FreshPoolHandsOutOneToNAndNeverBlockZero) {
  BlockPool pool(6);
  EXPECT_EQ(pool.num_blocks(), 6);
  EXPECT_EQ(pool.num_usable(), 5);
  EXPECT_EQ(pool.num_free(), 5);
  EXPECT_EQ(pool.usage(), 0.0);
  pool.check_invariants();
  EXPECT_EQ(drain(pool), (std::vector<BlockId>{1, 2, 3, 4, 5}));
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_EQ(pool.num_used(), 5);
  EXPECT_EQ(pool.usage(), 1.0);
  for (BlockId b = 1; b <= 5; ++b) EXPECT_EQ(pool.ref_count(b), 1);
  pool.check_invariants();
}

TEST(BlockPool, ExhaustionReturnsNulloptUntilABlockIsReleased) {
  BlockPool pool(4);
  drain(pool);
  EXPECT_EQ(pool.allocate(), std::nullopt);
  EXPECT_EQ(pool.allocate(), std::nullopt);
  pool.release(2);
  EXPECT_EQ(pool.allocate(), 2);
  EXPECT_EQ(pool.allocate(), std::nullopt);
  pool.check_invariants();
}

TEST(BlockPool, FreedBlocksAreReusedInReleaseOrder) {
  BlockPool pool(6);
  drain(pool);
  pool.release(3);  // A
  pool.release(1);  // B
  EXPECT_EQ(pool.allocate(), 3);
  EXPECT_EQ(pool.allocate(), 1);
  pool.check_invariants();
}

TEST(BlockPool, AFreedBlockGoesToTheTail) {
  BlockPool pool(6);
  EXPECT_EQ(pool.allocate(), 1);
  EXPECT_EQ(pool.allocate(), 2);
  pool.release(1);  // free list was 3 4 5, becomes 3 4 5 1
  pool.check_invariants();
  EXPECT_EQ(drain(pool), (std::vector<BlockId>{3, 4, 5, 1}));
}

TEST(BlockPool, SharedBlockIsFreedOnlyByItsLastRelease) {
  BlockPool pool(3);
  const BlockId b = *pool.allocate();
  pool.acquire(b);
  pool.acquire(b);
  EXPECT_EQ(pool.ref_count(b), 3);
  pool.release(b);
  pool.release(b);
  EXPECT_FALSE(pool.is_free(b));
  EXPECT_EQ(pool.num_free(), 1);
  pool.release(b);
  EXPECT_TRUE(pool.is_free(b));
  EXPECT_EQ(pool.num_free(), 2);
  pool.check_invariants();
}

TEST(BlockPool, AcquireOfACachedFreeBlockTakesItOffTheList) {
  BlockPool pool(6);
  drain(pool);
  for (BlockId b : {2, 4, 1, 5}) pool.release(b);  // free list 2 4 1 5
  pool.acquire(1);                                 // from the middle
  EXPECT_EQ(pool.ref_count(1), 1);
  EXPECT_FALSE(pool.is_free(1));
  EXPECT_EQ(pool.num_free(), 3);
  pool.check_invariants();
  pool.acquire(2);  // the head
  pool.acquire(5);  // the tail
  pool.check_invariants();
  EXPECT_EQ(drain(pool), (std::vector<BlockId>{4}));
}

TEST(BlockPool, ReleaseOfAFreeBlockThrowsAndChangesNothing) {
  BlockPool pool(4);
  const BlockId b = *pool.allocate();
  pool.release(b);
  EXPECT_EQ(error_code_of([&] { pool.release(b); }), ErrorCode::kInternal);
  EXPECT_EQ(error_code_of([&] { pool.release(3); }), ErrorCode::kInternal);  // never allocated
  EXPECT_EQ(pool.num_free(), 3);
  pool.check_invariants();
}

TEST(BlockPool, ReservedAndOutOfRangeIdsAreRejected) {
  BlockPool pool(4);
  for (BlockId bad : {0, -1, 4, 100}) {
    EXPECT_EQ(error_code_of([&] { pool.acquire(bad); }), ErrorCode::kInvalidArgument) << bad;
    EXPECT_EQ(error_code_of([&] { pool.release(bad); }), ErrorCode::kInvalidArgument) << bad;
    EXPECT_EQ(error_code_of([&] { (void)pool.ref_count(bad); }), ErrorCode::kInvalidArgument);
    EXPECT_EQ(error_code_of([&] { (void)pool.is_free(bad); }), ErrorCode::kInvalidArgument);
  }
  pool.check_invariants();
}

TEST(BlockPool, EvictionListenerFiresExactlyWhenAllocateHandsABlockOut) {
  BlockPool pool(5);
  std::vector<BlockId> evicted;
  pool.set_eviction_listener([&](BlockId b) { evicted.push_back(b); });
  std::vector<BlockId> handed_out;
  for (int i = 0; i < 3; ++i) handed_out.push_back(*pool.allocate());
  EXPECT_EQ(evicted, handed_out);

  evicted.clear();
  pool.release(2);
  pool.release(1);
  pool.acquire(2);  // a cache hit keeps the contents: no eviction
  pool.acquire(3);  // acquiring a used block is not a reuse either
  pool.release(3);
  EXPECT_TRUE(evicted.empty());

  EXPECT_EQ(pool.allocate(), 4);
  EXPECT_EQ(pool.allocate(), 1);
  EXPECT_EQ(pool.allocate(), std::nullopt);  // nothing handed out, nothing evicted
  EXPECT_EQ(evicted, (std::vector<BlockId>{4, 1}));
  pool.check_invariants();
}

TEST(BlockPool, ThrowingListenerLeavesTheBlockFreeAndCached) {
  BlockPool pool(4);
  pool.set_eviction_listener([](BlockId b) {
    throw Error(ErrorCode::kInternal, "listener refused block " + std::to_string(b));
  });
  EXPECT_THROW((void)pool.allocate(), Error);
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_TRUE(pool.is_free(1));
  pool.check_invariants();
  pool.set_eviction_listener(nullptr);
  EXPECT_EQ(pool.allocate(), 1);  // still at the head
}

TEST(BlockPool, ListenerThatReentersThePoolIsCaught) {
  BlockPool pool(4);
  pool.set_eviction_listener([&pool](BlockId b) { pool.acquire(b); });
  EXPECT_EQ(error_code_of([&] { (void)pool.allocate(); }), ErrorCode::kInternal);
}

// 1e5 random operations against a reference model: a reference count per block and the free
// blocks as a queue in eviction order. check_invariants runs after every operation. The mix of
// operations alternates between filling and draining phases so the pool swings between empty
// and exhausted instead of settling at one occupancy.
TEST(BlockPool, RandomOperationsMatchAReferenceModel) {
  constexpr int kBlocks = 33;
  BlockPool pool(kBlocks);
  std::vector<int> refs(kBlocks, 0);
  std::deque<BlockId> free_order;
  for (BlockId b = 1; b < kBlocks; ++b) free_order.push_back(b);
  std::vector<BlockId> evicted;
  pool.set_eviction_listener([&](BlockId b) { evicted.push_back(b); });

  std::mt19937 rng(12345);
  std::uniform_int_distribution<int> percent(0, 99);
  std::uniform_int_distribution<BlockId> any_block(1, kBlocks - 1);
  int allocations = 0, exhausted = 0, revived = 0, double_releases = 0, emptied = 0;
  std::vector<BlockId> used;
  for (int step = 0; step < 100000; ++step) {
    const bool filling = (step / 2000) % 2 == 0;
    const int op = percent(rng);
    if (op < (filling ? 50 : 20)) {
      const std::optional<BlockId> got = pool.allocate();
      if (free_order.empty()) {
        ASSERT_EQ(got, std::nullopt) << "step " << step;
        ++exhausted;
      } else {
        ASSERT_EQ(got, free_order.front()) << "step " << step;
        free_order.pop_front();
        refs[static_cast<size_t>(*got)] = 1;
        ++allocations;
        ASSERT_EQ(evicted.back(), *got) << "step " << step;
      }
    } else if (op < (filling ? 65 : 30)) {
      const BlockId b = any_block(rng);  // a used block (share) or a cached free one (revive)
      pool.acquire(b);
      if (refs[static_cast<size_t>(b)]++ == 0) {
        free_order.erase(std::find(free_order.begin(), free_order.end(), b));
        ++revived;
      }
    } else {
      used.clear();
      for (BlockId b = 1; b < kBlocks; ++b) {
        if (refs[static_cast<size_t>(b)] > 0) used.push_back(b);
      }
      // Mostly a block that is in use; sometimes any block, which may be a double release.
      const BlockId b = used.empty() || percent(rng) < 10
                            ? any_block(rng)
                            : used[static_cast<size_t>(rng() % used.size())];
      if (refs[static_cast<size_t>(b)] == 0) {
        ASSERT_EQ(error_code_of([&] { pool.release(b); }), ErrorCode::kInternal);
        ++double_releases;
      } else {
        pool.release(b);
        if (--refs[static_cast<size_t>(b)] == 0) free_order.push_back(b);
      }
    }
    ASSERT_NO_THROW(pool.check_invariants()) << "step " << step;
    ASSERT_EQ(pool.num_free(), static_cast<int>(free_order.size())) << "step " << step;
    if (pool.num_free() == pool.num_usable()) ++emptied;
    if (step % 997 == 0) {
      for (BlockId b = 1; b < kBlocks; ++b) {
        ASSERT_EQ(pool.ref_count(b), refs[static_cast<size_t>(b)]) << "step " << step;
      }
    }
  }
  EXPECT_EQ(static_cast<int>(evicted.size()), allocations);
  // The run reached every regime: exhaustion, a fully free pool, revivals and double releases.
  EXPECT_GT(allocations, 10000);
  EXPECT_GT(exhausted, 100);
  EXPECT_GT(emptied, 100);
  EXPECT_GT(revived, 1000);
  EXPECT_GT(double_releases, 100);
}

}  // namespace
}  // namespace deepinfer::kv
