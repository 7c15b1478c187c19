// The key-split Hopper attention kernel (cuda/attention/sm90/attention_wgmma_keysplit.cu,
// DEEPINFER_ATTENTION_KERNEL=wgmma_keysplit, bf16 rows) against the other tensor-core kernels on
// the same inputs at V4 widths (64 and 128 heads of 512 channels, W = 128, ring 134, CSA ratio 4
// with top-512, HCA ratio 128 with dense entries): decode batches with s_q = 1..4, B up to 128,
// a prefill chunk (one sequence's 200 rows, whose sliding keys are this call's rows), random
// sinks, masked keys (top-k columns of -1, sliding keys before position 0), key lists shorter
// than one step and forced key splits (the combine kernel). Its two warpgroups round their
// probabilities at different maxima (the file's head comment), so it is bf16-close to the ilp and
// mma.sync kernels rather than their bytes. Also: deterministic, bf16 q gives f32 q's bytes (both
// become the same bf16 tile), its bf16 output is its f32 output rounded, and over fp8 records the
// choice runs auto; auto takes it for the prefill chunk only. One test per case: a case whose
// barriers deadlock hangs its own test. The agreement with the CPU op: the op table
// (deepinfer_backend_ops) with DEEPINFER_ATTENTION_KERNEL=wgmma_keysplit. Skips without a GPU or
// without the wgmma kernels.
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
#include "cuda/backend/cuda_backend.h"
#include "deepinfer/backend.h"
#include "device_backends.h"
#include "inputs.h"
#include "kv_inputs.h"
#include "wgmma_backend.h"

