// CUDA dense and hyper-connection ops (cuda/ops_dense.cu, cuda/ops_hc.cu) and the GEMMs
// (cuda/ops_gemm.cu) against the CPU reference ops on the same random inputs, at tiny widths and
// at DeepSeek-V4-Flash widths (hidden 4096, hc_mult 4, 64 heads of 512, rope dim 64).
//
// Tolerances: copies, gathers, selections, argmax, scale, add and hc_expand must be exact; ops
// whose only differences are summation order (rms, GEMM) or expf/cosf/sinf ulps are checked at
// ~1e-5 of the largest reference value. bf16 GEMMs are compared with the CPU op run on the
// bf16-rounded weights (exact: the device widens them exactly) and, on the cuBLAS path, the
// bf16-rounded activations (the products are then exact on both sides). The decode GEMV path
// (M <= kGemvMaxTokens) keeps the f32 activations, so it is held to the f32 tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/error.h"
#include "error_message.h"
#include "gpu_test_util.h"

namespace deepinfer::gpu_test {
namespace {

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

// DeepSeek-V4-Flash widths.
constexpr int64_t kHidden = 4096;
constexpr int kHcMult = 4;
constexpr int64_t kHeads = 64;
constexpr int64_t kHeadDim = 512;
constexpr int64_t kRopeDim = 64;
constexpr int64_t kVocab = 129280;

class CudaDenseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DEEPINFER_REQUIRE_GPU();
    backends_ = std::make_unique<Backends>();
  }

  Backends& be() { return *backends_; }
  Backend& cpu() { return *backends_->cpu; }
  Backend& gpu() { return *backends_->cuda; }

  Tensor randn(const Shape& shape, float scale = 1.0f) { return random_f32(rng_, shape, scale); }

  Tensor random_ids(int64_t n, int32_t lo, int32_t hi) {
    std::uniform_int_distribution<int32_t> d(lo, hi);
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = d(rng_);
    return i32(v);
  }

  // A host tensor of `dtype` filled with random bytes (for byte-exact copy ops).
  Tensor random_bytes(const Shape& shape, DType dtype) {
    Tensor t = Tensor::zeros(shape, dtype);
    auto* p = static_cast<unsigned char*>(t.raw_data());
    std::uniform_int_distribution<int> d(0, 255);
    for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<unsigned char>(d(rng_));
    return t;
  }

  // The same host tensor on both backends, keeping its dtype (any dtype).
  Pair same_dtype(const Tensor& host) {
    return {cpu().upload(host, host.dtype()), gpu().upload(host, host.dtype())};
  }

  void expect_same_bytes(const Tensor& cpu_t, const Tensor& gpu_t, const std::string& what) {
    Tensor x = cpu().to_host(cpu_t);
    Tensor y = gpu().to_host(gpu_t);
    ASSERT_EQ(x.shape(), y.shape()) << what;
    ASSERT_EQ(x.dtype(), y.dtype()) << what;
    EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()), 0) << what;
  }

  void close(const Tensor& cpu_t, const Tensor& gpu_t, const std::string& what, double rtol = kRtol,
             double atol = kAtol) {
    expect_close(be(), cpu_t, gpu_t, rtol, atol, what);
  }

  std::mt19937 rng_{20240611};
  std::unique_ptr<Backends> backends_;
};

std::string shape_name(const Shape& s) {
  return shape_str(s);
}

Tensor round_bf16(const Tensor& t) {
  return t.to(DType::kBF16).to(DType::kF32);
}

// inv_freq[i] = theta^(-2i / rope_dim), as the model computes it.
Tensor rope_inv_freq(int64_t rope_dim, double theta) {
  std::vector<float> v(static_cast<size_t>(rope_dim / 2));
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>(
        1.0 / std::pow(theta, 2.0 * static_cast<double>(i) / static_cast<double>(rope_dim)));
  }
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
}

// ---- embedding --------------------------------------------------------------------------------

TEST_F(CudaDenseTest, EmbeddingF32AndBf16) {
  struct Case {
    int64_t vocab, hidden, tokens;
  };
  for (const Case c : {Case{100, 64, 1}, Case{100, 64, 37}, Case{1000, kHidden, 3}}) {
    const std::string what = "embedding V=" + std::to_string(c.vocab) +
                             " H=" + std::to_string(c.hidden) + " T=" + std::to_string(c.tokens);
    Tensor table = randn({c.vocab, c.hidden});
    Pair ids = both(be(), random_ids(c.tokens, 0, static_cast<int32_t>(c.vocab - 1)));
    Pair tf = both(be(), table);
    close(cpu().embedding(tf.cpu, ids.cpu), gpu().embedding(tf.cuda, ids.cuda), what, 0, 0);
    // bf16 table on the device vs the CPU op on the bf16-rounded table: exact.
    Tensor cpu_table = cpu().upload(round_bf16(table), DType::kF32);
    Tensor gpu_table = gpu().upload(table, DType::kBF16);
    close(cpu().embedding(cpu_table, ids.cpu), gpu().embedding(gpu_table, ids.cuda), what + " bf16",
          0, 0);
  }
}

