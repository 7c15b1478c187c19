// The confidence budget (sched/draft_budget.h): per-request acceptance estimates and the number
// of drafts that maximises expected tokens per second under the measured step-cost model.
#include <gtest/gtest.h>

#include <vector>

#include "sched/draft_budget.h"

namespace deepinfer::sched {
namespace {

TEST(DraftEstimate, UpdatesOnlyThePositionsReached) {
  DraftEstimate e;
  e.update(/*drafts=*/3, /*accepted=*/1);  // draft 0 accepted, draft 1 rejected, 2 not reached
  EXPECT_GT(e.conditional[0], DraftEstimate::kPrior);
  EXPECT_LT(e.conditional[1], DraftEstimate::kPrior);
  EXPECT_EQ(e.conditional[2], DraftEstimate::kPrior);
  for (int i = 0; i < 50; ++i) e.update(2, 2);
  EXPECT_GT(e.conditional[0], 0.99);
  EXPECT_GT(e.conditional[1], 0.99);
}

void feed(DraftBudget& b, double base, double slope) {
  for (int t = 1; t <= 64; t += 3) b.observe_step(t, base + slope * t);
}

TEST(DraftBudget, FixedMaximumUntilTheCostModelHasSamples) {
  DraftBudget b;
  DraftEstimate e;
  EXPECT_EQ(b.allocate({&e, &e}, 4), (std::vector<int>{4, 4}));
  b.observe_step(8, 0.01);
  EXPECT_EQ(b.allocate({&e}, 4), (std::vector<int>{4}));
}

TEST(DraftBudget, StepsOfOneSizeGiveNoModelSoDraftingGoesOn) {
  // Every timed step had the same size (a lone stream whose drafter found nothing): no slope
  // can be seen, so the budget stays at the maximum instead of turning drafting off for good.
  DraftBudget b;
  for (int i = 0; i < 40; ++i) b.observe_step(1, 0.002);
  double base = 0, slope = 0;
  EXPECT_FALSE(b.cost_model(base, slope));
  DraftEstimate e;
  EXPECT_EQ(b.allocate({&e}, 3), (std::vector<int>{3}));
}

TEST(DraftBudget, CheapTokensVerifyEverythingExpensiveOnesLittle) {
  DraftEstimate likely;
  for (int i = 0; i < 40; ++i) likely.update(4, 4);
  // A memory-bound step: extra tokens almost free, so every likely draft pays.
  DraftBudget cheap;
  feed(cheap, 0.010, 0.00001);
  double base = 0, slope = 0;
  ASSERT_TRUE(cheap.cost_model(base, slope));
  EXPECT_NEAR(base, 0.010, 1e-6);
  EXPECT_NEAR(slope, 0.00001, 1e-8);
  EXPECT_EQ(cheap.allocate({&likely, &likely}, 4), (std::vector<int>{4, 4}));
  // A compute-bound step: a token costs as much as the step's base, so only near-certain drafts
  // would pay, and a draft accepted half the time does not.
  DraftEstimate coin;
  for (int i = 0; i < 40; ++i) coin.update(1, i % 2);
  DraftBudget dear;
  feed(dear, 0.001, 0.001);
  EXPECT_EQ(dear.allocate({&coin, &coin}, 4), (std::vector<int>{0, 0}));
}

TEST(DraftBudget, LikelierRequestsGetMoreDraftsAsAPrefix) {
  DraftEstimate good, poor;
  for (int i = 0; i < 40; ++i) {
    good.update(4, 4);
    poor.update(4, 0);
  }
  DraftBudget b;
  feed(b, 0.004, 0.0004);
  const std::vector<int> d = b.allocate({&poor, &good, &poor}, 4);
  EXPECT_EQ(d[0], 0);
  EXPECT_EQ(d[2], 0);
  EXPECT_GT(d[1], 0);
}

}  // namespace
}  // namespace deepinfer::sched
