// The small-batch attention's trace instantiations (cuda/attention/sm80/attention_mma_trace.h:
// the mma.sync kernel's 16-head blocks and the separate combine): a traced call writes the same
// output bytes as the untraced one, every split block and combine block of the call leaves a
// record, each record's stamps are in the kernel's program order, and no combine block leaves its
// wait before the last split block has stored its partials. Skips without an sm_90 device, or
// where DEEPINFER_ATTENTION_KERNEL takes the call off the small-batch route.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attention_inputs.h"
#include "compare.h"
#include "cuda/attention/sm80/attention_mma_trace.h"
#include "cuda/backend/cuda_backend.h"
#include "deepinfer/backend.h"
#include "wgmma_backend.h"

namespace deepinfer::backend_ops {
namespace {

struct TraceCase {
  std::string name;
  std::vector<SeqSpec> seqs;
  DType kv;
};

class AttentionMmaTrace : public testing::TestWithParam<TraceCase> {};

TEST_P(AttentionMmaTrace, SameOutputAndRecordsInProgramOrder) {
  const TraceCase& tc = GetParam();
  DEEPINFER_WGMMA_BACKEND_OR_SKIP(cuda_be);
  Backend* be = cuda_be;
  constexpr int kHeads = 64;
  std::mt19937 rng(20261207);
  V4AttentionInputs in(*be, rng, tc.seqs, kHeads, 4, tc.kv);
  in.spec.bf16_output = true;  // the engine's call: the combine writes bf16
  auto call = [&] {
    return be->to_host(be->attention(in.q_f32, in.kv_rows, in.ring, in.entries, in.topk, in.sinks,
                                     in.layout, in.spec));
  };
  const Tensor want = call();
  const cuda::AttentionMmaPlan plan = cuda_be->last_attention_plan();
  if (cuda_be->last_attention_wgmma() || plan.rows != 16 || plan.splits < 2 || plan.fused) {
    // Every case takes it under the default kernel choice (at most kSmallBatchMaxGroups token x
    // 16-head units); another DEEPINFER_ATTENTION_KERNEL may not.
    if (cuda_be->attention_kernel() == cuda::AttentionKernelChoice::kWgmmaOverlapAuto) {
      FAIL() << "the call does not take the small-batch route (mma.sync 16-head blocks, separate "
                "combine) under the default kernel choice";
    }
    GTEST_SKIP() << "the call does not take the small-batch route under "
                    "DEEPINFER_ATTENTION_KERNEL's choice";
  }
  const int blocks = static_cast<int>(in.tokens * plan.head_groups * plan.splits);
  const int combines = static_cast<int>(in.tokens * kHeads);
  const Tensor stamps = be->zeros({cuda::mma_trace_words(blocks, combines)}, DType::kI64);
  cuda_be->set_attention_mma_trace({static_cast<int64_t*>(stamps.raw_data()), blocks, combines});
  const Tensor traced = call();
  cuda_be->set_attention_mma_trace({});
  EXPECT_TRUE(same_bytes(want, traced));

  const Tensor host = be->to_host(stamps);
  const int64_t* w = host.data<int64_t>();
  const std::vector<int64_t> words(w, w + cuda::mma_trace_words(blocks, combines));
  const cuda::MmaTraceSummary s = cuda::summarize_mma_trace(words, blocks, combines);
  EXPECT_EQ(s.blocks, blocks);
  EXPECT_EQ(s.combines, combines);
  for (int b = 0; b < blocks; ++b) {
    const int64_t* r = w + int64_t{b} * cuda::kMmaTraceWords;
    int64_t last = r[cuda::kMmaTraceEntry];
    for (int word = cuda::kMmaTraceTable; word <= cuda::kMmaTraceStored; ++word) {
      if (r[word] == 0) continue;  // a block without keys: no issued, query or first-tile stamp
      EXPECT_GE(r[word], last) << "split block " << b << " word " << word;
      last = r[word];
    }
    EXPECT_GE(r[cuda::kMmaTraceProbe], r[cuda::kMmaTraceWaited]) << "block " << b;
    EXPECT_GE(r[cuda::kMmaTraceTimerWaited], r[cuda::kMmaTraceTimerEntry]) << "block " << b;
    EXPECT_GE(r[cuda::kMmaTraceTimerEnd], r[cuda::kMmaTraceTimerWaited]) << "block " << b;
  }
  const int64_t* cw = w + int64_t{blocks} * cuda::kMmaTraceWords;
  for (int c = 0; c < combines; ++c) {
    const int64_t* r = cw + int64_t{c} * cuda::kCombineTraceWords;
    EXPECT_LE(r[cuda::kCombineTraceEntry], r[cuda::kCombineTraceWaited]) << "combine " << c;
    EXPECT_LE(r[cuda::kCombineTraceWaited], r[cuda::kCombineTraceLoaded]) << "combine " << c;
    EXPECT_LE(r[cuda::kCombineTraceLoaded], r[cuda::kCombineTraceEnd]) << "combine " << c;
  }
  // The combine waits for the split grid: on the device-wide timer every combine block leaves
  // its wait after the last split block's end stamp.
  EXPECT_GE(s.combine_waited.first, s.end.last);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AttentionMmaTrace,
    testing::Values(TraceCase{"b1_fp8", {{4095, 1, 0}}, DType::kU8},
                    TraceCase{"b1_bf16", {{4095, 1, 0}}, DType::kBF16},
                    // Two tokens: 2 x 4 units, the route's most (a B = 2, s_q = 2 case, 16
                    // units, took the wgmma kernel and always skipped).
                    TraceCase{"b2_sq1_fp8", spread_batch(2, 1, 300, 3800), DType::kU8},
                    TraceCase{"b1_sq2_fp8", {{2047, 2, 0}}, DType::kU8}),
    [](const testing::TestParamInfo<TraceCase>& param_info) { return param_info.param.name; });

}  // namespace
}  // namespace deepinfer::backend_ops