TEST_F(CudaDenseTest, EmbeddingOutOfRangeIdGivesZeroRow) {
  // The CPU op throws; the CUDA op cannot without a sync and writes a zero row instead.
  Tensor table = randn({10, 64});
  Tensor gpu_table = gpu().upload(table, DType::kF32);
  Tensor out =
      gpu().to_host(gpu().embedding(gpu_table, gpu().upload(i32({-1, 10, 3}), DType::kI32)));
  for (int64_t h = 0; h < 64; ++h) {
    EXPECT_EQ(out.item(h), 0.0);
    EXPECT_EQ(out.item(64 + h), 0.0);
    EXPECT_EQ(out.item(128 + h), table.item(3 * 64 + h));
  }
}

// ---- rms_norm -----------------------------------------------------------------------------------

// The shapes reach every kernel of the CUDA op: a warp per row (widths up to 1024 floats, with
// partly filled lanes), a block per row with and without the weight loaded early (few / many
// rows), a cluster of blocks per row (few rows wider than 4096 floats, the last block shorter),
// and the scalar fallback (a width not a multiple of 4, wider than 16384). "Few" is relative to
// the SM count; these shapes split as described on an H200 (132 SMs).
TEST_F(CudaDenseTest, RmsNorm) {
  const std::vector<Shape> shapes = {{1, 64},
                                     {37, 64},
                                     {5, 7},
                                     {3, kHidden},
                                     {3, kHcMult * kHidden},
                                     {2, kHeads, kHeadDim},
                                     {64},
                                     {1, 4},
                                     {9, 36},
                                     {1, 512},
                                     {1, kHeads, kHeadDim},
                                     {300, 1024},
                                     {1, 1024},
                                     {2, 1028},
                                     {1, kHidden},
                                     {200, kHidden},
                                     {1, 8192},
                                     {64, 8192},
                                     {1, kHcMult * kHidden},
                                     {1, kHcMult, kHidden},
                                     {3, 5000},
                                     {140, kHcMult * kHidden},
                                     {2, 4098},
                                     {1, 20000}};
  for (const Shape& s : shapes) {
    Tensor x = randn(s, 3.0f);
    Pair xp = both(be(), x);
    Pair w = both(be(), randn({s.back()}));
    close(cpu().rms_norm(xp.cpu, w.cpu, 1e-6f), gpu().rms_norm(xp.cuda, w.cuda, 1e-6f),
          "rms_norm weighted " + shape_name(s));
    close(cpu().rms_norm(xp.cpu, Tensor(), 1e-6f), gpu().rms_norm(xp.cuda, Tensor(), 1e-6f),
          "rms_norm unweighted " + shape_name(s));
  }
}

// A base that is not 16-byte aligned (a view one float into its storage) takes the scalar kernel.
TEST_F(CudaDenseTest, RmsNormUnalignedView) {
  for (int64_t dim : {int64_t{512}, kHidden, kHcMult * kHidden}) {
    Tensor flat = randn({dim + 1}, 3.0f);
    Pair xp = both(be(), flat);
    Pair w = both(be(), randn({dim}));
    const Tensor xc = xp.cpu.narrow(0, 1, dim);
    const Tensor xg = xp.cuda.narrow(0, 1, dim);
    close(cpu().rms_norm(xc, w.cpu, 1e-6f), gpu().rms_norm(xg, w.cuda, 1e-6f),
          "rms_norm unaligned dim " + std::to_string(dim));
    close(cpu().rms_norm(xc, Tensor(), 1e-6f), gpu().rms_norm(xg, Tensor(), 1e-6f),
          "rms_norm unaligned unweighted dim " + std::to_string(dim));
  }
}

// ---- elementwise --------------------------------------------------------------------------------

TEST_F(CudaDenseTest, ScaleAddSwiglu) {
  const std::vector<Shape> shapes = {{1, 64}, {37, 64}, {3, kHidden}, {3, 2048}, {5, 3, 7}};
  for (const Shape& s : shapes) {
    Pair a = both(be(), randn(s, 6.0f));
    Pair b = both(be(), randn(s, 6.0f));
    close(cpu().scale(a.cpu, 0.37f), gpu().scale(a.cuda, 0.37f), "scale " + shape_name(s), 0, 0);
    close(cpu().add(a.cpu, b.cpu), gpu().add(a.cuda, b.cuda), "add " + shape_name(s), 0, 0);
    for (float limit : {10.0f, 3.0f, 1e30f}) {
      close(cpu().swiglu(a.cpu, b.cpu, limit), gpu().swiglu(a.cuda, b.cuda, limit),
            "swiglu limit " + std::to_string(limit) + " " + shape_name(s));
    }
  }
}

// ---- gather_rows / copy_rows / select_tokens ----------------------------------------------------

