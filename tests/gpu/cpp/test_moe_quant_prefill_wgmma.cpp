// The wgmma prefill kernel of the quantized routed experts (cuda/moe/sm90/experts_quant_wgmma.cu,
// the default on sm_90) against the mma.sync prefill kernel (sm80/experts_quant.cu, chosen by
// DEEPINFER_MOE_QUANT_PREFILL=mma_sync at backend creation) on the same inputs: prefill-size passes
// with a skewed routing (experts with several 128-row tiles, tiles that take each wgmma n of 32,
// 64, 96 and 128, one expert with a single pair, one with none), K and N not multiples of the CTA's
// slice and column block, with and without activation quantization, MXFP4 and FP8 weights.
//
// Why a tight tolerance holds. Both kernels multiply the same bf16 values (exact products) and
// differ by f32 summation order only. The activations are small integers and the weights' scales
// powers of two near 1, so every gate/up sum is exact (fewer than 24 significant bits) and both
// kernels give bit-identical SwiGLU outputs: activation quantization of those (e4m3, 3 mantissa
// bits) cannot round differently. The down GEMM's sums then differ by f32 rounding only,
// ~1e-7 of the output; 1e-5 of max |y| fails on any wrong fragment, k order, scale or row.
// FP8 weights without activation quantization (three planes) keep the mma.sync kernel (the
// wgmma ring does not fit): checked too. Agreement with the CPU reference is the op table's
// (tests/backend_ops/cases_moe_quant.cpp: its default takes wgmma;
// DEEPINFER_MOE_QUANT_PREFILL=mma_sync the other). Skips without a GPU, and off sm_90 or in a build
// without sm_90a code. The heuristic's choice (cuda/moe/moe_heuristics.h) is checked on the host
// first.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/backend/cuda_backend.h"
#include "cuda/moe/moe_heuristics.h"
#include "deepinfer/backend.h"
#include "deepinfer/weight.h"
#include "device_backends.h"
#include "inputs.h"
#include "moe_inputs.h"
#include "scoped_env.h"

