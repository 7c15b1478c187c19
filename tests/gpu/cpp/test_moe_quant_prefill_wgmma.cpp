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
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/backend/cuda_backend.h"
#include "cuda/moe/moe_heuristics.h"
#include "deepinfer/backend.h"
#include "moe_quant_prefill_inputs.h"

namespace deepinfer::backend_ops {
namespace {

using namespace moe_prefill;  // NOLINT(google-build-using-namespace): this test's inputs

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
  bool must_fail = false;
  if (const std::string why = wgmma_unavailable(&must_fail); !why.empty()) {
    if (must_fail) FAIL() << why;
    GTEST_SKIP() << why;
  }
  std::unique_ptr<Backend> mma_sync = cuda_backend_with_prefill("mma_sync");
  std::unique_ptr<Backend> wgmma = cuda_backend_with_prefill("");  // the default
  auto& wgmma_be = dynamic_cast<cuda::CudaBackend&>(*wgmma);
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
    SCOPED_TRACE(describe(c));
    const TwoRuns r = run_both(*mma_sync, *wgmma, c, rng);
    ASSERT_EQ(mma_be.last_quant_experts_kernel(), cuda::ExpertsKernel::kQuantPrefill);
    const bool fits = c.format == kMx || c.act_group > 0;
    ASSERT_EQ(wgmma_be.last_quant_experts_kernel(),
              fits ? cuda::ExpertsKernel::kQuantPrefillWgmma : cuda::ExpertsKernel::kQuantPrefill);
    expect_close(r.first, r.second, 1e-5, c.hidden, "mma_sync", "wgmma");
  }
}

}  // namespace
}  // namespace deepinfer::backend_ops
