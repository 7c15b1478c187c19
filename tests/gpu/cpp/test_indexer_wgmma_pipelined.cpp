// The pipelined wgmma scores of fp8 index keys (cuda/indexer/indexer_score_wgmma_pipelined.cu)
// against the wgmma kernel's (indexer_score_wgmma.cu), both forced through indexer_topk_run: the
// two share every arithmetic step (indexer_wgmma_tile.cuh), so their scores must be the same
// bytes, -inf of unmapped keys included, and the op's top-k the same. Random paged inputs at V4's
// shape (64 heads of 128, ratio 4, 128-token blocks: runs of 32 records, which the pipelined
// kernel needs): B = 1 and 64 at 4K and 32K contexts, lengths off the 64-key tile and mid-block,
// block-table entries that are negative or past the cache (masked keys), rows with no visible
// key, and a prefill chunk whose rows walk many tiles each (the stage ring wraps); and with q in
// fp8 (quantize_indexer_q: the pipelined kernel's one MMA per tile against the wgmma kernel's two
// parts, whose lo parts are then zero: the same bytes). Also the
// switch: a backend created with DEEPINFER_INDEXER_FP8_SCORES=wgmma_pipelined runs it by
// default (for q in f32 every persistent choice, the default included, keeps it too). Skips without
// a GPU or off sm_90. The inputs of the 32K cases are 67M key values: drawn in a second or two
// since f32_to_f8e4m3 computes its code (it scanned the 127 codes per value, and the b64 32K case
// took 77 s on the host).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/backend/cuda_backend.h"
#include "cuda/indexer/indexer_options.h"
#include "deepinfer/backend.h"
#include "device_backends.h"
#include "indexer_rows.h"
#include "inputs.h"
#include "scoped_env.h"

