// The FP8 wgmma prefill kernel of the quantized routed experts
// (cuda/moe/sm90/experts_quant_wgmma_fp8.cu, chosen by DEEPINFER_MOE_QUANT_PREFILL=wgmma_fp8 at
// backend creation) against the mma.sync prefill kernel (the default) on the inputs of
// test_moe_quant_prefill_wgmma.cpp (moe_quant_prefill_inputs.h): skewed routings (tiles of every
// wgmma n, an expert with one pair, one with none), K and N tails, MXFP4 with act groups of 128
// (exact staging) and 32 (slices folded to one scale), FP8 with 128 x 128 blocks; and the passes
// it leaves to the bf16 wgmma kernel (three activation planes, FP8 blocks narrower than a slice).
//
// Tolerance. The bf16 kernels are exact up to f32 summation order; this one sums each k-step of
// 32 products in the FP8 tensor cores, whose accumulation keeps about 14 bits, and rounds the
// SwiGLU outputs' per-32 activation scales to one per slice (MXFP4, act group 32: at most 2^-10
// of the slice scale per value). The gate/up sums then differ by ~1e-4 relative at most, which
// can flip the e4m3 rounding of a SwiGLU output before the down GEMM (one term of a down sum moves
// by an e4m3 step, ~1e-3 of max |y| at these sizes). 5e-3 of max |y| (the op table's bound for
// quantized activations) holds that and fails on any wrong fragment, k order, table, scale or
// row, which are off by O(1). Agreement with the CPU reference is the op table's
// (tests/backend_ops/cases_moe_quant.cpp, run with DEEPINFER_MOE_QUANT_PREFILL=wgmma_fp8). Skips
// without a GPU, and off sm_90 or in a build without sm_90a code. The heuristic's choice
// (cuda/moe/moe_heuristics.h) is checked on the host first.
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

constexpr size_t kH200Smem = 232448;  // cudaDevAttrMaxSharedMemoryPerBlockOptin on sm_90

// The choice on the host (needs no device): the FP8 shape only in the prefill shape, only when
// asked for and where it runs (quantized activations on both GEMMs, FP8 blocks of at least 128
// columns); where it does not run, "wgmma_fp8" takes the bf16 wgmma kernel where that runs.
TEST(MoeQuantPrefillWgmmaFp8, HeuristicsTakeItOnlyWhereAskedAndWhereItRuns) {
  EXPECT_EQ(cuda::parse_quant_prefill("wgmma_fp8"), cuda::QuantPrefillChoice::kWgmmaFp8);
  EXPECT_FALSE(cuda::parse_quant_prefill("fp8").has_value());
  EXPECT_TRUE(cuda::quant_wgmma_fp8_fits(true, 32, 32, 1, 0, kH200Smem));      // MXFP4, W4A8
  EXPECT_TRUE(cuda::quant_wgmma_fp8_fits(true, 128, 128, 2, 128, kH200Smem));  // FP8 128 x 128
  EXPECT_FALSE(cuda::quant_wgmma_fp8_fits(true, 128, 128, 2, 32, kH200Smem));  // FP8 32 x 32
  EXPECT_FALSE(cuda::quant_wgmma_fp8_fits(true, 0, 32, 1, 0, kH200Smem));      // x not quantized
  EXPECT_FALSE(cuda::quant_wgmma_fp8_fits(true, 32, 0, 1, 0, kH200Smem));      // act not quantized
  EXPECT_FALSE(cuda::quant_wgmma_fp8_fits(false, 32, 32, 1, 0, kH200Smem));
  EXPECT_FALSE(cuda::quant_wgmma_fp8_fits(true, 32, 32, 1, 0, 101376));  // sm_89's 99 KB
  // V4-Flash at 4096 tokens.
  cuda::ExpertsPassProblem p{4096 * 6, 256, 4096, 2048, false, true};
  p.quantized = true;
  p.quant_wgmma = true;
  p.quant_wgmma_fp8 = true;
  p.quant_prefill = cuda::QuantPrefillChoice::kMmaSync;  // not asked for
  EXPECT_EQ(cuda::choose_experts_pass(p, kH200Smem).kernel, cuda::ExpertsKernel::kQuantPrefill);
  p.quant_prefill = cuda::QuantPrefillChoice::kWgmma;  // the default: not the FP8 kernel
  EXPECT_EQ(cuda::choose_experts_pass(p, kH200Smem).kernel,
            cuda::ExpertsKernel::kQuantPrefillWgmma);
  p.quant_prefill = cuda::QuantPrefillChoice::kWgmmaFp8;
  cuda::ExpertsPassConfig c = cuda::choose_experts_pass(p, kH200Smem);
  EXPECT_EQ(c.kernel, cuda::ExpertsKernel::kQuantPrefillWgmmaFp8);
  EXPECT_EQ(c.tile_rows, 128);
  EXPECT_EQ(c.max_tiles, 4096 * 6 / 128 + 256);
  p.quant_wgmma_fp8 = false;  // does not run here: the bf16 wgmma kernel
  EXPECT_EQ(cuda::choose_experts_pass(p, kH200Smem).kernel,
            cuda::ExpertsKernel::kQuantPrefillWgmma);
  p.quant_wgmma = false;
  EXPECT_EQ(cuda::choose_experts_pass(p, kH200Smem).kernel, cuda::ExpertsKernel::kQuantPrefill);
  p.quant_wgmma = p.quant_wgmma_fp8 = true;
  p.pairs = 16 * 256;  // the decode shape stays
  EXPECT_EQ(cuda::choose_experts_pass(p, kH200Smem).kernel, cuda::ExpertsKernel::kQuantStream);
}

