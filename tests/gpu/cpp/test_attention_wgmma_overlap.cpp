// The warp-specialised Hopper attention kernel (cuda/attention/sm90/attention_wgmma_overlap.cu,
// opt-in: DEEPINFER_ATTENTION_KERNEL=wgmma_overlap) against the plain wgmma kernel and the
// mma.sync kernel on the same inputs at V4 widths (64 and 128 heads of 512 channels, W = 128,
// ring 134, CSA ratio 4 with top-512, HCA ratio 128 with dense entries) over bf16 rows and V4's
// fp8 record: decode batches with s_q = 1..4, B up to 128 (several waves of blocks, so the
// producer's buffers turn over many times), random sinks, masked keys (top-k columns of -1,
// sliding keys before position 0), key lists shorter than one tile (an empty split: no tiles at
// all) and forced key splits (the combine kernel). Its tiles, softmax and denominators follow
// the wgmma kernels' arithmetic, so the bytes are expected to equal attention_wgmma_kernel's;
// the scores are one m64n64 product per tile there instead of two m64n32 halves, which the
// hardware is expected to round alike (if only same_bytes fails while bf16_close passes, that
// expectation is what broke, not the kernel's logic). Also: the kernel is deterministic and
// actually ran (the plan says so). One test per case: a case whose barriers deadlock hangs its
// own test (gpu_check.sh runs the binary under a time limit). Agreement with the CPU op: the op
// table (deepinfer_backend_ops) with DEEPINFER_ATTENTION_KERNEL=wgmma_overlap. Skips without a GPU
// or without the wgmma kernels (a build without sm_90a code, a device other than sm_90).
// wgmma_overlap_ilp (the same kernel, branch-free decode, the output staged, and the softmax in
// the key-split kernel's arithmetic with its row sums reduced once) is expected bf16-close, under
// AttentionSpec::bf16_output its own bytes rounded to bf16; the traced instantiations of both
// (fp8) give their kernel's bytes, with stamps in each role's program order. With q in bf16 (f32 q
// rounded, as rms_norm_rope's bf16 output) every kernel gives f32 q's bytes: the overlap kernels
// copy it as their tile, the others read it widened.
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
#include "overlap_trace_check.h"
#include "wgmma_backend.h"

