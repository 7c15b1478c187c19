// Host sampler (contract in sampler.h).
//
// Cost per row for a vocabulary of V: one pass for validation, argmax and log-sum-exp, one more
// for the candidate mass when temperature != 1, and ranking only the prefix of the order the row
// needs (top-k, the top-p nucleus, the walk to the drawn token, the top-N log-probabilities).
// Realistic distributions put almost all mass in a few hundred tokens, so a row ranks about a
// thousand ids out of ~129k instead of sorting all of them.
//
// Exact definitions a device backend has to reproduce (up to floating-point summation order):
//  - rank order: logit descending, lower id first on equal logits. Dividing by a temperature > 0
//    keeps this order, so it is also the order of probability descending.
//  - weight of a token: w = exp((logit - max_logit) / temperature) in double; exactly 0 for a
//    logit of -inf (a masked token), so temperature = +inf means uniform over unmasked tokens.
//  - top-k keeps the first k ranks; top-p then keeps the first m ranks where m is the smallest
//    count whose cumulative weight (summed in rank order) is >= top_p * (weight of the top-k
//    candidates); top_p == 1 skips the filter.
//  - draw: target = u * (weight kept); the token is the first rank whose cumulative weight
//    exceeds target. Only tokens of positive weight can be drawn.
// Logits must not contain NaN or +inf and need at least one finite value; such a row is a model
// or masking bug and is rejected rather than sampled from.
#include "sample/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "deepinfer/error.h"