TEST_F(CudaDenseTest, GatherRowsAnyDtype) {
  struct Case {
    Shape shape;
    DType dtype;
  };
  // Row sizes that pick each copy width: 16 B, 8 B (bf16 x4), 4 B, 2 B (bf16 x3), 1 B (fp8 x5).
  const std::vector<Case> cases = {{{37, 64}, DType::kF32}, {{5, kHeads, kHeadDim}, DType::kF32},
                                   {{9, 4}, DType::kBF16},  {{9, 3}, DType::kI32},
                                   {{9, 3}, DType::kBF16},  {{9, 5}, DType::kF8E4M3},
                                   {{9}, DType::kI64}};
  for (const Case& c : cases) {
    const std::string what =
        std::string("gather_rows ") + dtype_name(c.dtype) + shape_name(c.shape);
    Pair x = same_dtype(random_bytes(c.shape, c.dtype));
    const auto rows = static_cast<int32_t>(c.shape[0]);
    Pair r = both(be(), random_ids(2 * rows + 1, 0, rows - 1));  // repeats included
    expect_same_bytes(cpu().gather_rows(x.cpu, r.cpu), gpu().gather_rows(x.cuda, r.cuda), what);
    Pair none = both(be(), i32({}));
    expect_same_bytes(cpu().gather_rows(x.cpu, none.cpu), gpu().gather_rows(x.cuda, none.cuda),
                      what + " no rows");
  }
}

TEST_F(CudaDenseTest, GatherRowsOutOfRangeGivesZeroRow) {
  Tensor x = randn({4, 8});
  Tensor out = gpu().to_host(
      gpu().gather_rows(gpu().upload(x, DType::kF32), gpu().upload(i32({2, -1, 4}), DType::kI32)));
  for (int64_t h = 0; h < 8; ++h) {
    EXPECT_EQ(out.item(h), x.item(16 + h));
    EXPECT_EQ(out.item(8 + h), 0.0);
    EXPECT_EQ(out.item(16 + h), 0.0);
  }
}

TEST_F(CudaDenseTest, CopyRowsAnyDtype) {
  struct Case {
    Shape shape;
    DType dtype;
  };
  const std::vector<Case> cases = {{{16, 64}, DType::kF32},
                                   {{8, 134, kHeadDim}, DType::kF32},  // an SWA ring per slot
                                   {{16, 3}, DType::kBF16},
                                   {{16, 5}, DType::kF8E4M3},
                                   {{16}, DType::kI32}};
  for (const Case& c : cases) {
    const std::string what = std::string("copy_rows ") + dtype_name(c.dtype) + shape_name(c.shape);
    Pair t = same_dtype(random_bytes(c.shape, c.dtype));
    // Sources among the first half (one read twice), distinct destinations in the second half.
    const auto half = static_cast<int32_t>(c.shape[0] / 2);
    Pair src = both(be(), i32({0, 1, 1, half - 1}));
    Pair dst = both(be(), i32({half + 2, half, 2 * half - 1, half + 1}));
    cpu().copy_rows(t.cpu, src.cpu, dst.cpu);
    gpu().copy_rows(t.cuda, src.cuda, dst.cuda);
    expect_same_bytes(t.cpu, t.cuda, what);
  }
}

TEST_F(CudaDenseTest, CopyRowsOutOfRangeIsSkipped) {
  Tensor host = randn({4, 8});
  Tensor t = gpu().upload(host, DType::kF32);
  gpu().copy_rows(t, gpu().upload(i32({0, 5, 1}), DType::kI32),
                  gpu().upload(i32({2, 3, -1}), DType::kI32));
  Tensor out = gpu().to_host(t);
  for (int64_t h = 0; h < 8; ++h) {
    EXPECT_EQ(out.item(16 + h), host.item(h));       // 0 -> 2 copied
    EXPECT_EQ(out.item(24 + h), host.item(24 + h));  // 5 -> 3 skipped
    EXPECT_EQ(out.item(8 + h), host.item(8 + h));    // 1 -> -1 skipped
  }
}

TEST_F(CudaDenseTest, SelectTokens) {
  for (int64_t n : {1, 5, 37, 300}) {
    const int64_t prev = n / 2 + 1;
    Pair tokens = both(be(), random_ids(n, 0, 129279));
    Pair remap = both(be(), random_ids(n, -1, static_cast<int32_t>(prev - 1)));
    Pair previous = both(be(), random_ids(prev, 0, 129279));
    cpu().select_tokens(tokens.cpu, remap.cpu, previous.cpu);
    gpu().select_tokens(tokens.cuda, remap.cuda, previous.cuda);
    close(tokens.cpu, tokens.cuda, "select_tokens n=" + std::to_string(n), 0, 0);
  }
  // In place; a remap past `previous` (the CPU op throws) leaves the token as it was.
  Tensor tokens = gpu().upload(i32({7, 8, 9}), DType::kI32);
  gpu().select_tokens(tokens, gpu().upload(i32({0, 2, -1}), DType::kI32),
                      gpu().upload(i32({42, 43}), DType::kI32));
  Tensor out = gpu().to_host(tokens);
  EXPECT_EQ(out.item(0), 42);
  EXPECT_EQ(out.item(1), 8);
  EXPECT_EQ(out.item(2), 9);
}

// ---- rope ---------------------------------------------------------------------------------------

