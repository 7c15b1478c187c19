// CPU backend hyper-connection (hc_expand, hc_pre, hc_post, hc_post_pre, hc_head) and MoE
// (moe_route, moe_experts) ops against double-precision references on random inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "cpu_test_util.h"
#include "deepinfer/backend.h"
#include "deepinfer/error.h"
#include "error_message.h"

namespace deepinfer {
namespace {

using testing::expect_close;
using testing::fetch_f32;
using testing::fetch_i32;
using testing::sz;

// hc_post_pre's arguments: X [T, N, H], the trunk update (out, post, comb) and the mix weights
// (fn, base, scale).
struct HcPostPreArgs {
  Tensor X, out, post, comb, fn, base, scale;
};

class CpuHcMoeTest : public testing::BackendTest {
 protected:
  HcPostPreArgs random_hc_post_pre_args(int64_t T, int64_t N, int64_t H) {
    const int64_t M = (2 + N) * N;
    return {up(rng.uniform(sz(T * N * H), -2, 2), {T, N, H}),
            up(rng.uniform(sz(T * H)), {T, H}),
            up(rng.uniform(sz(T * N), 0, 2), {T, N}),
            up(rng.uniform(sz(T * N * N), 0, 1), {T, N, N}),
            up(rng.uniform(sz(M * N * H), -0.3f, 0.3f), {M, N * H}),
            up(rng.uniform(sz(M)), {M}),
            up(std::vector<float>{0.7f, 1.3f, 2.0f}, {3})};
  }
};

// ---- hyper-connections ------------------------------------------------------------------------

struct HcRef {
  std::vector<double> post, comb, y;
};

HcRef ref_hc_pre(const std::vector<float>& X, const std::vector<float>& fn,
                 const std::vector<float>& base, const std::vector<float>& scale, int64_t T,
                 int64_t N, int64_t H, const HcParams& p) {
  HcRef r;
  const int64_t W = N * H, M = (2 + N) * N;
  for (int64_t t = 0; t < T; ++t) {
    const float* x = X.data() + t * W;
    double ss = 0;
    for (int64_t i = 0; i < W; ++i) ss += double(x[i]) * x[i];
    const double inv = 1.0 / std::sqrt(ss / double(W) + p.norm_eps);
    std::vector<double> mix(sz(M));
    for (int64_t o = 0; o < M; ++o) {
      double s = 0;
      for (int64_t i = 0; i < W; ++i) s += x[i] * inv * fn[sz(o * W + i)];
      mix[sz(o)] = s;
    }
    auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
    std::vector<double> pre(sz(N));
    for (int64_t s = 0; s < N; ++s) {
      pre[sz(s)] = sig(mix[sz(s)] * scale[0] + base[sz(s)]) + p.hc_eps;
      r.post.push_back(2 * sig(mix[sz(N + s)] * scale[1] + base[sz(N + s)]));
    }
    std::vector<double> c(sz(N * N));
    for (int64_t i = 0; i < N; ++i) {
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j < N; ++j) {
        c[sz(i * N + j)] = mix[sz(2 * N + i * N + j)] * scale[2] + base[sz(2 * N + i * N + j)];
        mx = std::max(mx, c[sz(i * N + j)]);
      }
      for (int64_t j = 0; j < N; ++j) sum += std::exp(c[sz(i * N + j)] - mx);
      for (int64_t j = 0; j < N; ++j) {
        c[sz(i * N + j)] = std::exp(c[sz(i * N + j)] - mx) / sum + p.hc_eps;
      }
    }
    auto cols = [&] {
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t i = 0; i < N; ++i) s += c[sz(i * N + j)];
        for (int64_t i = 0; i < N; ++i) c[sz(i * N + j)] /= s + p.hc_eps;
      }
    };
    cols();
    for (int it = 1; it < p.sinkhorn_iters; ++it) {
      for (int64_t i = 0; i < N; ++i) {
        double s = 0;
        for (int64_t j = 0; j < N; ++j) s += c[sz(i * N + j)];
        for (int64_t j = 0; j < N; ++j) c[sz(i * N + j)] /= s + p.hc_eps;
      }
      cols();
    }
    r.comb.insert(r.comb.end(), c.begin(), c.end());
    for (int64_t h = 0; h < H; ++h) {
      double s = 0;
      for (int64_t k = 0; k < N; ++k) s += pre[sz(k)] * x[k * H + h];
      r.y.push_back(s);
    }
  }
  return r;
}

