// The tiling of the FP8 decode GEMV (cuda/gemm/gemm_fp8_heuristics.h: choose_fp8_gemv), checked
// on the host: where it applies (the kernel finds a column's scales by shifts, so the blocks and
// the activation groups must be powers of two), that it never depends on M (a token's result
// must not depend on the batch), and that its K splits cover K with no empty split in one
// portable cluster. Also where the default takes the streaming kernel instead of cuBLASLt.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/gemm/gemm_fp8_heuristics.h"

namespace deepinfer::cuda {
namespace {

constexpr int kH200Sms = 132;

Fp8Problem problem(int64_t m, int64_t n, int64_t k, int64_t groups = 1, int block = 128,
                   int act_group = 128) {
  return Fp8Problem{m, n, k, groups, block, block, act_group};
}

TEST(Fp8GemvHeuristics, AppliesToDecodeSizesWithPowerOfTwoBlocksAndGroups) {
  EXPECT_TRUE(choose_fp8_gemv(problem(1, 1024, 4096), kH200Sms).use);
  EXPECT_TRUE(choose_fp8_gemv(problem(kFp8GemvMaxTokens, 1024, 4096), kH200Sms).use);
  EXPECT_TRUE(choose_fp8_gemv(problem(1, 200, 544, 1, 32, 32), kH200Sms).use);  // V4.1's blocks
  EXPECT_TRUE(choose_fp8_gemv(Fp8Problem{1, 300, 1040, 1, 64, 32, 32}, kH200Sms).use);
  EXPECT_FALSE(choose_fp8_gemv(problem(0, 1024, 4096), kH200Sms).use);
  EXPECT_FALSE(choose_fp8_gemv(problem(kFp8GemvMaxTokens + 1, 1024, 4096), kH200Sms).use);
  // act_group 0: the tensor cores need the e4m3 activations.
  EXPECT_FALSE(choose_fp8_gemv(problem(1, 1024, 4096, 1, 128, 0), kH200Sms).use);
  // K % 16 != 0: weight rows are not 16-byte aligned.
  EXPECT_FALSE(choose_fp8_gemv(problem(1, 1024, 4100), kH200Sms).use);
  // Multiples of 32 that are not powers of two (block columns, block rows, activation groups).
  EXPECT_FALSE(choose_fp8_gemv(Fp8Problem{1, 192, 384, 1, 128, 96, 96}, kH200Sms).use);
  EXPECT_FALSE(choose_fp8_gemv(Fp8Problem{1, 192, 384, 1, 96, 128, 128}, kH200Sms).use);
  EXPECT_FALSE(choose_fp8_gemv(Fp8Problem{1, 192, 384, 1, 128, 128, 192}, kH200Sms).use);
  // Block columns narrower than a tensor-core step.
  EXPECT_FALSE(choose_fp8_gemv(problem(1, 64, 64, 1, 16, 16), kH200Sms).use);
}

TEST(Fp8GemvHeuristics, TilingDoesNotDependOnMAndSplitsCoverK) {
  for (const Fp8Problem& base :
       {problem(1, 1024, 4096), problem(1, 32768, 1024), problem(1, 512, 4096),
        problem(1, 1024, 4096, 8), problem(1, 4096, 8192), problem(1, 300, 1040, 1, 32, 32),
        problem(1, 100, 8192)}) {
    const Fp8GemvConfig first = choose_fp8_gemv(base, kH200Sms);
    ASSERT_TRUE(first.use) << base.n << " x " << base.k;
    EXPECT_GE(first.splits, 1);
    EXPECT_LE(first.splits, kFp8GemvMaxSplits);
    EXPECT_EQ(first.slab % base.act_group, 0);
    EXPECT_LE(first.slab, kFp8GemvMaxSlab);
    // Every split has columns: (splits - 1) slabs leave some of K to the last one.
    EXPECT_LT((first.splits - 1) * first.slab, base.k);
    EXPECT_GE(first.splits * first.slab, base.k);
    for (int64_t m = 2; m <= kFp8GemvMaxTokens; ++m) {
      Fp8Problem p = base;
      p.m = m;
      const Fp8GemvConfig c = choose_fp8_gemv(p, kH200Sms);
      ASSERT_TRUE(c.use) << m;
      EXPECT_EQ(c.kstep, first.kstep) << m;
      EXPECT_EQ(c.warps, first.warps) << m;
      EXPECT_EQ(c.splits, first.splits) << m;
      EXPECT_EQ(c.slab, first.slab) << m;
      EXPECT_EQ(c.row_tiles, first.row_tiles) << m;
    }
  }
}

// The default choice's streaming range: grouped linears above the GEMV's tokens, up to the
// streaming kernel's; plain linears never (cuBLASLt is faster there).
TEST(Fp8GemvHeuristics, GroupedLinearsAboveTheGemvTakeTheStreamingKernel) {
  for (const int64_t m : {int64_t{1}, int64_t{kFp8GemvMaxTokens}}) {
    EXPECT_FALSE(fp8_grouped_takes_stream(problem(m, 1024, 4096, 8))) << m;
  }
  for (const int64_t m :
       {int64_t{kFp8GemvMaxTokens + 1}, int64_t{32}, int64_t{kFp8StreamMaxTokens}}) {
    EXPECT_TRUE(fp8_grouped_takes_stream(problem(m, 1024, 4096, 8))) << m;
    EXPECT_FALSE(fp8_grouped_takes_stream(problem(m, 1024, 4096))) << m;
  }
  EXPECT_FALSE(fp8_grouped_takes_stream(problem(kFp8StreamMaxTokens + 1, 1024, 4096, 8)));
}

}  // namespace
}  // namespace deepinfer::cuda
