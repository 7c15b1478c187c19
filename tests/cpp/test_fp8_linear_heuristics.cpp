// The choices of cuda/gemm/gemm_fp8_heuristics.h, checked on the host. The streaming FP8 linear
// (choose_fp8_stream): where it applies, that it never depends on M (a token's result must not
// depend on the batch), that the K splits cover K with no empty split and fit one portable
// cluster, and the tilings of the V4-Flash weights on an H200 (132 SMs); its staging order
// (cuda/gemm/fp8_stream_layout.h): a permutation of each slice (fp8_stream.cu checks at compile
// time that it inverts the decode's slice_input). The FP8 decode GEMV (choose_fp8_gemv): where it
// applies (the kernel finds a column's scales by shifts, so blocks and activation groups must be
// powers of two), its tiling independent of M, its splits covering K; and where the default
// takes the streaming kernel instead of cuBLASLt (fp8_grouped_takes_stream). The Hopper weight
// stream (choose_fp8_wgmma): where it applies (DeepSeek's 128-column scaling, 64-row tiles in one
// scale row, wgmma devices), its K split independent of M and covering K in one cluster, the
// activations of a split within their shared-memory bound, the V4-Flash tilings on 132 SMs; its
// f16 math's bounds and splits (DEEPINFER_FP8_WGMMA_MATH) and activation tiles
// (cuda/gemm/fp8_wgmma_layout.h): a permutation of each tile that gives every k-step of a lane
// the activations its weight bytes meet.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <set>
#include <vector>

#include "cuda/gemm/fp8_stream_layout.h"
#include "cuda/gemm/fp8_wgmma_layout.h"
#include "cuda/gemm/gemm_fp8_heuristics.h"

