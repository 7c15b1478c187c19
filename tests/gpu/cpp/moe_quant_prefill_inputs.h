// Inputs and helpers shared by the GPU tests of the quantized experts' prefill kernels
// (test_moe_quant_prefill_wgmma.cpp, test_moe_quant_prefill_wgmma_fp8.cpp): weights with narrow
// power-of-two scales, small-integer activations, a skewed routing, a backend created with a
// DEEPINFER_MOE_QUANT_PREFILL value, one moe_experts run, and the largest difference of two
// outputs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/weight.h"
#include "device_backends.h"
#include "inputs.h"
#include "moe_inputs.h"
#include "scoped_env.h"

namespace deepinfer::backend_ops::moe_prefill {

struct PrefillCase {
  WeightFormat format;
  int block;      // kFp8Block: square scale blocks
  int act_group;  // 0: no activation quantization
  int experts, top_k, hidden, inter, tokens;
};

// A random [n, k] weight in `format` with power-of-two scales near 2^-6: random e2m1 bytes with
// e8m0 scales, or e4m3 bytes with exponent fields 6..10 (normal, no NaN) and f32 block scales.
// The narrow exponent ranges keep the gate/up sums of small-integer activations exact.
inline MatrixWeight random_weight(std::mt19937& rng, WeightFormat format, int64_t n, int64_t k,
                                  int block, int act_group) {
  MatrixWeight w;
  w.format = format;
  w.act_group = act_group;
  std::uniform_int_distribution<int> jitter(-1, 1);
  if (format == WeightFormat::kMxfp4) {
    w.block_rows = 1;
    w.block_cols = 32;
    w.values = random_bytes(rng, {n, k / 2}, DType::kE2M1x2);
    w.scales = Tensor::zeros({n, k / 32}, DType::kE8M0);
    auto* s = static_cast<uint8_t*>(w.scales.raw_data());
    for (int64_t i = 0; i < w.scales.numel(); ++i) s[i] = static_cast<uint8_t>(121 + jitter(rng));
    return w;
  }
  w.block_rows = block;
  w.block_cols = block;
  w.values = random_bytes(rng, {n, k}, DType::kF8E4M3);
  auto* v = static_cast<uint8_t*>(w.values.raw_data());
  std::uniform_int_distribution<int> exponent(6, 10);
  for (int64_t i = 0; i < w.values.numel(); ++i) {
    v[i] = static_cast<uint8_t>((v[i] & 0x87) | (exponent(rng) << 3));
  }
  w.scales = Tensor::zeros(weight_scale_shape(n, k, block, block), DType::kF32);
  float* s = w.scales.data<float>();
  for (int64_t i = 0; i < w.scales.numel(); ++i) s[i] = std::ldexp(1.0f, -9 + jitter(rng));
  return w;
}

// Integers in [-8, 8]: exact through activation quantization and in every gate/up sum.
inline Tensor small_integers(std::mt19937& rng, int64_t rows, int64_t cols) {
  std::uniform_int_distribution<int> u(-8, 8);
  Tensor t = Tensor::zeros({rows, cols}, DType::kF32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(u(rng));
  return t;
}

// k distinct experts per token from experts 0 .. E - 3 with popularity 1 / (1 + e / 4) (so the
// first experts get several 128-row tiles and the later ones short tiles), token 0's last slot
// on expert E - 2 (its only pair), expert E - 1 never chosen.
inline HostRouting skewed_routing(int tokens, int experts, int top_k, std::mt19937& rng) {
  std::vector<double> popularity(static_cast<size_t>(experts - 2));
  for (size_t e = 0; e < popularity.size(); ++e) popularity[e] = 1.0 / (1.0 + e / 4.0);
  std::discrete_distribution<int> pick(popularity.begin(), popularity.end());
  std::uniform_real_distribution<float> u(0.1f, 1.5f);
  std::vector<int32_t> ids;
  std::vector<float> w;
  for (int t = 0; t < tokens; ++t) {
    std::vector<int32_t> mine;
    while (static_cast<int>(mine.size()) < top_k) {
      const int e = t == 0 && static_cast<int>(mine.size()) == top_k - 1 ? experts - 2 : pick(rng);
      if (std::find(mine.begin(), mine.end(), e) == mine.end()) mine.push_back(e);
    }
    for (const int32_t e : mine) {
      ids.push_back(e);
      w.push_back(u(rng));
    }
  }
  return {Tensor::from_vector(ids, {tokens, top_k}), Tensor::from_vector(w, {tokens, top_k})};
}

// A CUDA backend created with DEEPINFER_MOE_QUANT_PREFILL set to `prefill` ("" for unset).
inline std::unique_ptr<Backend> cuda_backend_with_prefill(const char* prefill) {
  const ScopedEnv env("DEEPINFER_MOE_QUANT_PREFILL", prefill);
  return make_backend("cuda");
}

inline Tensor run_experts(Backend& be, const std::vector<MatrixWeight>& w1,
                          const std::vector<MatrixWeight>& w3, const std::vector<MatrixWeight>& w2,
                          const Tensor& x, const HostRouting& routing) {
  ExpertWeights w;
  for (size_t e = 0; e < w1.size(); ++e) {
    w.w1.push_back(be.upload_matrix_weight(w1[e]));
    w.w3.push_back(be.upload_matrix_weight(w3[e]));
    w.w2.push_back(be.upload_matrix_weight(w2[e]));
  }
  const Routing r{be.upload(routing.ids, DType::kI32), be.upload(routing.weights, DType::kF32)};
  return be.to_host(be.moe_experts(be.upload(x, DType::kF32), r, w, 10.0f));
}

// The largest |a - b| (NaN counts as the largest), where it is and max |a|.
struct OutputDiff {
  double max_ref = 0.0;
  double max_diff = 0.0;
  int64_t worst = -1;
};

inline OutputDiff output_diff(const Tensor& a, const Tensor& b) {
  OutputDiff d;
  for (int64_t i = 0; i < a.numel(); ++i) {
    d.max_ref = std::max(d.max_ref, std::fabs(static_cast<double>(a.item(i))));
    const double x = std::fabs(static_cast<double>(a.item(i)) - b.item(i));
    if (!(x <= d.max_diff)) {  // NaN counts as worst
      d.max_diff = std::isnan(x) ? INFINITY : x;
      d.worst = i;
    }
  }
  return d;
}

}  // namespace deepinfer::backend_ops::moe_prefill
