// DP-group voting (sched/dp_vote.h), N ranks simulated in one thread. Each test names the
// invariant it protects:
//   NonPointStepsNeverSwitch          no communication-driven switch between points (ITL guard)
//   AllPointNeedsEveryRank            ALL rule: one rank without work blocks the switch
//   AnyPointOneRankSuffices           ANY rule + empty prefill for ranks without work
//   AnyWinsWhenPointsCoincide         precedence of ANY over ALL
//   BackToBackPrefillOnlyWhileAllWant decode_step 0 is an ALL point
//   ConfirmationFallsBackToDecode     round 2 with nobody producing → decode, decode_step advances
//   ConfirmationStateChanged          a rank that wanted but produced nothing runs an empty prefill
//   DummyDecodeWhileAnyRankDecodes    lock-step: ranks without decode work still run a decode
//   IdleGroupPrefillsAtOnce           the idle-arrival decision (and DeepSeek's, when off)
//   IdleGroupWithoutWorkIsIdle        no forward and no decode_step drift when nobody has work
//   NoLivelockWhenEveryRankFull       full ranks keep decoding; attempts only at points
//   StarvationBound                   a lone rank's admissible head waits <= any_interval steps
//   AllRanksAgree                     every rank computes the same group step and decode_step
//   SweepRemovesDeadWaitingEntries    dead queue entries never vote for prefill
#include <gtest/gtest.h>

#include <vector>

#include "sched/dp_vote.h"

namespace deepinfer::sched {
namespace {

// One group step over all ranks. `can_produce[r]`: rank r's prefill selection would admit work.
struct Group {
  std::vector<DpVote> votes;
  std::vector<RankAction> actions;
  int second_rounds = 0;

  explicit Group(int n, DpVoteConfig cfg = {}) : votes(n, DpVote(cfg)) {}

