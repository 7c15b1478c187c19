// The host sampler (sample/sampler.h): the counter-based uniform, each stage of the pipeline on
// logits whose answer is known, frequencies against the softmax, and the lazy ranking against a
// straightforward full-sort reference on a V4-sized vocabulary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "deepinfer/error.h"
#include "sample/sampler.h"

namespace deepinfer::sample {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

size_t at(int64_t i) {
  return static_cast<size_t>(i);
}

// Ids by logit descending, lower id first on ties (a stable sort keeps id order among ties).
std::vector<int32_t> rank_order(const std::vector<float>& x) {
  std::vector<int32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return x[at(a)] > x[at(b)]; });
  return order;
}

std::vector<double> softmax(const std::vector<float>& x, double temperature = 1.0) {
  const double mx = *std::max_element(x.begin(), x.end());
  std::vector<double> p(x.size());
  double sum = 0.0;
  for (size_t i = 0; i < x.size(); ++i) sum += p[i] = std::exp((x[i] - mx) / temperature);
  for (double& v : p) v /= sum;
  return p;
}

// Token counts over `draws` positions (each draw keyed by its own position).
std::vector<int> histogram(const std::vector<float>& logits, RowParams params, int draws) {
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i) {
    params.position = i;
    ++counts[static_cast<size_t>(sample_row(logits, params).token)];
  }
  return counts;
}

// Every frequency within 5 standard deviations (plus a little slack) of `want`.
void expect_frequencies(const std::vector<int>& counts, const std::vector<double>& want,
                        int draws) {
  ASSERT_EQ(counts.size(), want.size());
  for (size_t i = 0; i < counts.size(); ++i) {
    const double got = static_cast<double>(counts[i]) / draws;
    const double sd = std::sqrt(want[i] * (1.0 - want[i]) / draws);
    EXPECT_NEAR(got, want[i], 5.0 * sd + 1e-3) << "token " << i;
  }
}

