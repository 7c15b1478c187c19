// Token sampling on the host: the reference the CPU backend's `sample` op runs and device
// backends must match.
//
// Randomness is counter-based: the uniform used for a row depends only on (seed, position,
// stream), never on batch size or row order, so a request's tokens do not depend on what else is
// batched with it.
//
// Pipeline per row: temperature == 0 -> argmax (lowest id on ties). Otherwise logits /
// temperature -> keep the top_k largest (top_k <= 0: all) -> keep the smallest prefix of the
// remaining tokens, sorted by probability descending (ties: lower id first), whose probability
// mass reaches top_p -> renormalise -> inverse-CDF draw with u = uniform(seed, position, stream)
// over that sorted order.
// Log-probabilities reported are log_softmax of the raw logits (before temperature and
// filtering), for the sampled token and for the `num_logprobs` most likely tokens.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "sample/counter_rng.h"  // splitmix64, uniform, normal

namespace deepinfer::sample {

struct RowParams {
  float temperature = 1.0f;  // 0 = greedy
  int top_k = 0;             // <= 0: no top-k filter
  float top_p = 1.0f;        // in (0, 1]
  uint64_t seed = 0;
  int64_t position = 0;  // position of the token being generated
  int num_logprobs = 0;  // top-N log-probabilities to report (0: none)
};

struct RowResult {
  int32_t token = 0;
  float logprob = 0.0f;                        // log_softmax(logits)[token]
  std::vector<std::pair<int32_t, float>> top;  // num_logprobs (id, logprob), descending
};

// Samples one row. Throws Error(kInvalidArgument) for an empty row, temperature < 0 or NaN,
// top_p outside (0, 1] or num_logprobs < 0.
RowResult sample_row(std::span<const float> logits, const RowParams& params);

// The distribution sample_row draws from, as (token, probability) pairs of the kept tokens in
// rank order (probabilities sum to 1; tokens outside the list have probability 0). Greedy rows
// give the argmax with probability 1. Same argument checks as sample_row.
std::vector<std::pair<int32_t, double>> sampling_distribution(std::span<const float> logits,
                                                              const RowParams& params);

}  // namespace deepinfer::sample
