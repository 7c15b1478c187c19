// CPU backend: memory and stream semantics and the dense ops, each op checked against a
// straightforward double-precision reference on random inputs. Hyper-connection and MoE ops are in
// test_cpu_hc_moe.cpp, cache and attention ops in test_cpu_attention.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "cpu_test_util.h"
#include "deepinfer/backend.h"
#include "deepinfer/error.h"
#include "error_message.h"

namespace deepinfer {
namespace {

using testing::expect_close;
using testing::fetch_f32;
using testing::fetch_i32;
using testing::host_f32;
using testing::host_i32;
using testing::Rng;
using testing::sz;

class CpuBackendTest : public testing::BackendTest {};

// ---- memory and stream semantics -----------------------------------------------------------

TEST_F(CpuBackendTest, Identity) {
  EXPECT_EQ(be->device_kind(), DeviceKind::kCpu);
  EXPECT_NE(be->name().find("cpu"), std::string::npos);
}

TEST_F(CpuBackendTest, ZerosAndEmptyAreZeroed) {
  for (Tensor t : {be->zeros({3, 5}, DType::kF32), be->empty({4}, DType::kF32)}) {
    for (float v : fetch_f32(*be, t)) EXPECT_EQ(v, 0.0f);
  }
  EXPECT_EQ(be->zeros({2, 2}, DType::kI32).dtype(), DType::kI32);
}

TEST_F(CpuBackendTest, UploadCopies) {
  Tensor host = host_f32({1, 2, 3, 4}, {2, 2});
  Tensor dev = be->upload(host, DType::kF32);
  host.data<float>()[0] = 100.0f;
  EXPECT_EQ(fetch_f32(*be, dev), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_NE(dev.raw_data(), host.raw_data());
}

TEST_F(CpuBackendTest, UploadConverts) {
  Tensor host = Tensor::from_vector<int64_t>({5, -7, 9}, {3});
  EXPECT_EQ(fetch_i32(*be, be->upload(host, DType::kI32)), (std::vector<int32_t>{5, -7, 9}));
  Tensor bf = host_f32({1.5f, -2.25f}, {2}).to(DType::kBF16);
  EXPECT_EQ(fetch_f32(*be, be->upload(bf, DType::kF32)), (std::vector<float>{1.5f, -2.25f}));
  EXPECT_THROW(be->upload(host, DType::kF32), Error);  // i64 -> f32 is not a conversion we do
}

TEST_F(CpuBackendTest, HostSyncForbiddenNestsAndRestores) {
  Tensor t = be->zeros({2}, DType::kF32);
  {
    HostSyncForbidden outer(*be);
    {
      HostSyncForbidden inner(*be);
      EXPECT_THROW(be->to_host(t), Error);
    }
    // The inner guard restored the outer one's setting, not "allowed".
    EXPECT_THROW(be->to_host(t), Error);
    EXPECT_THROW(be->synchronize(), Error);
  }
  EXPECT_EQ(fetch_f32(*be, t), (std::vector<float>{0, 0}));
}

TEST_F(CpuBackendTest, UploadIntoAndCopyIntoKeepTheDestination) {
  Tensor dst = be->zeros({2, 2}, DType::kF32);
  void* addr = dst.raw_data();
  Tensor host = host_f32({1, 2, 3, 4}, {2, 2});
  be->upload_into(dst, host);
  host.data<float>()[0] = 100;  // the caller may reuse host at once
  EXPECT_EQ(fetch_f32(*be, dst), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(dst.raw_data(), addr);
  Tensor src = be->upload(host_f32({5, 6}, {2}), DType::kF32);
  be->copy_into(dst.narrow(0, 1, 1).reshape({2}), src);
  EXPECT_EQ(fetch_f32(*be, dst), (std::vector<float>{1, 2, 5, 6}));
  EXPECT_THROW(be->upload_into(dst, host_f32({1, 2, 3}, {3})), Error);
  EXPECT_THROW(be->upload_into(dst, Tensor::from_vector<int64_t>({1, 2, 3, 4}, {2, 2})), Error);
  EXPECT_THROW(be->copy_into(dst, src), Error);
  EXPECT_THROW(be->copy_into(dst.narrow(0, 0, 1).reshape({2}), be->zeros({2}, DType::kI32)), Error);
}

TEST_F(CpuBackendTest, CaptureRecordsWithoutRunningAndReplaysOnCurrentInputs) {
  Tensor in = be->upload(host_f32({1, 2}, {2}), DType::kF32);
  Tensor out = be->zeros({2}, DType::kF32);
  int calls = 0;
  auto graph = be->capture([&] {
    ++calls;
    be->copy_into(out, be->scale(in, 2.0f));
  });
  be->synchronize();
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(fetch_f32(*be, out), (std::vector<float>{0, 0}));
  graph->replay();
  EXPECT_EQ(fetch_f32(*be, out), (std::vector<float>{2, 4}));
  be->upload_into(in, host_f32({-3, 5}, {2}));
  graph->replay();
  EXPECT_EQ(fetch_f32(*be, out), (std::vector<float>{-6, 10}));
  EXPECT_EQ(calls, 2);
  EXPECT_THROW(be->capture(nullptr), Error);
}

TEST_F(CpuBackendTest, UploadWeightAliasesOrConverts) {
  Tensor w = host_f32({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor dev = be->upload_weight(w, DType::kF32);
  EXPECT_EQ(dev.raw_data(), w.raw_data());
  EXPECT_EQ(dev.storage(), w.storage());
  Tensor bf = w.to(DType::kBF16);
  Tensor conv = be->upload_weight(bf, DType::kF32);
  EXPECT_EQ(conv.dtype(), DType::kF32);
  EXPECT_EQ(fetch_f32(*be, conv), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  Tensor f16 = w.to(DType::kF16);
  EXPECT_EQ(fetch_f32(*be, be->upload_weight(f16, DType::kF32)),
            (std::vector<float>{1, 2, 3, 4, 5, 6}));
  Tensor ids = Tensor::from_vector<int64_t>({0, 3, 1, 2}, {2, 2});
  EXPECT_EQ(fetch_i32(*be, be->upload_weight(ids, DType::kI32)),
            (std::vector<int32_t>{0, 3, 1, 2}));
  // A strided view is made contiguous (a copy).
  Tensor col = w.narrow(1, 1, 2);
  Tensor packed = be->upload_weight(col, DType::kF32);
  EXPECT_TRUE(packed.is_contiguous());
  EXPECT_EQ(fetch_f32(*be, packed), (std::vector<float>{2, 3, 5, 6}));
}

TEST_F(CpuBackendTest, ToHostReturnsACopy) {
  Tensor dev = up({1, 2, 3}, {3});
  Tensor h = be->to_host(dev);
  h.data<float>()[0] = 50.0f;
  EXPECT_EQ(fetch_f32(*be, dev), (std::vector<float>{1, 2, 3}));
}

TEST_F(CpuBackendTest, OpsRunInOrder) {
  std::vector<float> a = rng.uniform(1000);
  Tensor x = up(a, {10, 100});
  Tensor y = x;
  for (int i = 0; i < 50; ++i) y = be->add(be->scale(y, 0.5f), x);  // converges towards 2x
  auto e = be->record_event();
  e->wait();
  EXPECT_TRUE(e->query());
  std::vector<double> want(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    double v = a[i];
    for (int r = 0; r < 50; ++r) v = v * 0.5 + a[i];
    want[i] = v;
  }
  expect_close(fetch_f32(*be, y), want, 1e-5, 1e-6);
}

TEST_F(CpuBackendTest, WorkerErrorSurfacesAtSynchronizeAndBackendRecovers) {
  Tensor table = up(rng.uniform(4 * 3), {4, 3});
  Tensor bad = be->embedding(table, up_i({0, 4}, {2}));
  Tensor after = be->scale(bad, 2.0f);  // depends on the failed op: skipped
  (void)after;
  try {
    be->synchronize();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("embedding"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ids[1] = 4"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(be->synchronize());
  Tensor good = be->embedding(table, up_i({3}, {1}));
  auto tab = fetch_f32(*be, table);
  EXPECT_EQ(fetch_f32(*be, good), (std::vector<float>(tab.begin() + 9, tab.end())));
}

TEST_F(CpuBackendTest, ErrorReachesEventWait) {
  Tensor table = up(rng.uniform(4 * 3), {4, 3});
  auto before = be->record_event();
  be->embedding(table, up_i({-1}, {1}));
  auto after = be->record_event();
  EXPECT_NO_THROW(before->wait());
  EXPECT_THROW(after->wait(), Error);
  EXPECT_NO_THROW(be->synchronize());
}

TEST_F(CpuBackendTest, MetadataErrorsThrowOnTheCallingThread) {
  Tensor x = up(rng.uniform(6), {2, 3});
  Tensor w = up(rng.uniform(8), {2, 4});
  try {
    be->linear(x, w);
    ADD_FAILURE() << "expected a shape error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("linear"), std::string::npos) << msg;
    EXPECT_NE(msg.find("f32[2, 4]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("f32[*, 3]"), std::string::npos) << msg;
  }
  Tensor strided = up(rng.uniform(12), {3, 4}).narrow(1, 0, 3);
  EXPECT_THROW(be->linear(strided, up(rng.uniform(9), {3, 3})), Error);
  EXPECT_THROW(be->add(x, be->zeros({3, 2}, DType::kF32)), Error);
  EXPECT_THROW(be->embedding(x, up(rng.uniform(2), {2})), Error);  // ids must be i32
  EXPECT_THROW(be->rms_norm(x, up(rng.uniform(2), {2}), 1e-6f), Error);
}

TEST_F(CpuBackendTest, ResultsDoNotDependOnThreadCount) {
  auto one = make_cpu_backend(1);
  const std::vector<float> xv = rng.uniform(37 * 600), wv = rng.uniform(70 * 600);
  Tensor x = host_f32(xv, {37, 600}), w = host_f32(wv, {70, 600});
  auto a = fetch_f32(*be, be->linear(be->upload(x, DType::kF32), be->upload(w, DType::kF32)));
  auto b = fetch_f32(*one, one->linear(one->upload(x, DType::kF32), one->upload(w, DType::kF32)));
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

// ---- dense ops ----------------------------------------------------------------------------------

TEST_F(CpuBackendTest, Embedding) {
  const int V = 11, H = 6;
  auto table = rng.uniform(V * H);
  std::vector<int32_t> ids = {3, 0, 10, 3};
  auto got = fetch_f32(*be, be->embedding(up(table, {V, H}), up_i(ids, {4})));
  std::vector<double> want;
  for (int id : ids) {
    for (int h = 0; h < H; ++h) want.push_back(table[static_cast<size_t>(id * H + h)]);
  }
  expect_close(got, want, 0, 0);
}

std::vector<double> ref_rms_norm(const std::vector<float>& x, const std::vector<float>* w,
                                 size_t dim, double eps) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / dim; ++r) {
    double ss = 0;
    for (size_t i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / double(dim) + eps);
    for (size_t i = 0; i < dim; ++i) y[r * dim + i] = x[r * dim + i] * inv * (w ? (*w)[i] : 1.0);
  }
  return y;
}

TEST_F(CpuBackendTest, RmsNorm) {
  for (auto shape : {Shape{1, 7}, Shape{5, 64}, Shape{2, 3, 40}}) {
    const size_t dim = static_cast<size_t>(shape.back());
    size_t n = 1;
    for (auto s : shape) n *= static_cast<size_t>(s);
    auto x = rng.uniform(n, -3, 3);
    auto w = rng.uniform(dim);
    expect_close(fetch_f32(*be, be->rms_norm(up(x, shape), up(w, {int64_t(dim)}), 1e-6f)),
                 ref_rms_norm(x, &w, dim, 1e-6), 1e-5, 1e-6, "weighted");
    expect_close(fetch_f32(*be, be->rms_norm(up(x, shape), Tensor(), 1e-3f)),
                 ref_rms_norm(x, nullptr, dim, 1e-3), 1e-5, 1e-6, "unweighted");
  }
}

std::vector<double> ref_linear(const std::vector<float>& x, const std::vector<float>& w, int64_t m,
                               int64_t n, int64_t k) {
  std::vector<double> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t l = 0; l < k; ++l) s += double(x[sz(i * k + l)]) * w[sz(j * k + l)];
      y[sz(i * n + j)] = s;
    }
  }
  return y;
}

TEST_F(CpuBackendTest, Linear) {
  struct Case {
    int64_t m, n, k;
  };
  for (Case c : {Case{1, 1, 1}, Case{1, 33, 100}, Case{7, 13, 37}, Case{33, 70, 600},
                 Case{70, 5, 1030}, Case{4, 8, 16}, Case{3, 2, 0}}) {
    auto x = rng.uniform(sz(c.m * c.k));
    auto w = rng.uniform(sz(c.n * c.k));
    auto got = fetch_f32(*be, be->linear(up(x, {c.m, c.k}), up(w, {c.n, c.k})));
    // fp32 accumulation over K terms of size ~1: absolute error grows like sqrt(K) * 1e-7.
    expect_close(
        got, ref_linear(x, w, c.m, c.n, c.k), 1e-5, 2e-5,
        "linear " + std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k));
  }
}

TEST_F(CpuBackendTest, GroupedLinear) {
  const int64_t M = 5, G = 3, K = 20, N = 7;
  auto x = rng.uniform(sz(M * G * K));
  auto w = rng.uniform(sz(G * N * K));
  auto got = fetch_f32(*be, be->grouped_linear(up(x, {M, G * K}), up(w, {G * N, K}), int(G)));
  std::vector<double> want(sz(M * G * N));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) {
          s += double(x[sz(m * G * K + g * K + k)]) * w[sz((g * N + n) * K + k)];
        }
        want[sz(m * G * N + g * N + n)] = s;
      }
    }
  }
  expect_close(got, want, 1e-5, 1e-6);
  EXPECT_THROW(be->grouped_linear(up(x, {M, G * K}), up(w, {G * N, K}), 4), Error);
}

// linear_pair is the two linears of its weights, bit for bit on the CPU; a weight whose K is not
// x's is refused naming it.
TEST_F(CpuBackendTest, LinearPairIsTwoLinears) {
  const int64_t M = 3, K = 40, NA = 9, NB = 5;
  const Tensor x = up(rng.uniform(sz(M * K)), {M, K});
  const Tensor a = up(rng.uniform(sz(NA * K)), {NA, K});
  const Tensor b = up(rng.uniform(sz(NB * K)), {NB, K});
  const auto [ya, yb] = be->linear_pair(x, a, b);
  EXPECT_EQ(fetch_f32(*be, ya), fetch_f32(*be, be->linear(x, a)));
  EXPECT_EQ(fetch_f32(*be, yb), fetch_f32(*be, be->linear(x, b)));
  EXPECT_EQ(ya.shape(), (std::vector<int64_t>{M, NA}));
  EXPECT_EQ(yb.shape(), (std::vector<int64_t>{M, NB}));
  try {
    be->linear_pair(x, a, up(rng.uniform(sz(NB * 8)), {NB, 8}));
    ADD_FAILURE() << "a second weight of K 8 was accepted for x of K 40";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear_pair: argument b must be f32[*, 40]"),
              std::string::npos)
        << e.what();
  }
}

// linear and linear_pair with a RowNorm of x are rms_norm then the linears, bit for bit on the
// CPU; a norm weight whose width is not x's is refused naming it.
TEST_F(CpuBackendTest, LinearsWithARowNormReadTheNormedInput) {
  const int64_t M = 3, K = 40, NA = 9, NB = 5;
  const float eps = 1e-6f;
  const Tensor x = up(rng.uniform(sz(M * K), -3, 3), {M, K});
  const Tensor a = up(rng.uniform(sz(NA * K)), {NA, K});
  const Tensor b = up(rng.uniform(sz(NB * K)), {NB, K});
  const Tensor g = up(rng.uniform(sz(K), 0.5f, 1.5f), {K});
  const RowNorm norm{g, eps};
  const Tensor normed = be->rms_norm(x, g, eps);
  const auto [ya, yb] = be->linear_pair(x, a, b, norm);
  EXPECT_EQ(fetch_f32(*be, ya), fetch_f32(*be, be->linear(normed, a)));
  EXPECT_EQ(fetch_f32(*be, yb), fetch_f32(*be, be->linear(normed, b)));
  EXPECT_EQ(fetch_f32(*be, be->linear(x, a, norm)), fetch_f32(*be, be->linear(normed, a)));
  EXPECT_NE(fetch_f32(*be, be->linear(x, a, norm)), fetch_f32(*be, be->linear(x, a)));
  const RowNorm wrong{up(rng.uniform(sz(K + 1)), {K + 1}), eps};
  for (const std::string& message :
       {testing::error_message([&] { be->linear(x, a, wrong); }),
        testing::error_message([&] { be->linear_pair(x, a, b, wrong); })}) {
    EXPECT_NE(message.find("x_norm.weight"), std::string::npos) << message;
  }
}

TEST_F(CpuBackendTest, ScaleAddSwiglu) {
  auto a = rng.uniform(24, -15, 15), b = rng.uniform(24, -15, 15);
  std::vector<double> s, sum, sw;
  const double L = 10.0;
  for (size_t i = 0; i < a.size(); ++i) {
    s.push_back(double(a[i]) * 0.37f);
    sum.push_back(double(a[i]) + b[i]);
    const double g = std::min<double>(a[i], L);
    const double u = std::clamp<double>(b[i], -L, L);
    sw.push_back(g / (1 + std::exp(-g)) * u);
  }
  expect_close(fetch_f32(*be, be->scale(up(a, {4, 6}), 0.37f)), s, 1e-6, 0);
  expect_close(fetch_f32(*be, be->add(up(a, {4, 6}), up(b, {4, 6}))), sum, 1e-6, 0);
  expect_close(fetch_f32(*be, be->swiglu(up(a, {2, 12}), up(b, {2, 12}), float(L))), sw, 1e-5,
               1e-6);
}

TEST_F(CpuBackendTest, GatherRows) {
  auto x = rng.uniform(5 * 2 * 3);
  std::vector<int32_t> rows = {4, 0, 4, 2};
  auto got = fetch_f32(*be, be->gather_rows(up(x, {5, 2, 3}), up_i(rows, {4})));
  std::vector<double> want;
  for (int r : rows) {
    for (int i = 0; i < 6; ++i) want.push_back(x[sz(r * 6 + i)]);
  }
  expect_close(got, want, 0, 0);
  auto ids = fetch_i32(*be, be->gather_rows(up_i({7, 8, 9}, {3}), up_i({2, 2, 0}, {3})));
  EXPECT_EQ(ids, (std::vector<int32_t>{9, 9, 7}));
  be->gather_rows(up(x, {5, 6}), up_i({5}, {1}));
  EXPECT_THROW(be->synchronize(), Error);
}

TEST_F(CpuBackendTest, Argmax) {
  std::vector<float> x = {1,  3,  3,  0,   //
                          -1, -1, -1, -1,  //
                          0,  0,  0,  5};
  EXPECT_EQ(fetch_i32(*be, be->argmax(up(x, {3, 4}))), (std::vector<int32_t>{1, 0, 3}));
  auto big = rng.uniform(2 * 1000);
  auto got = fetch_i32(*be, be->argmax(up(big, {2, 1000})));
  for (int r = 0; r < 2; ++r) {
    auto it = std::max_element(big.begin() + r * 1000, big.begin() + (r + 1) * 1000);
    EXPECT_EQ(got[sz(r)], int(it - (big.begin() + r * 1000)));
  }
}

// inv_freq of R rotated channels at theta 10000.
std::vector<float> rope_inv_freq(int64_t R) {
  std::vector<float> inv_freq;
  for (int64_t i = 0; i < R / 2; ++i) inv_freq.push_back(std::pow(10000.0f, -2.0f * i / R));
  return inv_freq;
}

std::vector<double> ref_rope(const std::vector<float>& x, const std::vector<int32_t>& pos,
                             const std::vector<float>& inv_freq, int64_t heads, int64_t d,
                             bool inverse) {
  std::vector<double> y(x.begin(), x.end());
  const int64_t half = int64_t(inv_freq.size());
  for (size_t t = 0; t < pos.size(); ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < half; ++i) {
        const float angle = float(pos[t]) * inv_freq[sz(i)];  // fp32 angle, as specified
        const double c = std::cos(double(angle));
        const double s = (inverse ? -1 : 1) * std::sin(double(angle));
        const size_t base = (t * sz(heads) + sz(h)) * sz(d) + sz(d - 2 * half + 2 * i);
        const double a = x[base], b = x[base + 1];
        y[base] = a * c - b * s;
        y[base + 1] = b * c + a * s;
      }
    }
  }
  return y;
}

