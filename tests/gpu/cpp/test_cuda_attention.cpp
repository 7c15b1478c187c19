// CUDA indexer_topk and attention against the CPU reference on the same inputs, at tiny widths
// (D = 32, 4 heads, W = 8, ratios 4 and 8) and at V4-Flash widths (D = 512, 64 heads, W = 128,
// ring 134, CSA ratio 4 with top-k 512, HCA ratio 128 with dense entries, contexts up to 4096).
// Batches mix decode rows, 2..6-token verification steps and prefill chunks longer than the ring,
// over shuffled block tables. Attention with AttentionSpec::bf16_math (the tensor-core kernel)
// is compared with bf16 tolerances (see expect_close_bf16).
//
// indexer_topk must return exactly the CPU's indices. Summation order differs between the
// backends, so near-tied scores could legitimately swap; the exact tests therefore use small
// integer q, weights and keys with power-of-two scales: every score is then exact in f32 in any
// order, so equal scores are true ties (many of them, which exercises the tie rule: lower index
// first) and different scores are at least 2^-7 apart. One test with random floats compares the
// chosen entries by score instead.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "layout_test_util.h"

namespace deepinfer::gpu_test {
namespace {

// ---- indexer_topk -------------------------------------------------------------------------------

struct IndexerCase {
  std::vector<SeqSpec> seqs;
  int block = 16;
  int max_blocks = 0;  // 0: what the sequences need
  int heads = 4;
  int dim = 32;
  int ratio = 4;
  std::vector<int> top_ks;
  bool integers = true;
};

struct IndexerInputs {
  HostBatch hb;
  Tensor q, w, cache;
};

IndexerInputs make_indexer_inputs(const IndexerCase& c, std::mt19937& rng) {
  HostBatch hb(rng, c.seqs, c.block, c.max_blocks);
  const int64_t t = hb.num_tokens();
  const int64_t rows = int64_t{hb.num_blocks} * (c.block / c.ratio);
  if (c.integers) {
    return {hb, random_int_f32(rng, {t, c.heads, c.dim}, -2, 2),
            random_int_f32(rng, {t, c.heads}, -2, 2), random_int_f32(rng, {rows, c.dim}, -2, 2)};
  }
  return {hb, random_f32(rng, {t, c.heads, c.dim}), random_f32(rng, {t, c.heads}),
          random_f32(rng, {rows, c.dim})};
}

// Exact: the CUDA indices equal the CPU's.
void check_indexer_exact(const IndexerCase& c, uint32_t seed, const std::string& what) {
  Backends b;
  std::mt19937 rng(seed);
  IndexerInputs in = make_indexer_inputs(c, rng);
  Pair q = both(b, in.q), w = both(b, in.w), cache = both(b, in.cache);
  const BatchLayout lc = in.hb.upload(*b.cpu);
  const BatchLayout lg = in.hb.upload(*b.cuda);
  for (int top_k : c.top_ks) {
    Tensor got_cpu =
        b.cpu->indexer_topk(q.cpu, w.cpu, cache.cpu, lc, c.ratio, top_k, 0.0625f, 0.125f);
    Tensor got_cuda =
        b.cuda->indexer_topk(q.cuda, w.cuda, cache.cuda, lg, c.ratio, top_k, 0.0625f, 0.125f);
    ASSERT_EQ(got_cuda.shape(), (Shape{in.hb.num_tokens(), top_k})) << what;
    expect_close(b, got_cpu, got_cuda, 0, 0, what + ", top_k " + std::to_string(top_k));
  }
}

TEST(CudaIndexer, TinyExactWithTies) {
  DEEPINFER_REQUIRE_GPU();
  IndexerCase c;
  // Visible entries: 0..1 (fewer than top_k), 12 (decode), 7..8 (5 rows), 50..50 (3 rows), 250.
  c.seqs = {{0, 7, 0}, {48, 1, 1}, {29, 5, 2}, {200, 3, 3}, {999, 2, 4}};
  c.top_ks = {1, 5, 16, 64, 300};
  check_indexer_exact(c, 100, "tiny h=4 Di=32 m=4");
  c.ratio = 8;
  check_indexer_exact(c, 101, "tiny h=4 Di=32 m=8");
  c.ratio = 4;
  c.heads = 3;  // heads not a multiple of the warps or register groups
  c.dim = 20;
  check_indexer_exact(c, 102, "tiny h=3 Di=20");
  c.heads = 13;
  c.dim = 32;
  check_indexer_exact(c, 103, "tiny h=13 Di=32");
}

TEST(CudaIndexer, FlashWidthsExact) {
  DEEPINFER_REQUIRE_GPU();
  IndexerCase c;
  c.block = 128;
  c.heads = 64;
  c.dim = 128;
  c.ratio = 4;
  // Visible: 1024 (decode), 250..250 (fewer than top_k), 0..50 (prefill from 0), 750..751.
  c.seqs = {{4095, 1, 0}, {1000, 4, 1}, {0, 200, 2}, {3000, 6, 3}};
  c.top_ks = {512};
  check_indexer_exact(c, 110, "V4 h=64 Di=128 m=4");
  c.seqs = {{4096, 1, 0}};  // B = 1 decode
  check_indexer_exact(c, 111, "V4 B=1 decode");
}

TEST(CudaIndexer, LongContextsSharedAndGlobalScores) {
  DEEPINFER_REQUIRE_GPU();
  IndexerCase c;
  c.block = 128;  // 32 entries per block
  c.heads = 4;
  c.dim = 32;
  c.ratio = 4;
  c.top_ks = {512, 2048, 4096};
  // 50,000 visible entries: the block table reaches 50,016 entries, whose scores fit in shared
  // memory (about 200 KB of the H200's 227 KB) next to 512 or 2048 chosen pairs; with 4096 pairs
  // (32 KB) they do not, and the selection reads them from global memory.
  c.seqs = {{200000, 1, 0}, {100, 2, 1}, {70000, 3, 2}};
  check_indexer_exact(c, 120, "bound 50016 (scores in shared memory)");
  // 62,500 visible entries and a block table of 2048 columns (65,536 entries, 256 KB of scores):
  // the selection reads the scores from global memory.
  c.seqs = {{250000, 1, 0}, {100, 2, 1}, {70000, 3, 2}};
  c.max_blocks = 2048;
  check_indexer_exact(c, 121, "bound 65536 (scores in global memory)");
  // 1500 prefill rows at that bound need 384 MB of scores: the op runs them in two groups.
  c.seqs = {{0, 1500, 0}, {3000, 2, 1}};
  c.top_ks = {512};
  check_indexer_exact(c, 122, "1500 rows in token groups");
}

// Random floats: near-ties may swap, so compare each rank's score (double reference) instead.
TEST(CudaIndexer, RandomFloatsSameScores) {
  DEEPINFER_REQUIRE_GPU();
  IndexerCase c;
  c.block = 128;
  c.heads = 64;
  c.dim = 128;
  c.integers = false;
  c.seqs = {{4095, 1, 0}, {1000, 4, 1}, {37, 5, 2}};
  const int top_k = 512;
  const float sscale = 1.0f / std::sqrt(128.0f), wscale = 0.125f;
  Backends b;
  std::mt19937 rng(130);
  IndexerInputs in = make_indexer_inputs(c, rng);
  Pair q = both(b, in.q), w = both(b, in.w), cache = both(b, in.cache);
  Tensor got_cpu = b.cpu->to_host(b.cpu->indexer_topk(q.cpu, w.cpu, cache.cpu, in.hb.upload(*b.cpu),
                                                      c.ratio, top_k, sscale, wscale));
  Tensor got_cuda = b.cuda->to_host(b.cuda->indexer_topk(
      q.cuda, w.cuda, cache.cuda, in.hb.upload(*b.cuda), c.ratio, top_k, sscale, wscale));
  const int epb = c.block / c.ratio;
  const float* qp = in.q.data<float>();
  const float* wp = in.w.data<float>();
  const float* kp = in.cache.data<float>();
  for (int t = 0; t < in.hb.num_tokens(); ++t) {
    const size_t seq = size_t(in.hb.token_seq[size_t(t)]);
    const int visible = (in.hb.positions[size_t(t)] + 1) / c.ratio;
    auto score = [&](int j) {
      const float* key = kp + in.hb.entry_row(seq, j, epb) * c.dim;
      double s = 0;
      for (int h = 0; h < c.heads; ++h) {
        double d = 0;
        for (int i = 0; i < c.dim; ++i) d += double(qp[(t * c.heads + h) * c.dim + i]) * key[i];
        s += double(wp[t * c.heads + h]) * wscale * std::max(d, 0.0) * sscale;
      }
      return s;
    };
    std::vector<int> seen(size_t(std::max(visible, 1)), 0);
    for (int r = 0; r < top_k; ++r) {
      const int ic = int(got_cpu.item(t * top_k + r));
      const int ig = int(got_cuda.item(t * top_k + r));
      if (r >= visible) {
        EXPECT_EQ(ig, -1) << "token " << t << " rank " << r;
        continue;
      }
      ASSERT_GE(ig, 0) << "token " << t << " rank " << r;
      ASSERT_LT(ig, visible) << "token " << t << " rank " << r;
      EXPECT_EQ(seen[size_t(ig)]++, 0) << "token " << t << " chose entry " << ig << " twice";
      EXPECT_NEAR(score(ig), score(ic), 1e-4) << "token " << t << " rank " << r;
    }
  }
}

// ---- attention ----------------------------------------------------------------------------------

struct AttnCase {
  std::vector<SeqSpec> seqs;
  int block = 16;
  int heads = 4;
  int dim = 32;
  int window = 8;
  int ring_len = 14;  // W + 6
  int ratio = 0;      // 0: sliding only
  bool sparse = false;
  int topk_cols = 0;
  bool bf16 = false;  // AttentionSpec::bf16_math: the tensor-core path, bf16 tolerances
};

// Per token: distinct visible entries in random order with -1 anywhere; usually min(K, visible)
// of them, sometimes fewer.
Tensor random_topk(std::mt19937& rng, const HostBatch& hb, int ratio, int k) {
  std::vector<int32_t> out;
  for (int t = 0; t < hb.num_tokens(); ++t) {
    const int visible = (hb.positions[size_t(t)] + 1) / ratio;
    std::vector<int32_t> pick(static_cast<size_t>(visible));
    std::iota(pick.begin(), pick.end(), 0);
    std::shuffle(pick.begin(), pick.end(), rng);
    int n = std::min(k, visible);
    if (rng() % 3 == 0) n = int(rng() % unsigned(n + 1));
    pick.resize(size_t(n));
    pick.resize(size_t(k), -1);
    std::shuffle(pick.begin(), pick.end(), rng);
    out.insert(out.end(), pick.begin(), pick.end());
  }
  return Tensor::from_vector(out, {hb.num_tokens(), k});
}

// The bf16 path rounds q, the keys and the probabilities to bf16 (relative error 2^-9 each) and
// accumulates in f32: with unit-normal inputs each output is off by about 0.2% of its size. So
// the worst element must be within 2% of the largest reference value, and the mean error within
// 0.5% of the mean reference value (a wrong fragment, mask or rescale is off by O(1)).
void expect_close_bf16(Backends& b, const Tensor& cpu, const Tensor& cuda,
                       const std::string& what) {
  Tensor x = b.cpu->to_host(cpu);
  Tensor y = b.cuda->to_host(cuda);
  ASSERT_EQ(x.shape(), y.shape()) << what;
  double max_ref = 0, max_err = 0, sum_ref = 0, sum_err = 0;
  int64_t worst = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double r = x.item(i), c = y.item(i);
    double e = std::fabs(r - c);
    if (!std::isfinite(c)) e = INFINITY;
    max_ref = std::max(max_ref, std::fabs(r));
    sum_ref += std::fabs(r);
    sum_err += e;
    if (e > max_err) {
      max_err = e;
      worst = i;
    }
  }
  EXPECT_LE(max_err, 2e-2 * max_ref)
      << what << ": max |cpu - cuda| = " << max_err << " at element " << worst << " (cpu "
      << x.item(worst) << ", cuda " << y.item(worst) << "), max |cpu| = " << max_ref;
  EXPECT_LE(sum_err, 5e-3 * sum_ref) << what << ": mean |cpu - cuda| = " << sum_err / x.numel()
                                     << ", mean |cpu| = " << sum_ref / x.numel();
}

void check_attention(const AttnCase& c, uint32_t seed, const std::string& what) {
  Backends b;
  std::mt19937 rng(seed);
  HostBatch hb(rng, c.seqs, c.block);
  const int64_t t = hb.num_tokens();
  int slots = 0;
  for (const SeqSpec& s : c.seqs) slots = std::max(slots, s.slot + 1);
  Pair q = both(b, random_f32(rng, {t, c.heads, c.dim}));
  Pair kv = both(b, random_f32(rng, {t, c.dim}));
  Pair ring = both(b, random_f32(rng, {slots, c.ring_len, c.dim}));
  Pair sinks = both(b, random_f32(rng, {c.heads}));
  Pair entries, topk;
  if (c.ratio > 0) {
    entries = both(b, random_f32(rng, {int64_t{hb.num_blocks} * (c.block / c.ratio), c.dim}));
    if (c.sparse) topk = both(b, random_topk(rng, hb, c.ratio, c.topk_cols), DType::kI32);
  }
  AttentionSpec spec{c.window, 1.0f / std::sqrt(float(c.dim)), c.ratio, c.sparse};
  spec.bf16_math = c.bf16;
  Tensor got_cpu = b.cpu->attention(q.cpu, kv.cpu, ring.cpu, entries.cpu, topk.cpu, sinks.cpu,
                                    hb.upload(*b.cpu), spec);
  Tensor got_cuda = b.cuda->attention(q.cuda, kv.cuda, ring.cuda, entries.cuda, topk.cuda,
                                      sinks.cuda, hb.upload(*b.cuda), spec);
  ASSERT_EQ(got_cuda.shape(), (Shape{t, c.heads, c.dim})) << what;
  if (c.bf16) {
    expect_close_bf16(b, got_cpu, got_cuda, what + " (bf16_math)");
  } else {
    expect_close(b, got_cpu, got_cuda, 1e-5, 1e-6, what);
  }
}

// Starting at 0; a decode row reading a wrapped ring; a chunk longer than the ring; 3- and
// 2-token verification steps.
const std::vector<SeqSpec> kTinySeqs = {{0, 5, 2}, {37, 1, 0}, {20, 30, 4}, {50, 3, 1}, {9, 2, 3}};

TEST(CudaAttention, TinySliding) {
  DEEPINFER_REQUIRE_GPU();
  AttnCase c;
  c.seqs = kTinySeqs;
  check_attention(c, 200, "tiny sliding");
  c.heads = 5;  // a head count that is not a multiple of 8
  c.dim = 64;
  check_attention(c, 201, "tiny sliding h=5 D=64");
  c.heads = 12;
  c.dim = 96;
  check_attention(c, 202, "tiny sliding h=12 D=96");
}

TEST(CudaAttention, TinyDense) {
  DEEPINFER_REQUIRE_GPU();
  AttnCase c;
  c.seqs = kTinySeqs;
  c.ratio = 4;
  check_attention(c, 210, "tiny dense m=4");
  c.ratio = 8;
  check_attention(c, 211, "tiny dense m=8");
}

TEST(CudaAttention, TinySparse) {
  DEEPINFER_REQUIRE_GPU();
  AttnCase c;
  c.seqs = kTinySeqs;  // positions below 32: fewer visible entries than top_k
  c.ratio = 4;
  c.sparse = true;
  c.topk_cols = 8;
  check_attention(c, 220, "tiny sparse m=4 K=8");
  c.topk_cols = 3;
  c.ratio = 8;
  check_attention(c, 221, "tiny sparse m=8 K=3");
}

TEST(CudaAttention, TinySplitKeys) {
  DEEPINFER_REQUIRE_GPU();
  // Few tokens over long key lists: the keys are split across blocks and combined.
  AttnCase c;
  c.seqs = {{1000, 1, 0}, {777, 2, 1}};
  c.ratio = 4;
  check_attention(c, 230, "tiny dense split");
  c.sparse = true;
  c.topk_cols = 100;
  check_attention(c, 231, "tiny sparse split");
  c.ratio = 0;
  c.sparse = false;
  c.topk_cols = 0;
  c.window = 200;
  c.ring_len = 206;
  check_attention(c, 232, "tiny sliding W=200 split");
}

AttnCase flash_case() {
  AttnCase c;
  c.block = 128;
  c.heads = 64;
  c.dim = 512;
  c.window = 128;
  c.ring_len = 134;
  return c;
}

// A decode row at 4095, a 4-token step at 1000, a 200-token prefill chunk from 0 (longer than
// the ring), a 6-token verification step at 3000.
const std::vector<SeqSpec> kFlashSeqs = {{4095, 1, 0}, {1000, 4, 1}, {0, 200, 2}, {3000, 6, 3}};

TEST(CudaAttention, FlashSliding) {
  DEEPINFER_REQUIRE_GPU();
  AttnCase c = flash_case();
  c.seqs = kFlashSeqs;
  check_attention(c, 240, "V4 sliding");
  c.seqs = {{4000, 1, 0}};
  check_attention(c, 241, "V4 sliding B=1 decode");
}

TEST(CudaAttention, FlashSparseCsa) {
  DEEPINFER_REQUIRE_GPU();
  AttnCase c = flash_case();
  c.ratio = 4;
  c.sparse = true;
  c.topk_cols = 512;
  c.seqs = kFlashSeqs;
  check_attention(c, 250, "V4 CSA top-512");
  c.seqs = {{4096, 1, 0}};
  check_attention(c, 251, "V4 CSA B=1 decode");
  c.seqs = {{2047, 2, 0}, {1500, 2, 1}};
  check_attention(c, 252, "V4 CSA two 2-token steps");
}

TEST(CudaAttention, FlashDenseHca) {
  DEEPINFER_REQUIRE_GPU();
  AttnCase c = flash_case();
  c.ratio = 128;
  c.seqs = kFlashSeqs;
  check_attention(c, 260, "V4 HCA dense");
  c.seqs = {{4095, 1, 0}};
  check_attention(c, 261, "V4 HCA B=1 decode");
}

// ---- attention with bf16_math (the tensor-core kernel, ops_attention_mma.cu) ------------------

TEST(CudaAttentionBf16, TinySliding) {
  DEEPINFER_REQUIRE_GPU();
  AttnCase c;
  c.seqs = kTinySeqs;
  c.bf16 = true;
  c.dim = 64;
  check_attention(c, 300, "tiny sliding h=4 D=64");
  c.heads = 5;  // one partial row group of 16
  c.dim = 128;
  check_attention(c, 301, "tiny sliding h=5 D=128");
  c.heads = 72;  // two head groups of 64, the second with 8 heads
  c.dim = 64;
  check_attention(c, 302, "tiny sliding h=72 D=64");
  c.heads = 12;  // D = 96 has no tensor-core kernel: the f32 kernel runs
  c.dim = 96;
  check_attention(c, 303, "tiny sliding h=12 D=96 (f32 fallback)");
  c.heads = 3;
  c.dim = 256;
  check_attention(c, 304, "tiny sliding h=3 D=256");
}

TEST(CudaAttentionBf16, TinyDenseAndSparse) {
  DEEPINFER_REQUIRE_GPU();
  AttnCase c;
  c.seqs = kTinySeqs;
  c.bf16 = true;
  c.dim = 64;
  c.ratio = 4;
  check_attention(c, 310, "tiny dense m=4");
  c.ratio = 8;
  check_attention(c, 311, "tiny dense m=8");
  c.ratio = 4;
  c.sparse = true;
  c.topk_cols = 8;
  check_attention(c, 312, "tiny sparse m=4 K=8");
  c.topk_cols = 3;
  c.ratio = 8;
  c.heads = 20;
  check_attention(c, 313, "tiny sparse m=8 K=3 h=20");
}

TEST(CudaAttentionBf16, TinySplitKeys) {
  DEEPINFER_REQUIRE_GPU();
  // Few tokens over long key lists: the keys are split across blocks and combined.
  AttnCase c;
  c.bf16 = true;
  c.dim = 64;
  c.seqs = {{1000, 1, 0}, {777, 2, 1}};
  c.ratio = 4;
  check_attention(c, 320, "tiny dense split");
  c.sparse = true;
  c.topk_cols = 100;
  check_attention(c, 321, "tiny sparse split");
  c.ratio = 0;
  c.sparse = false;
  c.topk_cols = 0;
  c.window = 200;
  c.ring_len = 206;
  check_attention(c, 322, "tiny sliding W=200 split");
}

// Decode rows of `batch` sequences at spread-out contexts.
std::vector<SeqSpec> decode_seqs(int batch, int s_q) {
  std::vector<SeqSpec> seqs;
  for (int i = 0; i < batch; ++i) seqs.push_back({200 + (i * 997) % 3900, s_q, i});
  return seqs;
}

TEST(CudaAttentionBf16, FlashSliding) {
  DEEPINFER_REQUIRE_GPU();
  AttnCase c = flash_case();
  c.bf16 = true;
  c.seqs = kFlashSeqs;
  check_attention(c, 340, "V4 sliding");
  c.seqs = {{4000, 1, 0}};
  check_attention(c, 341, "V4 sliding B=1 decode");
}

TEST(CudaAttentionBf16, FlashSparseCsa) {
  DEEPINFER_REQUIRE_GPU();
  AttnCase c = flash_case();
  c.bf16 = true;
  c.ratio = 4;
  c.sparse = true;
  c.topk_cols = 512;
  c.seqs = kFlashSeqs;  // includes a 200-token prefill chunk from 0
  check_attention(c, 350, "V4 CSA top-512");
  c.seqs = {{4096, 1, 0}};
  check_attention(c, 351, "V4 CSA B=1 decode");
  c.seqs = {{2047, 2, 0}, {1500, 2, 1}};
  check_attention(c, 352, "V4 CSA two 2-token steps");
  c.seqs = decode_seqs(8, 1);
  check_attention(c, 353, "V4 CSA B=8 decode");
  c.seqs = decode_seqs(37, 1);
  check_attention(c, 354, "V4 CSA B=37 decode");
  c.seqs = decode_seqs(16, 2);
  check_attention(c, 355, "V4 CSA B=16 s_q=2");
  c.seqs = {{600, 150, 0}, {3000, 1, 1}};  // a prefill chunk after 600 cached tokens
  check_attention(c, 356, "V4 CSA prefill chunk with context");
}

TEST(CudaAttentionBf16, FlashDenseHca) {
  DEEPINFER_REQUIRE_GPU();
  AttnCase c = flash_case();
  c.bf16 = true;
  c.ratio = 128;
  c.seqs = kFlashSeqs;
  check_attention(c, 360, "V4 HCA dense");
  c.seqs = {{4095, 1, 0}};
  check_attention(c, 361, "V4 HCA B=1 decode");
  c.seqs = decode_seqs(8, 2);
  check_attention(c, 362, "V4 HCA B=8 s_q=2");
}

// bf16_math really takes the tensor-core kernel at V4 widths (its result differs from the f32
// kernel's, within the bf16 tolerance), and without it the f32 kernel runs (bit-identical to an
// explicit bf16_math = false call).
TEST(CudaAttentionBf16, SelectsTheKernel) {
  DEEPINFER_REQUIRE_GPU();
  Backends b;
  std::mt19937 rng(370);
  const AttnCase c = flash_case();
  HostBatch hb(rng, {{4096, 1, 0}, {3000, 2, 1}}, c.block);
  const int64_t t = hb.num_tokens();
  Pair q = both(b, random_f32(rng, {t, c.heads, c.dim}));
  Pair kv = both(b, random_f32(rng, {t, c.dim}));
  Pair ring = both(b, random_f32(rng, {2, c.ring_len, c.dim}));
  Pair sinks = both(b, random_f32(rng, {c.heads}));
  Pair entries = both(b, random_f32(rng, {int64_t{hb.num_blocks} * (c.block / 4), c.dim}));
  Pair topk = both(b, random_topk(rng, hb, 4, 512), DType::kI32);
  const BatchLayout lg = hb.upload(*b.cuda);
  AttentionSpec spec{c.window, 1.0f / std::sqrt(float(c.dim)), 4, true};
  auto run = [&](bool bf16) {
    spec.bf16_math = bf16;
    return b.cuda->to_host(b.cuda->attention(q.cuda, kv.cuda, ring.cuda, entries.cuda, topk.cuda,
                                             sinks.cuda, lg, spec));
  };
  const Tensor f32 = run(false);
  const Tensor f32_again = run(false);
  const Tensor bf16 = run(true);
  double diff = 0, diff_again = 0;
  for (int64_t i = 0; i < f32.numel(); ++i) {
    diff = std::max(diff, std::fabs(double(f32.item(i)) - bf16.item(i)));
    diff_again = std::max(diff_again, std::fabs(double(f32.item(i)) - f32_again.item(i)));
  }
  EXPECT_GT(diff, 0.0) << "bf16_math gave the f32 kernel's result";
  EXPECT_EQ(diff_again, 0.0);
}

}  // namespace
}  // namespace deepinfer::gpu_test
