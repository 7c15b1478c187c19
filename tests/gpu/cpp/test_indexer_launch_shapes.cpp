// The indexer ops' launch shapes (cuda/indexer/indexer_heuristics.h) at cuda_op_bench's shapes,
// checked on the host: every grid within CUDA's limits (x and y at least 1, y at most 65535) and
// every kernel's shared memory within an H200's opt-in limit. A bad shape is a launch error
// that only the GPU reports. Runs without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>

#include "cuda/indexer/indexer_heuristics.h"

namespace deepinfer::cuda {
namespace {

constexpr int kH200Sms = 132;
constexpr size_t kH200MaxSmem = 232448;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
constexpr int64_t kHeads = 32;           // V4.1's index heads of 128 channels
constexpr int64_t kDim = 128;
constexpr int64_t kBlockEntries = 8;
constexpr int64_t kTopBlocks = 2048;
constexpr int64_t kTopK = 512;

void expect_launchable(const IndexerProblem& p, const std::string& what) {
  const IndexerConfig c = choose_indexer(p, kH200Sms, kH200MaxSmem);
  ASSERT_TRUE(c.fits) << what;
  EXPECT_GE(c.group, 1) << what;
  EXPECT_LE(c.group, std::max<int64_t>(p.tokens, 1)) << what;
  EXPECT_GE(c.splits, 1) << what;
  EXPECT_LE(c.splits, 65535) << what;
  EXPECT_LE(c.group * c.splits, int64_t{1} << 31) << what;
  EXPECT_LE(c.score_smem, kH200MaxSmem) << what;
  EXPECT_LE(c.select_smem, kH200MaxSmem) << what;
  EXPECT_GE(c.cap, 1) << what;
  EXPECT_EQ(c.mma, score_mma_takes(p)) << what;
  EXPECT_GE(c.select_splits, 0) << what;
  EXPECT_LE(c.select_splits, 65535) << what;
  EXPECT_LE(c.group * c.select_splits, int64_t{1} << 31) << what;
  if (c.select_splits > 0) EXPECT_LE(c.split_final_smem, kH200MaxSmem) << what;
  if (c.binned) {
    EXPECT_LE(c.binned_smem, kH200MaxSmem) << what;
    EXPECT_EQ(c.select_splits, 0) << what;
  }
}

TEST(IndexerLaunchShapes, BenchShapesAreLaunchable) {
  for (const int64_t ctx : {32768, 131072}) {
    for (const int64_t batch : {1, 64, 1024}) {
      for (const KvFormat keys :
           {KvFormat::kF32, KvFormat::kBf16, KvFormat::kFp8, KvFormat::kV41Fp4Index}) {
        const std::string what = "ctx " + std::to_string(ctx) + " batch " + std::to_string(batch) +
                                 " keys " + std::to_string(static_cast<int>(keys));
        const int64_t block_row = (ctx + kBlockEntries - 1) / kBlockEntries;
        // indexer_candidates (indexer_candidates.cu): entries scored, blocks selected.
        const IndexerProblem blocks{
            batch, kHeads, kDim, kTopBlocks, ctx, block_row, (ctx + block_row) * 4, keys, false};
        expect_launchable(blocks, "indexer_candidates " + what);
        const IndexerConfig c = choose_indexer(blocks, kH200Sms, kH200MaxSmem);
        const int64_t bm = block_max_splits(c.group, block_row, kH200Sms);
        EXPECT_GE(bm, 1);
        EXPECT_LE(bm, 65535);
        // indexer_topk_in_candidates: the candidate entries of kTopBlocks blocks.
        const int64_t row = std::min(ctx, kTopBlocks * kBlockEntries);
        const int64_t words = (block_row + 31) / 32;
        EXPECT_TRUE(candidate_bitmap_in_smem(words, kH200MaxSmem)) << what;
        const IndexerProblem listed{
            batch, kHeads, kDim, kTopK, row, row, (row + kTopBlocks + 1) * 4, keys, true};
        expect_launchable(listed, "indexer_topk_in_candidates " + what);
        EXPECT_FALSE(choose_indexer(listed, kH200Sms, kH200MaxSmem).mma) << what;
        // indexer_topk.
        expect_launchable(topk_problem(batch, kHeads, kDim, kTopK, ctx, keys),
                          "indexer_topk " + what);
      }
    }
  }
}

TEST(IndexerLaunchShapes, TensorCoresScoreVisibleEntriesOfBf16Fp8AndFp4Keys) {
  for (const int64_t heads : {16, 32, 64}) {
    EXPECT_TRUE(score_mma_takes(topk_problem(1, heads, kDim, kTopK, 4096, KvFormat::kBf16)));
    EXPECT_TRUE(score_mma_takes(topk_problem(1, heads, kDim, kTopK, 4096, KvFormat::kFp8)));
    EXPECT_TRUE(score_mma_takes(topk_problem(1, heads, kDim, kTopK, 4096, KvFormat::kV41Fp4Index)));
    EXPECT_FALSE(score_mma_takes(topk_problem(1, heads, kDim, kTopK, 4096, KvFormat::kF32)));
    // V4.1's FP8 and FP4 main records are not index keys.
    EXPECT_FALSE(score_mma_takes(topk_problem(1, heads, kDim, kTopK, 4096, KvFormat::kV41Fp8)));
    EXPECT_FALSE(score_mma_takes(topk_problem(1, heads, kDim, kTopK, 4096, KvFormat::kV41Fp4Main)));
  }
  EXPECT_FALSE(score_mma_takes(topk_problem(1, 32, 64, kTopK, 4096, KvFormat::kV41Fp4Index)));
  // An FP4 record (68 bytes) fits its 80-byte stage row; 4 stages of 64 keys at 64 heads stay far
  // below the shared memory of two blocks per SM.
  EXPECT_GE(score_mma_key_bytes(KvFormat::kV41Fp4Index), kMmaDim / 2 + kMmaDim / 32);
  EXPECT_LE(2 * score_mma_smem_bytes(64, KvFormat::kV41Fp4Index), kH200MaxSmem);
  EXPECT_FALSE(score_mma_takes(topk_problem(1, 48, kDim, kTopK, 4096, KvFormat::kBf16)));
  EXPECT_FALSE(score_mma_takes(topk_problem(1, 32, 64, kTopK, 4096, KvFormat::kBf16)));
  // Forcing the CUDA cores always wins.
  EXPECT_FALSE(choose_indexer(topk_problem(1, 32, kDim, kTopK, 4096, KvFormat::kBf16), kH200Sms,
                              kH200MaxSmem, IndexerScoreKernel::kCudaCore)
                   .mma);
}

TEST(IndexerLaunchShapes, Fp8KeysCopyInRunsWhereBlocksAlign) {
  // V4 (128-token blocks): ratio 4 gives 32 entries per block, ratio 128 one.
  EXPECT_TRUE(score_mma_key_runs(KvFormat::kFp8, 32, 32 * 1000));
  EXPECT_TRUE(score_mma_key_runs(KvFormat::kFp8, 4, 4 * 7));
  EXPECT_TRUE(score_mma_key_runs(KvFormat::kFp8, 128, 128 * 3));
  EXPECT_FALSE(score_mma_key_runs(KvFormat::kFp8, 1, 1000));   // runs of 132 bytes: misaligned
  EXPECT_FALSE(score_mma_key_runs(KvFormat::kFp8, 2, 1000));   // 264 bytes: misaligned
  EXPECT_FALSE(score_mma_key_runs(KvFormat::kFp8, 12, 1200));  // tiles cut runs
  EXPECT_FALSE(score_mma_key_runs(KvFormat::kFp8, 32, 32 * 1000 + 2));      // a copy past the end
  EXPECT_FALSE(score_mma_key_runs(KvFormat::kBf16, 32, 32 * 1000));         // 16-byte rows already
  EXPECT_FALSE(score_mma_key_runs(KvFormat::kV41Fp4Index, 32, 32 * 1000));  // 68-byte records
  // A run of min(epb, kMmaKeys) records starts 16-byte aligned and ends on a 16-byte boundary.
  for (const int64_t epb : {4, 8, 16, 32, 64, 128}) {
    const int64_t run_bytes = std::min<int64_t>(epb, kMmaKeys) * (kMmaDim + 4);
    EXPECT_EQ(run_bytes % 16, 0) << epb;
    EXPECT_EQ(epb * (kMmaDim + 4) % 16, 0) << epb;
  }
}

// fp8 keys at V4's 64 heads take the wgmma kernel on an sm_90 device when the switch says so
// (DEEPINFER_INDEXER_FP8_SCORES=wgmma) or it is forced, unless the mma.sync kernel (or one of its
// measurement variants, or the CUDA cores) is forced; its blocks (kWgmmaBlocksPerSm per SM) make
// at most one wave.
TEST(IndexerLaunchShapes, Fp8KeysAt64HeadsTakeWgmmaOnSm90) {
  using K = IndexerScoreKernel;
  const WgmmaChoice on{true, true}, forced_only{true, false}, off_device{false, true};
  for (const int64_t batch : {1, 3, 64}) {
    for (const int64_t ctx : {4096, 32768, 131072}) {
      const IndexerProblem p = topk_problem(batch, 64, kDim, kTopK, ctx, KvFormat::kFp8);
      const std::string what = std::to_string(batch) + " x " + std::to_string(ctx);
      for (const auto& [want, choice] : {std::pair{K::kAuto, on}, std::pair{K::kTensorCore, on},
                                         std::pair{K::kTensorCoreWgmma, forced_only}}) {
        const IndexerConfig c =
            choose_indexer(p, kH200Sms, kH200MaxSmem, want, IndexerSelectKernel::kAuto, choice);
        EXPECT_TRUE(c.wgmma && c.mma && !c.wgmma_lo_e4m3) << what;
        EXPECT_EQ(c.score_smem, score_wgmma_smem_bytes()) << what;
        EXPECT_GE(c.splits, 1) << what;
        EXPECT_LE(c.group * c.splits, int64_t{kWgmmaBlocksPerSm} * kH200Sms) << what;
        EXPECT_LE(c.splits, (ctx + kMmaKeys - 1) / kMmaKeys) << what;
      }
      for (const K want : {K::kTensorCoreMmaSync, K::kTensorCoreOnePass, K::kTensorCoreKeyRuns}) {
        const IndexerConfig c =
            choose_indexer(p, kH200Sms, kH200MaxSmem, want, IndexerSelectKernel::kAuto, on);
        EXPECT_TRUE(c.mma && !c.wgmma) << what;
        EXPECT_EQ(c.score_smem, score_mma_smem_bytes(64, KvFormat::kFp8)) << what;
      }
      EXPECT_FALSE(
          choose_indexer(p, kH200Sms, kH200MaxSmem, K::kCudaCore, IndexerSelectKernel::kAuto, on)
              .mma);
      // The lo-e4m3 measurement variant only when forced.
      const IndexerConfig lo8 = choose_indexer(p, kH200Sms, kH200MaxSmem, K::kTensorCoreWgmmaLoE4m3,
                                               IndexerSelectKernel::kAuto, forced_only);
      EXPECT_TRUE(lo8.wgmma && lo8.wgmma_lo_e4m3 && lo8.mma) << what;
      // Not the default: kAuto stays on mma.sync. Off sm_90: a forced wgmma takes nothing.
      const IndexerConfig by_mma = choose_indexer(p, kH200Sms, kH200MaxSmem, K::kAuto,
                                                  IndexerSelectKernel::kAuto, forced_only);
      EXPECT_TRUE(by_mma.mma && !by_mma.wgmma) << what;
      EXPECT_FALSE(choose_indexer(p, kH200Sms, kH200MaxSmem).wgmma) << what;
      const IndexerConfig off = choose_indexer(p, kH200Sms, kH200MaxSmem, K::kTensorCoreWgmma,
                                               IndexerSelectKernel::kAuto, off_device);
      EXPECT_FALSE(off.wgmma || off.mma) << what;
    }
  }
  // Other heads, formats and candidate lists stay on mma.sync or the CUDA cores.
  for (const int64_t heads : {16, 32}) {
    EXPECT_FALSE(score_wgmma_takes(topk_problem(1, heads, kDim, kTopK, 4096, KvFormat::kFp8)));
  }
  EXPECT_FALSE(score_wgmma_takes(topk_problem(1, 64, kDim, kTopK, 4096, KvFormat::kBf16)));
  EXPECT_FALSE(score_wgmma_takes(topk_problem(1, 64, kDim, kTopK, 4096, KvFormat::kV41Fp4Index)));
  EXPECT_FALSE(score_wgmma_takes(topk_problem(1, 64, 64, kTopK, 4096, KvFormat::kFp8)));
  IndexerProblem listed = topk_problem(1, 64, kDim, kTopK, 4096, KvFormat::kFp8);
  listed.listed = true;
  EXPECT_FALSE(score_wgmma_takes(listed));
  // kWgmmaBlocksPerSm blocks fit an H200 SM's 228 KiB (1 KiB reserved per block).
  EXPECT_LE(kWgmmaBlocksPerSm * (score_wgmma_smem_bytes() + 1024), size_t{228} * 1024);
}

// The pipelined wgmma kernel (indexer_score_wgmma_pipelined.cu): by default where the switch
// says wgmma_pipelined (its default: unset), or forced; a forced plain wgmma stays on the plain
// kernel, so that one run can compare both. Its block fills an SM: at most one block per SM in all.
TEST(IndexerLaunchShapes, PipelinedWgmmaTakesOneBlockPerSm) {
  using K = IndexerScoreKernel;
  const WgmmaChoice pipelined{true, true, true}, plain{true, true, false}, forced_only{true, false};
  for (const int64_t batch : {1, 3, 64, 1024}) {
    for (const int64_t ctx : {4096, 32768, 131072}) {
      const IndexerProblem p = topk_problem(batch, 64, kDim, kTopK, ctx, KvFormat::kFp8);
      const std::string what = std::to_string(batch) + " x " + std::to_string(ctx);
      for (const auto& [want, choice] :
           {std::pair{K::kAuto, pipelined}, std::pair{K::kTensorCore, pipelined},
            std::pair{K::kTensorCoreWgmmaPipelined, forced_only},
            std::pair{K::kTensorCoreWgmmaPipelined, plain}}) {
        const IndexerConfig c =
            choose_indexer(p, kH200Sms, kH200MaxSmem, want, IndexerSelectKernel::kAuto, choice);
        EXPECT_TRUE(c.wgmma && c.wgmma_pipelined && c.mma && !c.wgmma_lo_e4m3) << what;
        EXPECT_EQ(c.score_smem, score_wgmma_pipelined_smem_bytes()) << what;
        EXPECT_GE(c.splits, 1) << what;
        EXPECT_LE(c.group * c.splits, std::max<int64_t>(c.group, kH200Sms)) << what;
        EXPECT_LE(c.splits, (ctx + kMmaKeys - 1) / kMmaKeys) << what;
      }
      for (const auto& [want, choice] :
           {std::pair{K::kAuto, plain}, std::pair{K::kTensorCoreWgmma, pipelined},
            std::pair{K::kTensorCoreWgmmaLoE4m3, pipelined}}) {
        const IndexerConfig c =
            choose_indexer(p, kH200Sms, kH200MaxSmem, want, IndexerSelectKernel::kAuto, choice);
        EXPECT_TRUE(c.wgmma && !c.wgmma_pipelined) << what;
      }
      EXPECT_FALSE(choose_indexer(p, kH200Sms, kH200MaxSmem, K::kTensorCoreWgmmaPipelined,
                                  IndexerSelectKernel::kAuto, WgmmaChoice{false, true, true})
                       .mma)
          << what;
    }
  }
  // B = 64 at 32K: two blocks per token on 132 SMs; B = 1: one per tile, up to the SMs.
  const auto splits = [&](int64_t batch, int64_t ctx) {
    return choose_indexer(topk_problem(batch, 64, kDim, kTopK, ctx, KvFormat::kFp8), kH200Sms,
                          kH200MaxSmem, K::kAuto, IndexerSelectKernel::kAuto, pipelined)
        .splits;
  };
  EXPECT_EQ(splits(64, 32768), 2);
  EXPECT_EQ(splits(1, 8192), 128);
  EXPECT_EQ(splits(1, 32768), kH200Sms);
  // One block per SM fits: the pipelined kernel's shared memory within the opt-in limit.
  EXPECT_LE(score_wgmma_pipelined_smem_bytes(), kH200MaxSmem);
}

// The persistent wgmma kernel (indexer_score_wgmma_persistent.cu): for q in fp8 where the switch
// says wgmma_persistent(_cvt, _fp8), or forced; q in f32 keeps the pipelined kernel under that
// switch, and a forced persistent kernel takes nothing there. One block per SM at most, no more
// than the group's tiles; its shared memory within the opt-in limit.
TEST(IndexerLaunchShapes, PersistentWgmmaTakesQInFp8) {
  using K = IndexerScoreKernel;
  const WgmmaChoice persistent{true, true, true, true, false},
      persistent_cvt{true, true, true, true, true},
      persistent_fp8{true, true, true, true, false, true}, pipelined{true, true, true},
      forced_only{true, false};
  for (const int64_t batch : {1, 3, 64, 1024}) {
    for (const int64_t ctx : {4096, 32768, 131072}) {
      IndexerProblem p = topk_problem(batch, 64, kDim, kTopK, ctx, KvFormat::kFp8);
      p.q_fp8 = true;
      const std::string what = std::to_string(batch) + " x " + std::to_string(ctx);
      const int64_t tiles = (ctx + kMmaKeys - 1) / kMmaKeys;
      // The fp8-MMA variant under its switch (kAuto) or forced, whatever the switch says.
      for (const auto& [want, choice, cvt_steps, fp8_mma] :
           {std::tuple{K::kAuto, persistent, kPersistMixedCvtSteps, false},
            std::tuple{K::kTensorCore, persistent_cvt, 8, false},
            std::tuple{K::kTensorCoreWgmmaPersistent, forced_only, kPersistMixedCvtSteps, false},
            std::tuple{K::kTensorCoreWgmmaPersistentCvt, pipelined, 8, false},
            std::tuple{K::kAuto, persistent_fp8, kPersistMixedCvtSteps, true},
            std::tuple{K::kTensorCoreWgmmaPersistentFp8, forced_only, kPersistMixedCvtSteps, true},
            std::tuple{K::kTensorCoreWgmmaPersistent, persistent_fp8, kPersistMixedCvtSteps,
                       false}}) {
        const IndexerConfig c =
            choose_indexer(p, kH200Sms, kH200MaxSmem, want, IndexerSelectKernel::kAuto, choice);
        EXPECT_TRUE(c.wgmma && c.wgmma_persistent && c.mma && c.fits) << what;
        EXPECT_TRUE(indexer_scores_take_codes(c, true)) << what;
        EXPECT_FALSE(indexer_scores_take_codes(c, false)) << what;
        EXPECT_EQ(c.persistent_cvt_steps, cvt_steps) << what;
        EXPECT_EQ(c.persistent_fp8_mma, fp8_mma) << what;
        EXPECT_EQ(c.score_smem, score_wgmma_persistent_smem_bytes(fp8_mma)) << what;
        EXPECT_GE(c.persistent_ctas, 1) << what;
        EXPECT_LE(c.persistent_ctas, std::min<int64_t>(kH200Sms, c.group * tiles)) << what;
      }
      // Not by default, nor under the pipelined switch; q in f32 under the persistent switch keeps
      // the pipelined kernel; forced on q in f32 it takes nothing (indexer_topk_run refuses).
      EXPECT_FALSE(
          choose_indexer(p, kH200Sms, kH200MaxSmem, K::kAuto, IndexerSelectKernel::kAuto, pipelined)
              .wgmma_persistent)
          << what;
      IndexerProblem f32_q = p;
      f32_q.q_fp8 = false;
      const IndexerConfig kept = choose_indexer(f32_q, kH200Sms, kH200MaxSmem, K::kAuto,
                                                IndexerSelectKernel::kAuto, persistent);
      EXPECT_TRUE(kept.wgmma_pipelined && !kept.wgmma_persistent) << what;
      EXPECT_FALSE(choose_indexer(f32_q, kH200Sms, kH200MaxSmem, K::kTensorCoreWgmmaPersistent,
                                  IndexerSelectKernel::kAuto, forced_only)
                       .wgmma_persistent)
          << what;
    }
  }
  // B = 64 at 32K: every SM; B = 1 at 8K entries: its 128 tiles.
  IndexerProblem b64 = topk_problem(64, 64, kDim, kTopK, 8192, KvFormat::kFp8);
  b64.q_fp8 = true;
  EXPECT_EQ(
      choose_indexer(b64, kH200Sms, kH200MaxSmem, K::kAuto, IndexerSelectKernel::kAuto, persistent)
          .persistent_ctas,
      kH200Sms);
  IndexerProblem b1 = b64;
  b1.tokens = 1;
  EXPECT_EQ(
      choose_indexer(b1, kH200Sms, kH200MaxSmem, K::kAuto, IndexerSelectKernel::kAuto, persistent)
          .persistent_ctas,
      128);
  EXPECT_LE(score_wgmma_persistent_smem_bytes(), kH200MaxSmem);
  EXPECT_LE(score_wgmma_persistent_smem_bytes(true), kH200MaxSmem);
}

TEST(IndexerLaunchShapes, SplitSelectionTakesFewLongRows) {
  constexpr int64_t kV4Heads = 64;
  auto splits = [](int64_t tokens, int64_t entries, IndexerSelectKernel want) {
    const IndexerProblem p = topk_problem(tokens, kV4Heads, kDim, kTopK, entries, KvFormat::kBf16);
    return choose_indexer(p, kH200Sms, kH200MaxSmem, IndexerScoreKernel::kAuto, want).select_splits;
  };
  const auto kAuto = IndexerSelectKernel::kAuto;
  // B = 1: a block per kSplitSlotsPerBlock keys (32,768 entries at 128K context), for rows the
  // binned selection does not fit (more than 18,333 slots at top 512). The split takes a token
  // from kSplitMinBlocks = 5 blocks (measured: it loses at 4).
  EXPECT_EQ(splits(1, 8192, kAuto), 0);  // binned
  EXPECT_EQ(splits(1, 18432, kAuto), 9);
  EXPECT_EQ(splits(1, 32768, kAuto), 16);
  // B = 64: two waves over the SMs, at most ceil(264 / 64) = 5 blocks per token.
  EXPECT_EQ(splits(64, 8192, kAuto), 0);
  EXPECT_EQ(splits(64, 32768, kAuto), 5);
  // Short rows and prefill chunks keep one block per token.
  EXPECT_EQ(splits(1, 4096, kAuto), 0);
  EXPECT_EQ(splits(1024, 32768, kAuto), 0);
  EXPECT_EQ(splits(65, 32768, kAuto), 5);  // ceil(264 / 65) = 5
  EXPECT_EQ(splits(66, 32768, kAuto), 0);  // 4
  // Forced: one block always, the split wherever it fits (at least one block per token).
  EXPECT_EQ(splits(1, 32768, IndexerSelectKernel::kOneBlock), 0);
  EXPECT_EQ(splits(1, 100, IndexerSelectKernel::kSplit), 1);
  EXPECT_EQ(splits(1024, 32768, IndexerSelectKernel::kSplit), 1);
}

TEST(IndexerLaunchShapes, BinnedSelectionTakesRowsThatFitOneBlock) {
  // Winners (cap rounded up to 32), keys and pairs of the row, an 11-bit histogram, 40 words.
  EXPECT_EQ(binned_select_smem_bytes(512, 8192), 512 * 8 + 8192 * 12 + 2048 * 4 + 40 * 4);
  EXPECT_EQ(binned_select_smem_bytes(5, 7), 32 * 8 + 7 * 12 + 2048 * 4 + 40 * 4);
  constexpr int64_t kV4Heads = 64;
  auto config = [](int64_t tokens, int64_t entries, int64_t top_k, IndexerSelectKernel want) {
    const IndexerProblem p = topk_problem(tokens, kV4Heads, kDim, top_k, entries, KvFormat::kBf16);
    return choose_indexer(p, kH200Sms, kH200MaxSmem, IndexerScoreKernel::kAuto, want);
  };
  const auto kAuto = IndexerSelectKernel::kAuto;
  // 32K context (8,192 entries) at every batch, prefill chunks included, at top 512 and 2048.
  for (const int64_t tokens : {1, 4, 64, 1024}) {
    for (const int64_t top_k : {512, 2048}) {
      const IndexerConfig c = config(tokens, 8192, top_k, kAuto);
      EXPECT_TRUE(c.binned) << tokens << " " << top_k;
      EXPECT_EQ(c.select_splits, 0) << tokens << " " << top_k;
      EXPECT_EQ(c.binned_smem, binned_select_smem_bytes(top_k, 8192));
    }
  }
  // Its limit at top 512: (232,448 - 4,096 - 8,192 - 160) / 12 = 18,333 slots; the op-table
  // rows v4_b1_bound18304 / 18336 sit on both sides of it.
  EXPECT_TRUE(config(1, 18333, 512, kAuto).binned);
  EXPECT_FALSE(config(1, 18334, 512, kAuto).binned);
  EXPECT_TRUE(config(1, 18304, 512, kAuto).binned);
  const IndexerConfig past = config(1, 18336, 512, kAuto);
  EXPECT_FALSE(past.binned);
  EXPECT_EQ(past.select_splits, 9);
  // Rows shorter than top_k: cap is the row.
  EXPECT_TRUE(config(1, 375, 512, kAuto).binned);
  EXPECT_EQ(config(1, 375, 512, kAuto).binned_smem, binned_select_smem_bytes(375, 375));
  // Forced: the other kernels never take it; a forced binned selection that does not fit runs
  // kAuto's choice.
  EXPECT_FALSE(config(1, 8192, 512, IndexerSelectKernel::kOneBlock).binned);
  EXPECT_EQ(config(1, 8192, 512, IndexerSelectKernel::kOneBlock).select_splits, 0);
  EXPECT_FALSE(config(1, 8192, 512, IndexerSelectKernel::kSplit).binned);
  EXPECT_EQ(config(1, 8192, 512, IndexerSelectKernel::kSplit).select_splits, 4);
  EXPECT_TRUE(config(1, 8192, 512, IndexerSelectKernel::kBinned).binned);
  const IndexerConfig forced_long = config(1, 32768, 512, IndexerSelectKernel::kBinned);
  EXPECT_FALSE(forced_long.binned);
  EXPECT_EQ(forced_long.select_splits, 16);
}

TEST(IndexerLaunchShapes, SplitSelectionScratchCountsInTheGroup) {
  // 1500 rows of 65,536 entries: the scores alone allow 1024 tokens per group; with the split
  // selection's histogram and pairs (16 KB + 512 KB per token) fewer.
  const IndexerProblem p = topk_problem(1500, 4, 32, kTopK, 65536, KvFormat::kF32);
  const IndexerConfig one = choose_indexer(p, kH200Sms, kH200MaxSmem, IndexerScoreKernel::kAuto,
                                           IndexerSelectKernel::kOneBlock);
  const IndexerConfig split = choose_indexer(p, kH200Sms, kH200MaxSmem, IndexerScoreKernel::kAuto,
                                             IndexerSelectKernel::kSplit);
  EXPECT_EQ(one.group, 1024);
  const int64_t per_token = 65536 * 4 + (kSplitBins + 1) * 4 + 65536 * 8;
  EXPECT_EQ(split.group, kScoreScratchBytes / per_token);
  EXPECT_EQ(split.split_final_smem, (kTopK + kSplitSmemPairs) * 8 + 256 * 4 + 40 * 4);
}

}  // namespace
}  // namespace deepinfer::cuda
