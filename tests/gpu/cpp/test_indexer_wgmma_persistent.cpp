// The persistent wgmma scores of fp8 index keys (cuda/indexer/indexer_score_wgmma_persistent.cu)
// against the pipelined kernel's (indexer_score_wgmma_pipelined.cu), both forced
// through indexer_topk_run with q in fp8 (quantize_indexer_q on the device): the persistent
// kernel's header says why its scores are the pipelined kernel's bytes (its integer key
// conversion gives each code times 2^-8, its q columns and key scales undo that exactly), so the
// scores must be the same bytes, -inf of unmapped keys included, and the op's top-k the same.
// Both conversion splits are checked (3 of 8 k-steps through cvt, and all 8). Random paged inputs
// at V4's shape (64 heads of 128, ratio 4, 128-token blocks: runs of 32 records): B = 1 and 64 at
// 4K and 32K, lengths off the 64-key tile, masked block-table entries, rows with no visible key,
// a prefill chunk whose rows walk many tiles, a chunk of short rows (many tokens per block,
// rows with no tile between them: the token walk), and 200 rows of spread lengths (more tokens
// than SMs). The prefill chunk of short rows (705 tokens) is the one case with more tokens than
// the block has threads, so its blocks walk the tokens from the positions in global memory; every
// other case walks the prologue's tables in shared memory. One TEST per case, so that a hang names
// its case. Also: the switch (DEEPINFER_INDEXER_FP8_SCORES=wgmma_persistent) runs it by default
// for q in fp8 and keeps the pipelined kernel for q in f32; forcing it on f32 q is refused; and
// the default scores right after the quantization of their q (the kernel waits for the previous
// grid after its prologue). Skips without a GPU or off sm_90. Host inputs: as
// test_indexer_wgmma_pipelined.cpp (a second or two for the 32K cases). The fp8-MMA variant (no
// key conversion; the default for q in fp8) is held to a tolerance instead (Fp8MmaScoresAreClose).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/backend/cuda_backend.h"
#include "cuda/indexer/indexer_options.h"
#include "deepinfer/backend.h"
#include "deepinfer/error.h"
#include "device_backends.h"
#include "indexer_rows.h"
#include "inputs.h"
#include "scoped_env.h"

