// The mma.sync attention kernel's fp8 key decode (cuda/attention/sm80/attention_mma_tile.cuh:
// decode_key_tile; V4's record, 448 e4m3 channels and 64 bf16 RoPE channels, goes through integer
// operations) against the same kernel over bf16 rows of the decoded keys. The decode is exact, so
// the key tiles are the bf16 rows' and the outputs are the same bytes: a channel, scale or RoPE
// chunk read from the wrong place shows. Both warp layouts (16 heads per block as at B = 1 and 2,
// 64 as at larger batches), one split and several, the separate combine and the fused one. The
// keys are the op tests' KV rows (random_kv_rows: ties, scales far above and below 1, e4m3
// subnormals, zero rows). Skips without an sm_90 device.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attention_inputs.h"
#include "compare.h"
#include "cuda/backend/cuda_backend.h"
#include "deepinfer/backend.h"
#include "inputs.h"
#include "kv_inputs.h"
#include "wgmma_backend.h"

namespace deepinfer::backend_ops {
namespace {

constexpr int kDim = V4AttentionInputs::kDim, kRope = V4AttentionInputs::kRope,
              kRingLen = V4AttentionInputs::kRingLen, kRatio = 4;

struct DecodeCase {
  std::string name;
  std::vector<SeqSpec> seqs;
  int64_t rows;    // heads per block (AttentionMmaChoice::rows)
  int64_t splits;  // key splits per token
  bool fused = false;
};

// n cache rows of the op tests' KV values as V4's fp8 records, and the same keys decoded as bf16
// rows (exact: e4m3 times a power of two, and the records' bf16 RoPE channels).
struct KeyPair {
  Tensor fp8, bf16;
};
KeyPair key_pair(std::mt19937& rng, const Shape& lead) {
  int64_t n = 1;
  for (const int64_t d : lead) n *= d;
  const Tensor fp8 = encode_kv_rows(random_kv_rows(rng, n, kDim), DType::kU8, kRope);
  const Tensor bf16 = encode_kv_rows(decode_kv_rows(fp8, kDim, kRope), DType::kBF16, kRope);
  Shape fp8_shape = lead;
  fp8_shape.push_back(fp8.shape().back());
  Shape bf16_shape = lead;
  bf16_shape.push_back(kDim);
  return {fp8.reshape(fp8_shape), bf16.reshape(bf16_shape)};
}

class AttentionMmaFp8Decode : public testing::TestWithParam<DecodeCase> {};

TEST_P(AttentionMmaFp8Decode, SameBytesAsBf16RowsOfTheDecodedKeys) {
  const DecodeCase& dc = GetParam();
  DEEPINFER_WGMMA_BACKEND_OR_SKIP(cuda_be);
  Backend* be = cuda_be;
  constexpr int kHeads = 64;
  std::mt19937 rng(20261208);
  // q, the top-k, the sinks and the layout; the keys are drawn below.
  const V4AttentionInputs in(*be, rng, dc.seqs, kHeads, kRatio, DType::kU8);
  // This call's rows come encoded (as rms_norm_rope_kv writes them in the model), so that both
  // calls see the same keys.
  const KeyPair kv = key_pair(rng, {in.tokens});
  const KeyPair ring = key_pair(rng, {in.ring.size(0), kRingLen});
  const KeyPair entries = key_pair(rng, {in.entries.size(0)});

  const cuda::AttentionKernelChoice kernel0 = cuda_be->attention_kernel();
  const cuda::AttentionMmaChoice choice0 = cuda_be->attention_mma_choice();
  cuda_be->set_attention_kernel(cuda::AttentionKernelChoice::kMmaSync);
  cuda_be->set_attention_mma_choice(
      {.fused_combine = dc.fused, .rows = dc.rows, .splits = dc.splits});
  auto run = [&](bool fp8) {
    const Tensor& kv_rows = fp8 ? kv.fp8 : kv.bf16;
    const Tensor& ring_rows = fp8 ? ring.fp8 : ring.bf16;
    const Tensor& entry_rows = fp8 ? entries.fp8 : entries.bf16;
    Tensor o =
        be->to_host(be->attention(in.q_f32, up_same(*be, kv_rows), up_same(*be, ring_rows),
                                  up_same(*be, entry_rows), in.topk, in.sinks, in.layout, in.spec));
    EXPECT_FALSE(cuda_be->last_attention_wgmma()) << "the mma.sync kernel ran";
    const cuda::AttentionMmaPlan plan = cuda_be->last_attention_plan();
    EXPECT_EQ(plan.rows, dc.rows);
    EXPECT_EQ(plan.splits, dc.splits);
    return o;
  };
  const Tensor from_fp8 = run(true);
  const Tensor from_bf16 = run(false);
  cuda_be->set_attention_kernel(kernel0);
  cuda_be->set_attention_mma_choice(choice0);
  EXPECT_TRUE(same_bytes(from_fp8, from_bf16));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AttentionMmaFp8Decode,
    testing::Values(DecodeCase{"b1_rows16_split20", {{4095, 1, 0}}, 16, 20},
                    DecodeCase{"b1_rows16_split1", {{4095, 1, 0}}, 16, 1},
                    DecodeCase{"b2_sq2_rows16_split5", spread_batch(2, 2, 300, 3800), 16, 5},
                    DecodeCase{"b8_rows64_split2", spread_batch(8, 1, 300, 3800), 64, 2},
                    DecodeCase{"b64_rows64_split1", spread_batch(64, 1, 300, 3800), 64, 1},
                    DecodeCase{"b2_rows64_split4_fused", spread_batch(2, 1, 300, 3800), 64, 4,
                               true}),
    [](const testing::TestParamInfo<DecodeCase>& param_info) { return param_info.param.name; });

}  // namespace
}  // namespace deepinfer::backend_ops
