// The mma.sync attention kernel's start (cuda/attention/sm80/attention_mma.cu, the small-batch
// decode default on sm_90): it reads the layout and the sequence's block-table row before it
// waits for the previous grid, and must not read q, the top-k columns or this call's kv rows
// before that wait. As in the model, the kernels that write those inputs run right before the
// attention (programmatic dependents on the stream, no synchronization between), each just after
// other contents (q negated, the kv rows and each top-k list in reverse order) were written and
// freed; the output must be the bytes of the same call with a synchronization before the
// attention. Skips without an sm_90 device (before sm_90 the launches are ordinary).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attention_inputs.h"
#include "batch_layout.h"
#include "compare.h"
#include "cuda/backend/cuda_backend.h"
#include "deepinfer/backend.h"
#include "inputs.h"
#include "kv_inputs.h"
#include "wgmma_backend.h"

namespace deepinfer::backend_ops {
namespace {

struct StartCase {
  std::string name;
  std::vector<SeqSpec> seqs;
};

class AttentionMmaStart : public testing::TestWithParam<StartCase> {};

TEST_P(AttentionMmaStart, RightAfterTheKernelsThatWriteItsInputs) {
  const StartCase& sc = GetParam();
  DEEPINFER_WGMMA_BACKEND_OR_SKIP(cuda_be);
  Backend* be = cuda_be;
  constexpr int kHeads = 64, kDim = 512, kRope = 64, kWindow = 128, kRingLen = 134, kBlock = 128,
                kRatio = 4, kTopK = 512;
  std::mt19937 rng(20261216);
  const HostBatch hb(rng, sc.seqs, kBlock);
  const int64_t tokens = hb.num_tokens();
  int slots = 0;
  for (const SeqSpec& s : sc.seqs) slots = std::max(slots, s.slot + 1);
  const Tensor q_src = up(*be, random_f32(rng, {tokens, kHeads, kDim}));
  const Tensor q_negated = be->scale(q_src, -1.0f);
  // This call's keys come encoded (fp8 records, as rms_norm_rope_kv writes them in the model), so
  // the attention kernel follows the top-k's writer directly.
  const Tensor kv_src = up_same(*be, random_cache_rows(rng, {tokens}, kDim, kRope, DType::kU8));
  const Tensor ring =
      up_same(*be, random_cache_rows(rng, {slots, kRingLen}, kDim, kRope, DType::kU8));
  const Tensor entries =
      up_same(*be, random_cache_rows(rng, {int64_t{hb.num_blocks} * (kBlock / kRatio)}, kDim, kRope,
                                     DType::kU8));
  const Tensor topk_host = random_topk(rng, hb, kRatio, kTopK);
  const Tensor topk_src = up(*be, topk_host);
  std::vector<int32_t> identity(static_cast<size_t>(tokens));
  std::vector<int32_t> reversed(static_cast<size_t>(tokens));
  for (int64_t i = 0; i < tokens; ++i) {
    identity[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    reversed[static_cast<size_t>(i)] = static_cast<int32_t>(tokens - 1 - i);
  }
  const Tensor rows = up(*be, Tensor::from_vector(identity, {tokens}));
  const Tensor rows_reversed = up(*be, Tensor::from_vector(reversed, {tokens}));
  // Other top-k columns: each row's list reversed (other entries first in every split).
  const int32_t* topk_values = topk_host.data<int32_t>();
  std::vector<int32_t> other(topk_values, topk_values + tokens * kTopK);
  for (int64_t t = 0; t < tokens; ++t) {
    std::reverse(other.begin() + t * kTopK, other.begin() + (t + 1) * kTopK);
  }
  const Tensor topk_other = up(*be, Tensor::from_vector(other, {tokens, kTopK}));
  const Tensor sinks = up(*be, random_f32(rng, {kHeads}, 4.0f));
  const BatchLayout layout = hb.upload(*be);
  AttentionSpec spec{kWindow, 1.0f / std::sqrt(float(kDim)), kRatio, true};
  spec.bf16_math = true;
  spec.rope_dim = kRope;

  const cuda::AttentionKernelChoice kernel0 = cuda_be->attention_kernel();
  cuda_be->set_attention_kernel(cuda::AttentionKernelChoice::kMmaSync);
  auto attention_after_writes = [&](bool synchronize) {
    // Other contents first, freed at once: the writes below may reuse their memory.
    (void)be->scale(q_negated, 1.0f);
    (void)be->gather_rows(kv_src, rows_reversed);
    (void)be->gather_rows(topk_other, rows);
    const Tensor q = be->scale(q_src, 1.0f);
    const Tensor kv = be->gather_rows(kv_src, rows);
    const Tensor topk = be->gather_rows(topk_src, rows);
    if (synchronize) be->synchronize();
    return be->to_host(be->attention(q, kv, ring, entries, topk, sinks, layout, spec));
  };
  const Tensor want = attention_after_writes(true);
  EXPECT_FALSE(cuda_be->last_attention_wgmma()) << "the mma.sync kernel ran";
  for (int round = 0; round < 3; ++round) {
    EXPECT_TRUE(same_bytes(want, attention_after_writes(false))) << "round " << round;
  }
  cuda_be->set_attention_kernel(kernel0);
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionMmaStart,
                         testing::Values(StartCase{"b1", {{4095, 1, 0}}},
                                         StartCase{"b2_sq2", spread_batch(2, 2, 300, 3800)}),
                         [](const testing::TestParamInfo<StartCase>& param_info) {
                           return param_info.param.name;
                         });

}  // namespace
}  // namespace deepinfer::backend_ops
