// PrefixCachePolicy alone: what a prompt may reuse, where its prefill is cut, and how snapshots
// are kept, evicted and freed.
#include <gtest/gtest.h>

#include <vector>

#include "deepinfer/error.h"
#include "kv/block_pool.h"
#include "sched/prefix_cache_policy.h"
#include "sched_test_util.h"

namespace deepinfer::sched {
namespace {

using test::distinct_tokens;
using test::make_seq;

// A sequence that computed `num_computed` tokens of `tokens` in blocks 1, 2, ... (+ `first_block`).
Sequence computed_seq(RequestId id, const std::vector<int32_t>& tokens, int num_computed,
                      kv::BlockId first_block) {
  Sequence s = make_seq(id, tokens);
  s.num_computed = num_computed;
  const int blocks = (static_cast<int>(tokens.size()) + 127) / 128;
  for (int b = 0; b < blocks; ++b) s.block_table.push_back(first_block + b);
  return s;
}

TEST(PrefixCachePolicy, CheckpointIsTheLastFullBlockBeforeTheLastToken) {
  PrefixCachePolicy p(128, true, /*first_snapshot_slot=*/10, /*num_snapshot_slots=*/2);
  EXPECT_EQ(p.checkpoint(make_seq(1, distinct_tokens(400))), 384);
  EXPECT_EQ(p.checkpoint(make_seq(2, distinct_tokens(384))), 256);  // 384 itself must be computed
  EXPECT_EQ(p.checkpoint(make_seq(3, distinct_tokens(128))), 0);
  Sequence resumed = make_seq(4, distinct_tokens(400));
  resumed.num_computed = 384;  // already past the checkpoint (a hit): no cut
  EXPECT_EQ(p.checkpoint(resumed), 0);
  PrefixCachePolicy off(128, false, 10, 2);
  EXPECT_EQ(off.checkpoint(make_seq(5, distinct_tokens(400))), 0);
  PrefixCachePolicy no_slots(128, true, 10, 0);
  EXPECT_FALSE(no_slots.enabled());
  EXPECT_EQ(no_slots.checkpoint(make_seq(6, distinct_tokens(400))), 0);
}

TEST(PrefixCachePolicy, AHitEndsAtTheLastBlockCarryingASnapshot) {
  PrefixCachePolicy p(128, true, 10, 2);
  const std::vector<int32_t> prompt = distinct_tokens(520);
  Sequence a = computed_seq(1, prompt, 512, 1);  // blocks 1..5; 4 full blocks computed
  const int32_t snap = p.take_snapshot_slot();
  ASSERT_GE(snap, 10);
  p.on_committed(a, snap, 256);  // indexes 4 blocks, snapshot after block 2
  EXPECT_EQ(p.index().size(), 4u);

  Sequence b = make_seq(2, prompt);
  PrefixCachePolicy::Hit hit = p.lookup(b);
  EXPECT_EQ(hit.blocks, (std::vector<kv::BlockId>{1, 2}));  // 4 match, cut back to the snapshot
  EXPECT_EQ(hit.snapshot, snap);

  // Another prompt sharing only the first block has no snapshot to resume from.
  std::vector<int32_t> other = prompt;
  other[200] += 1;
  Sequence c = make_seq(3, other);
  EXPECT_TRUE(p.lookup(c).blocks.empty());
  p.check_invariants();
}

TEST(PrefixCachePolicy, SnapshotsAreEvictedLeastRecentlyUsedFirst) {
  PrefixCachePolicy p(128, true, 10, 2);
  const std::vector<int32_t> x = distinct_tokens(300, 1), y = distinct_tokens(300, 2),
                             z = distinct_tokens(300, 3);
  Sequence a = computed_seq(1, x, 256, 1), b = computed_seq(2, y, 256, 4);
  p.on_committed(a, p.take_snapshot_slot(), 256);
  p.on_committed(b, p.take_snapshot_slot(), 256);
  EXPECT_EQ(p.snapshot_slots().num_free(), 0);
  // x is used again: y's snapshot is now the least recently used and goes first.
  Sequence again = make_seq(3, x);
  p.touch(p.lookup(again));
  const int32_t reused = p.take_snapshot_slot();
  ASSERT_GE(reused, 0);
  EXPECT_FALSE(p.lookup(*std::make_unique<Sequence>(make_seq(4, x))).blocks.empty());
  EXPECT_TRUE(p.lookup(*std::make_unique<Sequence>(make_seq(5, y))).blocks.empty());
  Sequence c = computed_seq(6, z, 256, 7);
  p.on_committed(c, reused, 256);
  p.check_invariants();
}

TEST(PrefixCachePolicy, AnEvictedBlockFreesItsSnapshot) {
  PrefixCachePolicy p(128, true, 10, 1);
  const std::vector<int32_t> x = distinct_tokens(300);
  Sequence a = computed_seq(1, x, 256, 1);
  p.on_committed(a, p.take_snapshot_slot(), 256);
  EXPECT_EQ(p.snapshot_slots().num_free(), 0);
  p.on_block_evicted(2);  // the block the snapshot sits on is reused by the pool
  EXPECT_EQ(p.snapshot_slots().num_free(), 1);
  EXPECT_TRUE(p.lookup(*std::make_unique<Sequence>(make_seq(2, x))).blocks.empty());
  p.check_invariants();
}

TEST(PrefixCachePolicy, ASnapshotThatCannotBeAttachedIsReleased) {
  PrefixCachePolicy p(128, true, 10, 1);
  Sequence a = computed_seq(1, distinct_tokens(300), 100, 1);  // no full block computed
  const int32_t snap = p.take_snapshot_slot();
  p.on_committed(a, snap, 128);
  EXPECT_EQ(p.snapshot_slots().num_free(), 1);
  p.release_snapshot_slot(-1);  // ignored
  p.check_invariants();
}

}  // namespace
}  // namespace deepinfer::sched