namespace deepinfer::backend_ops {
namespace {

using K = cuda::IndexerScoreKernel;
constexpr float kScoreScale = 0.0625f;
constexpr float kWeightScale = 0.125f;
constexpr int kTopK = 512;
constexpr int kRatio = 4;
constexpr int kBlock = 128;

struct PersistentCase {
  std::string name;
  std::vector<SeqSpec> seqs;
  bool integers = false;
  bool masked = false;  // some block-table entries negative or past the cache
};

// Every seventh column of every third sequence's block table negative, every eleventh past the
// cache (the kernels score their keys -inf).
void mask_blocks(HostBatch& hb) {
  for (size_t b = 0; b < hb.seqs.size(); b += 3) {
    for (int i = 0; i < hb.max_blocks; ++i) {
      int32_t& e = hb.block_table[b * static_cast<size_t>(hb.max_blocks) + static_cast<size_t>(i)];
      if (i % 7 == 3) e = -1;
      if (i % 11 == 5) e = hb.num_blocks + 2 + i;
    }
  }
}

std::vector<PersistentCase> persistent_cases() {
  std::vector<SeqSpec> b64_4k, b64_32k, b64_masked, b200;
  for (int b = 0; b < 64; ++b) {
    b64_4k.push_back({4095 - 37 * (b % 5), 1, b});
    b64_32k.push_back({32767 - 61 * b, 1, b});
    // Rows 0 and 1 see no key (positions 0 and 2: (p + 1) / 4 = 0).
    b64_masked.push_back({b == 0 ? 0 : b == 1 ? 2 : 4000 + 97 * b, 1, b});
  }
  for (int b = 0; b < 200; ++b) b200.push_back({50 + 173 * b, 1, b});
  return {
      {"b1_ctx4096", {{4095, 1, 0}}},
      {"b1_ctx32768", {{32767, 1, 0}}},
      {"b1_ctx_off_tile", {{32599, 1, 0}}},  // 8150 keys: 22 past the last tile
      {"b1_integers_masked", {{32599, 1, 0}}, true, true},
      {"b1_empty_row", {{1, 1, 0}}},
      {"b64_ctx4096", b64_4k},
      {"b64_ctx32768", b64_32k},
      {"b64_masked_and_empty", b64_masked, false, true},
      {"prefill_32k", {{32000, 40, 0}, {5000, 3, 1}}, false, true},
      {"prefill_short_rows", {{0, 700, 0}, {3000, 5, 1}}},
      {"b200_spread", b200, false, true},
  };
}

// A CUDA backend created with DEEPINFER_INDEXER_FP8_SCORES set to `value`.
std::unique_ptr<Backend> cuda_backend_with_fp8_scores(const char* value) {
  const ScopedEnv env("DEEPINFER_INDEXER_FP8_SCORES", value);
  return make_backend("cuda");
}

// The first float of `got` whose bytes differ from `want`'s, as a message ("" when none).
std::string first_difference(const Tensor& want, const Tensor& got, int64_t row) {
  const float* w = want.data<float>();
  const float* g = got.data<float>();
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (std::memcmp(w + i, g + i, sizeof(float)) != 0) {
      return "token " + std::to_string(i / row) + " entry " + std::to_string(i % row) + ": " +
             std::to_string(w[i]) + " vs " + std::to_string(g[i]);
    }
  }
  return "";
}

// The inputs of one case on one backend: q in fp8 unless f32_q.
struct OnDevice {
  Tensor q, w, cache;
  BatchLayout layout;
};

OnDevice upload(Backend& be, const IndexerIn& in, bool f32_q) {
  OnDevice d;
  d.q = up(be, in.q);
  d.w = up(be, in.w);
  if (!f32_q) {
    IndexerQFp8 q8 = be.quantize_indexer_q(d.q, d.w);
    d.q = std::move(q8.q);
    d.w = std::move(q8.weights);
  }
  d.cache = up_same(be, in.cache);
  d.layout = in.hb.upload(be);
  return d;
}

// The scores of `kernel` ([tokens, bound], all tokens in one group, zeros where not scored).
Tensor scores_of(cuda::CudaBackend& be, K kernel, const OnDevice& d, int64_t tokens,
                 int64_t bound) {
  Tensor s = be.zeros({tokens, bound}, DType::kF32);
  cuda::IndexerRunOptions opt;
  opt.score_kernel = kernel;
  opt.run_select = false;
  opt.scores = s.data<float>();
  (void)cuda::indexer_topk_run(be, d.q, d.w, d.cache, d.layout, kRatio, kTopK, kScoreScale,
                               kWeightScale, opt);
  return be.to_host(s);
}

Tensor top_k_of(cuda::CudaBackend& be, K kernel, const OnDevice& d) {
  cuda::IndexerRunOptions opt;
  opt.score_kernel = kernel;
  return be.to_host(cuda::indexer_topk_run(be, d.q, d.w, d.cache, d.layout, kRatio, kTopK,
                                           kScoreScale, kWeightScale, opt));
}

IndexerIn draw_case(const PersistentCase& pc, std::mt19937& rng) {
  Indexer c;
  c.cache = DType::kU8;
  c.block = kBlock;
  c.heads = 64;
  c.dim = 128;
  c.ratio = kRatio;
  c.integers = pc.integers;
  c.seqs = pc.seqs;
  IndexerIn in = draw_indexer(c, rng);
  if (pc.masked) mask_blocks(in.hb);
  return in;
}

// The CUDA backend on an sm_90 device, or null after skipping (or failing where a device is
// required).
cuda::CudaBackend* wgmma_backend() {
  std::string why;
  Backend* be = shared_backend("cuda", &why);
  if (be == nullptr) {
    if (device_required()) ADD_FAILURE() << why;
    return nullptr;
  }
  auto& cuda_be = dynamic_cast<cuda::CudaBackend&>(*be);
  return cuda::indexer_wgmma_runs(cuda_be) ? &cuda_be : nullptr;
}

// A case drawn (seed 20261213) and uploaded (q in fp8), with its scores rows' shape.
struct Drawn {
  Drawn(cuda::CudaBackend& be, const PersistentCase& pc, std::mt19937 rng = std::mt19937(20261213))
      : in(draw_case(pc, rng)),
        d(upload(be, in, /*f32_q=*/false)),
        tokens(in.hb.num_tokens()),
        bound(int64_t{in.hb.max_blocks} * (kBlock / kRatio)) {}
  IndexerIn in;
  OnDevice d;
  int64_t tokens;
  int64_t bound;
};

// kAuto's scores on a backend created with DEEPINFER_INDEXER_FP8_SCORES=value.
Tensor scores_by_switch(const char* value, const Drawn& c) {
  const std::unique_ptr<Backend> by_switch = cuda_backend_with_fp8_scores(value);
  auto& switch_be = dynamic_cast<cuda::CudaBackend&>(*by_switch);
  return scores_of(switch_be, K::kAuto, upload(switch_be, c.in, false), c.tokens, c.bound);
}

class IndexerWgmmaPersistent : public ::testing::TestWithParam<PersistentCase> {};

TEST_P(IndexerWgmmaPersistent, ScoresAreThePipelinedKernelsBytes) {
  cuda::CudaBackend* be = wgmma_backend();
  if (be == nullptr) GTEST_SKIP() << "needs the CUDA backend on an sm_90 device";
  const Drawn c(*be, GetParam());
  const OnDevice& d = c.d;
  const int64_t tokens = c.tokens, bound = c.bound;
  // The persistent kernel runs only where the records go in runs (score_mma_key_runs).
  ASSERT_EQ(64 % (kBlock / kRatio), 0);
  ASSERT_EQ(c.in.cache.size(0) % 4, 0);
  const Tensor want = scores_of(*be, K::kTensorCoreWgmmaPipelined, d, tokens, bound);
  for (const K kernel : {K::kTensorCoreWgmmaPersistent, K::kTensorCoreWgmmaPersistentCvt}) {
    SCOPED_TRACE(kernel == K::kTensorCoreWgmmaPersistent ? "3 of 8 k-steps by cvt" : "all by cvt");
    const Tensor got = scores_of(*be, kernel, d, tokens, bound);
    ASSERT_EQ(first_difference(want, got, bound), "");
  }
  const Tensor ia = top_k_of(*be, K::kTensorCoreWgmmaPipelined, d);
  const Tensor ib = top_k_of(*be, K::kTensorCoreWgmmaPersistent, d);
  ASSERT_EQ(ia.numel(), ib.numel());
  for (int64_t i = 0; i < ia.numel(); ++i) {
    ASSERT_EQ(ia.data<int32_t>()[i], ib.data<int32_t>()[i]) << "top-k slot " << i;
  }
  // The switch: kAuto on a backend created with it.
  ASSERT_EQ(first_difference(want, scores_by_switch("wgmma_persistent", c), bound), "");
}

// The fp8-MMA variant (kTensorCoreWgmmaPersistentFp8, the default) against the pipelined kernel's
// scores: the same -inf entries, every other score within kFp8MmaTol of its row's largest |score|
// (Hopper's e4m3 MMAs keep fewer bits of their sums over a key's 128 channels than f32: 5.4e-4
// at most on the H200 in session 17; a misplaced code or weight is off by O(1) instead), and top-k
// sets that share at least kFp8MmaOverlap of their entries (ties within the sums' rounding may
// swap: 0.99976 at least in session 17). Prints both figures.
constexpr double kFp8MmaTol = 2e-3;
constexpr double kFp8MmaOverlap = 0.995;

TEST_P(IndexerWgmmaPersistent, Fp8MmaScoresAreClose) {
  cuda::CudaBackend* be = wgmma_backend();
  if (be == nullptr) GTEST_SKIP() << "needs the CUDA backend on an sm_90 device";
  const PersistentCase& pc = GetParam();
  const Drawn c(*be, pc);
  const OnDevice& d = c.d;
  const int64_t tokens = c.tokens, bound = c.bound;
  const Tensor want = scores_of(*be, K::kTensorCoreWgmmaPipelined, d, tokens, bound);
  const Tensor got = scores_of(*be, K::kTensorCoreWgmmaPersistentFp8, d, tokens, bound);
  double worst = 0.0;
  for (int64_t t = 0; t < tokens; ++t) {
    const float* w = want.data<float>() + t * bound;
    const float* g = got.data<float>() + t * bound;
    double row_max = 0.0;
    for (int64_t j = 0; j < bound; ++j) {
      if (std::isfinite(w[j])) row_max = std::max(row_max, std::fabs(double{w[j]}));
    }
    for (int64_t j = 0; j < bound; ++j) {
      if (!std::isfinite(w[j])) {
        ASSERT_EQ(w[j], g[j]) << "token " << t << " entry " << j;
        continue;
      }
      ASSERT_TRUE(std::isfinite(g[j])) << "token " << t << " entry " << j;
      const double err = std::fabs(double{g[j]} - double{w[j]});
      if (row_max > 0.0) worst = std::max(worst, err / row_max);
      ASSERT_LE(err, kFp8MmaTol * row_max)
          << "token " << t << " entry " << j << ": " << w[j] << " vs " << g[j];
    }
  }
  const Tensor ia = top_k_of(*be, K::kTensorCoreWgmmaPipelined, d);
  const Tensor ib = top_k_of(*be, K::kTensorCoreWgmmaPersistentFp8, d);
  ASSERT_EQ(ia.numel(), ib.numel());
  int64_t chosen = 0, shared = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int32_t> a(ia.data<int32_t>() + t * kTopK, ia.data<int32_t>() + (t + 1) * kTopK);
    std::vector<int32_t> b(ib.data<int32_t>() + t * kTopK, ib.data<int32_t>() + (t + 1) * kTopK);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    std::vector<int32_t> both;
    std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
    chosen += std::count_if(a.begin(), a.end(), [](int32_t i) { return i >= 0; });
    shared += std::count_if(both.begin(), both.end(), [](int32_t i) { return i >= 0; });
  }
  const double overlap = chosen == 0 ? 1.0 : static_cast<double>(shared) / chosen;
  std::printf("FP8-MMA-INDEXER %s: max |score error| / row max %.3g, top-%d overlap %.5f\n",
              pc.name.c_str(), worst, kTopK, overlap);
  EXPECT_GE(overlap, kFp8MmaOverlap);
  // The switch: kAuto on a backend created with it gives the forced variant's bytes.
  ASSERT_EQ(first_difference(got, scores_by_switch("wgmma_persistent_fp8", c), bound), "");
}

