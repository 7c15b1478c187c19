// The small scheduling policies (interleave, preemption victim), each alone.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "deepinfer/error.h"
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
  // A sequence preempted earlier in the same schedule (back to waiting, still listed in running
  // until the schedule drops it) holds no blocks: picking it again would loop forever.
  running[2]->state = SeqState::kWaiting;
  EXPECT_EQ(choose_preemption_victim(running, 1), 1);
  running[1]->state = SeqState::kWaiting;
  EXPECT_EQ(choose_preemption_victim(running, 1), -1);
}

}  // namespace
}  // namespace deepinfer::sched