TEST_F(CudaDenseTest, Rope) {
  struct Case {
    Shape shape;
    int64_t rope_dim;
    int32_t max_pos;
  };
  const std::vector<Case> cases = {{{1, 4, 64}, 16, 10},
                                   {{37, 4, 64}, 64, 5000},
                                   {{5, 7}, 6, 100},
                                   {{37, 64}, 64, 200000},
                                   {{3, kHeads, kHeadDim}, kRopeDim, 1 << 20},
                                   {{3, kHeadDim}, kRopeDim, 100000},
                                   {{4, 2, 8}, 0, 10}};
  for (const Case& c : cases) {
    const int64_t tokens = c.shape[0];
    Pair x = both(be(), randn(c.shape));
    Pair pos = both(be(), random_ids(tokens, 0, c.max_pos));
    Pair freq = both(be(), rope_inv_freq(c.rope_dim, 10000.0));
    for (bool inverse : {false, true}) {
      close(cpu().rope(x.cpu, pos.cpu, freq.cpu, inverse),
            gpu().rope(x.cuda, pos.cuda, freq.cuda, inverse),
            "rope " + shape_name(c.shape) + " rope_dim " + std::to_string(c.rope_dim) +
                (inverse ? " inverse" : ""));
    }
  }
}

// ---- argmax -------------------------------------------------------------------------------------

TEST_F(CudaDenseTest, ArgmaxRandom) {
  // One block per row (up to 4096 floats), a row split over blocks and a final reduction
  // (the vocabulary, one row and a decode batch), the scalar path (widths not a multiple of 4,
  // one and several blocks), and a row longer than the most blocks a row gets (blocks loop).
  for (const Shape& s : std::vector<Shape>{{1, 64},
                                           {37, 64},
                                           {3, 1000},
                                           {4, kVocab},
                                           {2, 1},
                                           {1, 4},
                                           {5, 3},
                                           {3, 4096},
                                           {2, 4100},
                                           {1, kVocab},
                                           {64, kVocab},
                                           {3, 1027},
                                           {2, kVocab + 1},
                                           {1, 4 * 1024 * 1024 + 36}}) {
    Pair x = both(be(), randn(s));
    close(cpu().argmax(x.cpu), gpu().argmax(x.cuda), "argmax " + shape_name(s), 0, 0);
  }
}

// A base that is not 16-byte aligned (a view one float into its storage) takes the scalar path.
TEST_F(CudaDenseTest, ArgmaxUnalignedView) {
  for (int64_t cols : {int64_t{1000}, kVocab}) {
    Pair flat = both(be(), randn({2 * cols + 1}));
    const Tensor xc = flat.cpu.narrow(0, 1, 2 * cols).reshape({2, cols});
    const Tensor xg = flat.cuda.narrow(0, 1, 2 * cols).reshape({2, cols});
    close(cpu().argmax(xc), gpu().argmax(xg), "argmax unaligned cols=" + std::to_string(cols), 0,
          0);
  }
}

TEST_F(CudaDenseTest, ArgmaxTiesAndSpecialValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t cols : {int64_t{64}, int64_t{1000}, int64_t{4097}, kVocab}) {
    const int64_t rows = 8;
    Tensor x = Tensor::zeros({rows, cols}, DType::kF32);
    auto at = [&](int64_t r, int64_t c) -> float& { return x.data<float>()[r * cols + c]; };
    std::uniform_int_distribution<int64_t> col(0, cols - 1);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) at(r, c) = static_cast<float>(c % 17) * 0.25f - 2.0f;
    }
    // Row 0: the maximum (2.0 at c % 17 == 16) repeats: lowest index wins.
    // Row 1: a larger value at three random places.
    for (int k = 0; k < 3; ++k) at(1, col(rng_)) = 100.0f;
    // Row 2: all equal -> 0.
    for (int64_t c = 0; c < cols; ++c) at(2, c) = 1.5f;
    // Row 3: NaN first -> 0 (the CPU's scan never replaces it).
    at(3, 0) = nan;
    // Row 4: NaNs elsewhere, including after the max, are skipped.
    for (int64_t c = 1; c < cols; c += 3) at(4, c) = nan;
    // Row 5: all -inf except NaNs -> lowest -inf index.
    for (int64_t c = 0; c < cols; ++c) at(5, c) = c % 2 == 0 ? nan : -inf;
    at(5, 0) = -inf;
    // Row 6: -0 and +0 are equal: the first zero wins.
    for (int64_t c = 0; c < cols; ++c) at(6, c) = -1.0f;
    at(6, cols - 1) = 0.0f;
    at(6, cols / 2) = -0.0f;
    // Row 7: +inf at the end.
    at(7, cols - 1) = inf;
    Pair xp = both(be(), x);
    close(cpu().argmax(xp.cpu), gpu().argmax(xp.cuda),
          "argmax special values cols=" + std::to_string(cols), 0, 0);
  }
}

// ---- hyper-connections --------------------------------------------------------------------------

struct HcCase {
  int64_t tokens;
  int n;
  int64_t hidden;
  int sinkhorn_iters;
};

