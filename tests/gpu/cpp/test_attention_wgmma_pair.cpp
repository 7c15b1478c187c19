// The paired Hopper attention kernel (cuda/attention/sm90/attention_wgmma_pair.cu, opt-in:
// DEEPINFER_ATTENTION_KERNEL=wgmma_pair) against the default prefetching kernel
// (wgmma_prefetch_sw128) on the same inputs: at 128 heads or a multiple the two blocks of a
// token's 128 heads share the key tiles through distributed shared memory, each loading and
// decoding half of every tile; the tiles, products and softmax are the default kernel's, so the
// outputs must be the same bytes. Cases at V4 widths (512 channels, W = 128, ring 134, CSA ratio 4
// with top-512, HCA ratio 128 with dense entries) over bf16 and fp8 caches: s_q 1 to 4, B = 1, 3
// and 64, masked keys (top-k columns of -1, sliding keys before position 0), key lists shorter
// than a tile, forced key splits (most of them empty for the short lists), random sinks; 256 heads
// (two clusters per token); 192 heads, which the pair does not take (the default runs). One test
// per case, so that a case that hangs (a cluster barrier one block skips) names itself. Skips
// without a GPU or without the wgmma kernels (a build without sm_90a code, a device other than
// sm_90).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "batch_layout.h"
#include "compare.h"
#include "cuda/attention/sm90/attention_wgmma_config.h"
#include "cuda/backend/cuda_backend.h"
#include "deepinfer/backend.h"
#include "device_backends.h"
#include "inputs.h"
#include "kv_inputs.h"