TEST_F(CpuHcMoeTest, HcExpand) {
  auto x = rng.uniform(3 * 5);
  auto got = fetch_f32(*be, be->hc_expand(up(x, {3, 5}), 4));
  std::vector<double> want;
  for (int t = 0; t < 3; ++t) {
    for (int s = 0; s < 4; ++s) {
      for (int h = 0; h < 5; ++h) want.push_back(x[sz(t * 5 + h)]);
    }
  }
  expect_close(got, want, 0, 0);
}

TEST_F(CpuHcMoeTest, HcPre) {
  HcParams p;
  for (int64_t T : {1, 6}) {
    const int64_t N = 4, H = 24, M = (2 + N) * N;
    auto X = rng.uniform(sz(T * N * H), -2, 2);
    auto fn = rng.uniform(sz(M * N * H), -0.3f, 0.3f);
    auto base = rng.uniform(sz(M));
    std::vector<float> scale = {0.7f, 1.3f, 2.0f};
    HcMix mix = be->hc_pre(up(X, {T, N, H}), up(fn, {M, N * H}), up(base, {M}), up(scale, {3}), p);
    HcRef ref = ref_hc_pre(X, fn, base, scale, T, N, H, p);
    expect_close(fetch_f32(*be, mix.post), ref.post, 1e-5, 1e-6, "post");
    expect_close(fetch_f32(*be, mix.comb), ref.comb, 1e-5, 1e-6, "comb");
    expect_close(fetch_f32(*be, mix.y), ref.y, 1e-5, 1e-6, "y");
    EXPECT_EQ(mix.comb.shape(), (Shape{T, N, N}));
  }
  HcParams few;
  few.hc_mult = 2;
  few.sinkhorn_iters = 1;
  const int64_t T = 3, N = 2, H = 5, M = 8;
  auto X = rng.uniform(sz(T * N * H));
  auto fn = rng.uniform(sz(M * N * H));
  auto base = rng.uniform(sz(M));
  std::vector<float> scale = {1.0f, 0.5f, 3.0f};
  HcMix mix = be->hc_pre(up(X, {T, N, H}), up(fn, {M, N * H}), up(base, {M}), up(scale, {3}), few);
  HcRef ref = ref_hc_pre(X, fn, base, scale, T, N, H, few);
  expect_close(fetch_f32(*be, mix.comb), ref.comb, 1e-5, 1e-6, "comb, one iteration");
  expect_close(fetch_f32(*be, mix.y), ref.y, 1e-5, 1e-6, "y, N=2");
  EXPECT_THROW(be->hc_pre(up(X, {T, N, H}), up(fn, {M, N * H}), up(base, {M}), up(scale, {3}), p),
               Error);  // hc_mult 4 does not match X
}

TEST_F(CpuHcMoeTest, HcPost) {
  const int64_t T = 3, N = 4, H = 7;
  auto X = rng.uniform(sz(T * N * H)), out = rng.uniform(sz(T * H));
  auto post = rng.uniform(sz(T * N), 0, 2), comb = rng.uniform(sz(T * N * N), 0, 1);
  auto got = fetch_f32(
      *be, be->hc_post(up(X, {T, N, H}), up(out, {T, H}), up(post, {T, N}), up(comb, {T, N, N})));
  std::vector<double> want;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < N; ++j) {
      for (int64_t h = 0; h < H; ++h) {
        double v = double(post[sz(t * N + j)]) * out[sz(t * H + h)];
        for (int64_t i = 0; i < N; ++i) {
          v += double(comb[sz(t * N * N + i * N + j)]) * X[sz((t * N + i) * H + h)];
        }
        want.push_back(v);
      }
    }
  }
  expect_close(got, want, 1e-5, 1e-6);
}

// hc_post_pre is hc_post, then hc_pre of its result: the same bits; and its checks are both ops'.
TEST_F(CpuHcMoeTest, HcPostPreIsPostThenPre) {
  HcParams p;
  const auto [X, out, post, comb, fn, base, scale] = random_hc_post_pre_args(3, 4, 6);
  const HcPostPre fused = be->hc_post_pre(X, out, post, comb, fn, base, scale, p);
  const Tensor trunk = be->hc_post(X, out, post, comb);
  const HcMix mix = be->hc_pre(trunk, fn, base, scale, p);
  auto want = [&](const Tensor& t) {
    const std::vector<float> v = fetch_f32(*be, t);
    return std::vector<double>(v.begin(), v.end());
  };
  expect_close(fetch_f32(*be, fused.trunk), want(trunk), 0, 0, "trunk");
  expect_close(fetch_f32(*be, fused.mix.post), want(mix.post), 0, 0, "post");
  expect_close(fetch_f32(*be, fused.mix.comb), want(mix.comb), 0, 0, "comb");
  expect_close(fetch_f32(*be, fused.mix.y), want(mix.y), 0, 0, "y");
  // hc_post's checks (comb's shape) and hc_pre's (fn's rows), under the op's name.
  EXPECT_THROW(be->hc_post_pre(X, out, post, post, fn, base, scale, p), Error);
  EXPECT_THROW(be->hc_post_pre(X, out, post, comb, base, base, scale, p), Error);
}

