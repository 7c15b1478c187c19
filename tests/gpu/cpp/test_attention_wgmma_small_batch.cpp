// The small-batch variants of the warp-specialised Hopper attention kernel
// (cuda/attention/sm90/attention_wgmma_overlap.cu, opt-in: DEEPINFER_ATTENTION_KERNEL=
// wgmma_overlap_pdl / wgmma_overlap_fused) against the default kernel (wgmma_overlap) on the same
// inputs at V4 widths (64 and 128 heads of 512 channels, W = 128, ring 134, CSA top-512 over
// bf16 rows and V4's fp8 record), decode at B = 1, 2, 8 with s_q 1 and 2:
//  - wgmma_overlap_pdl runs the same kernel body and the same combine as programmatic dependent
//    launches: the same bytes as the default;
//  - wgmma_overlap_fused merges a token's splits in the kernel (a cluster of the splits, at most
//    8) with the combine kernel's arithmetic: with the same forced splits the same bytes as the
//    default; with its own plan (5 splits at B = 1 where the default takes 10, so another merge
//    order) within bf16_close of the default and of the mma.sync kernel;
// and the plans say which ran (pdl, cluster_merge, no merge with one split). Agreement with the
// CPU op: the op table (deepinfer_backend_ops) under either value. Skips without a GPU or without
// the wgmma kernels (a build without sm_90a code, a device other than sm_90).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attention_inputs.h"
#include "batch_layout.h"
#include "compare.h"
#include "cuda/attention/sm90/attention_wgmma_config.h"
#include "cuda/backend/cuda_backend.h"
#include "deepinfer/backend.h"
#include "device_backends.h"
#include "inputs.h"
#include "kv_inputs.h"
#include "wgmma_backend.h"

