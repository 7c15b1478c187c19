// The Hopper attention kernel (cuda/attention/sm90/attention_wgmma.cu, opt-in:
// DEEPINFER_ATTENTION_KERNEL=wgmma) against the mma.sync kernel (sm80/attention_mma.cu) on the
// same inputs at V4 widths (64 and 128 heads of 512 channels, W = 128, ring 134, CSA ratio 4 with
// top-512 and HCA ratio 128 with dense entries) over bf16 and fp8 caches: decode batches of
// B = 1, 3 and 64 with s_q = 1 and 2, random sinks scaled so that they matter, masked keys (top-k
// columns of -1, sliding keys before position 0), key lists shorter than one tile, and forced key
// splits. Both kernels round q, the keys and the probabilities to bf16 and accumulate in f32, but
// over different tiles (64 vs 32 keys: other running maxima, so other roundings of P), so they
// agree to the bf16 tolerance, not bit for bit; the wgmma kernel must also be deterministic and
// must actually have run. Its prefetching variant (DEEPINFER_ATTENTION_KERNEL=wgmma_prefetch: the
// same tiles, the key loads further ahead; _pdl: also programmatic dependent launches; _sw128:
// the tiles in wgmma's 128-byte swizzle) must give the wgmma kernel's bytes exactly. Agreement with
// the CPU op is the op table's (the V4-width bf16_ rows of cases_attention.cpp, run with
// DEEPINFER_ATTENTION_KERNEL= wgmma or a prefetch value). Skips without a GPU or without the wgmma
// kernel (a build without sm_90a code, a device other than sm_90).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

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

struct WgmmaAttnCase {
  std::string name;
  std::vector<SeqSpec> seqs;
  int heads = 64;
  int ratio = 4;       // 4: sparse top-512 (CSA); 128: dense entries (HCA)
  int64_t splits = 0;  // forced key splits (DEEPINFER_ATTENTION_SPLITS); 0: the plans' own
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

TEST(AttentionWgmma, MatchesTheMmaSyncKernel) {
  DEEPINFER_WGMMA_BACKEND_OR_SKIP(wgmma_be);
  cuda::CudaBackend& cuda_be = *wgmma_be;
  Backend* be = wgmma_be;
  const cuda::AttentionKernelChoice kernel0 = cuda_be.attention_kernel();
  const cuda::AttentionMmaChoice choice0 = cuda_be.attention_mma_choice();
  constexpr int kDim = 512, kRope = 64, kWindow = 128, kRingLen = 134, kBlock = 128;
  const std::vector<WgmmaAttnCase> cases = {
      {"b1_decode", {{4095, 1, 0}}},
      {"b1_sq2", {{3000, 2, 0}}},
      {"b3_decode", decode_batch(3, 1)},
      {"b3_sq2_split3", decode_batch(3, 2), 64, 4, 3},
      {"b64_decode", decode_batch(64, 1)},
      {"b64_sq2", decode_batch(64, 2)},
      // Position 0 and 5: fewer keys than one tile (1 and 6 sliding keys, 0 and 1 entries);
      // with 4 forced splits most splits are empty.
      {"short_lists_split4", {{0, 1, 0}, {5, 1, 1}, {60, 2, 2}}, 64, 4, 4},
      {"h128_b3", decode_batch(3, 1), 128},
      {"hca_dense_b3", decode_batch(3, 2), 64, 128},
  };
  std::mt19937 rng(20261202);
  for (const DType kv : {DType::kBF16, DType::kU8}) {
    for (const WgmmaAttnCase& wc : cases) {
      SCOPED_TRACE(kv_label(kv) + wc.name);
      const HostBatch hb(rng, wc.seqs, kBlock);
      const int64_t tokens = hb.num_tokens();
      int slots = 0;
      for (const SeqSpec& s : wc.seqs) slots = std::max(slots, s.slot + 1);
      const bool sparse = wc.ratio == 4;
      const Tensor q = up(*be, random_f32(rng, {tokens, wc.heads, kDim}));
      const Tensor kv_rows = up(*be, random_f32(rng, {tokens, kDim}));
      const Tensor ring = up_same(*be, random_rows(rng, {slots, kRingLen}, kDim, kRope, kv));
      const Tensor entries = up_same(
          *be, random_rows(rng, {int64_t{hb.num_blocks} * (kBlock / wc.ratio)}, kDim, kRope, kv));
      const Tensor topk = sparse ? up(*be, random_topk(rng, hb, wc.ratio, 512)) : Tensor();
      // Sinks up to +-4: comparable with the logits, so a sink that is dropped or added twice
      // shows.
      const Tensor sinks = up(*be, random_f32(rng, {wc.heads}, 4.0f));
      const BatchLayout layout = hb.upload(*be);
      AttentionSpec spec{kWindow, 1.0f / std::sqrt(float(kDim)), wc.ratio, sparse};
      spec.bf16_math = true;
      spec.rope_dim = kRope;
      auto run = [&](cuda::AttentionKernelChoice k) {
        cuda_be.set_attention_kernel(k);
        cuda_be.set_attention_mma_choice({.splits = wc.splits});
        Tensor o = be->to_host(be->attention(q, kv_rows, ring, entries, topk, sinks, layout, spec));
        const bool wgmma = cuda_be.last_attention_wgmma();
        const cuda::AttentionMmaPlan plan = cuda_be.last_attention_plan();
        cuda_be.set_attention_kernel(kernel0);
        cuda_be.set_attention_mma_choice(choice0);
        const cuda::WgmmaPrefetchChoice asked = cuda::wgmma_prefetch_choice(k);
        EXPECT_EQ(wgmma, k == cuda::AttentionKernelChoice::kWgmma || asked.prefetch);
        // V4's fp8 record and bf16 rows both take the prefetching variants: the one asked for
        // must have run.
        EXPECT_EQ(wgmma && plan.prefetch, asked.prefetch);
        EXPECT_EQ(wgmma && plan.pdl, asked.pdl);
        EXPECT_EQ(wgmma && plan.swizzle, asked.swizzle);
        if (wc.splits > 0 && wgmma) {
          EXPECT_GT(plan.splits, 1);
        }
        return o;
      };
      const Tensor ref = run(cuda::AttentionKernelChoice::kMmaSync);
      const Tensor got = run(cuda::AttentionKernelChoice::kWgmma);
      EXPECT_TRUE(bf16_close(ref, got));
      EXPECT_TRUE(same_bytes(got, run(cuda::AttentionKernelChoice::kWgmma)));
      // The prefetching variant runs the same tiles, products and softmax: the same bytes, also
      // as programmatic dependent launches (a kernel that read this call's kv rows before their
      // encoding finished, or a combine that read the splits early, would differ).
      // With the tiles in the 128-byte swizzle the products are the same too (a wrong
      // descriptor or store address would not be).
      for (const cuda::AttentionKernelChoice k :
           {cuda::AttentionKernelChoice::kWgmmaPrefetch,
            cuda::AttentionKernelChoice::kWgmmaPrefetchPdl,
            cuda::AttentionKernelChoice::kWgmmaPrefetchSw128,
            cuda::AttentionKernelChoice::kWgmmaPrefetchSw128Pdl}) {
        SCOPED_TRACE(static_cast<int>(k));
        EXPECT_TRUE(same_bytes(got, run(k)));
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer::backend_ops