namespace deepinfer::backend_ops {
namespace {

struct PipelinedCase {
  std::string name;
  std::vector<SeqSpec> seqs;
  bool integers;
  bool masked;  // some block-table entries negative or past the cache
  // q in fp8 (quantize_indexer_q on the device): the pipelined kernel's one-MMA tiles against
  // the wgmma kernel's two parts over the same codes.
  bool fp8_q = false;
};

// Entries of sequence b's block table made unmapped: every seventh column of every third
// sequence negative, every eleventh past the cache (the kernels score their keys -inf).
void mask_blocks(HostBatch& hb) {
  for (size_t b = 0; b < hb.seqs.size(); b += 3) {
    for (int i = 0; i < hb.max_blocks; ++i) {
      int32_t& e = hb.block_table[b * static_cast<size_t>(hb.max_blocks) + static_cast<size_t>(i)];
      if (i % 7 == 3) e = -1;
      if (i % 11 == 5) e = hb.num_blocks + 2 + i;
    }
  }
}

std::vector<PipelinedCase> pipelined_cases() {
  std::vector<SeqSpec> b64_4k, b64_32k, b64_masked;
  for (int b = 0; b < 64; ++b) {
    b64_4k.push_back({4095 - 37 * (b % 5), 1, b});
    b64_32k.push_back({32767 - 61 * b, 1, b});
    // Rows 0 and 1 see no key (positions 0 and 2: (p + 1) / 4 = 0).
    b64_masked.push_back({b == 0 ? 0 : b == 1 ? 2 : 4000 + 97 * b, 1, b});
  }
  return {
      {"b1_ctx4096", {{4095, 1, 0}}, false, false},
      {"b1_ctx32768", {{32767, 1, 0}}, false, false},
      {"b1_ctx_off_tile", {{32599, 1, 0}}, false, false},  // 8150 keys: 22 past the last tile
      {"b1_integers_masked", {{32599, 1, 0}}, true, true},
      {"b1_empty_row", {{1, 1, 0}}, false, false},
      {"b64_ctx4096", b64_4k, false, false},
      {"b64_ctx32768", b64_32k, false, false},
      {"b64_masked_and_empty", b64_masked, false, true},
      {"prefill_32k", {{32000, 40, 0}, {5000, 3, 1}}, false, true},
      {"b1_integers_masked_q8", {{32599, 1, 0}}, true, true, true},
      {"b64_ctx32768_q8", b64_32k, false, false, true},
      {"b64_masked_and_empty_q8", b64_masked, false, true, true},
      {"prefill_32k_q8", {{32000, 40, 0}, {5000, 3, 1}}, false, true, true},
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

// One test per case, so a slow or stuck case names itself.
class IndexerWgmmaPipelined : public ::testing::TestWithParam<PipelinedCase> {};

TEST_P(IndexerWgmmaPipelined, ScoresAreTheWgmmaKernelsBytes) {
  std::string why;
  Backend* be = shared_backend("cuda", &why);
  if (be == nullptr) {
    if (device_required()) FAIL() << why;
    GTEST_SKIP() << why;
  }
  auto& cuda_be = dynamic_cast<cuda::CudaBackend&>(*be);
  if (!cuda::indexer_wgmma_runs(cuda_be)) GTEST_SKIP() << "wgmma needs an sm_90 device";
  const std::unique_ptr<Backend> by_switch = cuda_backend_with_fp8_scores("wgmma_pipelined");
  auto& switch_be = dynamic_cast<cuda::CudaBackend&>(*by_switch);
  std::mt19937 rng(20261203);
  {
    const PipelinedCase& pc = GetParam();
    Indexer c;
    c.cache = DType::kU8;
    c.block = 128;
    c.heads = 64;
    c.dim = 128;
    c.ratio = 4;
    c.integers = pc.integers;
    c.seqs = pc.seqs;
    IndexerIn in = draw_indexer(c, rng);
    if (pc.masked) mask_blocks(in.hb);
    // The pipelined kernel runs only where the records go in runs (score_mma_key_runs): entries
    // per block a multiple of 4 that divides a tile of 64, cache rows a multiple of 4.
    const int epb = c.block / c.ratio;
    ASSERT_EQ(epb % 4, 0);
    ASSERT_EQ(64 % epb, 0);
    ASSERT_EQ(in.cache.size(0) % 4, 0);
    // q and weights on `on`, quantized there for the fp8-q cases.
    auto q_and_weights = [&](Backend& on) {
      Tensor q = up(on, in.q), w = up(on, in.w);
      if (!pc.fp8_q) return std::pair{q, w};
      IndexerQFp8 q8 = on.quantize_indexer_q(q, w);
      return std::pair{q8.q, q8.weights};
    };
    const std::pair<Tensor, Tensor> qw = q_and_weights(*be);
    const Tensor &q = qw.first, &w = qw.second;
    const Tensor cache = up_same(*be, in.cache);
    const BatchLayout layout = in.hb.upload(*be);
    const int64_t tokens = in.hb.num_tokens();
    const int64_t bound = int64_t{in.hb.max_blocks} * epb;
    const float sscale = 0.0625f, wscale = 0.125f;
    constexpr int kTopK = 512;
    using K = cuda::IndexerScoreKernel;
    // Each kernel's scores ([tokens, bound], all tokens in one group, zeros where not scored)
    // and the whole op's top-k.
    auto scores_of = [&](cuda::CudaBackend& on, K kernel, const Tensor& qd, const Tensor& wd,
                         const Tensor& cd, const BatchLayout& ld) {
      Tensor s = on.zeros({tokens, bound}, DType::kF32);
      cuda::IndexerRunOptions opt;
      opt.score_kernel = kernel;
      opt.run_select = false;
      opt.scores = s.data<float>();
      (void)cuda::indexer_topk_run(on, qd, wd, cd, ld, c.ratio, kTopK, sscale, wscale, opt);
      return on.to_host(s);
    };
    auto top_k_of = [&](K kernel) {
      cuda::IndexerRunOptions opt;
      opt.score_kernel = kernel;
      return be->to_host(cuda::indexer_topk_run(cuda_be, q, w, cache, layout, c.ratio, kTopK,
                                                sscale, wscale, opt));
    };
    const Tensor want = scores_of(cuda_be, K::kTensorCoreWgmma, q, w, cache, layout);
    const Tensor got = scores_of(cuda_be, K::kTensorCoreWgmmaPipelined, q, w, cache, layout);
    ASSERT_EQ(first_difference(want, got, bound), "");
    const Tensor ia = top_k_of(K::kTensorCoreWgmma), ib = top_k_of(K::kTensorCoreWgmmaPipelined);
    ASSERT_EQ(ia.numel(), ib.numel());
    for (int64_t i = 0; i < ia.numel(); ++i) {
      ASSERT_EQ(ia.data<int32_t>()[i], ib.data<int32_t>()[i]) << "top-k slot " << i;
    }
    // The switch: kAuto on a backend created with it.
    const std::pair<Tensor, Tensor> qw2 = q_and_weights(*by_switch);
    const Tensor &q2 = qw2.first, &w2 = qw2.second;
    const Tensor cache2 = up_same(*by_switch, in.cache);
    const BatchLayout layout2 = in.hb.upload(*by_switch);
    const Tensor by_default = scores_of(switch_be, K::kAuto, q2, w2, cache2, layout2);
    ASSERT_EQ(first_difference(want, by_default, bound), "");
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, IndexerWgmmaPipelined, ::testing::ValuesIn(pipelined_cases()),
                         [](const ::testing::TestParamInfo<PipelinedCase>& param_info) {
                           return param_info.param.name;
                         });

}  // namespace
}  // namespace deepinfer::backend_ops
