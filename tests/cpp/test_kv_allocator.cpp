// KvAllocator alone: admission, growth and release of a sequence's blocks and state slot.
#include <gtest/gtest.h>

#include <vector>

#include "sched/kv_allocator.h"
#include "sched_test_util.h"

namespace deepinfer::sched {
namespace {

using test::make_seq;

TEST(KvAllocator, AdmitGrowReleaseReturnEverything) {
  KvAllocator kv({/*num_blocks=*/9, /*num_live_slots=*/3, /*num_snapshot_slots=*/2, 128, true});
  Sequence a = make_seq(1, std::vector<int32_t>(300, 5));
  Admission ad = kv.admit(a);
  ASSERT_EQ(ad.status, AdmitStatus::kAdmitted);
  EXPECT_EQ(a.block_table.size(), 3u);
  EXPECT_EQ(ad.hit_tokens, 0);
  EXPECT_TRUE(kv.grow(a, 385));
  EXPECT_EQ(a.block_table.size(), 4u);
  kv.check_invariants({&a});
  kv.release(a);
  kv.check_invariants({});
  EXPECT_EQ(kv.blocks().num_free(), 8);
  EXPECT_EQ(kv.live_slots().num_free(), 2);
}

TEST(KvAllocator, NeverAndLater) {
  KvAllocator kv({5, 2, 0, 128, true});
  Sequence big = make_seq(1, std::vector<int32_t>(600, 5));  // 5 blocks > 4 usable
  EXPECT_EQ(kv.admit(big).status, AdmitStatus::kNever);
  Sequence a = make_seq(2, std::vector<int32_t>(300, 5));
  ASSERT_EQ(kv.admit(a).status, AdmitStatus::kAdmitted);
  Sequence b = make_seq(3, std::vector<int32_t>(10, 5));
  EXPECT_EQ(kv.admit(b).status, AdmitStatus::kLater);  // one live slot only
  kv.release(a);
}

TEST(KvAllocator, GrowFailsWhenNoBlockIsFreeAndKeepsWhatItHad) {
  KvAllocator kv({4, 3, 0, 128, true});
  Sequence a = make_seq(1, std::vector<int32_t>(200, 5));  // 2 of the 3 usable blocks
  ASSERT_EQ(kv.admit(a).status, AdmitStatus::kAdmitted);
  Sequence b = make_seq(2, std::vector<int32_t>(10, 5));  // the last block
  ASSERT_EQ(kv.admit(b).status, AdmitStatus::kAdmitted);
  EXPECT_FALSE(kv.grow(a, 257));
  EXPECT_EQ(a.block_table.size(), 2u);
  kv.check_invariants({&a, &b});
  kv.release(b);
  EXPECT_TRUE(kv.grow(a, 257));
  kv.release(a);
  kv.check_invariants({});
}

TEST(KvAllocator, ReleasedPrefixBlocksStayCachedAndAreReusedByAHit) {
  KvAllocator kv({16, 4, 2, 128, true});
  std::vector<int32_t> prompt = test::distinct_tokens(400);
  Sequence a = make_seq(1, prompt);
  ASSERT_EQ(kv.admit(a).status, AdmitStatus::kAdmitted);
  a.num_computed = 384;
  const int32_t snap = kv.prefix_cache().take_snapshot_slot();
  kv.prefix_cache().on_committed(a, snap, 384);
  const std::vector<kv::BlockId> first_blocks(a.block_table.begin(), a.block_table.begin() + 3);
  kv.release(a);
  EXPECT_EQ(kv.num_cached_free_blocks(), 3);

  Sequence b = make_seq(2, prompt);
  Admission hit = kv.admit(b);
  ASSERT_EQ(hit.status, AdmitStatus::kAdmitted);
  EXPECT_EQ(hit.hit_tokens, 384);
  EXPECT_EQ(std::vector<kv::BlockId>(b.block_table.begin(), b.block_table.begin() + 3),
            first_blocks);
  EXPECT_EQ(kv.num_cached_free_blocks(), 0);  // the hit blocks are in use again
  kv.check_invariants({&b});
  kv.release(b);
}

TEST(KvAllocator, HitsNeedASnapshotAndNeverCoverTheLastToken) {
  KvAllocator kv({16, 4, 2, 128, true});
  std::vector<int32_t> prompt(400);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i % 97);
  Sequence a = make_seq(1, prompt);
  ASSERT_EQ(kv.admit(a).status, AdmitStatus::kAdmitted);
  EXPECT_EQ(kv.prefix_cache().checkpoint(a), 384);
  a.num_computed = 384;
  const int32_t snap = kv.prefix_cache().take_snapshot_slot();
  ASSERT_GE(snap, 0);
  kv.prefix_cache().on_committed(a, snap, 384);
  kv.release(a);

  Sequence b = make_seq(2, prompt);  // same prompt: 3 blocks and the snapshot at 384
  Admission hit = kv.admit(b);
  EXPECT_EQ(hit.hit_tokens, 384);
  EXPECT_EQ(hit.restore_snapshot, snap);
  kv.check_invariants({&b});
  kv.release(b);

  // A 384-token prompt may reuse at most 2 blocks (its last token must be computed), and no
  // snapshot sits at 256: no hit.
  Sequence c = make_seq(3, std::vector<int32_t>(prompt.begin(), prompt.begin() + 384));
  EXPECT_EQ(kv.admit(c).hit_tokens, 0);
  kv.release(c);
  kv.check_invariants({});
}

}  // namespace
}  // namespace deepinfer::sched
