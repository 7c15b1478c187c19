// The wgmma scores of fp8 index keys (cuda/indexer/indexer_score_wgmma.cu) against the mma.sync
// kernel's (indexer_score_mma.cu) on the same inputs, both forced through indexer_topk_run
// whatever DEEPINFER_INDEXER_FP8_SCORES says: V4's 64 heads of 128 over fp8 caches at ratio 4
// (records copied in runs of a block) and 128 (key by key), decode rows of B = 1, 3 and 64 whose
// contexts end mid-block, and a prefill chunk. Both kernels split q the same way (f16 hi + lo
// after the same power-of-two head scale) and keep exact products, so integer inputs (the op
// table's exact rows) give bit-identical scores and the same top-k; random floats differ by
// summation order only. The measurement variant with q's lo parts in e4m3 is checked too (exact
// on integers, within its 15 bits on floats). Their agreement with the CPU op is the op table's
// (kv_fp8_wgmma_ rows: the pipelined kernel by default, this one with
// DEEPINFER_INDEXER_FP8_SCORES=wgmma). Skips without a GPU or off
// sm_90. Also: the switch is read when a backend is created, and an unknown value is refused
// there, naming the variable and the value.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/backend/cuda_backend.h"
#include "cuda/indexer/indexer_options.h"
#include "deepinfer/backend.h"
#include "device_backends.h"
#include "error_message.h"
#include "indexer_rows.h"
#include "inputs.h"
#include "scoped_env.h"