std::vector<float> random_logits(size_t n, uint32_t seed, float scale = 3.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// ---- the counter-based uniform ----------------------------------------------------------------

TEST(SamplerRng, SplitMix64MatchesTheReferenceSequence) {
  // SplitMix64 seeded with 1234567: each output is splitmix64(state), the state advancing by the
  // golden-ratio increment.
  const uint64_t want[] = {6457827717110365317ULL, 3203168211198807973ULL, 9817491932198370423ULL,
                           4593380528125082431ULL, 16408922859458223821ULL};
  uint64_t state = 1234567;
  for (uint64_t w : want) {
    EXPECT_EQ(splitmix64(state), w);
    state += 0x9E3779B97F4A7C15ULL;
  }
}

TEST(SamplerRng, UniformIsDeterministicAndInRange) {
  for (int64_t p = -5; p < 1000; ++p) {
    const double u = uniform(42, p, 3);
    EXPECT_EQ(u, uniform(42, p, 3));
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
  EXPECT_EQ(uniform(7, 11), uniform(7, 11, 0));  // stream 0 is the default
}

TEST(SamplerRng, UniformDependsOnEveryKey) {
  const double base = uniform(1, 100, 0);
  EXPECT_NE(base, uniform(2, 100, 0));
  EXPECT_NE(base, uniform(1, 101, 0));
  EXPECT_NE(base, uniform(1, 100, 1));
  // No collisions across a grid of neighbouring keys (a 53-bit collision would be a mixing bug).
  std::set<double> seen;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    for (int64_t p = 0; p < 200; ++p) {
      for (uint32_t s = 0; s < 4; ++s) seen.insert(uniform(seed, p, s));
    }
  }
  EXPECT_EQ(seen.size(), 8u * 200u * 4u);
}

TEST(SamplerRng, UniformIsRoughlyUniform) {
  // Chi-square over 100 buckets of 1e5 draws along positions (99 degrees of freedom: mean 99,
  // standard deviation 14); 200 is far in the tail, so only a real bias fails.
  constexpr int kBuckets = 100;
  constexpr int kDraws = 100000;
  for (uint32_t stream : {0u, 1u}) {
    std::vector<int> counts(kBuckets, 0);
    double mean = 0.0;
    for (int i = 0; i < kDraws; ++i) {
      const double u = uniform(12345, i, stream);
      mean += u;
      ++counts[static_cast<size_t>(u * kBuckets)];
    }
    const double expected = static_cast<double>(kDraws) / kBuckets;
    double chi2 = 0.0;
    for (int c : counts) chi2 += (c - expected) * (c - expected) / expected;
    EXPECT_LT(chi2, 200.0) << "stream " << stream;
    EXPECT_NEAR(mean / kDraws, 0.5, 0.005) << "stream " << stream;
  }
}

// ---- greedy ----------------------------------------------------------------------------------

TEST(Sampler, GreedyIsArgmax) {
  for (uint32_t s = 0; s < 20; ++s) {
    const std::vector<float> x = random_logits(1000, s);
    const auto want = std::max_element(x.begin(), x.end()) - x.begin();
    RowParams p;
    p.temperature = 0.0f;
    p.top_k = 3;  // ignored by greedy
    p.top_p = 0.1f;
    p.seed = s;
    EXPECT_EQ(sample_row(x, p).token, want);
  }
}

TEST(Sampler, GreedyTiesTakeTheLowestId) {
  RowParams p;
  p.temperature = 0.0f;
  EXPECT_EQ(sample_row(std::vector<float>{1, 5, 2, 5, 5}, p).token, 1);
  EXPECT_EQ(sample_row(std::vector<float>{7, 7}, p).token, 0);
  EXPECT_EQ(sample_row(std::vector<float>{-kInf, 0, -kInf, 0}, p).token, 1);
}

TEST(Sampler, TinyTemperatureBehavesLikeGreedy) {
  const std::vector<float> x = {0.5f, 2.0f, 1.99f, -1.0f};
  RowParams p;
  p.temperature = 1e-6f;
  for (int i = 0; i < 100; ++i) {
    p.position = i;
    EXPECT_EQ(sample_row(x, p).token, 1);
  }
}

// ---- temperature, top-k, top-p -----------------------------------------------------------------

TEST(Sampler, TemperatureFrequenciesMatchSoftmax) {
  const std::vector<float> x = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f, -2.0f, 0.7f};
  constexpr int kDraws = 40000;
  for (float t : {1.0f, 0.6f, 2.5f}) {
    RowParams p;
    p.temperature = t;
    p.seed = 99;
    expect_frequencies(histogram(x, p, kDraws), softmax(x, t), kDraws);
  }
}

TEST(Sampler, InfiniteTemperatureIsUniformOverUnmaskedTokens) {
  const std::vector<float> x = {3.0f, -kInf, -1.0f, 0.0f};
  RowParams p;
  p.temperature = kInf;
  constexpr int kDraws = 30000;
  expect_frequencies(histogram(x, p, kDraws), {1.0 / 3, 0.0, 1.0 / 3, 1.0 / 3}, kDraws);
}

TEST(Sampler, MaskedTokensAreNeverSampled) {
  std::vector<float> x(64, 0.0f);
  for (size_t i = 0; i < x.size(); i += 2) x[i] = -kInf;
  RowParams p;
  p.temperature = 1.0f;
  const std::vector<int> counts = histogram(x, p, 5000);
  for (size_t i = 0; i < x.size(); i += 2) EXPECT_EQ(counts[i], 0) << i;
}