// n = 5: the largest n * n <= 32 (one warp per token in hc_pre, idle lanes); n = 6 and 9: the
// block path of hc_pre's weights (n = 9 also takes two batches of stream loads in the collapse);
// T = 203 at full width: several channel chunks per token, the last one partial.
const std::vector<HcCase> kHcCases = {{1, 4, 64, 20},
                                      {5, 4, 64, 20},
                                      {37, 4, 64, 20},
                                      {7, 2, 64, 1},
                                      {6, 3, 40, 5},
                                      {3, 1, 64, 20},
                                      {3, kHcMult, kHidden, 20},
                                      {2, 5, 64, 20},
                                      {3, 6, 40, 5},
                                      {2, 9, 40, 20},
                                      {203, kHcMult, kHidden, 20}};

std::string hc_name(const HcCase& c) {
  return "T=" + std::to_string(c.tokens) + " N=" + std::to_string(c.n) +
         " H=" + std::to_string(c.hidden) + " iters=" + std::to_string(c.sinkhorn_iters);
}

TEST_F(CudaDenseTest, HcExpand) {
  for (const HcCase& c : kHcCases) {
    Pair x = both(be(), randn({c.tokens, c.hidden}));
    close(cpu().hc_expand(x.cpu, c.n), gpu().hc_expand(x.cuda, c.n), "hc_expand " + hc_name(c), 0,
          0);
  }
}

TEST_F(CudaDenseTest, HcPre) {
  for (const HcCase& c : kHcCases) {
    HcParams p;
    p.hc_mult = c.n;
    p.sinkhorn_iters = c.sinkhorn_iters;
    const int64_t width = c.n * c.hidden;
    const int64_t fn_rows = static_cast<int64_t>(2 + c.n) * c.n;
    // fn scaled so that the mix is O(1) and the sigmoids / softmax are not saturated.
    Pair X = both(be(), randn({c.tokens, c.n, c.hidden}));
    Pair fn = both(be(), randn({fn_rows, width}, 1.0f / std::sqrt(static_cast<float>(width))));
    Pair base = both(be(), randn({fn_rows}, 0.5f));
    Pair scale = both(be(), Tensor::from_vector(std::vector<float>{0.8f, 1.3f, 2.0f}, {3}));
    HcMix a = cpu().hc_pre(X.cpu, fn.cpu, base.cpu, scale.cpu, p);
    HcMix b = gpu().hc_pre(X.cuda, fn.cuda, base.cuda, scale.cuda, p);
    close(a.post, b.post, "hc_pre post " + hc_name(c));
    close(a.comb, b.comb, "hc_pre comb " + hc_name(c));
    close(a.y, b.y, "hc_pre y " + hc_name(c));
  }
}

TEST_F(CudaDenseTest, HcPost) {
  for (const HcCase& c : kHcCases) {
    Pair X = both(be(), randn({c.tokens, c.n, c.hidden}));
    Pair out = both(be(), randn({c.tokens, c.hidden}));
    Pair post = both(be(), randn({c.tokens, c.n}));
    Pair comb = both(be(), randn({c.tokens, c.n, c.n}, 0.5f));
    close(cpu().hc_post(X.cpu, out.cpu, post.cpu, comb.cpu),
          gpu().hc_post(X.cuda, out.cuda, post.cuda, comb.cuda), "hc_post " + hc_name(c));
  }
}

TEST_F(CudaDenseTest, HcHead) {
  for (const HcCase& c : kHcCases) {
    HcParams p;
    p.hc_mult = c.n;
    const int64_t width = c.n * c.hidden;
    Pair X = both(be(), randn({c.tokens, c.n, c.hidden}));
    Pair fn = both(be(), randn({c.n, width}, 1.0f / std::sqrt(static_cast<float>(width))));
    Pair base = both(be(), randn({c.n}, 0.5f));
    Pair scale = both(be(), Tensor::from_vector(std::vector<float>{1.1f}, {1}));
    close(cpu().hc_head(X.cpu, fn.cpu, base.cpu, scale.cpu, p),
          gpu().hc_head(X.cuda, fn.cuda, base.cuda, scale.cuda, p), "hc_head " + hc_name(c));
  }
}

// ---- linear / grouped_linear (cuda/ops_gemm.cu) -------------------------------------------------

struct GemmCase {
  int64_t m, k, n;
  int groups;  // 0: linear; else grouped_linear with x [m, groups*k], w [groups*n, k]
};

const std::vector<GemmCase> kGemmCases = {
    {1, 64, 96, 0},        {37, 64, 96, 0}, {5, 7, 3, 0},    {3, kHidden, 1024, 0},
    {37, kHidden, 512, 0}, {4, 64, 16, 2},  {37, 32, 24, 4}, {3, kHidden, 1024, 8}};

std::string gemm_name(const GemmCase& c) {
  return std::string(c.groups ? "grouped_linear G=" + std::to_string(c.groups) : "linear") +
         " M=" + std::to_string(c.m) + " K=" + std::to_string(c.k) + " N=" + std::to_string(c.n);
}

Tensor run_gemm(Backend& b, const GemmCase& c, const Tensor& x, const Tensor& w) {
  return c.groups ? b.grouped_linear(x, w, c.groups) : b.linear(x, w);
}