INSTANTIATE_TEST_SUITE_P(Cases, IndexerWgmmaPersistent, ::testing::ValuesIn(persistent_cases()),
                         [](const ::testing::TestParamInfo<PersistentCase>& param_info) {
                           return param_info.param.name;
                         });

// q in f32 under the switch keeps the pipelined kernel (the same bytes as it forced); forcing the
// persistent kernel there is refused.
TEST(IndexerWgmmaPersistentSwitch, F32QKeepsThePipelinedKernel) {
  cuda::CudaBackend* be = wgmma_backend();
  if (be == nullptr) GTEST_SKIP() << "needs the CUDA backend on an sm_90 device";
  std::mt19937 rng(20261214);
  std::vector<SeqSpec> seqs;
  for (int b = 0; b < 5; ++b) seqs.push_back({3000 + 777 * b, 1, b});
  const IndexerIn in = draw_case({"f32_q", seqs}, rng);
  const int64_t tokens = in.hb.num_tokens();
  const int64_t bound = int64_t{in.hb.max_blocks} * (kBlock / kRatio);
  const OnDevice d = upload(*be, in, /*f32_q=*/true);
  const Tensor want = scores_of(*be, K::kTensorCoreWgmmaPipelined, d, tokens, bound);
  const std::unique_ptr<Backend> by_switch = cuda_backend_with_fp8_scores("wgmma_persistent_cvt");
  auto& switch_be = dynamic_cast<cuda::CudaBackend&>(*by_switch);
  EXPECT_EQ(switch_be.indexer_fp8_scores(), cuda::IndexerFp8Scores::kWgmmaPersistentCvt);
  const Tensor got = scores_of(switch_be, K::kAuto, upload(switch_be, in, true), tokens, bound);
  ASSERT_EQ(first_difference(want, got, bound), "");
  try {
    (void)scores_of(*be, K::kTensorCoreWgmmaPersistent, d, tokens, bound);
    ADD_FAILURE() << "the persistent kernel took q in f32";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
  }
}