// y_norm (RowNorm) is rms_norm of the collapsed y, bit for bit, for each op that takes it;
// a weight of the wrong width is an error naming it.
TEST_F(CpuHcMoeTest, OutputNormIsRmsNormOfY) {
  HcParams p;
  const int64_t N = 4, H = 8;
  const float eps = 1e-5f;
  const auto [X, out, post, comb, fn, base, scale] = random_hc_post_pre_args(3, N, H);
  Tensor head_fn = up(rng.uniform(sz(N * N * H), -0.3f, 0.3f), {N, N * H});
  Tensor head_base = up(rng.uniform(sz(N)), {N});
  Tensor head_scale = up(std::vector<float>{0.8f}, {1});
  Tensor w = up(rng.uniform(sz(H), -1.5f, 1.5f), {H});
  const RowNorm norm{w, eps};
  auto same = [&](const Tensor& got, const Tensor& want, const char* what) {
    const std::vector<float> v = fetch_f32(*be, want);
    expect_close(fetch_f32(*be, got), std::vector<double>(v.begin(), v.end()), 0, 0, what);
  };
  same(be->hc_pre(X, fn, base, scale, p, norm).y,
       be->rms_norm(be->hc_pre(X, fn, base, scale, p).y, w, eps), "hc_pre");
  same(be->hc_post_pre(X, out, post, comb, fn, base, scale, p, norm).mix.y,
       be->rms_norm(be->hc_post_pre(X, out, post, comb, fn, base, scale, p).mix.y, w, eps),
       "hc_post_pre");
  same(be->hc_head(X, head_fn, head_base, head_scale, p, norm),
       be->rms_norm(be->hc_head(X, head_fn, head_base, head_scale, p), w, eps), "hc_head");
  const RowNorm wrong{up(rng.uniform(sz(H + 1)), {H + 1}), eps};
  EXPECT_NE(testing::error_message([&] {
              be->hc_pre(X, fn, base, scale, p, wrong);
            }).find("y_norm.weight"),
            std::string::npos);
  EXPECT_NE(testing::error_message([&] {
              be->hc_head(X, head_fn, head_base, head_scale, p, wrong);
            }).find("y_norm.weight"),
            std::string::npos);
}

TEST_F(CpuHcMoeTest, HcHead) {
  HcParams p;
  const int64_t T = 2, N = 4, H = 9;
  auto X = rng.uniform(sz(T * N * H), -2, 2);
  auto fn = rng.uniform(sz(N * N * H), -0.5f, 0.5f);
  auto base = rng.uniform(sz(N));
  std::vector<float> scale = {0.8f};
  auto got = fetch_f32(
      *be, be->hc_head(up(X, {T, N, H}), up(fn, {N, N * H}), up(base, {N}), up(scale, {1}), p));
  std::vector<double> want;
  for (int64_t t = 0; t < T; ++t) {
    const float* x = X.data() + t * N * H;
    double ss = 0;
    for (int64_t i = 0; i < N * H; ++i) ss += double(x[i]) * x[i];
    const double inv = 1.0 / std::sqrt(ss / double(N * H) + p.norm_eps);
    std::vector<double> pre(sz(N));
    for (int64_t s = 0; s < N; ++s) {
      double m = 0;
      for (int64_t i = 0; i < N * H; ++i) m += x[i] * inv * fn[sz(s * N * H + i)];
      pre[sz(s)] = 1.0 / (1.0 + std::exp(-(m * scale[0] + base[sz(s)]))) + p.hc_eps;
    }
    for (int64_t h = 0; h < H; ++h) {
      double v = 0;
      for (int64_t s = 0; s < N; ++s) v += pre[sz(s)] * x[s * H + h];
      want.push_back(v);
    }
  }
  expect_close(got, want, 1e-5, 1e-6);
}

// ---- mixture of experts
// ---------------------------------------------------------------------------