namespace deepinfer::sample {

namespace {

[[noreturn]] void invalid(const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "sample_row: " + what);
}

// The first ranked chunk of a row: large enough to hold the nucleus of a typical distribution,
// small enough that ranking it is negligible next to the passes over V.
constexpr int64_t kFirstRankChunk = 256;
// Logits sampled to estimate the threshold above which the first chunk lies.
constexpr int64_t kThresholdSample = 1024;

// Sort key of a token: ascending key order is rank order (logit descending, then id ascending),
// so ranking sorts plain integers instead of chasing ids into the logits. Needs a non-NaN logit.
uint64_t rank_key(float x, int32_t id) {
  if (x == 0.0f) x = 0.0f;  // -0 and +0 are the same logit: they must tie and fall back to the id
  const auto bits = std::bit_cast<uint32_t>(x);
  // Monotone map of the float's value onto unsigned order.
  const uint32_t ascending = (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
  return (static_cast<uint64_t>(~ascending) << 32) | static_cast<uint32_t>(id);
}

int32_t key_id(uint64_t key) {
  return static_cast<int32_t>(key & 0xFFFFFFFFu);
}

// Token ids of one row in rank order, ranked on demand.
//
// keys_ is [ranked prefix, in rank order | pool, unordered]. Every pool token ranks after the
// prefix, and every token not yet in keys_ ranks after the pool (its logit is below floor_). The
// first request collects only the tokens above an estimated threshold, a few times as many as
// asked for, so a typical row ranks about a thousand of ~129k tokens; the rest are collected only
// when a walk gets past them.
class RankedTokens {
 public:
  explicit RankedTokens(std::span<const float> logits)
      : logits_(logits), vocab_(static_cast<int64_t>(logits.size())) {}

  // Id at rank r (< V). Growth at least doubles, so a walk to rank r re-selects O(log r) times.
  int32_t at(int64_t r) {
    if (r >= ranked_) rank_prefix(std::max({r + 1, 2 * ranked_, kFirstRankChunk}));
    return key_id(keys_[static_cast<size_t>(r)]);
  }

  // Puts ranks [0, len) in order (len is clamped to V).
  void rank_prefix(int64_t len) {
    len = std::min(len, vocab_);
    if (len <= ranked_) return;
    if (len > static_cast<int64_t>(keys_.size())) collect(len);
    const auto first = keys_.begin() + ranked_;
    const auto mid = keys_.begin() + len;
    // Selection first: afterwards [ranked_, len) holds exactly the next ranks, in some order.
    if (mid != keys_.end()) std::nth_element(first, mid, keys_.end());
    std::sort(first, mid);
    ranked_ = len;
  }

 private:
  // Adds tokens to the pool until it holds at least `len` (or all V).
  void collect(int64_t len) {
    if (keys_.empty()) {
      floor_ = estimate_threshold(len);
      for (int64_t v = 0; v < vocab_; ++v) {
        const float x = logits_[static_cast<size_t>(v)];
        if (x >= floor_) keys_.push_back(rank_key(x, static_cast<int32_t>(v)));
      }
      if (static_cast<int64_t>(keys_.size()) >= len) return;
    }
    if (static_cast<int64_t>(keys_.size()) == vocab_) return;
    // Everything below the floor ranks after the whole pool, so appending it keeps the invariant.
    keys_.reserve(static_cast<size_t>(vocab_));
    for (int64_t v = 0; v < vocab_; ++v) {
      const float x = logits_[static_cast<size_t>(v)];
      if (x < floor_) keys_.push_back(rank_key(x, static_cast<int32_t>(v)));
    }
    floor_ = -std::numeric_limits<float>::infinity();
  }

  // A logit above which roughly 4 * len tokens lie, from an evenly strided sample of the row; -inf
  // (take everything) when the row is small or len a large part of it. Only the cost depends on
  // the estimate: collect() falls back to the full row when too few tokens clear it.
  float estimate_threshold(int64_t len) const {
    const int64_t want = 4 * len + 64;
    if (vocab_ < 4 * kThresholdSample || 2 * want > vocab_) {
      return -std::numeric_limits<float>::infinity();
    }
    const int64_t stride = vocab_ / kThresholdSample;
    std::vector<float> sample(static_cast<size_t>(kThresholdSample));
    for (int64_t i = 0; i < kThresholdSample; ++i) {
      sample[static_cast<size_t>(i)] = logits_[static_cast<size_t>(i * stride)];
    }
    const int64_t nth = std::min(kThresholdSample - 1, want * kThresholdSample / vocab_);
    std::nth_element(sample.begin(), sample.begin() + nth, sample.end(), std::greater<>());
    return sample[static_cast<size_t>(nth)];
  }

  std::span<const float> logits_;
  int64_t vocab_;
  std::vector<uint64_t> keys_;
  int64_t ranked_ = 0;
  float floor_ = -std::numeric_limits<float>::infinity();
};

void check_params(std::span<const float> logits, const RowParams& p) {
  if (logits.empty()) invalid("logits row is empty");
  if (logits.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    invalid("logits row has " + std::to_string(logits.size()) +
            " entries, more than token ids (i32) can address");
  }
  if (std::isnan(p.temperature) || p.temperature < 0.0f) {
    invalid("temperature must be >= 0, got " + std::to_string(p.temperature));
  }
  // Written so that NaN fails too.
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    invalid("top_p must be in (0, 1], got " + std::to_string(p.top_p));
  }
  if (p.num_logprobs < 0) {
    invalid("num_logprobs must be >= 0, got " + std::to_string(p.num_logprobs));
  }
}

// Index of the largest logit (lowest id on ties); rejects NaN, +inf and rows without a finite
// value, which would make every probability NaN.
int32_t checked_argmax(std::span<const float> logits) {
  size_t best = 0;
  for (size_t v = 0; v < logits.size(); ++v) {
    if (std::isnan(logits[v])) invalid("logits[" + std::to_string(v) + "] is NaN");
    // Strictly greater keeps the lowest id among equal maxima.
    if (logits[v] > logits[best]) best = v;
  }
  const float top = logits[best];
  if (std::isinf(top)) {
    invalid(top > 0 ? "logits[" + std::to_string(best) + "] is +inf"
                    : std::string("every logit is -inf: no token can be sampled"));
  }
  return static_cast<int32_t>(best);
}

}  // namespace