TEST(Sampler, TopKKeepsExactlyKCandidates) {
  const std::vector<float> x = random_logits(200, 5, 1.0f);
  const std::vector<int32_t> order = rank_order(x);
  constexpr int kDraws = 40000;
  for (int k : {1, 2, 7}) {
    RowParams p;
    p.temperature = 3.0f;  // flat enough that every kept token shows up
    p.top_k = k;
    p.seed = 3;
    const std::vector<int> counts = histogram(x, p, kDraws);
    std::vector<float> kept_logits;
    for (int r = 0; r < k; ++r) kept_logits.push_back(x[at(order[at(r)])]);
    const std::vector<double> kept_p = softmax(kept_logits, p.temperature);
    std::vector<double> want(x.size(), 0.0);
    for (int r = 0; r < k; ++r) want[at(order[at(r)])] = kept_p[at(r)];
    for (size_t i = 0; i < x.size(); ++i) {
      if (want[i] == 0.0) {
        EXPECT_EQ(counts[i], 0) << "k " << k << " token " << i;
      }
    }
    expect_frequencies(counts, want, kDraws);
  }
}

TEST(Sampler, TopKTiesAtTheCutTakeLowerIds) {
  // Ranks: id 5 (3.0), then the tie at 1.0 between ids 6, 2, 4 (in that order of position).
  const std::vector<float> x = {0.0f, -1.0f, 1.0f, 0.5f, 1.0f, 3.0f, 1.0f};
  RowParams p;
  p.temperature = 1.0f;
  p.top_k = 3;
  const std::vector<int> counts = histogram(x, p, 20000);
  EXPECT_GT(counts[5], 0);
  EXPECT_GT(counts[2], 0);
  EXPECT_GT(counts[4], 0);
  EXPECT_EQ(counts[6], 0);
  for (int i : {0, 1, 3}) EXPECT_EQ(counts[at(i)], 0);
}

TEST(Sampler, TopKLargerThanVocabIsOff) {
  const std::vector<float> x = {0.0f, 1.0f, 2.0f};
  RowParams p;
  p.top_k = 10;
  constexpr int kDraws = 30000;
  expect_frequencies(histogram(x, p, kDraws), softmax(x), kDraws);
}

// Ids observed over many draws.
std::set<int32_t> support(const std::vector<float>& x, RowParams p, int draws = 4000) {
  std::set<int32_t> ids;
  for (int i = 0; i < draws; ++i) {
    p.position = i;
    ids.insert(sample_row(x, p).token);
  }
  return ids;
}

TEST(Sampler, TopPKeepsTheMinimalPrefix) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 placed at scrambled ids.
  std::vector<float> x(4);
  x[2] = std::log(0.5f);
  x[0] = std::log(0.3f);
  x[3] = std::log(0.15f);
  x[1] = std::log(0.05f);
  RowParams p;
  p.seed = 17;
  p.top_p = 0.45f;
  EXPECT_EQ(support(x, p), (std::set<int32_t>{2}));
  p.top_p = 0.75f;
  EXPECT_EQ(support(x, p), (std::set<int32_t>{2, 0}));
  p.top_p = 0.9f;
  EXPECT_EQ(support(x, p), (std::set<int32_t>{2, 0, 3}));
  p.top_p = 1.0f;
  EXPECT_EQ(support(x, p), (std::set<int32_t>{0, 1, 2, 3}));

  // Renormalised over the nucleus {2, 0}: 0.5 / 0.8 and 0.3 / 0.8.
  p.top_p = 0.75f;
  constexpr int kDraws = 40000;
  expect_frequencies(histogram(x, p, kDraws), {0.375, 0.0, 0.625, 0.0}, kDraws);
}

TEST(Sampler, TopPReachingTheMassExactlyStops) {
  // Four equal weights (exactly 1 each): top_p 0.5 needs mass 2 of 4, reached exactly by two
  // tokens; the tie is broken towards the lower ids.
  const std::vector<float> x = {0.0f, 0.0f, 0.0f, 0.0f};
  RowParams p;
  p.top_p = 0.5f;
  EXPECT_EQ(support(x, p), (std::set<int32_t>{0, 1}));
  p.top_p = 0.25f;
  EXPECT_EQ(support(x, p), (std::set<int32_t>{0}));
  p.top_p = 0.5000001f;
  EXPECT_EQ(support(x, p), (std::set<int32_t>{0, 1, 2}));
}