namespace deepinfer::cuda {
namespace {

constexpr int kH200Sms = 132;

Fp8Problem problem(int64_t m, int64_t n, int64_t k, int64_t groups = 1, int block = 128,
                   int act_group = 128) {
  return Fp8Problem{m, n, k, groups, block, block, act_group};
}

TEST(Fp8StreamHeuristics, AppliesToDecodeSizesWithQuantizedActivations) {
  EXPECT_TRUE(choose_fp8_stream(problem(1, 1024, 4096), kH200Sms).use);
  EXPECT_TRUE(choose_fp8_stream(problem(kFp8StreamMaxTokens, 1024, 4096), kH200Sms).use);
  EXPECT_FALSE(choose_fp8_stream(problem(0, 1024, 4096), kH200Sms).use);
  EXPECT_FALSE(choose_fp8_stream(problem(kFp8StreamMaxTokens + 1, 1024, 4096), kH200Sms).use);
  // act_group 0: f32 activations are not exact in bf16.
  EXPECT_FALSE(choose_fp8_stream(problem(1, 1024, 4096, 1, 128, 0), kH200Sms).use);
  // K % 16 != 0: weight rows are not 16-byte aligned.
  EXPECT_FALSE(choose_fp8_stream(problem(1, 1024, 4100), kH200Sms).use);
  // Scale blocks narrower than a 16-byte chunk, or not a power of two.
  EXPECT_FALSE(choose_fp8_stream(problem(1, 64, 64, 1, 8, 8), kH200Sms).use);
  EXPECT_FALSE(choose_fp8_stream(Fp8Problem{1, 64, 96, 1, 48, 48, 48}, kH200Sms).use);
  EXPECT_TRUE(choose_fp8_stream(problem(1, 64, 32, 1, 16, 16), kH200Sms).use);
  EXPECT_TRUE(choose_fp8_stream(Fp8Problem{1, 96, 48, 1, 64, 32, 32}, kH200Sms).use);
}

TEST(Fp8StreamHeuristics, TilingDoesNotDependOnM) {
  for (const Fp8Problem& base :
       {problem(1, 1024, 4096), problem(1, 32768, 1024), problem(1, 1024, 4096, 8),
        problem(1, 300, 1040, 1, 32), problem(1, 72, 1024, 3), problem(1, 200, 48, 2, 16, 16)}) {
    const Fp8StreamConfig first = choose_fp8_stream(base, kH200Sms);
    ASSERT_TRUE(first.use);
    for (int64_t m = 2; m <= kFp8StreamMaxTokens; ++m) {
      Fp8Problem p = base;
      p.m = m;
      const Fp8StreamConfig c = choose_fp8_stream(p, kH200Sms);
      ASSERT_TRUE(c.use) << m;
      EXPECT_EQ(c.warps, first.warps) << m;
      EXPECT_EQ(c.splits, first.splits) << m;
      EXPECT_EQ(c.slab, first.slab) << m;
      EXPECT_EQ(c.row_tiles, first.row_tiles) << m;
      EXPECT_EQ(c.tokens, m <= 16 ? 16 : 64) << m;
    }
  }
}

TEST(Fp8StreamHeuristics, SplitsCoverKInOneCluster) {
  for (const int sms : {16, 78, 114, 132, 148}) {
    for (const int64_t n : {1, 16, 72, 300, 512, 1024, 4096, 32768}) {
      for (const int64_t k : {16, 48, 128, 144, 1040, 2048, 4096, 8192, 16384}) {
        for (const int64_t groups : {1, 3, 8}) {
          const Fp8StreamConfig c = choose_fp8_stream(problem(1, n, k, groups), sms);
          ASSERT_TRUE(c.use);
          const int64_t slices = (k + kFp8StreamSliceK - 1) / kFp8StreamSliceK;
          EXPECT_GE(c.splits, 1);
          EXPECT_LE(c.splits, kFp8StreamMaxSplits);
          EXPECT_GE(int64_t{c.slab} * c.splits, slices);        // K covered
          EXPECT_LT(int64_t{c.slab} * (c.splits - 1), slices);  // no empty split
          EXPECT_TRUE(c.warps == 2 || c.warps == 4 || c.warps == 8);
          EXPECT_GE(c.row_tiles * kFp8StreamRowsPerWarp * c.warps, n);  // N covered
          EXPECT_LT((c.row_tiles - 1) * kFp8StreamRowsPerWarp * c.warps, n);
        }
      }
    }
  }
}

// The V4-Flash weights on 132 SMs: the widest CTA giving one per SM with up to 8 splits, the
// fewest splits giving two.
TEST(Fp8StreamHeuristics, V4FlashShapesOnH200) {
  struct Expect {
    int64_t n, k, groups;
    int warps, splits, slab;
  };
  for (const Expect& e : {
           Expect{1024, 4096, 1, 2, 8, 4},   // wq_a: 16 x 8 = 128 CTAs of 64 rows
           Expect{32768, 1024, 1, 8, 2, 4},  // wq_b: 128 x 2
           Expect{512, 4096, 1, 2, 8, 4},    // wkv: 8 x 8 (the smallest CTA)
           Expect{1024, 4096, 8, 8, 8, 4},   // wo_a: 32 x 8
           Expect{4096, 8192, 1, 4, 8, 8},   // wo_b: 32 x 8
           Expect{2048, 4096, 1, 2, 8, 4},   // shared w1 / w3: 32 x 8
           Expect{4096, 2048, 1, 4, 8, 2},   // shared w2: 32 x 8
           Expect{8192, 1024, 1, 8, 8, 1},   // indexer wq_b: 32 x 8
       }) {
    const Fp8StreamConfig c = choose_fp8_stream(problem(1, e.n, e.k, e.groups), kH200Sms);
    ASSERT_TRUE(c.use);
    EXPECT_EQ(c.warps, e.warps) << e.n << "x" << e.k;
    EXPECT_EQ(c.splits, e.splits) << e.n << "x" << e.k;
    EXPECT_EQ(c.slab, e.slab) << e.n << "x" << e.k;
  }
}

TEST(Fp8StreamHeuristics, SharedMemoryPerTokenTile) {
  // 16 tokens: 3 slices of 32 KiB of weights and 4.5 KiB of activations at 8 warps.
  EXPECT_EQ(fp8_stream_smem(8, 16), size_t{3} * (32768 + 16 * 72 * 4));
  // 64 tokens: 4 slices; the partial tile (64 tokens x 256 rows of f32) fits in the ring.
  EXPECT_EQ(fp8_stream_smem(8, 64), size_t{4} * (32768 + 64 * 72 * 4));
  // Smaller CTAs: deeper rings at 16 tokens (5 slices), 3 or 4 at 64.
  EXPECT_EQ(fp8_stream_smem(2, 16), size_t{5} * (8192 + 16 * 72 * 4));
  EXPECT_EQ(fp8_stream_smem(4, 64), size_t{3} * (16384 + 64 * 72 * 4));
  EXPECT_EQ(fp8_stream_smem(2, 64), size_t{4} * (8192 + 64 * 72 * 4));
  for (const int warps : {2, 4, 8}) {
    for (const int tokens : {16, 64}) {
      EXPECT_GE(fp8_stream_smem(warps, tokens), size_t{4} * tokens * kFp8StreamRowsPerWarp * warps);
    }
  }
}

TEST(Fp8StreamLayout, StagedIndexPermutesEachSlice) {
  for (int64_t slice = 0; slice < 3; ++slice) {
    std::vector<int> hits(128, 0);
    for (int64_t k = slice * 128; k < (slice + 1) * 128; ++k) {
      const int64_t at = fp8_stream_staged_index(k);
      ASSERT_GE(at, slice * 128);
      ASSERT_LT(at, (slice + 1) * 128);
      ++hits[static_cast<size_t>(at - slice * 128)];
    }
    for (const int h : hits) EXPECT_EQ(h, 1);
  }
  // Lane 0's piece of steps 0 and 1 (the slice's first 8 staged elements): inputs 0, 2 (step 0,
  // slots 2q, 2q + 1 as one bf16 pair), 1, 3 (slots 2q + 8, + 9), then 4, 6, 5, 7 (step 1).
  const int64_t expect[8] = {0, 2, 1, 3, 4, 6, 5, 7};
  for (int64_t k = 0; k < 8; ++k) EXPECT_EQ(fp8_stream_staged_index(expect[k]), k) << k;
}

TEST(Fp8StreamHeuristics, ParsesTheSwitch) {
  EXPECT_EQ(parse_fp8_linear(nullptr), Fp8LinearChoice::kAuto);
  EXPECT_EQ(parse_fp8_linear(""), Fp8LinearChoice::kAuto);
  EXPECT_EQ(parse_fp8_linear("auto"), Fp8LinearChoice::kAuto);
  EXPECT_EQ(parse_fp8_linear("wgmma"), Fp8LinearChoice::kWgmma);
  EXPECT_EQ(parse_fp8_linear("stream"), Fp8LinearChoice::kStream);
  EXPECT_EQ(parse_fp8_linear("stream_pdl"), Fp8LinearChoice::kStreamPdl);
  EXPECT_EQ(parse_fp8_linear("legacy"), Fp8LinearChoice::kLegacy);
  EXPECT_EQ(parse_fp8_linear("gemv"), std::nullopt);
}

// The default tries the weight stream from kFp8WgmmaAutoMinTokens tokens (4: the batches where
// the model step measured faster on it); "wgmma" at every count, "legacy" and the streaming
// kernel's choices never.
TEST(Fp8StreamHeuristics, TheDefaultTriesTheWeightStreamFromFourTokens) {
  EXPECT_EQ(kFp8WgmmaAutoMinTokens, 4);
  for (const int64_t m : {1, 2, 3}) {
    EXPECT_FALSE(fp8_choice_tries_wgmma(Fp8LinearChoice::kAuto, m)) << m;
    EXPECT_TRUE(fp8_choice_tries_wgmma(Fp8LinearChoice::kWgmma, m)) << m;
  }
  for (const int64_t m : {4, 8, 16, 64}) {
    EXPECT_TRUE(fp8_choice_tries_wgmma(Fp8LinearChoice::kAuto, m)) << m;
    EXPECT_TRUE(fp8_choice_tries_wgmma(Fp8LinearChoice::kWgmma, m)) << m;
  }
  for (const Fp8LinearChoice c :
       {Fp8LinearChoice::kLegacy, Fp8LinearChoice::kStream, Fp8LinearChoice::kStreamPdl}) {
    for (const int64_t m : {1, 4, 16}) EXPECT_FALSE(fp8_choice_tries_wgmma(c, m)) << m;
  }
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

// K splits of equal slabs where some count dividing K's activation groups still gives a CTA per
// SM: V4-Flash's wo_a (8 groups of 1024 x 4096, 8 row tiles each) takes 4 splits of 1024 columns
// on 132 SMs, not 5 of 896, 896, 896, 896 and 512.
TEST(Fp8GemvHeuristics, SplitsTakeEqualSlabsWhereTheyCoverTheSms) {
  const Fp8GemvConfig wo_a = choose_fp8_gemv(problem(1, 1024, 4096, 8), kH200Sms);
  ASSERT_TRUE(wo_a.use);
  EXPECT_EQ(wo_a.warps, kFp8GemvMaxWarps);
  EXPECT_EQ(wo_a.splits, 4);
  EXPECT_EQ(wo_a.slab, 1024);
  for (const Fp8Problem& p :
       {problem(1, 1024, 4096), problem(1, 32768, 1024), problem(1, 512, 4096),
        problem(1, 1024, 4096, 8), problem(1, 4096, 8192), problem(1, 2048, 4096),
        problem(1, 4096, 2048), problem(1, 300, 1040, 1, 32, 32)}) {
    for (const int sms : {78, 114, kH200Sms, 170}) {
      const Fp8GemvConfig c = choose_fp8_gemv(p, sms);
      ASSERT_TRUE(c.use) << p.n << " x " << p.k;
      const int64_t act_groups = (p.k + p.act_group - 1) / p.act_group;
      if (act_groups % c.splits == 0) continue;
      // Uneven: no smaller count of at least the slab limit's splits divides K and fills the SMs.
      const int64_t ctas_per_split = c.row_tiles * p.groups;
      for (int64_t even = c.splits - 1; even >= 1; --even) {
        if (act_groups % even != 0 || act_groups / even * p.act_group > kFp8GemvMaxSlab) continue;
        EXPECT_LT(ctas_per_split * even, sms) << p.n << " x " << p.k << " on " << sms << " SMs";
      }
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

TEST(Fp8WgmmaHeuristics, AppliesToDeepSeekScalingOnWgmmaDevices) {
  EXPECT_TRUE(choose_fp8_wgmma(problem(1, 1024, 4096), kH200Sms, true).use);
  EXPECT_TRUE(choose_fp8_wgmma(problem(kFp8WgmmaMaxTokens, 300, 1040), kH200Sms, true).use);
  EXPECT_TRUE(
      choose_fp8_wgmma(problem(kFp8WgmmaGroupedMaxTokens, 1024, 4096, 8), kH200Sms, true).use);
  EXPECT_TRUE(choose_fp8_wgmma(Fp8Problem{1, 512, 4096, 1, 256, 128, 128}, kH200Sms, true).use);
  // No wgmma (sm_100a, or a build without sm_90a code).
  EXPECT_FALSE(choose_fp8_wgmma(problem(1, 1024, 4096), kH200Sms, false).use);
  EXPECT_FALSE(choose_fp8_wgmma(problem(0, 1024, 4096), kH200Sms, true).use);
  // Past the token bounds: linear above 16, grouped above 64.
  EXPECT_FALSE(choose_fp8_wgmma(problem(kFp8WgmmaMaxTokens + 1, 1024, 4096), kH200Sms, true).use);
  EXPECT_FALSE(
      choose_fp8_wgmma(problem(kFp8WgmmaGroupedMaxTokens + 1, 1024, 4096, 8), kH200Sms, true).use);
  // Other scalings: 32x32 blocks (V4.1), act_group 64 or 0, 32-row blocks with 128 columns.
  EXPECT_FALSE(choose_fp8_wgmma(problem(1, 1024, 4096, 1, 32, 128), kH200Sms, true).use);
  EXPECT_FALSE(choose_fp8_wgmma(problem(1, 1024, 4096, 1, 128, 64), kH200Sms, true).use);
  EXPECT_FALSE(choose_fp8_wgmma(problem(1, 1024, 4096, 1, 128, 0), kH200Sms, true).use);
  EXPECT_FALSE(choose_fp8_wgmma(Fp8Problem{1, 512, 4096, 1, 32, 128, 128}, kH200Sms, true).use);
  EXPECT_FALSE(choose_fp8_wgmma(Fp8Problem{1, 512, 4096, 1, 96, 128, 128}, kH200Sms, true).use);
  // K % 16 != 0 (tensor-copy rows of 16-byte multiples); grouped N % 64 != 0.
  EXPECT_FALSE(choose_fp8_wgmma(problem(1, 1024, 4100), kH200Sms, true).use);
  EXPECT_FALSE(choose_fp8_wgmma(problem(1, 72, 1024, 3), kH200Sms, true).use);
  EXPECT_TRUE(choose_fp8_wgmma(problem(1, 128, 1024, 3), kH200Sms, true).use);
}

TEST(Fp8WgmmaHeuristics, SplitDoesNotDependOnMAndCoversKInOneCluster) {
  for (const Fp8Problem& base :
       {problem(1, 1024, 4096), problem(1, 32768, 1024), problem(1, 512, 4096),
        problem(1, 1024, 4096, 8), problem(1, 4096, 8192), problem(1, 300, 1040),
        problem(1, 64, 48), problem(1, 128, 16384), problem(1, 8192, 1024)}) {
    const int max_m = base.groups > 1 ? kFp8WgmmaGroupedMaxTokens : kFp8WgmmaMaxTokens;
    const Fp8WgmmaConfig one = choose_fp8_wgmma(base, kH200Sms, true);
    ASSERT_TRUE(one.use) << base.n << " x " << base.k;
    const int64_t blocks = (base.k + kFp8WgmmaSliceK - 1) / kFp8WgmmaSliceK;
    EXPECT_GE(one.splits, 1);
    EXPECT_LE(one.splits, kFp8WgmmaMaxSplits);
    EXPECT_GE(int64_t{one.splits} * one.kb_per_split, blocks) << base.n << " x " << base.k;
    EXPECT_LT(int64_t{one.splits - 1} * one.kb_per_split, blocks)
        << base.n << " x " << base.k << ": an empty split";
    EXPECT_LE(int64_t{one.kb_per_split} * kFp8WgmmaSliceK * fp8_wgmma_tokens(max_m),
              kFp8WgmmaMaxActBytes);
    for (int64_t m = 1; m <= max_m; ++m) {
      Fp8Problem p = base;
      p.m = m;
      const Fp8WgmmaConfig c = choose_fp8_wgmma(p, kH200Sms, true);
      EXPECT_EQ(c.splits, one.splits) << m;
      EXPECT_EQ(c.kb_per_split, one.kb_per_split) << m;
      EXPECT_EQ(c.tokens, fp8_wgmma_tokens(m)) << m;
      EXPECT_GE(c.tokens, m);
    }
  }
  // K 131072 at 16 tokens: 1024 blocks, at most 32 a split under the activation bound, so more
  // than 8 splits would be needed: not the weight stream.
  EXPECT_FALSE(choose_fp8_wgmma(problem(1, 64, 131072), kH200Sms, true).use);
}

TEST(Fp8WgmmaHeuristics, V4FlashShapesOnH200) {
  struct Expect {
    Fp8Problem p;
    int splits, kb_per_split;
  };
  // Row tiles double their splits while under 2 x 132 CTAs and 2+ blocks a split.
  for (const Expect& e : {Expect{problem(1, 1024, 4096), 8, 4},     // wq_a: 16 tiles
                          Expect{problem(1, 32768, 1024), 1, 8},    // wq_b: 512 tiles
                          Expect{problem(1, 512, 4096), 8, 4},      // wkv: 8 tiles
                          Expect{problem(1, 1024, 4096, 8), 4, 8},  // wo_a: 128 tiles
                          Expect{problem(1, 4096, 8192), 8, 8},     // wo_b: 64 tiles
                          Expect{problem(1, 4096, 2048), 8, 2},     // shared w2: 64 tiles
                          Expect{problem(1, 8192, 1024), 4, 2}}) {  // indexer wq_b: 128 tiles
    const Fp8WgmmaConfig c = choose_fp8_wgmma(e.p, kH200Sms, true);
    ASSERT_TRUE(c.use);
    EXPECT_EQ(c.splits, e.splits) << e.p.n << " x " << e.p.k << " g " << e.p.groups;
    EXPECT_EQ(c.kb_per_split, e.kb_per_split) << e.p.n << " x " << e.p.k << " g " << e.p.groups;
  }
}

TEST(Fp8WgmmaHeuristics, QuantizesInTheKernelWhereACtaHasFewActivationItems) {
  const auto at = [](Fp8Problem p, int64_t m) {
    p.m = m;
    return choose_fp8_wgmma(p, kH200Sms, true);
  };
  // One token: every V4-Flash linear (at most 8 blocks a split) quantizes in the kernel.
  for (const Fp8Problem& p :
       {problem(1, 1024, 4096), problem(1, 32768, 1024), problem(1, 512, 4096),
        problem(1, 1024, 4096, 8), problem(1, 4096, 8192), problem(1, 4096, 2048),
        problem(1, 8192, 1024)}) {
    EXPECT_TRUE(at(p, 1).fused_quant) << p.n << " x " << p.k << " g " << p.groups;
  }
  // Four tokens: wq_a (4 blocks a split) still does, wq_b and wo_b (8 blocks) no longer.
  EXPECT_TRUE(at(problem(1, 1024, 4096), 4).fused_quant);
  EXPECT_FALSE(at(problem(1, 32768, 1024), 4).fused_quant);
  EXPECT_FALSE(at(problem(1, 4096, 8192), 4).fused_quant);
  // The bound is on M x blocks per split, whatever the shape.
  for (const Fp8Problem& p : {problem(1, 1024, 4096), problem(1, 300, 1040),
                              problem(1, 1024, 4096, 8), problem(1, 8192, 1024)}) {
    const int max_m = p.groups > 1 ? kFp8WgmmaGroupedMaxTokens : kFp8WgmmaMaxTokens;
    for (int64_t m = 1; m <= max_m; ++m) {
      const Fp8WgmmaConfig c = at(p, m);
      EXPECT_EQ(c.fused_quant, m * c.kb_per_split <= kFp8WgmmaFusedQuantMaxItems)
          << p.n << " x " << p.k << " m " << m;
    }
  }
}

TEST(Fp8WgmmaHeuristics, MathNames) {
  EXPECT_EQ(parse_fp8_wgmma_math(nullptr), Fp8WgmmaMath::kAuto);
  EXPECT_EQ(parse_fp8_wgmma_math(""), Fp8WgmmaMath::kAuto);
  EXPECT_EQ(parse_fp8_wgmma_math("auto"), Fp8WgmmaMath::kAuto);
  EXPECT_EQ(parse_fp8_wgmma_math("mma_sync"), Fp8WgmmaMath::kMmaSync);
  EXPECT_EQ(parse_fp8_wgmma_math("f16"), Fp8WgmmaMath::kF16);
  EXPECT_EQ(parse_fp8_wgmma_math("bf16"), std::nullopt);
}

// The f16 math takes linears up to kFp8WgmmaF16MaxTokens too (its activations stream with the
// weights), with a K split that still ignores M and needs no activation bound: K 131072 fits.
TEST(Fp8WgmmaHeuristics, F16MathTakesLinearsToSixtyFourTokens) {
  const auto f16 = [](const Fp8Problem& p) {
    return choose_fp8_wgmma(p, kH200Sms, true, Fp8WgmmaMath::kF16);
  };
  for (const Fp8Problem& base :
       {problem(1, 1024, 4096), problem(1, 32768, 1024), problem(1, 4096, 8192),
        problem(1, 1024, 4096, 8), problem(1, 300, 1040), problem(1, 64, 131072)}) {
    const Fp8WgmmaConfig one = f16(base);
    ASSERT_TRUE(one.use) << base.n << " x " << base.k;
    EXPECT_EQ(one.math, Fp8WgmmaMath::kF16);
    for (int64_t m = 1; m <= kFp8WgmmaF16MaxTokens; ++m) {
      Fp8Problem p = base;
      p.m = m;
      const Fp8WgmmaConfig c = f16(p);
      ASSERT_TRUE(c.use) << m;
      EXPECT_EQ(c.splits, one.splits) << m;
      EXPECT_EQ(c.kb_per_split, one.kb_per_split) << m;
      EXPECT_EQ(c.tokens, fp8_wgmma_tokens(m)) << m;
    }
    Fp8Problem past = base;
    past.m = kFp8WgmmaF16MaxTokens + 1;
    EXPECT_FALSE(f16(past).use);
  }
  // The V4-Flash tilings match the mma.sync math's (whose activation bound they never reach).
  for (const Fp8Problem& p : {problem(1, 1024, 4096), problem(1, 32768, 1024),
                              problem(1, 1024, 4096, 8), problem(1, 4096, 8192)}) {
    EXPECT_EQ(f16(p).splits, choose_fp8_wgmma(p, kH200Sms, true).splits) << p.n << " x " << p.k;
  }
  EXPECT_EQ(choose_fp8_wgmma(problem(1, 1024, 4096), kH200Sms, true).math, Fp8WgmmaMath::kMmaSync);
}

// auto: the f16 math past 16 tokens on grouped linears and on the q / kv pair's 1536 rows (and
// narrower), the mma.sync math up to 16 tokens and on wider linears (which past 16 tokens then
// leave the stream for cuBLASLt).
TEST(Fp8WgmmaHeuristics, AutoMathTakesF16OnGroupedAndNarrowLinearsPastSixteenTokens) {
  const auto at = [](Fp8Problem p, int64_t m) {
    p.m = m;
    return choose_fp8_wgmma(p, kH200Sms, true, Fp8WgmmaMath::kAuto);
  };
  for (const Fp8Problem& p : {problem(1, 1536, 4096), problem(1, 1024, 4096), problem(1, 512, 4096),
                              problem(1, 1024, 4096, 8)}) {
    for (const int64_t m : {1, 4, 16}) {
      EXPECT_EQ(at(p, m).math, Fp8WgmmaMath::kMmaSync) << p.n << " x " << p.k << " m " << m;
    }
    for (const int64_t m : {17, 32, 64}) {
      ASSERT_TRUE(at(p, m).use) << p.n << " x " << p.k << " m " << m;
      EXPECT_EQ(at(p, m).math, Fp8WgmmaMath::kF16) << p.n << " x " << p.k << " m " << m;
    }
    EXPECT_FALSE(at(p, 65).use);
  }
  for (const Fp8Problem& p : {problem(1, 1537, 4096), problem(1, 2048, 4096),
                              problem(1, 32768, 1024), problem(1, 4096, 8192)}) {
    EXPECT_EQ(at(p, 16).math, Fp8WgmmaMath::kMmaSync) << p.n << " x " << p.k;
    EXPECT_FALSE(at(p, 17).use) << p.n << " x " << p.k;
  }
}

// Every (token, column) of a tile has its own f16 slot, the slots fill the tile, and the slot of
// k-step s, k j (the wgmma's B layout: core matrix (token / 8, 2 s + j / 8), row token % 8,
// element j % 8) holds the column whose weight byte lane q puts at that k: the byte of column
// 32 q + 4 s + 2 h + e at k 8 h + 2 q + e (h: the word's upper half, e: the byte in the half).
TEST(Fp8WgmmaLayout, TilesArePermutationsMatchingTheFragments) {
  for (const int tokens : {8, 16, 32, 64}) {
    std::set<int64_t> slots;
    for (int t = 0; t < tokens; ++t) {
      for (int c = 0; c < 128; ++c) {
        const int64_t o = fp8_wgmma_tile_offset(t, c);
        EXPECT_EQ(o % 2, 0);
        EXPECT_GE(o, 0);
        EXPECT_LT(o, fp8_wgmma_tile_bytes(tokens));
        slots.insert(o);
      }
    }
    EXPECT_EQ(static_cast<int64_t>(slots.size()), int64_t{tokens} * 128) << tokens;
    for (int t = 0; t < tokens; ++t) {
      for (int s = 0; s < 8; ++s) {
        for (int q = 0; q < 4; ++q) {
          for (int h = 0; h < 2; ++h) {
            for (int e = 0; e < 2; ++e) {
              const int j = 8 * h + 2 * q + e;
              const int64_t b_slot =
                  (16 * (t / 8) + 2 * s + j / 8) * kFp8WgmmaTileLead + (t % 8) * 16 + (j % 8) * 2;
              EXPECT_EQ(fp8_wgmma_tile_offset(t, 32 * q + 4 * s + 2 * h + e), b_slot)
                  << "token " << t << " step " << s << " k " << j;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(kFp8WgmmaTileStride, 16 * kFp8WgmmaTileLead);
}

// cuBLASLt's timed candidates: K splits that leave each split at least two 128-column blocks
// (V4-Flash's K of 1024, 2048, 4096 and 8192 columns: 8 to 64 blocks).
TEST(Fp8CublasLtTuning, SplitCountsKeepTwoBlocksPerSplit) {
  EXPECT_TRUE(lt_tune_split_counts(1).empty());
  EXPECT_TRUE(lt_tune_split_counts(3).empty());
  EXPECT_EQ(lt_tune_split_counts(4), (std::vector<int32_t>{2}));
  EXPECT_EQ(lt_tune_split_counts(8), (std::vector<int32_t>{2, 4}));
  EXPECT_EQ(lt_tune_split_counts(32), (std::vector<int32_t>{2, 4, 8, 16}));
  EXPECT_EQ(lt_tune_split_counts(64), (std::vector<int32_t>{2, 4, 8, 16}));
  for (int64_t blocks = 1; blocks <= 64; ++blocks) {
    for (int32_t s : lt_tune_split_counts(blocks)) EXPECT_GE(blocks, 2 * s) << blocks;
  }
}

}  // namespace
}  // namespace deepinfer::cuda