  GroupStep step(const std::vector<LocalWish>& wishes, const std::vector<bool>& can_produce) {
    const size_t n = votes.size();
    std::vector<Ballot> b1(n);
    for (size_t r = 0; r < n; ++r) b1[r] = votes[r].first_ballot(wishes[r]);
    const Tally t1 = Tally::of(b1);
    const DpVote::Proposal first = votes.front().after_first(t1);
    for (size_t r = 1; r < n; ++r) EXPECT_EQ(votes[r].after_first(t1), first);
    if (first == DpVote::Proposal::kConfirm) {
      ++second_rounds;
      std::vector<Ballot> b2(n);
      for (size_t r = 0; r < n; ++r)
        b2[r] = votes[r].second_ballot(votes[r].runs_prefill_selection() && can_produce[r]);
      const Tally t2 = Tally::of(b2);
      for (size_t r = 0; r < n; ++r) votes[r].after_second(t2);
    }
    actions.clear();
    for (size_t r = 0; r < n; ++r) {
      EXPECT_EQ(votes[r].group_step(), votes[0].group_step());
      EXPECT_EQ(votes[r].decode_step(), votes[0].decode_step());
      actions.push_back(votes[r].action());
    }
    return votes[0].group_step();
  }
  GroupStep step(const std::vector<LocalWish>& wishes) {
    return step(wishes, std::vector<bool>(wishes.size(), true));
  }
  // Runs decode steps (everyone decoding, nobody wanting) until decode_step == target.
  void decode_until(uint32_t target) {
    const std::vector<LocalWish> w(votes.size(), LocalWish{false, true});
    while (votes[0].decode_step() != target) ASSERT_EQ(step(w), GroupStep::kDecode);
  }
};

constexpr LocalWish kDecodeOnly{false, true};
constexpr LocalWish kBoth{true, true};
constexpr LocalWish kPrefillOnly{true, false};
constexpr LocalWish kNothing{false, false};

TEST(DpVote, NonPointStepsNeverSwitch) {
  Group g(2);
  g.decode_until(1);
  for (int i = 1; i < 70; ++i) ASSERT_EQ(g.step({kBoth, kBoth}), GroupStep::kDecode) << i;
  EXPECT_EQ(g.votes[0].decode_step(), 70u);
  EXPECT_EQ(g.second_rounds, 0);
}

TEST(DpVote, AllPointNeedsEveryRank) {
  Group g(3);
  g.decode_until(70);
  EXPECT_EQ(g.step({kBoth, kBoth, kDecodeOnly}), GroupStep::kDecode);
  g.decode_until(140);
  EXPECT_EQ(g.step({kBoth, kBoth, kBoth}), GroupStep::kPrefill);
  EXPECT_EQ(g.votes[0].decode_step(), 0u);
  for (RankAction a : g.actions) EXPECT_EQ(a, RankAction::kPrefill);
}

TEST(DpVote, AnyPointOneRankSuffices) {
  Group g(4);
  g.decode_until(100);
  EXPECT_EQ(g.step({kDecodeOnly, kDecodeOnly, kBoth, kNothing}), GroupStep::kPrefill);
  EXPECT_EQ(g.actions,
            (std::vector<RankAction>{RankAction::kEmptyPrefill, RankAction::kEmptyPrefill,
                                     RankAction::kPrefill, RankAction::kEmptyPrefill}));
}

TEST(DpVote, AnyWinsWhenPointsCoincide) {
  Group g(2, DpVoteConfig{.all_interval = 2, .any_interval = 4});
  g.decode_until(2);
  EXPECT_EQ(g.step({kBoth, kDecodeOnly}), GroupStep::kDecode);  // ALL point
  g.decode_until(4);                                            // both points: ANY rules
  EXPECT_EQ(g.step({kBoth, kDecodeOnly}), GroupStep::kPrefill);
}

TEST(DpVote, BackToBackPrefillOnlyWhileAllWant) {
  Group g(2);
  g.decode_until(100);
  ASSERT_EQ(g.step({kBoth, kDecodeOnly}), GroupStep::kPrefill);
  EXPECT_EQ(g.step({kBoth, kBoth}), GroupStep::kPrefill);       // decode_step 0: ALL point
  EXPECT_EQ(g.step({kBoth, kDecodeOnly}), GroupStep::kDecode);  // one rank done: decode
  EXPECT_EQ(g.step({kBoth, kBoth}), GroupStep::kDecode);        // decode_step 1: no point
}

TEST(DpVote, ConfirmationFallsBackToDecode) {
  Group g(3);
  g.decode_until(100);
  EXPECT_EQ(g.step({kBoth, kBoth, kDecodeOnly}, {false, false, false}), GroupStep::kDecode);
  EXPECT_EQ(g.second_rounds, 1);
  EXPECT_EQ(g.votes[0].decode_step(), 101u);  // advanced, not reset: next try at the next point
  for (RankAction a : g.actions) EXPECT_EQ(a, RankAction::kDecode);
}

TEST(DpVote, ConfirmationStateChanged) {
  Group g(2);
  g.decode_until(70);
  // Both wanted in round 1; rank 1's head became inadmissible before its selection.
  EXPECT_EQ(g.step({kBoth, kBoth}, {true, false}), GroupStep::kPrefill);
  EXPECT_EQ(g.actions, (std::vector<RankAction>{RankAction::kPrefill, RankAction::kEmptyPrefill}));
}

TEST(DpVote, DummyDecodeWhileAnyRankDecodes) {
  Group g(3);
  g.decode_until(5);
  EXPECT_EQ(g.step({kDecodeOnly, kNothing, kPrefillOnly}), GroupStep::kDecode);
  EXPECT_EQ(g.actions, (std::vector<RankAction>{RankAction::kDecode, RankAction::kDummyDecode,
                                                RankAction::kDummyDecode}));
}

TEST(DpVote, IdleGroupPrefillsAtOnce) {
  Group g(2);
  g.decode_until(37);
  EXPECT_EQ(g.step({kNothing, kNothing}), GroupStep::kIdle);
  EXPECT_EQ(g.step({kNothing, kPrefillOnly}), GroupStep::kPrefill);  // mid-cycle arrival

  // DeepSeek's behaviour: dummy decode steps until the ANY point at 100.
  Group ds(2, DpVoteConfig{.prefill_when_group_idle = false});
  ds.decode_until(37);
  int dummies = 0;
  while (ds.step({kNothing, kPrefillOnly}) == GroupStep::kDecode) {
    EXPECT_EQ(ds.actions[1], RankAction::kDummyDecode);
    ++dummies;
  }
  EXPECT_EQ(dummies, 63);
  EXPECT_EQ(ds.votes[0].group_step(), GroupStep::kPrefill);
}

TEST(DpVote, IdleGroupWithoutWorkIsIdle) {
  for (bool idle_rule : {true, false}) {
    Group g(4, DpVoteConfig{.prefill_when_group_idle = idle_rule});
    g.decode_until(12);
    for (int i = 0; i < 300; ++i)
      ASSERT_EQ(g.step(std::vector<LocalWish>(4, kNothing)), GroupStep::kIdle);
    EXPECT_EQ(g.votes[0].decode_step(), 12u);
    for (RankAction a : g.actions) EXPECT_EQ(a, RankAction::kIdle);
  }
}

TEST(DpVote, NoLivelockWhenEveryRankFull) {
  // Every rank wants prefill (waiting non-empty) but none can admit (running full).
  Group g(4);
  const std::vector<LocalWish> w(4, kBoth);
  const std::vector<bool> none(4, false);
  int steps = 0;
  for (; steps < 1000; ++steps) ASSERT_EQ(g.step(w, none), GroupStep::kDecode) << steps;
  for (RankAction a : g.actions) EXPECT_EQ(a, RankAction::kDecode);
  // Attempts happen only at points (0 is the first ALL point), never every step.
  int points = 0;
  for (int ds = 0; ds < 1000; ++ds) points += (ds % 70 == 0 || (ds != 0 && ds % 100 == 0));
  EXPECT_EQ(g.second_rounds, points);
  // Capacity frees on rank 2: it prefills within any_interval steps.
  int waited = 0;
  while (g.step(w, {false, false, true, false}) != GroupStep::kPrefill) ASSERT_LE(++waited, 100);
  EXPECT_EQ(g.actions[2], RankAction::kPrefill);
  EXPECT_EQ(g.actions[0], RankAction::kEmptyPrefill);
}

TEST(DpVote, StarvationBound) {
  // A rank alone with new work, the others decoding: for every arrival phase in the cycle the wait
  // is at most any_interval decode steps (ALL points cannot help: the others never want).
  int worst = 0;
  for (uint32_t phase = 0; phase < 300; ++phase) {
    Group g(3);
    g.decode_until(1);
    const std::vector<LocalWish> quiet(3, kDecodeOnly);
    while (g.votes[0].decode_step() % 300 != phase) {
      if (g.step(quiet) != GroupStep::kDecode) FAIL();
    }
    int waited = 0;
    while (g.step({kDecodeOnly, kBoth, kDecodeOnly}) != GroupStep::kPrefill) ++waited;
    worst = std::max(worst, waited);
  }
  EXPECT_LE(worst, 100);  // the bound
  EXPECT_EQ(worst, 99);   // arrival just after an ANY point
}

TEST(DpVote, SweepRemovesDeadWaitingEntries) {
  std::vector<Sequence> seqs(4);
  seqs[0].state = SeqState::kFinished;
  seqs[2].state = SeqState::kFinished;
  std::deque<Sequence*> waiting{&seqs[0], &seqs[1], &seqs[2], &seqs[3]};
  EXPECT_EQ(sweep_dead_waiting(waiting), 2);
  EXPECT_EQ(waiting, (std::deque<Sequence*>{&seqs[1], &seqs[3]}));

  // A rank whose queue held only dead entries forms no wish, so an ALL point can pass.
  std::deque<Sequence*> dead_only{&seqs[0]};
  sweep_dead_waiting(dead_only);
  const LocalWish swept{!dead_only.empty(), true};
  Group g(2);
  g.decode_until(70);
  EXPECT_EQ(g.step({kBoth, swept}), GroupStep::kDecode);
  EXPECT_FALSE(g.votes[1].action() == RankAction::kIdle);
}

TEST(DpVote, TallyIsAndOr) {
  std::vector<Ballot> b{{.want = true, .decode = false}, {.want = false, .decode = true}};
  const Tally t = Tally::of(b);
  EXPECT_TRUE(t.any_want);
  EXPECT_FALSE(t.all_want);
  EXPECT_TRUE(t.any_decode);
  EXPECT_FALSE(Tally::of({}).all_want);
}

}  // namespace
}  // namespace deepinfer::sched