TEST_F(CpuBackendTest, Rope) {
  const int64_t T = 4, heads = 3, d = 12, R = 8;
  const std::vector<float> inv_freq = rope_inv_freq(R);
  std::vector<int32_t> pos = {0, 1, 17, 4099};
  auto x = rng.uniform(sz(T * heads * d));
  for (bool inverse : {false, true}) {
    auto got = fetch_f32(
        *be, be->rope(up(x, {T, heads, d}), up_i(pos, {T}), up(inv_freq, {R / 2}), inverse));
    expect_close(got, ref_rope(x, pos, inv_freq, heads, d, inverse), 1e-5, 1e-6);
  }
  // Rank-2 input, every channel rotating; rope then inverse rope is the identity.
  auto x2 = rng.uniform(sz(T * R));
  Tensor fwd = be->rope(up(x2, {T, R}), up_i(pos, {T}), up(inv_freq, {R / 2}), false);
  expect_close(fetch_f32(*be, fwd), ref_rope(x2, pos, inv_freq, 1, R, false), 1e-5, 1e-6);
  Tensor back = be->rope(fwd, up_i(pos, {T}), up(inv_freq, {R / 2}), true);
  expect_close(fetch_f32(*be, back), std::vector<double>(x2.begin(), x2.end()), 1e-5, 1e-5);
  EXPECT_THROW(be->rope(up(x2, {T, R}), up_i(pos, {T}), up(rng.uniform(5), {5}), false), Error);
}