TEST(Sampler, TopPTieAtTheBoundaryTakesLowerIds) {
  // Rank 0 is id 3 (logit 2); ids 4, 1, 5 tie at logit 1. The nucleus needs id 3 and exactly one
  // of the tie, which must be the lowest id, 1.
  const std::vector<float> x = {-3.0f, 1.0f, -2.0f, 2.0f, 1.0f, 1.0f};
  const std::vector<double> prob = softmax(x);
  RowParams p;
  p.top_p = static_cast<float>(prob[3] + 0.5 * prob[1]);
  EXPECT_EQ(support(x, p), (std::set<int32_t>{3, 1}));
  p.top_p = static_cast<float>(prob[3] + 1.5 * prob[1]);
  EXPECT_EQ(support(x, p), (std::set<int32_t>{3, 1, 4}));
}

TEST(Sampler, TopPAppliesAfterTopKAndTemperature) {
  // Top-k 3 keeps ids 0, 1, 2 with equal weight whatever the temperature; top_p 0.6 of that mass
  // needs two of them.
  const std::vector<float> x = {5.0f, 5.0f, 5.0f, 4.0f, 4.0f, 4.0f};
  RowParams p;
  p.temperature = 0.5f;
  p.top_k = 3;
  p.top_p = 0.6f;
  EXPECT_EQ(support(x, p), (std::set<int32_t>{0, 1}));
  // Without top-k the reference mass also holds the three 4s (weight e^-2 each at T = 0.5): two
  // 5s carry 2 / 3.41 < 0.6 of it, so the nucleus needs the third.
  p.top_k = 0;
  EXPECT_EQ(support(x, p), (std::set<int32_t>{0, 1, 2}));
}

// ---- log-probabilities -------------------------------------------------------------------------

TEST(Sampler, LogprobsAreLogSoftmaxOfRawLogits) {
  const std::vector<float> x = random_logits(500, 77);
  const std::vector<double> prob = softmax(x);
  const std::vector<int32_t> order = rank_order(x);
  for (float t : {0.0f, 0.3f, 1.0f, 4.0f}) {
    RowParams p;
    p.temperature = t;
    p.top_k = 20;
    p.top_p = 0.8f;
    p.num_logprobs = 12;
    for (int pos = 0; pos < 20; ++pos) {
      p.position = pos;
      const RowResult r = sample_row(x, p);
      EXPECT_NEAR(r.logprob, std::log(prob[at(r.token)]), 1e-5) << "t " << t;
      ASSERT_EQ(r.top.size(), 12u);
      for (size_t i = 0; i < r.top.size(); ++i) {
        EXPECT_EQ(r.top[i].first, order[i]);
        EXPECT_NEAR(r.top[i].second, std::log(prob[at(order[i])]), 1e-5);
        if (i > 0) {
          EXPECT_GE(r.top[i - 1].second, r.top[i].second);
        }
      }
    }
  }
}

TEST(Sampler, LogprobTopListBreaksTiesByIdAndClampsToVocab) {
  const std::vector<float> x = {1.0f, 3.0f, 1.0f, 3.0f, -kInf};
  RowParams p;
  p.num_logprobs = 10;
  const RowResult r = sample_row(x, p);
  ASSERT_EQ(r.top.size(), 5u);
  const std::vector<int32_t> want = {1, 3, 0, 2, 4};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(r.top[i].first, want[i]);
  EXPECT_EQ(r.top[4].second, -kInf);
  EXPECT_NE(r.token, 4);
  p.num_logprobs = 0;
  EXPECT_TRUE(sample_row(x, p).top.empty());
  // -0 and +0 are one logit value: the tie goes to the lower id whatever the sign bit.
  p.num_logprobs = 2;
  const RowResult zeros = sample_row(std::vector<float>{-0.0f, 0.0f}, p);
  EXPECT_EQ(zeros.top[0].first, 0);
  EXPECT_EQ(zeros.top[1].first, 1);
}

// ---- invalid input -----------------------------------------------------------------------------