double ref_score(const std::vector<float>& x, const std::vector<float>& gw, int64_t t, int64_t e,
                 int64_t H) {
  double l = 0;
  for (int64_t h = 0; h < H; ++h) l += double(x[sz(t * H + h)]) * gw[sz(e * H + h)];
  const double sp = l > 20 ? l : std::log1p(std::exp(l));
  return std::sqrt(sp);
}

TEST_F(CpuHcMoeTest, MoeRouteTopK) {
  const int64_t T = 5, H = 16, E = 8;
  const int k = 3;
  auto x = rng.uniform(sz(T * H));
  auto gw = rng.uniform(sz(E * H));
  // Experts 2 and 5 share a gate row, so they tie on every token.
  std::copy(gw.begin() + 2 * H, gw.begin() + 3 * H, gw.begin() + 5 * H);
  auto bias = rng.uniform(sz(E), -0.1f, 0.1f);
  bias[5] = bias[2];
  for (bool with_bias : {false, true}) {
    Routing r = be->moe_route(up(x, {T, H}), up(gw, {E, H}), with_bias ? up(bias, {E}) : Tensor(),
                              Tensor(), Tensor(), k, 1.5f);
    auto ids = fetch_i32(*be, r.expert_ids);
    auto w = fetch_f32(*be, r.weights);
    std::vector<double> want_w;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> score(sz(E)), key(sz(E));
      for (int64_t e = 0; e < E; ++e) {
        score[sz(e)] = ref_score(x, gw, t, e, H);
        key[sz(e)] = score[sz(e)] + (with_bias ? bias[sz(e)] : 0.0);
      }
      std::vector<int> order(sz(E));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int a, int b) { return key[sz(a)] > key[sz(b)]; });
      std::vector<int> want_ids(order.begin(), order.begin() + k);
      std::vector<int> got_ids(ids.begin() + t * k, ids.begin() + (t + 1) * k);
      // The two tied experts: if both are chosen the lower one comes first; if one is, it is 2.
      EXPECT_EQ(got_ids, want_ids) << "token " << t;
      double sum = 0;
      for (int e : want_ids) sum += score[sz(e)];
      for (int e : want_ids) want_w.push_back(score[sz(e)] / (sum + 1e-20) * 1.5);
    }
    expect_close(w, want_w, 1e-5, 1e-7);
  }
}

TEST_F(CpuHcMoeTest, MoeRouteExactTiesPickLowerIndex) {
  const int64_t H = 4, E = 6;
  std::vector<float> x = {1, 0, 0, 0};
  std::vector<float> gw(sz(E * H), 0.0f);  // every expert scores the same
  Routing r = be->moe_route(up(x, {1, H}), up(gw, {E, H}), Tensor(), Tensor(), Tensor(), 4, 1.0f);
  EXPECT_EQ(fetch_i32(*be, r.expert_ids), (std::vector<int32_t>{0, 1, 2, 3}));
  expect_close(fetch_f32(*be, r.weights), {0.25, 0.25, 0.25, 0.25}, 1e-6, 0);
  // Large logits take softplus's linear branch.
  std::vector<float> big_gw(sz(E * H), 0.0f);
  big_gw[0] = 30.0f;
  big_gw[4] = 10.0f;
  Routing r2 =
      be->moe_route(up(x, {1, H}), up(big_gw, {E, H}), Tensor(), Tensor(), Tensor(), 2, 1.0f);
  EXPECT_EQ(fetch_i32(*be, r2.expert_ids), (std::vector<int32_t>{0, 1}));
  const double s0 = std::sqrt(30.0), s1 = std::sqrt(std::log1p(std::exp(10.0)));
  expect_close(fetch_f32(*be, r2.weights), {s0 / (s0 + s1), s1 / (s0 + s1)}, 1e-6, 0);
}