// A bf16 x (an attention output under AttentionSpec::bf16_output) is widened exactly: the result
// is f32 and equals the rotation of the widened values bit for bit. Other dtypes are refused by
// name.
TEST_F(CpuBackendTest, RopeTakesBf16InputAsItsF32Widening) {
  const int64_t T = 3, heads = 2, d = 16, R = 8;
  const std::vector<float> inv_freq = rope_inv_freq(R);
  const Tensor pos = up_i({0, 9, 4099}, {T});
  const Tensor freq = up(inv_freq, {R / 2});
  const Tensor host_bf16 =
      Tensor::from_vector(rng.uniform(sz(T * heads * d)), {T, heads, d}).to(DType::kBF16);
  const Tensor x_bf16 = be->upload(host_bf16, DType::kBF16);
  const Tensor x_wide = be->upload(host_bf16.to(DType::kF32), DType::kF32);
  for (bool inverse : {false, true}) {
    const Tensor got = be->rope(x_bf16, pos, freq, inverse);
    EXPECT_EQ(got.dtype(), DType::kF32);
    EXPECT_EQ(fetch_f32(*be, got), fetch_f32(*be, be->rope(x_wide, pos, freq, inverse)));
  }
  try {
    be->rope(up_i(std::vector<int32_t>(sz(T * d), 1), {T, d}), pos, freq, false);
    FAIL() << "an i32 x was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rope: argument x must be f32 or bf16"), std::string::npos)
        << e.what();
  }
}