// The kernel waits for the previous grid only after its prologue (the header's "Start"), so its
// q warps must not read q's codes before that wait. As in the model, quantize_indexer_q runs right
// before the scores (programmatic dependents on the stream, no synchronization between), each
// time just after other codes (q negated) were written and freed; the scores must be the bytes of
// the same call with a synchronization after the quantization.
TEST(IndexerWgmmaPersistentStart, ScoresRightAfterTheQuantization) {
  cuda::CudaBackend* be = wgmma_backend();
  if (be == nullptr) GTEST_SKIP() << "needs the CUDA backend on an sm_90 device";
  std::mt19937 rng(20261215);
  std::vector<SeqSpec> seqs;
  for (int b = 0; b < 64; ++b) seqs.push_back({32767 - 61 * b, 1, b});
  const IndexerIn in = draw_case({"start", seqs}, rng);
  const int64_t tokens = in.hb.num_tokens();
  const int64_t bound = int64_t{in.hb.max_blocks} * (kBlock / kRatio);
  const OnDevice d = upload(*be, in, /*f32_q=*/true);
  Tensor negated = in.q.to(DType::kF32);
  for (int64_t i = 0; i < negated.numel(); ++i) negated.data<float>()[i] *= -1.0f;
  const Tensor q_negated = up(*be, negated);
  auto scores_after_quantization = [&](bool synchronize) {
    Tensor s = be->zeros({tokens, bound}, DType::kF32);
    (void)be->quantize_indexer_q(q_negated, d.w);  // other codes, freed at once
    const IndexerQFp8 q8 = be->quantize_indexer_q(d.q, d.w);
    if (synchronize) be->synchronize();
    cuda::IndexerRunOptions opt;
    opt.run_select = false;
    opt.scores = s.data<float>();
    (void)cuda::indexer_topk_run(*be, q8.q, q8.weights, d.cache, d.layout, kRatio, kTopK,
                                 kScoreScale, kWeightScale, opt);
    return be->to_host(s);
  };
  const Tensor want = scores_after_quantization(true);
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(first_difference(want, scores_after_quantization(false), bound), "")
        << "round " << round;
  }
}

}  // namespace
}  // namespace deepinfer::backend_ops
