// The warp-specialised Hopper attention kernel's cluster-pair mode
// (cuda/attention/sm90/attention_wgmma_overlap.cu with kPair, opt-in:
// DEEPINFER_ATTENTION_KERNEL=wgmma_overlap_pair) against the unpaired ilp kernel
// (wgmma_overlap_ilp) on the same inputs: at 128 heads or a multiple the two blocks of a token's
// 128 heads are one cluster, each producer loading and decoding half of every key tile into both
// blocks' buffers (st.async into the peer, completing on its mbarriers); the tiles, products and
// softmax are the unpaired ilp kernel's, so the outputs must be the same bytes (and bf16-close to
// the plain wgmma_overlap kernel's, whose softmax arithmetic differs). Cases at V4 widths (512
// channels, W = 128, ring 134, CSA ratio 4 with top-512, HCA ratio 128 with dense entries) over
// bf16 rows and V4's fp8 record: s_q 1 to 4, B = 1, 3, 64 and 128 (many tiles per buffer, so both
// mbarrier parities turn over), masked keys (top-k columns of -1, sliding keys before position
// 0), key lists shorter than a tile, forced key splits (most of them empty for the short
// lists: no tile at all in either block), random sinks; 256 heads (two clusters per token);
// 192 heads, which the pair does not take (the unpaired kernel runs). Also against the
// mma.sync kernel (bf16 closeness) and run twice (a tile read before the peer's half landed
// would differ from run to run). One test per format and case, so a case that hangs (a wait
// without its arrivals) names itself; gpu_check.sh runs the binary under a time limit. Skips
// without a GPU or without the wgmma kernels (a build without sm_90a code, a device other than
// sm_90). Also: the default kernel choice (auto: pairs over fp8 only), the bf16 output (the f32
// bytes rounded, a cluster per unit or, wgmma_overlap_pair_blocks, forced), q in bf16 (f32 q
// rounded: the same bytes; over fp8 with bf16 output the persistent launch, whose clusters walk
// several units when there are more than fit at once, B >= 128 here, also with some units of
// one tile among long ones) and the traced pair (fp8: the same bytes, its stamps in program
// order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "batch_layout.h"
#include "compare.h"
#include "cuda/attention/sm90/attention_wgmma_config.h"
#include "cuda/backend/cuda_backend.h"
#include "deepinfer/backend.h"
#include "device_backends.h"
#include "inputs.h"
#include "kv_inputs.h"
#include "overlap_trace_check.h"
#include "wgmma_backend.h"