namespace deepinfer::backend_ops {
namespace {

struct PairCase {
  std::string name;
  std::vector<SeqSpec> seqs;
  int heads = 128;
  int ratio = 4;       // 4: sparse top-512 (CSA); 128: dense entries (HCA)
  int64_t splits = 0;  // forced key splits (DEEPINFER_ATTENTION_SPLITS); 0: the plan's own
};

// Decode rows of `batch` sequences at spread-out contexts (as the op table's decode_seqs).
std::vector<SeqSpec> decode_batch(int batch, int s_q) {
  std::vector<SeqSpec> seqs;
  for (int i = 0; i < batch; ++i) seqs.push_back({200 + (i * 997) % 3900, s_q, i});
  return seqs;
}

// Random rows of `dim` channels as a cache of `kv` holds them.
Tensor random_rows(std::mt19937& rng, const Shape& lead, int64_t dim, int rope, DType kv) {
  Shape shape = lead;
  shape.push_back(dim);
  return encode_kv_rows(random_f32(rng, shape), kv, rope);
}

class AttentionWgmmaPair : public ::testing::TestWithParam<PairCase> {};

TEST_P(AttentionWgmmaPair, GivesTheDefaultKernelsBytes) {
  const PairCase& pc = GetParam();
  std::string why;
  Backend* be = shared_backend("cuda", &why);
  if (be == nullptr) {
    if (device_required()) FAIL() << why;
    GTEST_SKIP() << why;
  }
  auto& cuda_be = dynamic_cast<cuda::CudaBackend&>(*be);
  if (!cuda_be.wgmma_device()) {
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    if (device_required() && major == 9) FAIL() << "an sm_90 device, but no sm_90a code built";
    GTEST_SKIP() << "the wgmma attention needs sm_90a code (DEEPINFER_CUDA_ARCHITECTURES with 90a) "
                    "and an sm_90 device";
  }
  const cuda::AttentionKernelChoice kernel0 = cuda_be.attention_kernel();
  const cuda::AttentionMmaChoice choice0 = cuda_be.attention_mma_choice();
  constexpr int kDim = 512, kRope = 64, kWindow = 128, kRingLen = 134, kBlock = 128;
  std::mt19937 rng(20261212);
  for (const DType kv : {DType::kBF16, DType::kU8}) {
    SCOPED_TRACE(kv_label(kv) + pc.name);
    const HostBatch hb(rng, pc.seqs, kBlock);
    const int64_t tokens = hb.num_tokens();
    int slots = 0;
    for (const SeqSpec& s : pc.seqs) slots = std::max(slots, s.slot + 1);
    const bool sparse = pc.ratio == 4;
    const Tensor q = up(*be, random_f32(rng, {tokens, pc.heads, kDim}));
    const Tensor kv_rows = up(*be, random_f32(rng, {tokens, kDim}));
    const Tensor ring = up_same(*be, random_rows(rng, {slots, kRingLen}, kDim, kRope, kv));
    const Tensor entries = up_same(
        *be, random_rows(rng, {int64_t{hb.num_blocks} * (kBlock / pc.ratio)}, kDim, kRope, kv));
    const Tensor topk = sparse ? up(*be, random_topk(rng, hb, pc.ratio, 512)) : Tensor();
    // Sinks up to +-4: comparable with the logits, so a sink dropped or added twice shows.
    const Tensor sinks = up(*be, random_f32(rng, {pc.heads}, 4.0f));
    const BatchLayout layout = hb.upload(*be);
    AttentionSpec spec{kWindow, 1.0f / std::sqrt(float(kDim)), pc.ratio, sparse};
    spec.bf16_math = true;
    spec.rope_dim = kRope;
    cuda::AttentionMmaPlan plan;
    auto run = [&](cuda::AttentionKernelChoice k) {
      cuda_be.set_attention_kernel(k);
      cuda_be.set_attention_mma_choice({.splits = pc.splits});
      Tensor o = be->to_host(be->attention(q, kv_rows, ring, entries, topk, sinks, layout, spec));
      EXPECT_TRUE(cuda_be.last_attention_wgmma());
      plan = cuda_be.last_attention_plan();
      cuda_be.set_attention_kernel(kernel0);
      cuda_be.set_attention_mma_choice(choice0);
      return o;
    };
    const Tensor ref = run(cuda::AttentionKernelChoice::kWgmmaPrefetchSw128);
    const cuda::AttentionMmaPlan ref_plan = plan;
    EXPECT_FALSE(ref_plan.pair);
    const Tensor got = run(cuda::AttentionKernelChoice::kWgmmaPair);
    // The pair ran where it takes the heads (the default elsewhere), with the default's splits.
    EXPECT_EQ(plan.pair, cuda::wgmma_pair_takes(pc.heads));
    EXPECT_TRUE(plan.prefetch && plan.swizzle && !plan.pdl);
    EXPECT_EQ(plan.splits, ref_plan.splits);
    if (pc.splits > 0) {
      EXPECT_GT(plan.splits, 1);
    }
    EXPECT_TRUE(same_bytes(ref, got));
    // Deterministic: a tile read before its peer's half landed would differ from run to run.
    EXPECT_TRUE(same_bytes(got, run(cuda::AttentionKernelChoice::kWgmmaPair)));
  }
}

const PairCase kPairCases[] = {
    {"b1_decode", {{4095, 1, 0}}},
    {"b1_sq2", {{3000, 2, 0}}},
    {"b3_sq3", decode_batch(3, 3)},
    {"b3_sq4_split3", decode_batch(3, 4), 128, 4, 3},
    {"b3_decode_split7", decode_batch(3, 1), 128, 4, 7},
    {"b64_decode", decode_batch(64, 1)},
    {"b64_sq2", decode_batch(64, 2)},
    // Position 0 and 5: fewer keys than one tile (1 and 6 sliding keys, 0 and 1 entries); with 4
    // forced splits most splits are empty (both blocks of a cluster skip every tile).
    {"short_lists_split4", {{0, 1, 0}, {5, 1, 1}, {60, 2, 2}}, 128, 4, 4},
    {"h256_b3_sq2", decode_batch(3, 2), 256},
    {"h192_b3_default", decode_batch(3, 1), 192},
    {"hca_dense_b3_sq2", decode_batch(3, 2), 128, 128},
};

INSTANTIATE_TEST_SUITE_P(Cases, AttentionWgmmaPair, ::testing::ValuesIn(kPairCases),
                         [](const ::testing::TestParamInfo<PairCase>& param_info) {
                           return param_info.param.name;
                         });

}  // namespace
}  // namespace deepinfer::backend_ops
