// The attention output's inverse RoPE in the call (AttentionSpec::output_rope_inv_freq, the
// engine's call): where the CUDA backend's split combine rotates the output as it stores it, the
// bytes must be those of the unfused pair, the call under bf16_output and the rope op after it
// (rope_quads over the bf16 output); where there is no separate combine, the backend runs that
// pair itself. V4 widths (64 heads of 512, 32 RoPE pairs, CSA top-512), the engine's call (bf16 q,
// this call's keys in the cache format, bf16 output), fp8 and bf16 caches, at the batches of the
// small-batch mma.sync route (B = 1, 2 and s_q = 2) and the wgmma route (B = 64: two splits, the
// separate combine; B = 150: one split), and under DEEPINFER_ATTENTION_KERNEL=mma_sync. Agreement
// with the CPU op: the op table's ropeback_ rows.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attention_inputs.h"
#include "compare.h"
#include "cuda/backend/cuda_backend.h"
#include "deepinfer/backend.h"
#include "wgmma_backend.h"

namespace deepinfer::backend_ops {
namespace {

struct RopeBackCase {
  std::string name;
  std::vector<SeqSpec> seqs;
};

std::vector<RopeBackCase> rope_back_cases() {
  return {
      {"b1_sq1", {{4095, 1, 0}}},         {"b1_sq2", {{2047, 2, 0}}},
      {"b2_sq1", spread_batch(2, 1)},     {"b64_sq1", spread_batch(64, 1)},
      {"b150_sq1", spread_batch(150, 1)},
  };
}

class AttentionRopeBack : public testing::TestWithParam<std::tuple<DType, RopeBackCase>> {};

TEST_P(AttentionRopeBack, MatchesTheCallThenRope) {
  const DType kv = std::get<0>(GetParam());
  const RopeBackCase& rc = std::get<1>(GetParam());
  DEEPINFER_WGMMA_BACKEND_OR_SKIP(wgmma_be);
  cuda::CudaBackend& cuda_be = *wgmma_be;
  Backend& be = cuda_be;
  std::mt19937 rng(20261207);
  V4AttentionInputs in(be, rng, rc.seqs, 64, 4, kv);
  const Tensor q = up_same(be, be.to_host(in.q_f32).to(DType::kBF16));
  const Tensor kv_rows =
      up_same(be, encode_kv_rows(be.to_host(in.kv_rows), kv, V4AttentionInputs::kRope));
  constexpr int kPairs = 32;
  std::vector<float> freq(kPairs);
  for (int i = 0; i < kPairs; ++i)
    freq[static_cast<size_t>(i)] = std::pow(10000.0f, -float(i) / kPairs);
  const Tensor inv_freq = up(be, Tensor::from_vector(freq, {kPairs}));
  AttentionSpec spec = in.spec;
  spec.bf16_output = true;

  const cuda::AttentionKernelChoice kernel0 = cuda_be.attention_kernel();
  for (const bool mma_sync : {false, true}) {
    SCOPED_TRACE(mma_sync ? "mma_sync" : "default kernel");
    if (mma_sync) cuda_be.set_attention_kernel(cuda::AttentionKernelChoice::kMmaSync);
    AttentionSpec plain = spec;
    const Tensor out =
        be.attention(q, kv_rows, in.ring, in.entries, in.topk, in.sinks, in.layout, plain);
    const Tensor want = be.to_host(be.rope(out, in.layout.positions, inv_freq, /*inverse=*/true));
    AttentionSpec back = spec;
    back.output_rope_inv_freq = inv_freq;
    const Tensor got = be.to_host(
        be.attention(q, kv_rows, in.ring, in.entries, in.topk, in.sinks, in.layout, back));
    cuda_be.set_attention_kernel(kernel0);
    EXPECT_EQ(got.dtype(), DType::kF32);
    EXPECT_TRUE(same_bytes(want, got));
  }
}

INSTANTIATE_TEST_SUITE_P(
    V4Widths, AttentionRopeBack,
    testing::Combine(testing::Values(DType::kU8, DType::kBF16),
                     testing::ValuesIn(rope_back_cases())),
    [](const testing::TestParamInfo<AttentionRopeBack::ParamType>& param_info) {
      return std::string(std::get<0>(param_info.param) == DType::kU8 ? "fp8_" : "bf16_") +
             std::get<1>(param_info.param).name;
    });

}  // namespace
}  // namespace deepinfer::backend_ops