namespace deepinfer::backend_ops {
namespace {

struct WgmmaCase {
  std::string name;
  std::vector<SeqSpec> seqs;
  int ratio;
  bool integers;
};

// A CUDA backend created with DEEPINFER_INDEXER_FP8_SCORES set to `value` (null: unset).
std::unique_ptr<Backend> cuda_backend_with_fp8_scores(const char* value) {
  const ScopedEnv env("DEEPINFER_INDEXER_FP8_SCORES", value);
  return make_backend("cuda");
}

TEST(IndexerWgmma, Fp8ScoresSwitchIsReadWhenTheBackendIsCreated) {
  std::string why;
  if (shared_backend("cuda", &why) == nullptr) {
    if (device_required()) FAIL() << why;
    GTEST_SKIP() << why;
  }
  using cuda::IndexerFp8Scores;
  const auto scores_of = [](const std::unique_ptr<Backend>& be) {
    return dynamic_cast<const cuda::CudaBackend&>(*be).indexer_fp8_scores();
  };
  EXPECT_EQ(scores_of(cuda_backend_with_fp8_scores(nullptr)),
            IndexerFp8Scores::kWgmmaPersistentFp8);
  EXPECT_EQ(scores_of(cuda_backend_with_fp8_scores("wgmma_pipelined")),
            IndexerFp8Scores::kWgmmaPipelined);
  EXPECT_EQ(scores_of(cuda_backend_with_fp8_scores("wgmma")), IndexerFp8Scores::kWgmma);
  // The value at creation stays the backend's: a later change of the variable does not reach it.
  const std::unique_ptr<Backend> mma = cuda_backend_with_fp8_scores("mma_sync");
  {
    const ScopedEnv later("DEEPINFER_INDEXER_FP8_SCORES", "wgmma");
    EXPECT_EQ(scores_of(mma), IndexerFp8Scores::kMmaSync);
  }
  const std::string m = testing::error_message([] { (void)cuda_backend_with_fp8_scores("mma"); });
  EXPECT_NE(m.find("DEEPINFER_INDEXER_FP8_SCORES"), std::string::npos) << m;
  EXPECT_NE(m.find("'mma'"), std::string::npos) << m;
}

TEST(IndexerWgmma, ScoresMatchTheMmaSyncKernel) {
  std::string why;
  Backend* be = shared_backend("cuda", &why);
  if (be == nullptr) {
    if (device_required()) FAIL() << why;
    GTEST_SKIP() << why;
  }
  auto& cuda_be = dynamic_cast<cuda::CudaBackend&>(*be);
  if (!cuda::indexer_wgmma_runs(cuda_be)) GTEST_SKIP() << "wgmma needs an sm_90 device";
  std::vector<SeqSpec> b64, b64_floats;
  for (int b = 0; b < 64; ++b) {
    b64.push_back({300 + 61 * b, 1, b});
    b64_floats.push_back({500 + 97 * b, 1, b});
  }
  const std::vector<WgmmaCase> cases = {
      {"b1_ctx32768", {{32767, 1, 0}}, 4, true},
      {"b1_mid_block", {{9999, 1, 0}}, 4, true},
      {"b3_mid_block", {{5000, 1, 0}, {777, 1, 1}, {12345, 1, 2}}, 4, true},
      {"b64_mid_block", b64, 4, true},
      {"prefill", {{2000, 37, 0}, {130, 3, 1}}, 4, true},
      {"ratio128", {{20000, 1, 0}, {9000, 3, 1}, {100, 1, 2}}, 128, true},
      {"b1_floats", {{32767, 1, 0}}, 4, false},
      {"b64_floats", b64_floats, 4, false},
      {"ratio128_floats", {{20000, 1, 0}, {9000, 3, 1}}, 128, false},
  };
  std::mt19937 rng(20261202);
  for (const WgmmaCase& wc : cases) {
    SCOPED_TRACE(wc.name);
    Indexer c;
    c.cache = DType::kU8;
    c.block = 128;
    c.heads = 64;
    c.dim = 128;
    c.ratio = wc.ratio;
    c.integers = wc.integers;
    c.seqs = wc.seqs;
    const IndexerIn in = draw_indexer(c, rng);
    const Tensor q = up(*be, in.q), w = up(*be, in.w), cache = up_same(*be, in.cache);
    const BatchLayout layout = in.hb.upload(*be);
    const int64_t tokens = in.hb.num_tokens();
    const int64_t bound = int64_t{in.hb.max_blocks} * (c.block / c.ratio);
    const float sscale = 0.0625f, wscale = 0.125f;
    constexpr int kTopK = 512;
    using K = cuda::IndexerScoreKernel;
    // Each kernel's scores ([tokens, bound], all tokens in one group) and the whole op's top-k.
    auto scores_of = [&](K kernel) {
      Tensor s = be->zeros({tokens, bound}, DType::kF32);
      cuda::IndexerRunOptions opt;
      opt.score_kernel = kernel;
      opt.run_select = false;
      opt.scores = s.data<float>();
      (void)cuda::indexer_topk_run(cuda_be, q, w, cache, layout, c.ratio, kTopK, sscale, wscale,
                                   opt);
      return be->to_host(s);
    };
    auto top_k_of = [&](K kernel) {
      cuda::IndexerRunOptions opt;
      opt.score_kernel = kernel;
      return be->to_host(cuda::indexer_topk_run(cuda_be, q, w, cache, layout, c.ratio, kTopK,
                                                sscale, wscale, opt));
    };
    const Tensor want = scores_of(K::kTensorCoreMmaSync);
    // The lo-e4m3 variant (q to 15 significant bits): integer q has no lo part, so it is exact
    // there too; random floats within 2^-15 of each product's size, at most 2.4e-4 here.
    for (const auto& [kernel, tol] :
         {std::pair{K::kTensorCoreWgmma, 1e-5}, std::pair{K::kTensorCoreWgmmaLoE4m3, 5e-4}}) {
      SCOPED_TRACE(kernel == K::kTensorCoreWgmma ? "wgmma" : "wgmma, lo in e4m3");
      const Tensor got = scores_of(kernel);
      const float* wp = want.data<float>();
      const float* gp = got.data<float>();
      int64_t checked = 0;
      for (int64_t t = 0; t < tokens; ++t) {
        const int64_t visible =
            std::min<int64_t>((in.hb.positions[size_t(t)] + 1) / c.ratio, bound);
        for (int64_t j = 0; j < visible; ++j) {
          const float a = wp[t * bound + j], b = gp[t * bound + j];
          if (wc.integers) {
            ASSERT_EQ(a, b) << "token " << t << " entry " << j;
          } else {
            ASSERT_NEAR(a, b, tol * (1.0 + std::fabs(a))) << "token " << t << " entry " << j;
          }
          ++checked;
        }
      }
      EXPECT_GT(checked, 0);
    }
    if (wc.integers) {
      const Tensor ia = top_k_of(K::kTensorCoreMmaSync), ib = top_k_of(K::kTensorCoreWgmma);
      for (int64_t i = 0; i < ia.numel(); ++i) {
        ASSERT_EQ(ia.data<int32_t>()[i], ib.data<int32_t>()[i]) << "top-k slot " << i;
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer::backend_ops
