// Host-side sampling parameters of a batch of rows and their upload as a SamplingBatch: the one
// place that spells SamplingBatch's tensor dtypes for the op tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/tensor.h"

namespace deepinfer::backend_ops {

struct SamplingRows {
  std::vector<float> temperature;
  std::vector<int32_t> top_k;
  std::vector<float> top_p;
  std::vector<int64_t> seed;
  std::vector<int32_t> position;
  std::vector<int32_t> num_logprobs;
  int max_logprobs = 0;

  int64_t rows() const { return static_cast<int64_t>(temperature.size()); }
  void add(float t, int32_t k, float p, int64_t s, int64_t pos, int32_t n) {
    temperature.push_back(t);
    top_k.push_back(k);
    top_p.push_back(p);
    seed.push_back(s);
    position.push_back(static_cast<int32_t>(pos));
    num_logprobs.push_back(n);
  }

  SamplingBatch upload(Backend& be) const {
    const int64_t n = rows();
    SamplingBatch s;
    s.num_rows = static_cast<int>(n);
    s.max_logprobs = max_logprobs;
    s.temperature = be.upload(Tensor::from_vector(temperature, {n}), DType::kF32);
    s.top_k = be.upload(Tensor::from_vector(top_k, {n}), DType::kI32);
    s.top_p = be.upload(Tensor::from_vector(top_p, {n}), DType::kF32);
    s.seed = be.upload(Tensor::from_vector(seed, {n}), DType::kI64);
    s.position = be.upload(Tensor::from_vector(position, {n}), DType::kI32);
    s.num_logprobs = be.upload(Tensor::from_vector(num_logprobs, {n}), DType::kI32);
    return s;
  }

  std::string describe(int64_t r) const {
    const auto i = static_cast<size_t>(r);
    return "row " + std::to_string(r) + " (T " + std::to_string(temperature[i]) + ", top_k " +
           std::to_string(top_k[i]) + ", top_p " + std::to_string(top_p[i]) + ", seed " +
           std::to_string(seed[i]) + ", position " + std::to_string(position[i]) + ", N " +
           std::to_string(num_logprobs[i]) + ")";
  }
};

enum class RowKind { kNormal, kTied, kMasked, kFlat };

// Random logits of one row: N(0, sigma) with variations that exercise ties (values on a coarse
// grid), masked tokens (-inf) and nearly flat rows (draws deep in the rank order).
inline void fill_logits_row(float* row, int64_t vocab, RowKind kind, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, kind == RowKind::kFlat ? 0.05f : 3.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int64_t v = 0; v < vocab; ++v) {
    float x = normal(rng);
    if (kind == RowKind::kTied) x = std::round(x * 2.0f) / 2.0f;
    if (kind == RowKind::kMasked && unit(rng) < 0.7f) x = -std::numeric_limits<float>::infinity();
    row[v] = x;
  }
  if (kind == RowKind::kMasked) {
    row[rng() % static_cast<uint64_t>(vocab)] = 1.0f;  // at least one finite logit
  }
}

}  // namespace deepinfer::backend_ops