TEST_F(CudaDenseTest, GemmF32) {
  for (const GemmCase& c : kGemmCases) {
    const int g = c.groups ? c.groups : 1;
    Pair x = both(be(), randn({c.m, g * c.k}));
    Pair w = both(be(), randn({g * c.n, c.k}));
    close(run_gemm(cpu(), c, x.cpu, w.cpu), run_gemm(gpu(), c, x.cuda, w.cuda), gemm_name(c));
  }
}

// bf16 linears of 1..kGemvMaxTokens tokens with K % 8 == 0 and 16-byte aligned x and w run the
// GEMV of ops_gemm.cu on the f32 activations; the others run cuBLAS on bf16-rounded activations.
constexpr int64_t kGemvMaxTokens = 2;
bool gemv_path(int64_t m, int64_t k) {
  return m >= 1 && m <= kGemvMaxTokens && k % 8 == 0;
}

// The CPU reference of a bf16-weight GEMM for the path the device takes, and its tolerance.
struct Bf16Reference {
  Tensor x;  // the activations the CPU op runs on
  double rtol, atol;
};
Bf16Reference bf16_reference(const Tensor& x, bool gemv) {
  if (gemv) return {x, kRtol, kAtol};
  return {round_bf16(x), 1e-3, 1e-5};
}

TEST_F(CudaDenseTest, GemmBf16Weights) {
  for (const GemmCase& c : kGemmCases) {
    const int g = c.groups ? c.groups : 1;
    Tensor x = randn({c.m, g * c.k});
    Tensor w = randn({g * c.n, c.k});
    // The device keeps w in bf16 (widened exactly) and, on the cuBLAS path, casts x to bf16; the
    // CPU runs on the same values, so the products agree exactly and only the fp32 summation
    // order differs.
    const Bf16Reference ref = bf16_reference(x, gemv_path(c.m, c.k));
    Tensor cpu_out = run_gemm(cpu(), c, cpu().upload(ref.x, DType::kF32),
                              cpu().upload(round_bf16(w), DType::kF32));
    Tensor gpu_out =
        run_gemm(gpu(), c, gpu().upload(x, DType::kF32), gpu().upload(w, DType::kBF16));
    close(cpu_out, gpu_out, gemm_name(c) + " bf16", ref.rtol, ref.atol);
  }
}

// The bf16 linears of a V4-Flash decode step (N x K of w; groups: wo_a's grouped projection).
struct DecodeGemmShape {
  int64_t n, k;
  int groups;  // 0: linear
};
const std::vector<DecodeGemmShape> kDecodeGemmShapes = {
    {1024, kHidden, 0}, {32768, 1024, 0},   {512, kHidden, 0},  {kHidden, 8192, 0},
    {1024, kHidden, 8}, {2048, kHidden, 0}, {kHidden, 2048, 0}, {8192, 1024, 0},
    {64, kHidden, 0},   {256, kHidden, 0}};

TEST_F(CudaDenseTest, GemmBf16DecodeShapes) {
  for (const DecodeGemmShape& s : kDecodeGemmShapes) {
    const int g = s.groups ? s.groups : 1;
    Tensor w = randn({g * s.n, s.k});
    Tensor cpu_w = cpu().upload(round_bf16(w), DType::kF32);
    Tensor gpu_w = gpu().upload(w, DType::kBF16);
    // M = 17 (cuBLAS) once for linear and once for grouped_linear.
    const bool above = s.n == 1024 && s.k == kHidden;
    for (int64_t m : {1, 3, 8, 16, 17}) {
      if (m > kGemvMaxTokens && !above) continue;
      const GemmCase c{m, s.k, s.n, s.groups};
      Tensor x = randn({m, g * s.k});
      const Bf16Reference ref = bf16_reference(x, gemv_path(m, s.k));
      close(run_gemm(cpu(), c, cpu().upload(ref.x, DType::kF32), cpu_w),
            run_gemm(gpu(), c, gpu().upload(x, DType::kF32), gpu_w), gemm_name(c) + " bf16",
            ref.rtol, ref.atol);
    }
  }
}

// K % 8 != 0 or operands not 16-byte aligned: the cuBLAS path (bf16-rounded x), still correct.
TEST_F(CudaDenseTest, GemmBf16FallbackShapesAndUnalignedViews) {
  for (const GemmCase& c : {GemmCase{3, 4100, 256, 0}, GemmCase{2, 36, 40, 3}}) {
    const int g = c.groups ? c.groups : 1;
    Tensor x = randn({c.m, g * c.k});
    Tensor w = randn({g * c.n, c.k});
    ASSERT_FALSE(gemv_path(c.m, c.k));
    const Bf16Reference ref = bf16_reference(x, false);
    close(run_gemm(cpu(), c, cpu().upload(ref.x, DType::kF32),
                   cpu().upload(round_bf16(w), DType::kF32)),
          run_gemm(gpu(), c, gpu().upload(x, DType::kF32), gpu().upload(w, DType::kBF16)),
          gemm_name(c) + " bf16 (K % 8 != 0)", ref.rtol, ref.atol);
  }
  // A shape the GEMV takes, with x 4 bytes off 16-byte alignment, then w 2 bytes off.
  const int64_t m = 3, k = kHidden, n = 512;
  Tensor flat_x = randn({m * k + 1});
  Tensor flat_w = randn({n * k + 1});
  for (bool shift_x : {true, false}) {
    const int64_t ox = shift_x ? 1 : 0, ow = shift_x ? 0 : 1;
    const Tensor cx = cpu().upload(round_bf16(flat_x), DType::kF32).narrow(0, ox, m * k);
    const Tensor gx = gpu().upload(flat_x, DType::kF32).narrow(0, ox, m * k);
    const Tensor cw = cpu().upload(round_bf16(flat_w), DType::kF32).narrow(0, ow, n * k);
    const Tensor gw = gpu().upload(flat_w, DType::kBF16).narrow(0, ow, n * k);
    close(cpu().linear(cx.reshape({m, k}), cw.reshape({n, k})),
          gpu().linear(gx.reshape({m, k}), gw.reshape({n, k})),
          std::string("linear bf16 unaligned ") + (shift_x ? "x" : "w"), 1e-3, 1e-5);
  }
}

