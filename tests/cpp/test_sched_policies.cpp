// Scheduling policies and the KV allocator, each alone.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "deepinfer/error.h"
#include "sched/kv_allocator.h"
#include "sched/policies.h"

namespace deepinfer::sched {
namespace {

TEST(InterleavePolicy, AlternatesWhenBothKindsHaveWork) {
  InterleavePolicy p(1);
  EXPECT_EQ(p.choose(true, false), StepKind::kPrefill);
  EXPECT_EQ(p.choose(false, true), StepKind::kDecode);
  EXPECT_EQ(p.choose(true, true), StepKind::kPrefill);
  p.record(StepKind::kPrefill);
  EXPECT_EQ(p.choose(true, true), StepKind::kDecode);
  p.record(StepKind::kDecode);
  EXPECT_EQ(p.choose(true, true), StepKind::kPrefill);
}

TEST(InterleavePolicy, SeveralPrefillStepsPerDecodeStep) {
  InterleavePolicy p(3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(p.choose(true, true), StepKind::kPrefill) << i;
    p.record(StepKind::kPrefill);
  }
  EXPECT_EQ(p.choose(true, true), StepKind::kDecode);
  EXPECT_THROW({ InterleavePolicy bad(0); }, deepinfer::Error);
}

TEST(PreemptionVictim, NewestRunningSequenceAfterTheCandidate) {
  std::vector<std::unique_ptr<Sequence>> owned;
  std::vector<Sequence*> running;
  for (int i = 0; i < 4; ++i) {
    owned.push_back(std::make_unique<Sequence>());
    owned.back()->arrival = static_cast<uint64_t>(i);
    owned.back()->state = SeqState::kRunning;
    running.push_back(owned.back().get());
  }
  EXPECT_EQ(choose_preemption_victim(running, 1), 3);
  running[3]->state = SeqState::kFinished;
  EXPECT_EQ(choose_preemption_victim(running, 1), 2);
  EXPECT_EQ(choose_preemption_victim(running, 3), -1);
}

Sequence make_seq(RequestId id, std::vector<int32_t> tokens) {
  Sequence s;
  s.id = id;
  s.tokens = std::move(tokens);
  s.num_prompt_tokens = static_cast<int>(s.tokens.size());
  return s;
}

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