namespace deepinfer::backend_ops {
namespace {

struct OverlapPairCase {
  std::string name;
  std::vector<SeqSpec> seqs;
  int heads = 128;
  int ratio = 4;       // 4: sparse top-512 (CSA); 128: dense entries (HCA)
  int64_t splits = 0;  // forced key splits (DEEPINFER_ATTENTION_SPLITS); 0: the plan's own
};

// Decode rows of `batch` sequences at spread-out contexts (as the op table's decode_seqs).
std::vector<SeqSpec> spread_seqs(int batch, int s_q) {
  std::vector<SeqSpec> seqs;
  for (int i = 0; i < batch; ++i) seqs.push_back({200 + (i * 997) % 3900, s_q, i});
  return seqs;
}

// As spread_seqs, with every fifth sequence at position 0 .. 6 (one tile among long lists).
std::vector<SeqSpec> mixed_seqs(int batch) {
  std::vector<SeqSpec> seqs = spread_seqs(batch, 1);
  for (int i = 0; i < batch; i += 5) seqs[i].ctx = i % 7;
  return seqs;
}

std::vector<OverlapPairCase> overlap_pair_cases() {
  return {
      {"b1_decode", {{4095, 1, 0}}},
      {"b1_sq4", {{3000, 4, 0}}},
      {"b3_sq3", spread_seqs(3, 3)},
      {"b3_sq2_split3", spread_seqs(3, 2), 128, 4, 3},
      {"b3_decode_split7", spread_seqs(3, 1), 128, 4, 7},
      {"b64_decode", spread_seqs(64, 1)},
      {"b64_sq2", spread_seqs(64, 2)},
      {"b128_decode", spread_seqs(128, 1)},
      {"b300_decode", spread_seqs(300, 1)},
      {"b200_mixed_lengths", mixed_seqs(200)},
      // Position 0 and 5: fewer keys than one tile (1 and 6 sliding keys, 0 and 1 entries); with
      // 4 forced splits most splits have no tile at all.
      {"short_lists_split4", {{0, 1, 0}, {5, 1, 1}, {60, 2, 2}}, 128, 4, 4},
      {"h256_b3_sq2", spread_seqs(3, 2), 256},
      {"h256_b64_decode", spread_seqs(64, 1), 256},
      {"h192_b3_unpaired", spread_seqs(3, 1), 192},
      {"hca_dense_b3_sq2", spread_seqs(3, 2), 128, 128},
  };
}

// Random rows of `dim` channels as a cache of `kv` holds them.
Tensor random_kv_rows(std::mt19937& rng, const Shape& lead, int64_t dim, int rope, DType kv) {
  Shape shape = lead;
  shape.push_back(dim);
  return encode_kv_rows(random_f32(rng, shape), kv, rope);
}

class AttentionWgmmaOverlapPair
    : public testing::TestWithParam<std::tuple<DType, OverlapPairCase>> {};

TEST_P(AttentionWgmmaOverlapPair, GivesTheUnpairedKernelsBytes) {
  const DType kv = std::get<0>(GetParam());
  const OverlapPairCase& pc = std::get<1>(GetParam());
  DEEPINFER_WGMMA_BACKEND_OR_SKIP(wgmma_be);
  cuda::CudaBackend& cuda_be = *wgmma_be;
  Backend* be = wgmma_be;
  const cuda::AttentionKernelChoice kernel0 = cuda_be.attention_kernel();
  const cuda::AttentionMmaChoice choice0 = cuda_be.attention_mma_choice();
  constexpr int kDim = 512, kRope = 64, kWindow = 128, kRingLen = 134, kBlock = 128;
  std::mt19937 rng(20261213);
  const HostBatch hb(rng, pc.seqs, kBlock);
  const int64_t tokens = hb.num_tokens();
  int slots = 0;
  for (const SeqSpec& s : pc.seqs) slots = std::max(slots, s.slot + 1);
  const bool sparse = pc.ratio == 4;
  const Tensor q_f32 = up(*be, random_f32(rng, {tokens, pc.heads, kDim}));
  Tensor q = q_f32;  // the runs' q: f32, or below bf16
  const Tensor kv_rows = up(*be, random_f32(rng, {tokens, kDim}));
  const Tensor ring = up_same(*be, random_kv_rows(rng, {slots, kRingLen}, kDim, kRope, kv));
  const Tensor entries = up_same(
      *be, random_kv_rows(rng, {int64_t{hb.num_blocks} * (kBlock / pc.ratio)}, kDim, kRope, kv));
  const Tensor topk = sparse ? up(*be, random_topk(rng, hb, pc.ratio, 512)) : Tensor();
  // Sinks up to +-4: comparable with the logits, so a sink dropped or added twice shows.
  const Tensor sinks = up(*be, random_f32(rng, {pc.heads}, 4.0f));
  const BatchLayout layout = hb.upload(*be);
  AttentionSpec spec{kWindow, 1.0f / std::sqrt(float(kDim)), pc.ratio, sparse};
  spec.bf16_math = true;
  spec.rope_dim = kRope;
  cuda::AttentionMmaPlan plan;
  bool wgmma = false;
  auto run = [&](cuda::AttentionKernelChoice k) {
    cuda_be.set_attention_kernel(k);
    cuda_be.set_attention_mma_choice({.splits = pc.splits});
    Tensor o = be->to_host(be->attention(q, kv_rows, ring, entries, topk, sinks, layout, spec));
    wgmma = cuda_be.last_attention_wgmma();
    plan = cuda_be.last_attention_plan();
    cuda_be.set_attention_kernel(kernel0);
    cuda_be.set_attention_mma_choice(choice0);
    return o;
  };
  // The byte reference: the unpaired ilp kernel (the pairs run its decode and softmax).
  const Tensor ref = run(cuda::AttentionKernelChoice::kWgmmaOverlapIlp);
  const cuda::AttentionMmaPlan ref_plan = plan;
  EXPECT_TRUE(wgmma && ref_plan.overlap && ref_plan.ilp && !ref_plan.pair);
  EXPECT_TRUE(bf16_close(run(cuda::AttentionKernelChoice::kWgmmaOverlap), ref));
  const Tensor got = run(cuda::AttentionKernelChoice::kWgmmaOverlapPair);
  // The pair ran where it takes the heads (the unpaired kernel elsewhere), with its splits.
  EXPECT_TRUE(wgmma && plan.overlap);
  EXPECT_EQ(plan.pair, cuda::wgmma_pair_takes(pc.heads));
  EXPECT_TRUE(plan.ilp);  // pairs or not, the integer decode (the same bytes)
  EXPECT_EQ(plan.splits, ref_plan.splits);
  if (pc.splits > 0) {
    EXPECT_GT(plan.splits, 1);
  }
  EXPECT_TRUE(same_bytes(ref, got));
  EXPECT_TRUE(same_bytes(got, run(cuda::AttentionKernelChoice::kWgmmaOverlapPair)));
  EXPECT_TRUE(bf16_close(run(cuda::AttentionKernelChoice::kMmaSync), got));
  // The default (auto): mma.sync's 16-head blocks at small batches (bf16-close), pairs over fp8
  // records where they take the heads, over bf16 rows the key-split kernel where auto takes it
  // (bf16-close), else the unpaired ilp kernel (the same bytes).
  const Tensor automatic = run(cuda::AttentionKernelChoice::kWgmmaOverlapAuto);
  const bool auto_small_batch = cuda::small_batch_mma_takes(tokens, pc.heads, kDim);
  const bool auto_keysplit =
      !auto_small_batch && kv == DType::kBF16 &&
      cuda::keysplit_auto_takes(tokens, static_cast<int64_t>(pc.seqs.size()), ref_plan.splits);
  EXPECT_EQ(plan.keysplit, auto_keysplit);
  if (auto_small_batch) {
    EXPECT_FALSE(wgmma);
    EXPECT_EQ(plan.rows, 16);
    EXPECT_TRUE(bf16_close(automatic, got));
  } else if (auto_keysplit) {
    EXPECT_TRUE(bf16_close(automatic, got));
  } else {
    EXPECT_TRUE(same_bytes(got, automatic));
    EXPECT_TRUE(wgmma && plan.overlap && plan.ilp);
    EXPECT_EQ(plan.pair, kv == DType::kU8 && cuda::wgmma_pair_takes(pc.heads));
  }
  // AttentionSpec::bf16_output: the same values rounded to bf16 (the pairs run the ilp epilogue).
  spec.bf16_output = true;
  const Tensor got_bf16 = run(cuda::AttentionKernelChoice::kWgmmaOverlapPair);
  spec.bf16_output = false;
  EXPECT_EQ(got_bf16.dtype(), DType::kBF16);
  EXPECT_TRUE(same_bytes(got.to(DType::kBF16), got_bf16));
  EXPECT_EQ(plan.persistent, plan.pair);
  // A cluster per unit: the same bytes.
  spec.bf16_output = true;
  const Tensor blocks_bf16 = run(cuda::AttentionKernelChoice::kWgmmaOverlapPairBlocks);
  spec.bf16_output = false;
  EXPECT_TRUE(plan.pair == cuda::wgmma_pair_takes(pc.heads) && !plan.persistent);
  EXPECT_TRUE(same_bytes(got_bf16, blocks_bf16));
  // bf16 q (f32 q rounded, as rms_norm_rope's bf16 output): copied as the q tile, at the start
  // and (persistent: bf16 q and output over fp8) between units; the same bytes.
  q = up_same(*be, be->to_host(q_f32).to(DType::kBF16));
  EXPECT_TRUE(same_bytes(got, run(cuda::AttentionKernelChoice::kWgmmaOverlapPair)));
  spec.bf16_output = true;
  EXPECT_TRUE(same_bytes(got_bf16, run(cuda::AttentionKernelChoice::kWgmmaOverlapPair)));
  EXPECT_EQ(plan.persistent, plan.pair);
  EXPECT_TRUE(same_bytes(got_bf16, run(cuda::AttentionKernelChoice::kWgmmaOverlapPairBlocks)));
  spec.bf16_output = false;
  q = q_f32;
  if (kv != DType::kU8 || !plan.pair) return;
  // The traced pair (fp8): the same bytes, and each traced block's stamps in program order.
  constexpr int kCtas = 4;
  const Tensor stamps = be->zeros({cuda::overlap_trace_words(kCtas)}, DType::kI64);
  cuda_be.set_attention_trace({static_cast<int64_t*>(stamps.raw_data()), kCtas});
  const Tensor traced = run(cuda::AttentionKernelChoice::kWgmmaOverlapPair);
  cuda_be.set_attention_trace({});
  EXPECT_TRUE(same_bytes(got, traced));
  expect_trace_in_program_order(be->to_host(stamps).data<int64_t>(), kCtas);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AttentionWgmmaOverlapPair,
    testing::Combine(testing::Values(DType::kBF16, DType::kU8),
                     testing::ValuesIn(overlap_pair_cases())),
    [](const testing::TestParamInfo<AttentionWgmmaOverlapPair::ParamType>& param_info) {
      return (std::get<0>(param_info.param) == DType::kU8 ? std::string("fp8_")
                                                          : std::string("bf16_")) +
             std::get<1>(param_info.param).name;
    });

}  // namespace
}  // namespace deepinfer::backend_ops