TEST(MoeQuantPrefillWgmmaFp8, MatchesTheMmaSyncKernel) {
  bool must_fail = false;
  if (const std::string why = wgmma_unavailable(&must_fail); !why.empty()) {
    if (must_fail) FAIL() << why;
    GTEST_SKIP() << why;
  }
  std::unique_ptr<Backend> mma_sync = cuda_backend_with_prefill("mma_sync");
  std::unique_ptr<Backend> fp8 = cuda_backend_with_prefill("wgmma_fp8");
  auto& fp8_be = dynamic_cast<cuda::CudaBackend&>(*fp8);
  auto& mma_be = dynamic_cast<cuda::CudaBackend&>(*mma_sync);
  constexpr WeightFormat kMx = WeightFormat::kMxfp4, kFp8 = WeightFormat::kFp8Block;
  struct Row {
    PrefillCase c;
    bool fp8;  // takes the FP8 kernel (else the bf16 wgmma one)
  };
  const std::vector<Row> rows = {
      // V4-Flash widths, few experts: 300 pairs per expert on average; exact staging.
      {{kMx, 32, 128, 8, 6, 4096, 2048, 400}, true},
      // Many experts, skewed: tiles of every wgmma n.
      {{kMx, 32, 128, 64, 6, 1024, 512, 2000}, true},
      // DeepSeek's W4A8 act groups of 32; K tails (1056 = 8.25 x 128, 608 = 4.75 x 128) and N
      // tails of the column blocks.
      {{kMx, 32, 32, 64, 6, 1056, 608, 700}, true},
      {{kFp8, 128, 128, 64, 6, 1024, 512, 1500}, true},
      {{kFp8, 128, 128, 32, 4, 1072, 336, 500}, true},
      // Left to the bf16 wgmma kernel: three activation planes, 16-column FP8 blocks.
      {{kMx, 32, 0, 16, 4, 544, 352, 300}, false},
      {{kFp8, 16, 16, 32, 4, 1072, 336, 500}, false},
  };
  std::mt19937 rng(20261203);
  for (const Row& row : rows) {
    const PrefillCase& c = row.c;
    SCOPED_TRACE(describe(c));
    const TwoRuns r = run_both(*mma_sync, *fp8, c, rng);
    ASSERT_EQ(mma_be.last_quant_experts_kernel(), cuda::ExpertsKernel::kQuantPrefill);
    ASSERT_EQ(fp8_be.last_quant_experts_kernel(), row.fp8
                                                      ? cuda::ExpertsKernel::kQuantPrefillWgmmaFp8
                                                      : cuda::ExpertsKernel::kQuantPrefillWgmma);
    // 1e-5 where the bf16 wgmma kernel runs: its own bound (test_moe_quant_prefill_wgmma.cpp).
    expect_close(r.first, r.second, row.fp8 ? 5e-3 : 1e-5, c.hidden, "mma_sync", "wgmma_fp8");
  }
}

}  // namespace
}  // namespace deepinfer::backend_ops