// The GEMV sums every output in an order fixed by (N, K, groups): two runs agree bitwise, and a
// token's row does not depend on how many tokens share the call.
TEST_F(CudaDenseTest, GemmBf16GemvIsDeterministicAndPerToken) {
  for (const DecodeGemmShape& s :
       {DecodeGemmShape{64, kHidden, 0}, DecodeGemmShape{1024, kHidden, 8},
        DecodeGemmShape{8192, 1024, 0}, DecodeGemmShape{kHidden, 8192, 0}}) {
    const int g = s.groups ? s.groups : 1;
    Tensor gpu_w = gpu().upload(randn({g * s.n, s.k}), DType::kBF16);
    Tensor x = gpu().upload(randn({kGemvMaxTokens, g * s.k}), DType::kF32);
    const auto run = [&](int64_t m) {
      const GemmCase c{m, s.k, s.n, s.groups};
      return gpu().to_host(run_gemm(gpu(), c, x.narrow(0, 0, m), gpu_w));
    };
    const std::string what = gemm_name({kGemvMaxTokens, s.k, s.n, s.groups});
    Tensor first = run(kGemvMaxTokens);
    Tensor second = run(kGemvMaxTokens);
    ASSERT_EQ(first.nbytes(), second.nbytes());
    EXPECT_EQ(std::memcmp(first.raw_data(), second.raw_data(), first.nbytes()), 0)
        << what << ": two runs differ";
    for (int64_t m = 1; m < kGemvMaxTokens; ++m) {
      Tensor few = run(m);
      EXPECT_EQ(std::memcmp(first.raw_data(), few.raw_data(), few.nbytes()), 0)
          << what << ": the first " << m << " tokens differ when run alone";
    }
  }
}

// ---- metadata errors and stream discipline ------------------------------------------------------

// The same bad call on both backends: the same Error(kInvalidArgument) message from the shared
// checker (backend/op_checks.h), up to the device each names.
TEST_F(CudaDenseTest, ArgumentErrorsAreTheSameOnBothBackends) {
  using testing::error_message;
  // Each case gets a backend and its uploads; cuda -> cpu in the CUDA message gives the CPU's.
  const std::vector<std::function<void(Backend&)>> cases = {
      [](Backend& b) {  // b: [3, 2], a is [2, 3]
        b.add(b.upload(Tensor::zeros({2, 3}, DType::kF32), DType::kF32),
              b.upload(Tensor::zeros({3, 2}, DType::kF32), DType::kF32));
      },
      [](Backend& b) {  // ids must be i32
        b.embedding(b.upload(Tensor::zeros({4, 8}, DType::kF32), DType::kF32),
                    b.upload(Tensor::zeros({2}, DType::kF32), DType::kF32));
      },
      [](Backend& b) {  // a strided view
        Tensor t = b.upload(Tensor::zeros({4, 3}, DType::kF32), DType::kF32);
        b.copy_rows(t.narrow(1, 0, 2), b.upload(i32({0}), DType::kI32),
                    b.upload(i32({1}), DType::kI32));
      },
      [](Backend& b) {  // an undefined tensor
        Tensor tokens = b.upload(i32({1, 2}), DType::kI32);
        b.select_tokens(tokens, Tensor(), tokens);
      },
      [](Backend& b) {  // position is i32
        SamplingBatch s;
        s.num_rows = 1;
        s.temperature = b.upload(Tensor::zeros({1}, DType::kF32), DType::kF32);
        s.top_k = b.upload(i32({0}), DType::kI32);
        s.top_p = b.upload(Tensor::zeros({1}, DType::kF32), DType::kF32);
        s.seed = b.upload(Tensor::zeros({1}, DType::kI64), DType::kI64);
        s.position = b.upload(Tensor::zeros({1}, DType::kI64), DType::kI64);
        s.num_logprobs = b.upload(i32({0}), DType::kI32);
        b.sample(b.upload(Tensor::zeros({1, 8}, DType::kF32), DType::kF32), s);
      },
  };
  for (const auto& bad : cases) {
    const std::string on_cpu = error_message([&] { bad(cpu()); });
    std::string on_gpu = error_message([&] { bad(gpu()); });
    for (size_t at = on_gpu.find(" on cuda"); at != std::string::npos;
         at = on_gpu.find(" on cuda", at)) {
      on_gpu.replace(at, 8, " on cpu");
    }
    EXPECT_EQ(on_gpu, on_cpu);
  }
  // A host tensor given to the CUDA backend.
  EXPECT_EQ(error_message([&] { gpu().scale(randn({2}), 2.0f); }),
            "scale: argument x must be on the cuda device, got f32[2] on cpu");
  // bf16 is a matrix weight dtype of the CUDA backend (weight_dtype(bf16) == bf16), f16 is not.
  EXPECT_EQ(error_message([&] {
              gpu().linear(gpu().upload(randn({2, 3}), DType::kF32),
                           gpu().upload(randn({2, 3}), DType::kF16));
            }),
            "linear: argument w must be (f32 or bf16)[*, 3], got f16[2, 3] on cuda");
  gpu().synchronize();
}