TEST(Sampler, InvalidParamsThrow) {
  const std::vector<float> x = {0.0f, 1.0f};
  auto expect_invalid = [&](const std::vector<float>& logits, RowParams p, const char* needle) {
    try {
      sample_row(logits, p);
      ADD_FAILURE() << "expected an error containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  RowParams ok;
  RowParams p = ok;
  p.temperature = -0.5f;
  expect_invalid(x, p, "temperature");
  p.temperature = std::numeric_limits<float>::quiet_NaN();
  expect_invalid(x, p, "temperature");
  for (float top_p : {0.0f, -0.1f, 1.01f, std::numeric_limits<float>::quiet_NaN()}) {
    p = ok;
    p.top_p = top_p;
    expect_invalid(x, p, "top_p");
  }
  p = ok;
  p.num_logprobs = -1;
  expect_invalid(x, p, "num_logprobs");
  // Greedy rows are validated the same way.
  p = ok;
  p.temperature = 0.0f;
  p.top_p = 0.0f;
  expect_invalid(x, p, "top_p");
  expect_invalid({}, ok, "empty");
  expect_invalid({0.0f, std::numeric_limits<float>::quiet_NaN()}, ok, "logits[1] is NaN");
  expect_invalid({0.0f, kInf}, ok, "+inf");
  expect_invalid({-kInf, -kInf}, ok, "-inf");
}

// ---- the lazy ranking against a full sort -------------------------------------------------------

// The pipeline of sampler.h over the full rank order, without shortcuts.
int32_t reference_sample(const std::vector<float>& x, const std::vector<int32_t>& order,
                         const RowParams& p) {
  if (p.temperature == 0.0f) return order[0];
  size_t n = order.size();
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) n = static_cast<size_t>(p.top_k);
  const double mx = x[at(order[0])];
  std::vector<double> w(n);
  for (size_t r = 0; r < n; ++r) w[r] = std::exp((x[at(order[r])] - mx) / p.temperature);
  double mass = 0.0;
  for (double v : w) mass += v;
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    size_t kept = n;
    for (size_t r = 0; r < n; ++r) {
      cum += w[r];
      if (cum >= p.top_p * mass) {
        kept = r + 1;
        break;
      }
    }
    n = kept;
    mass = cum;
  }
  const double target = uniform(p.seed, p.position) * mass;
  double cum = 0.0;
  for (size_t r = 0; r < n; ++r) {
    cum += w[r];
    if (cum > target) return order[r];
  }
  return order[n - 1];
}

TEST(Sampler, MatchesAFullSortOnALargeVocabulary) {
  // V4's vocabulary size with logits spread like a trained model's (a few dominant tokens, a long
  // tail), plus a block of exact ties.
  const std::vector<float> base = random_logits(129280, 2024, 2.5f);
  std::vector<float> x = base;
  for (size_t i = 1000; i < 1100; ++i) x[i] = 6.0f;
  const std::vector<int32_t> order = rank_order(x);
  struct Case {
    float temperature;
    int top_k;
    float top_p;
  };
  const Case cases[] = {{1.0f, 0, 1.0f},     {0.7f, 0, 1.0f},     {1.0f, 50, 1.0f},
                        {0.8f, 40, 0.9f},    {1.2f, 0, 0.95f},    {1.0f, 0, 0.5f},
                        {2.0f, 0, 0.3f},     {0.5f, 2000, 0.99f}, {0.0f, 0, 1.0f},
                        {1.0f, 129279, 1.0f}};
  for (const Case& c : cases) {
    RowParams p;
    p.temperature = c.temperature;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.seed = 0xDEADBEEF;
    for (int pos = 0; pos < 25; ++pos) {
      p.position = pos * 7919;
      EXPECT_EQ(sample_row(x, p).token, reference_sample(x, order, p))
          << "T " << c.temperature << " k " << c.top_k << " p " << c.top_p << " pos " << pos;
    }
  }
}

}  // namespace
}  // namespace deepinfer::sample