namespace deepinfer::backend_ops {
namespace {

struct OverlapCase {
  std::string name;
  std::vector<SeqSpec> seqs;
  int heads = 64;
  int ratio = 4;       // 4: sparse top-512 (CSA); 128: dense entries (HCA)
  int64_t splits = 0;  // forced key splits (DEEPINFER_ATTENTION_SPLITS); 0: the plan's own
};

std::vector<OverlapCase> overlap_cases() {
  return {
      {"b1_decode", {{4095, 1, 0}}},
      {"b1_sq4", {{3000, 4, 0}}},
      {"b3_sq3", spread_batch(3, 3)},
      {"b3_sq2_split3", spread_batch(3, 2), 64, 4, 3},
      {"b64_decode", spread_batch(64, 1)},
      {"b64_sq2", spread_batch(64, 2)},
      {"b128_decode", spread_batch(128, 1)},
      // Position 0 and 5: fewer keys than one tile (1 and 6 sliding keys, 0 and 1 entries);
      // with 4 forced splits most splits have no tile at all.
      {"short_lists_split4", {{0, 1, 0}, {5, 1, 1}, {60, 2, 2}}, 64, 4, 4},
      {"h128_b3", spread_batch(3, 1), 128},
      {"hca_dense_b3", spread_batch(3, 2), 64, 128},
  };
}

class AttentionWgmmaOverlap : public testing::TestWithParam<std::tuple<DType, OverlapCase>> {};

TEST_P(AttentionWgmmaOverlap, MatchesTheWgmmaKernels) {
  const DType kv = std::get<0>(GetParam());
  const OverlapCase& wc = std::get<1>(GetParam());
  DEEPINFER_WGMMA_BACKEND_OR_SKIP(wgmma_be);
  cuda::CudaBackend& cuda_be = *wgmma_be;
  Backend* be = wgmma_be;
  const cuda::AttentionKernelChoice kernel0 = cuda_be.attention_kernel();
  const cuda::AttentionMmaChoice choice0 = cuda_be.attention_mma_choice();
  std::mt19937 rng(20261212);
  V4AttentionInputs in(*be, rng, wc.seqs, wc.heads, wc.ratio, kv);
  const Tensor& q_f32 = in.q_f32;
  Tensor q = q_f32;  // the runs' q: f32, or below bf16
  const Tensor &kv_rows = in.kv_rows, &ring = in.ring, &entries = in.entries, &topk = in.topk,
               &sinks = in.sinks;
  const BatchLayout& layout = in.layout;
  AttentionSpec& spec = in.spec;
  auto run = [&](cuda::AttentionKernelChoice k) {
    cuda_be.set_attention_kernel(k);
    cuda_be.set_attention_mma_choice({.splits = wc.splits});
    Tensor o = be->to_host(be->attention(q, kv_rows, ring, entries, topk, sinks, layout, spec));
    const bool wgmma = cuda_be.last_attention_wgmma();
    const cuda::AttentionMmaPlan plan = cuda_be.last_attention_plan();
    cuda_be.set_attention_kernel(kernel0);
    cuda_be.set_attention_mma_choice(choice0);
    const bool overlap_asked = k == cuda::AttentionKernelChoice::kWgmmaOverlap ||
                               k == cuda::AttentionKernelChoice::kWgmmaOverlapIlp;
    EXPECT_EQ(wgmma && plan.overlap, overlap_asked);
    EXPECT_EQ(wgmma && plan.ilp, k == cuda::AttentionKernelChoice::kWgmmaOverlapIlp);
    if (wc.splits > 0 && wgmma) {
      EXPECT_GT(plan.splits, 1);
    }
    return o;
  };
  const Tensor got = run(cuda::AttentionKernelChoice::kWgmmaOverlap);
  EXPECT_TRUE(bf16_close(run(cuda::AttentionKernelChoice::kMmaSync), got));
  EXPECT_TRUE(same_bytes(run(cuda::AttentionKernelChoice::kWgmma), got));
  EXPECT_TRUE(same_bytes(got, run(cuda::AttentionKernelChoice::kWgmmaOverlap)));
  // The ilp variant: its softmax in another arithmetic, bf16-close; deterministic.
  const Tensor ilp = run(cuda::AttentionKernelChoice::kWgmmaOverlapIlp);
  EXPECT_TRUE(bf16_close(got, ilp));
  EXPECT_TRUE(same_bytes(ilp, run(cuda::AttentionKernelChoice::kWgmmaOverlapIlp)));
  // AttentionSpec::bf16_output: the ilp variant returns its values rounded to bf16 (its epilogue
  // with one split, the combine with several); another kernel keeps f32.
  spec.bf16_output = true;
  const Tensor ilp_bf16 = run(cuda::AttentionKernelChoice::kWgmmaOverlapIlp);
  EXPECT_EQ(ilp_bf16.dtype(), DType::kBF16);
  EXPECT_TRUE(same_bytes(ilp.to(DType::kBF16), ilp_bf16));
  EXPECT_TRUE(same_bytes(got, run(cuda::AttentionKernelChoice::kWgmmaOverlap)));
  spec.bf16_output = false;
  // bf16 q (the engine's, rms_norm_rope under bf16_output): the overlap kernels copy it into the
  // tile they round f32 q into, and the op widens it for the other kernels, which round it back;
  // the same bytes either way.
  q = up_same(*be, be->to_host(q_f32).to(DType::kBF16));
  EXPECT_TRUE(same_bytes(got, run(cuda::AttentionKernelChoice::kWgmmaOverlap)));
  EXPECT_TRUE(same_bytes(ilp, run(cuda::AttentionKernelChoice::kWgmmaOverlapIlp)));
  EXPECT_TRUE(same_bytes(got, run(cuda::AttentionKernelChoice::kWgmma)));
  spec.bf16_output = true;
  EXPECT_TRUE(same_bytes(ilp_bf16, run(cuda::AttentionKernelChoice::kWgmmaOverlapIlp)));
  spec.bf16_output = false;
  q = q_f32;
  if (kv != DType::kU8) return;
  // The traced instantiations (fp8 only) of both: their kernel's bytes, and each traced block's
  // stamps in program order per role and tile.
  constexpr int kCtas = 4;
  for (const cuda::AttentionKernelChoice k : {cuda::AttentionKernelChoice::kWgmmaOverlap,
                                              cuda::AttentionKernelChoice::kWgmmaOverlapIlp}) {
    const Tensor stamps = be->zeros({cuda::overlap_trace_words(kCtas)}, DType::kI64);
    cuda_be.set_attention_trace({static_cast<int64_t*>(stamps.raw_data()), kCtas});
    const Tensor traced = run(k);
    cuda_be.set_attention_trace({});
    EXPECT_TRUE(same_bytes(k == cuda::AttentionKernelChoice::kWgmmaOverlapIlp ? ilp : got, traced));
    const Tensor host = be->to_host(stamps);
    expect_trace_in_program_order(host.data<int64_t>(), kCtas);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AttentionWgmmaOverlap,
    testing::Combine(testing::Values(DType::kBF16, DType::kU8), testing::ValuesIn(overlap_cases())),
    [](const testing::TestParamInfo<AttentionWgmmaOverlap::ParamType>& param_info) {
      return (std::get<0>(param_info.param) == DType::kU8 ? std::string("fp8_")
                                                          : std::string("bf16_")) +
             std::get<1>(param_info.param).name;
    });

}  // namespace
}  // namespace deepinfer::backend_ops
