// The confidence budget (sched/draft_budget.h): per-request acceptance estimates and the number
// of drafts that maximises expected tokens per second under the measured step-cost model, and the
// calibration error of the estimates the engine reports.
#include <gtest/gtest.h>

#include <cmath>
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

// The expected accepted drafts of a row of n: the sum of the cumulative products, capped at the
// estimate's kMaxDrafts positions.
TEST(DraftEstimate, ExpectedAcceptedIsTheSumOfTheCumulativeProducts) {
  DraftEstimate e = DraftEstimate::of_probabilities(std::vector<float>{0.5f, 0.5f, 1.0f});
  EXPECT_DOUBLE_EQ(e.expected_accepted(0), 0.0);
  EXPECT_DOUBLE_EQ(e.expected_accepted(1), 0.5);
  EXPECT_DOUBLE_EQ(e.expected_accepted(3), 0.5 + 0.25 + 0.25);
  EXPECT_DOUBLE_EQ(e.expected_accepted(9), 1.0);  // no draft past the probabilities given
  const DraftEstimate prior;
  EXPECT_NEAR(prior.expected_accepted(3), 0.6 + 0.36 + 0.216, 1e-12);
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

TEST(DraftEstimate, DraftProbabilitiesAreTheConditionalsAndMultiply) {
  const std::vector<float> probs{0.5f, 0.25f, 2.0f};  // out-of-range ones clamp to [0, 1]
  const DraftEstimate e = DraftEstimate::of_probabilities(probs);
  EXPECT_EQ(e.conditional[0], 0.5);
  EXPECT_EQ(e.conditional[2], 1.0);
  EXPECT_EQ(e.conditional[3], 0.0);  // no draft there
  std::vector<double> a;
  e.cumulative(4, a);
  EXPECT_EQ(a, (std::vector<double>{0.5, 0.125, 0.125, 0.0}));
  // A request whose only draft is likely gets it verified before one whose drafts are not.
  DraftBudget b;
  feed(b, 0.004, 0.0004);
  const DraftEstimate sure = DraftEstimate::of_probabilities(std::vector<float>{0.99f});
  const DraftEstimate unsure = DraftEstimate::of_probabilities(std::vector<float>{0.01f, 0.01f});
  EXPECT_EQ(b.allocate({&unsure, &sure}, 2), (std::vector<int>{0, 1}));
}

TEST(DraftCalibration, PerfectlyCalibratedBinsHaveNoError) {
  DraftCalibration c;
  // p = 0.25: 1 of 4 accepted; p = 0.75: 3 of 4; p = 1: all.
  for (int i = 0; i < 4; ++i) record_calibration(c, 0.25, i == 0);
  for (int i = 0; i < 4; ++i) record_calibration(c, 0.75, i != 0);
  for (int i = 0; i < 3; ++i) record_calibration(c, 1.0, true);
  EXPECT_EQ(c.drafts[2], 4u);
  EXPECT_EQ(c.drafts[7], 4u);
  EXPECT_EQ(c.drafts[9], 3u);  // p = 1 falls into the last bin
  EXPECT_NEAR(calibration_error(c), 0.0, 1e-12);
}

TEST(DraftCalibration, ErrorIsTheDraftWeightedGapPerBin) {
  EXPECT_EQ(calibration_error(DraftCalibration{}), 0.0);
  // A constant overconfident 0.9 against a 60% acceptance: a 0.3 gap.
  DraftCalibration over;
  for (int i = 0; i < 10; ++i) record_calibration(over, 0.9, i < 6);
  EXPECT_NEAR(calibration_error(over), 0.3, 1e-12);
  // Two bins with gaps of opposite sign do not cancel: 8 drafts at 0.1 all accepted (gap 0.9),
  // 2 at 0.95 none accepted (gap 0.95): (8 * 0.9 + 2 * 0.95) / 10.
  DraftCalibration mixed;
  for (int i = 0; i < 8; ++i) record_calibration(mixed, 0.1, true);
  for (int i = 0; i < 2; ++i) record_calibration(mixed, 0.95, false);
  EXPECT_NEAR(calibration_error(mixed), (8 * 0.9 + 2 * 0.95) / 10, 1e-12);
  // Within one bin, over- and underconfident drafts do average out (that is binning).
  DraftCalibration bin;
  record_calibration(bin, 0.41, true);
  record_calibration(bin, 0.49, false);
  EXPECT_NEAR(calibration_error(bin), 0.05, 1e-12);
  // Out-of-range and NaN estimates clamp into [0, 1].
  DraftCalibration odd;
  record_calibration(odd, 1.5, true);
  record_calibration(odd, -1.0, false);
  record_calibration(odd, std::nan(""), false);
  EXPECT_EQ(odd.drafts[9], 1u);
  EXPECT_EQ(odd.drafts[0], 2u);
  EXPECT_NEAR(calibration_error(odd), 0.0, 1e-12);
}

}  // namespace
}  // namespace deepinfer::sched