namespace deepinfer::backend_ops {
namespace {

struct PrefillCase {
  WeightFormat format;
  int block;      // kFp8Block: square scale blocks
  int act_group;  // 0: no activation quantization
  int experts, top_k, hidden, inter, tokens;
};

// A random [n, k] weight in `format` with power-of-two scales near 2^-6: random e2m1 bytes with
// e8m0 scales, or e4m3 bytes with exponent fields 6..10 (normal, no NaN) and f32 block scales.
// The narrow exponent ranges keep the gate/up sums of small-integer activations exact.
MatrixWeight random_weight(std::mt19937& rng, WeightFormat format, int64_t n, int64_t k, int block,
                           int act_group) {
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
Tensor small_integers(std::mt19937& rng, int64_t rows, int64_t cols) {
  std::uniform_int_distribution<int> u(-8, 8);
  Tensor t = Tensor::zeros({rows, cols}, DType::kF32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(u(rng));
  return t;
}

// k distinct experts per token from experts 0 .. E - 3 with popularity 1 / (1 + e / 4) (so the
// first experts get several 128-row tiles and the later ones short tiles), token 0's last slot
// on expert E - 2 (its only pair), expert E - 1 never chosen.
HostRouting skewed_routing(int tokens, int experts, int top_k, std::mt19937& rng) {
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
std::unique_ptr<Backend> cuda_backend_with_prefill(const char* prefill) {
  const ScopedEnv env("DEEPINFER_MOE_QUANT_PREFILL", prefill);
  return make_backend("cuda");
}

Tensor run_experts(Backend& be, const std::vector<MatrixWeight>& w1,
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

// The choice on the host (needs no device): the wgmma shape (128-row tiles) only in the prefill
// shape, only when asked for and where it runs; FP8 without activation quantization never.
TEST(MoeQuantPrefillWgmma, HeuristicsTakeItOnlyWhereAskedAndWhereItRuns) {
  EXPECT_EQ(cuda::parse_quant_prefill(nullptr), cuda::QuantPrefillChoice::kWgmma);
  EXPECT_EQ(cuda::parse_quant_prefill("mma_sync"), cuda::QuantPrefillChoice::kMmaSync);
  EXPECT_EQ(cuda::parse_quant_prefill("wgmma"), cuda::QuantPrefillChoice::kWgmma);
  EXPECT_FALSE(cuda::parse_quant_prefill("wgmma2").has_value());
  constexpr size_t kH200Smem = 232448;  // cudaDevAttrMaxSharedMemoryPerBlockOptin on sm_90
  EXPECT_TRUE(cuda::quant_wgmma_fits(true, 1, 1, kH200Smem));   // MXFP4, quantized activations
  EXPECT_TRUE(cuda::quant_wgmma_fits(true, 1, 3, kH200Smem));   // MXFP4, three planes
  EXPECT_TRUE(cuda::quant_wgmma_fits(true, 2, 1, kH200Smem));   // FP8, quantized activations
  EXPECT_FALSE(cuda::quant_wgmma_fits(true, 2, 3, kH200Smem));  // FP8, three planes
  EXPECT_FALSE(cuda::quant_wgmma_fits(false, 1, 1, kH200Smem));
  EXPECT_FALSE(cuda::quant_wgmma_fits(true, 1, 1, 101376));  // sm_89's 99 KB
  // V4-Flash at 4096 tokens: 96 pairs per expert on average.
  cuda::ExpertsPassProblem p{4096 * 6, 256, 4096, 2048, false, true};
  p.quantized = true;
  p.quant_wgmma = true;
  p.quant_prefill = cuda::QuantPrefillChoice::kMmaSync;
  cuda::ExpertsPassConfig c = cuda::choose_experts_pass(p, kH200Smem);
  EXPECT_EQ(c.kernel, cuda::ExpertsKernel::kQuantPrefill);  // not asked for
  EXPECT_EQ(c.tile_rows, 64);
  p.quant_prefill = cuda::QuantPrefillChoice::kWgmma;
  c = cuda::choose_experts_pass(p, kH200Smem);
  EXPECT_EQ(c.kernel, cuda::ExpertsKernel::kQuantPrefillWgmma);
  EXPECT_EQ(c.tile_rows, 128);
  EXPECT_EQ(c.max_tiles, 4096 * 6 / 128 + 256);
  p.quant_wgmma = false;  // does not run here
  EXPECT_EQ(cuda::choose_experts_pass(p, kH200Smem).kernel, cuda::ExpertsKernel::kQuantPrefill);
  p.quant_wgmma = true;
  p.pairs = 16 * 256;  // the decode shape stays
  EXPECT_EQ(cuda::choose_experts_pass(p, kH200Smem).kernel, cuda::ExpertsKernel::kQuantStream);
}

TEST(MoeQuantPrefillWgmma, MatchesTheMmaSyncKernel) {
  std::string why;
  if (shared_backend("cuda", &why) == nullptr) {
    if (device_required()) FAIL() << why;
    GTEST_SKIP() << why;
  }
  std::unique_ptr<Backend> mma_sync = cuda_backend_with_prefill("mma_sync");
  std::unique_ptr<Backend> wgmma = cuda_backend_with_prefill("");  // the default
  auto& wgmma_be = dynamic_cast<cuda::CudaBackend&>(*wgmma);
  if (!wgmma_be.wgmma_device()) {
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    // On an sm_90 device that must be tested, a build without sm_90a code fails, not skips.
    if (device_required() && major == 9) FAIL() << "an sm_90 device, but no sm_90a code built";
    GTEST_SKIP() << "wgmma needs an sm_90 device and a build with sm_90a code";
  }
  auto& mma_be = dynamic_cast<cuda::CudaBackend&>(*mma_sync);
  constexpr WeightFormat kMx = WeightFormat::kMxfp4, kFp8 = WeightFormat::kFp8Block;
  const std::vector<PrefillCase> cases = {
      // V4-Flash widths, few experts: 300 pairs per expert on average.
      {kMx, 32, 128, 8, 6, 4096, 2048, 400},
      // Many experts, skewed: tiles of every wgmma n; one plane.
      {kMx, 32, 128, 64, 6, 1024, 512, 2000},
      // K tails (1056 = 8.25 x 128, 608 = 4.75 x 128) and N tails of the column blocks.
      {kMx, 32, 32, 64, 6, 1056, 608, 700},
      // Three activation planes.
      {kMx, 32, 0, 16, 4, 544, 352, 300},
      {kFp8, 128, 128, 64, 6, 1024, 512, 1500},
      {kFp8, 16, 16, 32, 4, 1072, 336, 500},
      // FP8 without activation quantization: the mma.sync kernel on both backends.
      {kFp8, 32, 0, 16, 4, 256, 160, 300},
  };
  std::mt19937 rng(20261202);
  for (const PrefillCase& c : cases) {
    SCOPED_TRACE("format " + std::to_string(static_cast<int>(c.format)) + " act " +
                 std::to_string(c.act_group) + " E " + std::to_string(c.experts) + " H " +
                 std::to_string(c.hidden) + " I " + std::to_string(c.inter) + " T " +
                 std::to_string(c.tokens));
    std::vector<MatrixWeight> w1, w3, w2;
    for (int e = 0; e < c.experts; ++e) {
      w1.push_back(random_weight(rng, c.format, c.inter, c.hidden, c.block, c.act_group));
      w3.push_back(random_weight(rng, c.format, c.inter, c.hidden, c.block, c.act_group));
      w2.push_back(random_weight(rng, c.format, c.hidden, c.inter, c.block, c.act_group));
    }
    const Tensor x = small_integers(rng, c.tokens, c.hidden);
    const HostRouting routing = skewed_routing(c.tokens, c.experts, c.top_k, rng);
    const Tensor a = run_experts(*mma_sync, w1, w3, w2, x, routing);
    ASSERT_EQ(mma_be.last_quant_experts_kernel(), cuda::ExpertsKernel::kQuantPrefill);
    const Tensor b = run_experts(*wgmma, w1, w3, w2, x, routing);
    const bool fits = c.format == kMx || c.act_group > 0;
    ASSERT_EQ(wgmma_be.last_quant_experts_kernel(),
              fits ? cuda::ExpertsKernel::kQuantPrefillWgmma : cuda::ExpertsKernel::kQuantPrefill);
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
    EXPECT_LE(max_diff, 1e-5 * max_ref)
        << "worst element " << worst << " of " << a.numel() << " (token " << worst / c.hidden
        << ", channel " << worst % c.hidden << "): mma_sync " << (worst >= 0 ? a.item(worst) : 0.0f)
        << ", wgmma " << (worst >= 0 ? b.item(worst) : 0.0f) << ", max |y| " << max_ref;
  }
}

}  // namespace
}  // namespace deepinfer::backend_ops