namespace deepinfer::backend_ops {
namespace {

struct KeySplitCase {
  std::string name;
  std::vector<SeqSpec> seqs;
  int heads = 64;
  int ratio = 4;       // 4: sparse top-512 (CSA); 128: dense entries (HCA)
  int64_t splits = 0;  // forced key splits (DEEPINFER_ATTENTION_SPLITS); 0: the plan's own
};

std::vector<KeySplitCase> keysplit_cases() {
  return {
      {"b1_decode", {{4095, 1, 0}}},
      {"b1_sq4", {{3000, 4, 0}}},
      {"b3_sq3_split3", spread_batch(3, 3), 64, 4, 3},
      {"b64_decode", spread_batch(64, 1)},
      {"b128_sq2", spread_batch(128, 2)},
      // Position 0 and 5: fewer keys than one step; with 4 forced splits most splits are empty.
      {"short_lists_split4", {{0, 1, 0}, {5, 1, 1}, {60, 2, 2}}, 64, 4, 4},
      {"prefill_chunk", {{2000, 200, 0}}},
      {"h128_b3", spread_batch(3, 1), 128},
      {"hca_dense_b3", spread_batch(3, 2), 64, 128},
  };
}

class AttentionWgmmaKeySplit : public testing::TestWithParam<std::tuple<DType, KeySplitCase>> {};

TEST_P(AttentionWgmmaKeySplit, IsCloseToTheOtherKernels) {
  const DType kv = std::get<0>(GetParam());
  const KeySplitCase& wc = std::get<1>(GetParam());
  DEEPINFER_WGMMA_BACKEND_OR_SKIP(wgmma_be);
  cuda::CudaBackend& cuda_be = *wgmma_be;
  Backend* be = wgmma_be;
  const cuda::AttentionKernelChoice kernel0 = cuda_be.attention_kernel();
  const cuda::AttentionMmaChoice choice0 = cuda_be.attention_mma_choice();
  std::mt19937 rng(20261204);
  V4AttentionInputs in(*be, rng, wc.seqs, wc.heads, wc.ratio, kv);
  const int64_t tokens = in.tokens;
  const Tensor& q_f32 = in.q_f32;
  Tensor q = q_f32;  // the runs' q: f32, or below bf16
  const Tensor &kv_rows = in.kv_rows, &ring = in.ring, &entries = in.entries, &topk = in.topk,
               &sinks = in.sinks;
  const BatchLayout& layout = in.layout;
  AttentionSpec& spec = in.spec;
  cuda::AttentionMmaPlan plan;
  auto run = [&](cuda::AttentionKernelChoice k) {
    cuda_be.set_attention_kernel(k);
    cuda_be.set_attention_mma_choice({.splits = wc.splits});
    Tensor o = be->to_host(be->attention(q, kv_rows, ring, entries, topk, sinks, layout, spec));
    plan =
        cuda_be.last_attention_wgmma() ? cuda_be.last_attention_plan() : cuda::AttentionMmaPlan{};
    cuda_be.set_attention_kernel(kernel0);
    cuda_be.set_attention_mma_choice(choice0);
    return o;
  };
  const Tensor got = run(cuda::AttentionKernelChoice::kWgmmaKeySplit);
  const cuda::AttentionMmaPlan keysplit_plan = plan;
  if (kv != DType::kBF16) {
    // Other records: the choice runs auto, the same bytes.
    EXPECT_FALSE(keysplit_plan.keysplit);
    EXPECT_TRUE(same_bytes(run(cuda::AttentionKernelChoice::kWgmmaOverlapAuto), got));
    return;
  }
  ASSERT_TRUE(keysplit_plan.keysplit);
  EXPECT_FALSE(keysplit_plan.overlap);
  // Auto: mma.sync's 16-head blocks at small batches (no Hopper plan then), else the key-split
  // kernel for prefill-like calls (the chunk) and one-split decode, the ilp kernel for decode
  // with splits (its plan's count, uncapped there, decides).
  const Tensor automatic = run(cuda::AttentionKernelChoice::kWgmmaOverlapAuto);
  if (cuda::small_batch_mma_takes(tokens, wc.heads, V4AttentionInputs::kDim)) {
    EXPECT_FALSE(cuda_be.last_attention_wgmma());
    EXPECT_EQ(cuda_be.last_attention_plan().rows, 16);
    EXPECT_TRUE(bf16_close(automatic, got));
  } else {
    const bool auto_keysplit =
        cuda::keysplit_auto_takes(tokens, static_cast<int64_t>(wc.seqs.size()), plan.splits);
    EXPECT_EQ(plan.keysplit, auto_keysplit);
    EXPECT_EQ(plan.ilp, !auto_keysplit);
    if (auto_keysplit) {
      EXPECT_TRUE(same_bytes(got, automatic));
    }
  }
  if (wc.splits > 0) {
    EXPECT_GT(keysplit_plan.splits, 1);
  }
  EXPECT_TRUE(bf16_close(run(cuda::AttentionKernelChoice::kWgmmaOverlapIlp), got));
  EXPECT_TRUE(bf16_close(run(cuda::AttentionKernelChoice::kMmaSync), got));
  EXPECT_TRUE(same_bytes(got, run(cuda::AttentionKernelChoice::kWgmmaKeySplit)));
  // AttentionSpec::bf16_output: its epilogue (one split) or the combine rounds the same values.
  spec.bf16_output = true;
  const Tensor got_bf16 = run(cuda::AttentionKernelChoice::kWgmmaKeySplit);
  EXPECT_EQ(got_bf16.dtype(), DType::kBF16);
  EXPECT_TRUE(same_bytes(got.to(DType::kBF16), got_bf16));
  spec.bf16_output = false;
  // bf16 q (f32 q rounded, as rms_norm_rope's bf16 output): the same q tile, the same bytes.
  q = up_same(*be, be->to_host(q_f32).to(DType::kBF16));
  EXPECT_TRUE(same_bytes(got, run(cuda::AttentionKernelChoice::kWgmmaKeySplit)));
  q = q_f32;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AttentionWgmmaKeySplit,
    testing::Combine(testing::Values(DType::kBF16, DType::kU8),
                     testing::ValuesIn(keysplit_cases())),
    [](const testing::TestParamInfo<AttentionWgmmaKeySplit::ParamType>& param_info) {
      return (std::get<0>(param_info.param) == DType::kU8 ? std::string("fp8_")
                                                          : std::string("bf16_")) +
             std::get<1>(param_info.param).name;
    });

}  // namespace
}  // namespace deepinfer::backend_ops