// rms_norm_rope is rope(rms_norm(.)) bit for bit, weighted or not, and its checks name the
// argument at fault.
TEST_F(CpuBackendTest, RmsNormRopeIsTheNormThenTheRotation) {
  const int64_t T = 3, heads = 2, d = 16, R = 8;
  const std::vector<float> inv_freq = rope_inv_freq(R);
  const Tensor pos = up_i({0, 9, 4099}, {T});
  const Tensor freq = up(inv_freq, {R / 2});
  const Tensor x = up(rng.uniform(sz(T * heads * d)), {T, heads, d});
  const Tensor w = up(rng.uniform(sz(d)), {d});
  for (const Tensor& weight : {w, Tensor()}) {
    const auto fused = fetch_f32(*be, be->rms_norm_rope(x, weight, 1e-6f, pos, freq));
    const auto two = fetch_f32(*be, be->rope(be->rms_norm(x, weight, 1e-6f), pos, freq, false));
    EXPECT_EQ(fused, two);
    // bf16_output permits a device to round; the CPU reference stays f32.
    const Tensor kept = be->rms_norm_rope(x, weight, 1e-6f, pos, freq, /*bf16_output=*/true);
    EXPECT_EQ(kept.dtype(), DType::kF32);
    EXPECT_EQ(fetch_f32(*be, kept), fused);
  }
  // Nor does its attention round q, so the model asks it for f32 q.
  AttentionSpec spec;
  spec.bf16_math = true;
  EXPECT_FALSE(be->attention_rounds_query(512, DType::kU8, spec));
  try {
    be->rms_norm_rope(x, w, 1e-6f, up_i({0, 1}, {2}), freq);
    FAIL() << "positions of the wrong length were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rms_norm_rope: argument positions"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(be->rms_norm_rope(x, up(rng.uniform(5), {5}), 1e-6f, pos, freq), Error);
  EXPECT_THROW(be->rms_norm_rope(x, w, 1e-6f, pos, up(rng.uniform(9), {9})), Error);
}

}  // namespace
}  // namespace deepinfer