TEST_F(CpuHcMoeTest, MoeRouteHash) {
  const int64_t T = 4, H = 8, E = 5, V = 6;
  const int k = 2;
  auto x = rng.uniform(sz(T * H));
  auto gw = rng.uniform(sz(E * H));
  std::vector<int32_t> table = {0, 1, 4, 4, 2, 3, 1, 0, 3, 3, 0, 2};  // row 1 repeats expert 4
  std::vector<int32_t> tokens = {1, 5, 1, 3};
  Routing r = be->moe_route(up(x, {T, H}), up(gw, {E, H}), Tensor(), up_i(table, {V, k}),
                            up_i(tokens, {T}), k, 2.5f);
  auto ids = fetch_i32(*be, r.expert_ids);
  std::vector<int32_t> want_ids;
  std::vector<double> want_w;
  for (int64_t t = 0; t < T; ++t) {
    double sum = 0;
    for (int j = 0; j < k; ++j) {
      const int e = table[sz(tokens[sz(t)] * k + j)];
      want_ids.push_back(e);
      sum += ref_score(x, gw, t, e, H);
    }
    for (int j = 0; j < k; ++j) {
      want_w.push_back(ref_score(x, gw, t, table[sz(tokens[sz(t)] * k + j)], H) / (sum + 1e-20) *
                       2.5);
    }
  }
  EXPECT_EQ(ids, want_ids);
  expect_close(fetch_f32(*be, r.weights), want_w, 1e-5, 1e-7);
  // A token id past tid2eid and an expert id past the gate are content errors.
  be->moe_route(up(x, {T, H}), up(gw, {E, H}), Tensor(), up_i(table, {V, k}),
                up_i({0, 6, 0, 0}, {T}), k, 1.0f);
  EXPECT_THROW(be->synchronize(), Error);
  std::vector<int32_t> bad_table = table;
  bad_table[3] = 5;
  be->moe_route(up(x, {T, H}), up(gw, {E, H}), Tensor(), up_i(bad_table, {V, k}), up_i(tokens, {T}),
                k, 1.0f);
  EXPECT_THROW(be->synchronize(), Error);
}

TEST_F(CpuHcMoeTest, MoeExperts) {
  const int64_t T = 6, H = 12, I = 10, E = 4, K = 3;
  const float L = 1.5f;  // small enough that the clamps bite
  auto x = rng.uniform(sz(T * H), -2, 2);
  ExpertWeights ew;
  std::vector<std::vector<float>> w1, w3, w2;
  for (int64_t e = 0; e < E; ++e) {
    w1.push_back(rng.uniform(sz(I * H)));
    w3.push_back(rng.uniform(sz(I * H)));
    w2.push_back(rng.uniform(sz(H * I)));
    ew.w1.push_back(up(w1.back(), {I, H}));
    ew.w3.push_back(up(w3.back(), {I, H}));
    ew.w2.push_back(up(w2.back(), {H, I}));
  }
  // Token 2 picks expert 1 twice; expert 3 is used by nobody.
  std::vector<int32_t> ids = {0, 1, 2, 1, 2, 0, 1, 1, 0, 2, 0, 1, 0, 0, 2, 1, 2, 0};
  auto wts = rng.uniform(sz(T * K), 0.1f, 1.0f);
  Routing r{up_i(ids, {T, K}), up(wts, {T, K})};
  auto got = fetch_f32(*be, be->moe_experts(up(x, {T, H}), r, ew, L));
  std::vector<double> want(sz(T * H), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < K; ++j) {
      const size_t e = sz(ids[sz(t * K + j)]);
      std::vector<double> act(sz(I));
      for (int64_t i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (int64_t h = 0; h < H; ++h) {
          g += double(w1[e][sz(i * H + h)]) * x[sz(t * H + h)];
          u += double(w3[e][sz(i * H + h)]) * x[sz(t * H + h)];
        }
        g = std::min<double>(g, L);
        u = std::clamp<double>(u, -L, L);
        act[sz(i)] = g / (1 + std::exp(-g)) * u;
      }
      for (int64_t h = 0; h < H; ++h) {
        double y = 0;
        for (int64_t i = 0; i < I; ++i) y += double(w2[e][sz(h * I + i)]) * act[sz(i)];
        want[sz(t * H + h)] += wts[sz(t * K + j)] * y;
      }
    }
  }
  expect_close(got, want, 1e-5, 1e-6);
  // Metadata errors name the expert matrix (the front checks all 3 x E of them).
  const Tensor xs = up(x, {T, H});
  ExpertWeights bad = ew;
  bad.w3[2] = up(rng.uniform(sz(I * (H + 1))), {I, H + 1});
  std::string m = testing::error_message([&] { be->moe_experts(xs, r, bad, L); });
  EXPECT_NE(m.find("experts.w3[2]"), std::string::npos) << m;
  bad = ew;
  bad.w2[1].act_group = 4;
  m = testing::error_message([&] { be->moe_experts(xs, r, bad, L); });
  EXPECT_NE(m.find("experts.w2[1]"), std::string::npos) << m;
  EXPECT_NE(m.find("one format for all experts"), std::string::npos) << m;
  // An expert id outside the list is a content error.
  ids[4] = 4;
  be->moe_experts(up(x, {T, H}), Routing{up_i(ids, {T, K}), up(wts, {T, K})}, ew, L);
  EXPECT_THROW(be->synchronize(), Error);
}

}  // namespace
}  // namespace deepinfer