RowResult sample_row(std::span<const float> logits, const RowParams& params) {
  check_params(logits, params);
  const int32_t best = checked_argmax(logits);
  const int64_t vocab = static_cast<int64_t>(logits.size());
  const double max_logit = logits[static_cast<size_t>(best)];
  const bool greedy = params.temperature == 0.0f;
  const double temperature = params.temperature;
  const bool top_k_on = params.top_k > 0 && params.top_k < vocab;
  // The scaled weights equal the raw softmax terms at temperature 1, so one sum serves both.
  const bool need_scaled_sum = !greedy && !top_k_on && temperature != 1.0;
  auto logit = [&](int32_t id) { return logits[static_cast<size_t>(id)]; };
  auto weight = [&](float x) {
    if (x == -std::numeric_limits<float>::infinity()) return 0.0;
    return std::exp((static_cast<double>(x) - max_logit) / temperature);
  };

  double raw_sum = 0.0;
  double scaled_sum = 0.0;
  for (const float x : logits) {
    raw_sum += std::exp(static_cast<double>(x) - max_logit);
    if (need_scaled_sum) scaled_sum += weight(x);
  }
  const double log_norm = std::log(raw_sum);
  auto logprob = [&](int32_t id) {
    return static_cast<float>(static_cast<double>(logit(id)) - max_logit - log_norm);
  };

  RowResult result;
  const int64_t num_top = std::min<int64_t>(params.num_logprobs, vocab);
  if (greedy && num_top == 0) {
    result.token = best;
    result.logprob = logprob(best);
    return result;
  }
  RankedTokens ranked(logits);

  if (greedy) {
    result.token = best;
  } else {
    // Candidates are ranks [0, num_candidates); their total weight is the top-p reference.
    int64_t num_candidates = vocab;
    double candidate_mass = temperature == 1.0 ? raw_sum : scaled_sum;
    if (top_k_on) {
      num_candidates = params.top_k;
      ranked.rank_prefix(num_candidates);
      candidate_mass = 0.0;
      for (int64_t r = 0; r < num_candidates; ++r) candidate_mass += weight(logit(ranked.at(r)));
    }

    int64_t kept = num_candidates;
    double kept_mass = candidate_mass;
    if (params.top_p < 1.0f) {
      const double threshold = static_cast<double>(params.top_p) * candidate_mass;
      double cum = 0.0;
      for (int64_t r = 0; r < num_candidates; ++r) {
        cum += weight(logit(ranked.at(r)));
        kept = r + 1;
        if (cum >= threshold) break;
      }
      // Summed in rank order, which the draw below repeats, so the draw stays inside the kept
      // prefix even when rounding kept `cum` just below the threshold.
      kept_mass = cum;
    }

    const double target = uniform(params.seed, params.position) * kept_mass;
    double cum = 0.0;
    int64_t pick = 0;  // rank 0 has weight 1, so it is the fallback of last resort
    for (int64_t r = 0; r < kept; ++r) {
      const double w = weight(logit(ranked.at(r)));
      if (w <= 0.0) continue;  // a zero-weight token is never drawn, even through rounding
      cum += w;
      pick = r;
      if (cum > target) break;
    }
    result.token = ranked.at(pick);
  }
  result.logprob = logprob(result.token);

  ranked.rank_prefix(num_top);
  result.top.reserve(static_cast<size_t>(num_top));
  for (int64_t r = 0; r < num_top; ++r) {
    const int32_t id = ranked.at(r);
    result.top.emplace_back(id, logprob(id));
  }
  return result;
}

std::vector<std::pair<int32_t, double>> sampling_distribution(std::span<const float> logits,
                                                              const RowParams& params) {
  check_params(logits, params);
  const int32_t best = checked_argmax(logits);
  if (params.temperature == 0.0f) return {{best, 1.0}};
  const int64_t vocab = static_cast<int64_t>(logits.size());
  const double max_logit = logits[static_cast<size_t>(best)];
  const double temperature = params.temperature;
  auto weight = [&](int32_t id) {
    const float x = logits[static_cast<size_t>(id)];
    if (x == -std::numeric_limits<float>::infinity()) return 0.0;
    return std::exp((static_cast<double>(x) - max_logit) / temperature);
  };
  RankedTokens ranked(logits);
  // The same candidates and nucleus as sample_row, summed in the same rank order.
  const int64_t num_candidates = params.top_k > 0 && params.top_k < vocab ? params.top_k : vocab;
  double candidate_mass = 0.0;
  for (int64_t r = 0; r < num_candidates; ++r) candidate_mass += weight(ranked.at(r));
  int64_t kept = num_candidates;
  double kept_mass = candidate_mass;
  if (params.top_p < 1.0f) {
    const double threshold = static_cast<double>(params.top_p) * candidate_mass;
    double cum = 0.0;
    for (int64_t r = 0; r < num_candidates; ++r) {
      cum += weight(ranked.at(r));
      kept = r + 1;
      if (cum >= threshold) break;
    }
    kept_mass = cum;
  }
  std::vector<std::pair<int32_t, double>> out;
  out.reserve(static_cast<size_t>(kept));
  for (int64_t r = 0; r < kept; ++r) {
    const int32_t id = ranked.at(r);
    const double w = weight(id);
    if (w > 0.0) out.emplace_back(id, w / kept_mass);
  }
  return out;
}

}  // namespace deepinfer::sample