TEST_F(CudaDenseTest, MetadataErrorsThrowLikeTheCpu) {
  Tensor x = gpu().upload(randn({4, 64}), DType::kF32);
  Tensor host_x = randn({4, 64});
  Tensor pos = gpu().upload(i32({0, 1, 2, 3}), DType::kI32);
  EXPECT_THROW(gpu().rms_norm(x, gpu().upload(randn({63}), DType::kF32), 1e-6f), Error);
  EXPECT_THROW(gpu().rms_norm(host_x, Tensor(), 1e-6f), Error);
  EXPECT_THROW(gpu().add(x, gpu().upload(randn({4, 63}), DType::kF32)), Error);
  EXPECT_THROW(gpu().rope(x, pos, gpu().upload(rope_inv_freq(66, 1e4), DType::kF32), false), Error);
  EXPECT_THROW(gpu().argmax(gpu().upload(randn({4, 0}), DType::kF32)), Error);
  EXPECT_THROW(gpu().embedding(x, gpu().upload(randn({2}), DType::kF32)), Error);
  EXPECT_THROW(gpu().hc_expand(x, 0), Error);
  HcParams p;
  Tensor X = gpu().upload(randn({2, 4, 16}), DType::kF32);
  Tensor fn = gpu().upload(randn({24, 64}), DType::kF32);
  Tensor base = gpu().upload(randn({24}), DType::kF32);
  Tensor scale3 = gpu().upload(randn({3}), DType::kF32);
  EXPECT_NO_THROW(gpu().hc_pre(X, fn, base, scale3, p));
  EXPECT_THROW(gpu().hc_pre(X, fn, base, gpu().upload(randn({2}), DType::kF32), p), Error);
  p.sinkhorn_iters = 0;
  EXPECT_THROW(gpu().hc_pre(X, fn, base, scale3, p), Error);
  gpu().synchronize();
}

TEST_F(CudaDenseTest, OpsDoNotSynchronize) {
  Tensor x = gpu().upload(randn({5, 64}), DType::kF32);
  Tensor X = gpu().upload(randn({5, 4, 64}), DType::kF32);
  Tensor fn = gpu().upload(randn({24, 256}, 0.0625f), DType::kF32);
  Tensor base = gpu().upload(randn({24}), DType::kF32);
  Tensor scale3 = gpu().upload(randn({3}), DType::kF32);
  Tensor ids = gpu().upload(i32({0, 1, 2, 3, 4}), DType::kI32);
  Tensor freq = gpu().upload(rope_inv_freq(16, 1e4), DType::kF32);
  Tensor wl = gpu().upload(randn({96, 64}), DType::kBF16);
  Tensor wg = gpu().upload(randn({96, 32}), DType::kBF16);
  {
    HostSyncForbidden guard(gpu());
    Tensor l = gpu().linear(x, wl);              // bf16 GEMV
    Tensor gl = gpu().grouped_linear(x, wg, 2);  // bf16 GEMV, 2 groups
    Tensor e = gpu().embedding(x, ids);
    Tensor n = gpu().rms_norm(e, Tensor(), 1e-6f);
    Tensor r = gpu().rope(n, ids, freq, false);
    Tensor s = gpu().swiglu(gpu().scale(r, 2.0f), gpu().add(r, n), 10.0f);
    Tensor a = gpu().argmax(s);
    Tensor g = gpu().gather_rows(s, ids);
    gpu().copy_rows(g, gpu().upload(i32({0}), DType::kI32), gpu().upload(i32({1}), DType::kI32));
    HcMix m = gpu().hc_pre(X, fn, base, scale3, HcParams{});
    Tensor post = gpu().hc_post(X, m.y, m.post, m.comb);
    Tensor head = gpu().hc_head(post, gpu().upload(randn({4, 256}, 0.0625f), DType::kF32),
                                gpu().upload(randn({4}), DType::kF32),
                                gpu().upload(randn({1}), DType::kF32), HcParams{});
    gpu().select_tokens(gpu().zeros({5}, DType::kI32), ids, a);
  }
  gpu().synchronize();
}

}  // namespace
}  // namespace deepinfer::gpu_test