namespace deepinfer::backend_ops {
namespace {

struct SmallBatchCase {
  std::string name;
  std::vector<SeqSpec> seqs;
  int heads = 64;
  int64_t splits = 5;  // the splits forced for the byte comparisons (DEEPINFER_ATTENTION_SPLITS)
};

std::vector<SmallBatchCase> small_batch_cases() {
  return {
      {"b1_sq1", {{4095, 1, 0}}},
      {"b1_sq2", {{4000, 2, 0}}},
      {"b2_sq1", spread_batch(2, 1, 300, 3800)},
      {"b2_sq2", spread_batch(2, 2, 300, 3800), 64, 8},
      {"b8_sq1", spread_batch(8, 1, 300, 3800), 64, 3},
      {"b8_sq2", spread_batch(8, 2, 300, 3800)},
      // Short key lists: most of the 8 splits have no tile (their outputs weigh 0).
      {"short_lists_split8", {{0, 1, 0}, {5, 1, 1}, {60, 2, 2}}, 64, 8},
      {"h128_b2", spread_batch(2, 1, 300, 3800), 128},
  };
}

class AttentionWgmmaSmallBatch : public testing::TestWithParam<std::tuple<DType, SmallBatchCase>> {
};

TEST_P(AttentionWgmmaSmallBatch, MatchesTheDefaultKernel) {
  const DType kv = std::get<0>(GetParam());
  const SmallBatchCase& wc = std::get<1>(GetParam());
  DEEPINFER_WGMMA_BACKEND_OR_SKIP(wgmma_be);
  cuda::CudaBackend& cuda_be = *wgmma_be;
  Backend* be = wgmma_be;
  const cuda::AttentionKernelChoice kernel0 = cuda_be.attention_kernel();
  const cuda::AttentionMmaChoice choice0 = cuda_be.attention_mma_choice();
  constexpr int kDim = 512, kRope = 64, kWindow = 128, kRingLen = 134, kBlock = 128, kRatio = 4;
  std::mt19937 rng(20261213);
  const HostBatch hb(rng, wc.seqs, kBlock);
  const int64_t tokens = hb.num_tokens();
  int slots = 0;
  for (const SeqSpec& s : wc.seqs) slots = std::max(slots, s.slot + 1);
  const Tensor q = up(*be, random_f32(rng, {tokens, wc.heads, kDim}));
  const Tensor kv_rows = up(*be, random_f32(rng, {tokens, kDim}));
  const Tensor ring = up_same(*be, random_cache_rows(rng, {slots, kRingLen}, kDim, kRope, kv));
  const Tensor entries = up_same(
      *be, random_cache_rows(rng, {int64_t{hb.num_blocks} * (kBlock / kRatio)}, kDim, kRope, kv));
  const Tensor topk = up(*be, random_topk(rng, hb, kRatio, 512));
  const Tensor sinks = up(*be, random_f32(rng, {wc.heads}, 4.0f));
  const BatchLayout layout = hb.upload(*be);
  AttentionSpec spec{kWindow, 1.0f / std::sqrt(float(kDim)), kRatio, true};
  spec.bf16_math = true;
  spec.rope_dim = kRope;
  cuda::AttentionMmaPlan plan;
  auto run = [&](cuda::AttentionKernelChoice k, int64_t splits) {
    cuda_be.set_attention_kernel(k);
    cuda_be.set_attention_mma_choice({.splits = splits});
    Tensor o = be->to_host(be->attention(q, kv_rows, ring, entries, topk, sinks, layout, spec));
    EXPECT_EQ(cuda_be.last_attention_wgmma(), k != cuda::AttentionKernelChoice::kMmaSync);
    plan = cuda_be.last_attention_plan();
    cuda_be.set_attention_kernel(kernel0);
    cuda_be.set_attention_mma_choice(choice0);
    return o;
  };
  using K = cuda::AttentionKernelChoice;
  // The same forced splits: the same bytes.
  const Tensor base = run(K::kWgmmaOverlap, wc.splits);
  EXPECT_TRUE(plan.overlap && !plan.pdl && !plan.cluster_merge);
  const int64_t forced = plan.splits;
  EXPECT_TRUE(same_bytes(base, run(K::kWgmmaOverlapPdl, wc.splits)));
  EXPECT_TRUE(plan.overlap && plan.pdl && !plan.cluster_merge);
  EXPECT_TRUE(same_bytes(base, run(K::kWgmmaOverlapFused, wc.splits)));
  EXPECT_TRUE(plan.overlap && plan.pdl && plan.cluster_merge);
  EXPECT_EQ(plan.splits, forced);
  // Each one's own plan.
  const Tensor own = run(K::kWgmmaOverlap, 0);
  EXPECT_TRUE(same_bytes(own, run(K::kWgmmaOverlapPdl, 0)));
  const Tensor fused = run(K::kWgmmaOverlapFused, 0);
  EXPECT_LE(plan.splits, cuda::kWgmmaClusterMergeMaxSplits);
  EXPECT_EQ(plan.cluster_merge, plan.splits > 1);
  EXPECT_TRUE(bf16_close(own, fused));
  EXPECT_TRUE(bf16_close(run(K::kMmaSync, 0), fused));
  // Deterministic (the merge reads every split after the cluster barrier).
  EXPECT_TRUE(same_bytes(fused, run(K::kWgmmaOverlapFused, 0)));
  // One split: nothing to merge, the kernel writes the output itself.
  const Tensor unsplit = run(K::kWgmmaOverlap, 1);
  EXPECT_TRUE(same_bytes(unsplit, run(K::kWgmmaOverlapFused, 1)));
  EXPECT_FALSE(plan.cluster_merge);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AttentionWgmmaSmallBatch,
    testing::Combine(testing::Values(DType::kBF16, DType::kU8),
                     testing::ValuesIn(small_batch_cases())),
    [](const testing::TestParamInfo<AttentionWgmmaSmallBatch::ParamType>& param_info) {
      return (std::get<0>(param_info.param) == DType::kU8 ? std::string("fp8_")
                                                          : std::string("bf16_")) +
             std::get<1>(param_info.param).name;
    });

}  // namespace
}  // namespace deepinfer::backend_ops
