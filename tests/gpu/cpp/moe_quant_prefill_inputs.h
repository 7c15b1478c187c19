// Inputs and helpers shared by the GPU tests of the quantized experts' wgmma prefill kernels
// (test_moe_quant_prefill_wgmma.cpp, test_moe_quant_prefill_wgmma_fp8.cpp): whether they can run
// here, weights with narrow power-of-two scales, small-integer activations, a skewed routing, a
// backend created with a DEEPINFER_MOE_QUANT_PREFILL value, one moe_experts run, and the check
// of two outputs against each other.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/backend/cuda_backend.h"
#include "deepinfer/backend.h"
#include "deepinfer/weight.h"
#include "device_backends.h"
#include "inputs.h"
#include "moe_inputs.h"
#include "scoped_env.h"

namespace deepinfer::backend_ops::moe_prefill {

// Why the wgmma kernels cannot run here ("" when they can): no CUDA device, or not an sm_90 one
// with sm_90a code built. `must_fail`: whether that fails the test where the device must be
// tested (device_required()): always without a device, and on an sm_90 device that lacks the
// sm_90a code (a build error, not a missing device).
inline std::string wgmma_unavailable(bool* must_fail) {
  std::string why;
  Backend* be = shared_backend("cuda", &why);
  *must_fail = device_required();
  if (be == nullptr) return why;
  if (dynamic_cast<cuda::CudaBackend&>(*be).wgmma_device()) return "";
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  *must_fail = *must_fail && major == 9;
  return *must_fail ? "an sm_90 device, but no sm_90a code built"
                    : "wgmma needs an sm_90 device and a build with sm_90a code";
}

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

// The case, for SCOPED_TRACE.
inline std::string describe(const PrefillCase& c) {
  return "format " + std::to_string(static_cast<int>(c.format)) + " act " +
         std::to_string(c.act_group) + " E " + std::to_string(c.experts) + " H " +
         std::to_string(c.hidden) + " I " + std::to_string(c.inter) + " T " +
         std::to_string(c.tokens);
}

// The moe_experts outputs of two backends on one draw of case c's inputs (weights, small-integer
// activations, skewed routing).
struct TwoRuns {
  Tensor first, second;
};
inline TwoRuns run_both(Backend& first, Backend& second, const PrefillCase& c, std::mt19937& rng) {
  std::vector<MatrixWeight> w1, w3, w2;
  for (int e = 0; e < c.experts; ++e) {
    w1.push_back(random_weight(rng, c.format, c.inter, c.hidden, c.block, c.act_group));
    w3.push_back(random_weight(rng, c.format, c.inter, c.hidden, c.block, c.act_group));
    w2.push_back(random_weight(rng, c.format, c.hidden, c.inter, c.block, c.act_group));
  }
  const Tensor x = small_integers(rng, c.tokens, c.hidden);
  const HostRouting routing = skewed_routing(c.tokens, c.experts, c.top_k, rng);
  return {run_experts(first, w1, w3, w2, x, routing), run_experts(second, w1, w3, w2, x, routing)};
}

// Expects max |a - b| <= rtol * max |a| (NaN fails), naming the worst element (token and channel
// of [tokens, hidden] outputs) and the two kernels.
inline void expect_close(const Tensor& a, const Tensor& b, double rtol, int64_t hidden,
                         const char* name_a, const char* name_b) {
  ASSERT_EQ(a.nbytes(), b.nbytes());
  double max_ref = 0.0, max_diff = 0.0;
  int64_t worst = -1;
  for (int64_t i = 0; i < a.numel(); ++i) {
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(a.item(i))));
    const double d = std::fabs(static_cast<double>(a.item(i)) - b.item(i));
    if (!(d <= max_diff)) {  // NaN counts as worst
      max_diff = std::isnan(d) ? INFINITY : d;
      worst = i;
    }
  }
  EXPECT_GT(max_ref, 0.0) << "all-zero output";
  EXPECT_LE(max_diff, rtol * max_ref)
      << "worst element " << worst << " of " << a.numel() << " (token " << worst / hidden
      << ", channel " << worst % hidden << "): " << name_a << " "
      << (worst >= 0 ? a.item(worst) : 0.0f) << ", " << name_b << " "
      << (worst >= 0 ? b.item(worst) : 0.0f) << ", max |y| " << max_ref;
}

}  // namespace deepinfer::backend_ops::moe_prefill
