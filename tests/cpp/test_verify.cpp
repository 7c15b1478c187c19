// verify_row: greedy prefix acceptance, and rejection sampling whose committed tokens have the
// target distribution whatever the drafts (chi-square over many seeds; a planted always-accept
// verifier fails the same check).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <tuple>
#include <vector>

#include "deepinfer/error.h"
#include "sample/verify.h"

namespace deepinfer::sample {
namespace {

std::vector<std::span<const float>> spans(const std::vector<std::vector<float>>& rows) {
  return {rows.begin(), rows.end()};
}

TEST(VerifyRow, GreedyAcceptsTheMatchingPrefix) {
  const std::vector<std::vector<float>> rows = {
      {0.0f, 3.0f, 1.0f, 0.0f}, {2.0f, 0.0f, 1.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 5.0f}};
  RowParams greedy;
  greedy.temperature = 0.0f;
  const std::vector<int32_t> good = {1, 0};
  VerifyResult all = verify_row(spans(rows), good, {}, greedy);
  EXPECT_EQ(all.num_accepted, 2);
  EXPECT_EQ(all.tokens, (std::vector<int32_t>{1, 0, 3}));
  const std::vector<int32_t> second_wrong = {1, 2};
  VerifyResult some = verify_row(spans(rows), second_wrong, {}, greedy);
  EXPECT_EQ(some.num_accepted, 1);
  EXPECT_EQ(some.tokens, (std::vector<int32_t>{1, 0}));
  const std::vector<int32_t> first_wrong = {2, 0};
  VerifyResult none = verify_row(spans(rows), first_wrong, {}, greedy);
  EXPECT_EQ(none.num_accepted, 0);
  EXPECT_EQ(none.tokens, (std::vector<int32_t>{1}));
  // No drafts: the plain sample.
  VerifyResult plain = verify_row(spans({rows[0]}), {}, {}, greedy);
  EXPECT_EQ(plain.tokens, (std::vector<int32_t>{1}));
}

// Pearson's statistic of `counts` against the probabilities `expected`.
double chi_square(const std::vector<int>& counts, const std::vector<double>& expected, int n) {
  double x = 0.0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = expected[i] * n;
    if (e == 0.0) {
      // A token the target never draws must never be committed.
      if (counts[i] > 0) return INFINITY;
      continue;
    }
    x += (counts[i] - e) * (counts[i] - e) / e;
  }
  return x;
}

// df = 5 (6 tokens): P(chi2 > 25.7) = 1e-4, so a correct verifier fails about once in 10^4 runs
// of this fixed-seed test, i.e. never; the planted bias below lands orders of magnitude above.
constexpr double kCritical = 25.7;
constexpr int kRuns = 40000;

struct VerifyCase {
  std::vector<float> logits = {1.2f, 0.3f, -0.5f, 2.0f, 0.0f, -1.0f};
  DraftDistribution draft = {{0, 0.05}, {1, 0.5}, {2, 0.2}, {3, 0.05}, {4, 0.1}, {5, 0.1}};
  RowParams params;
};

// The token a drafter with distribution `draft` proposes for seed s.
int32_t draw_draft(const DraftDistribution& draft, uint64_t seed) {
  const double u = uniform(seed, 0, 7);
  double cum = 0.0;
  for (const auto& [id, p] : draft) {
    cum += p;
    if (u < cum) return id;
  }
  return draft.back().first;
}

std::vector<double> target_of(const VerifyCase& s) {
  std::vector<double> q(s.logits.size(), 0.0);
  for (const auto& [id, p] : sampling_distribution(s.logits, s.params))
    q[static_cast<size_t>(id)] = p;
  return q;
}

void expect_target_distribution(VerifyCase s, bool point_mass) {
  const std::vector<std::vector<float>> rows = {s.logits, s.logits};
  std::vector<int> first(s.logits.size(), 0), drafted(s.logits.size(), 0);
  int accepted = 0;
  for (int run = 0; run < kRuns; ++run) {
    s.params.seed = 1000 + static_cast<uint64_t>(run);
    const int32_t x = point_mass ? 4 : draw_draft(s.draft, s.params.seed);
    const std::vector<int32_t> drafts = {x};
    const std::vector<DraftDistribution> dists = {point_mass ? DraftDistribution{} : s.draft};
    const VerifyResult r = verify_row(spans(rows), drafts, dists, s.params);
    ++first[static_cast<size_t>(r.tokens[0])];
    ++drafted[static_cast<size_t>(x)];
    accepted += r.num_accepted;
  }
  const std::vector<double> q = target_of(s);
  EXPECT_LT(chi_square(first, q, kRuns), kCritical) << "committed tokens are not the target's";
  // Acceptance rate is sum_x min(p(x), q(x)) (point mass: q(4)).
  double expected_rate = 0.0;
  if (point_mass) {
    expected_rate = q[4];
  } else {
    for (const auto& [id, p] : s.draft) expected_rate += std::min(p, q[static_cast<size_t>(id)]);
  }
  EXPECT_NEAR(static_cast<double>(accepted) / kRuns, expected_rate, 0.01);
  if (!point_mass) {
    // The planted bias: a verifier that accepted every draft would commit the drafter's
    // distribution, which the same check rejects by far.
    EXPECT_GT(chi_square(drafted, q, kRuns), 20 * kCritical);
  }
}

TEST(VerifyRow, RejectionSamplingCommitsTheTargetDistribution) {
  VerifyCase s;
  expect_target_distribution(s, /*point_mass=*/false);
}

TEST(VerifyRow, TargetDistributionWithTemperatureTopKTopP) {
  VerifyCase s;
  s.params.temperature = 0.7f;
  s.params.top_k = 4;
  s.params.top_p = 0.9f;
  expect_target_distribution(s, /*point_mass=*/false);
}

TEST(VerifyRow, PointMassDraftsCommitTheTargetDistribution) {
  VerifyCase s;
  expect_target_distribution(s, /*point_mass=*/true);
}

TEST(VerifyRow, SamplingDistributionIsWhatSampleRowDraws) {
  for (const auto& [temperature, top_k, top_p] :
       {std::tuple{1.0f, 0, 1.0f}, std::tuple{0.7f, 4, 0.9f}, std::tuple{1.5f, 0, 0.6f}}) {
    VerifyCase s;
    s.params.temperature = temperature;
    s.params.top_k = top_k;
    s.params.top_p = top_p;
    std::vector<int> counts(s.logits.size(), 0);
    for (int run = 0; run < kRuns; ++run) {
      s.params.seed = 7 + static_cast<uint64_t>(run);
      ++counts[static_cast<size_t>(sample_row(s.logits, s.params).token)];
    }
    EXPECT_LT(chi_square(counts, target_of(s), kRuns), kCritical)
        << "temperature " << temperature << " top_k " << top_k << " top_p " << top_p;
  }
}

TEST(VerifyRow, Errors) {
  const std::vector<std::vector<float>> rows = {{0.0f, 1.0f}, {1.0f, 0.0f}};
  RowParams p;
  const std::vector<int32_t> two = {0, 1};
  const std::vector<int32_t> outside = {2};
  EXPECT_THROW(verify_row(spans(rows), two, {}, p), Error);
  EXPECT_THROW(verify_row(spans(rows), outside, {}, p), Error);
  const std::vector<DraftDistribution> dists(2);
  const std::vector<int32_t> one = {0};
  EXPECT_THROW(verify_row(spans(rows), one, dists, p), Error);
}

}  // namespace
}  // namespace deepinfer::sample
