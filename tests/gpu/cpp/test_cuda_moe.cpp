// CUDA moe_route and moe_experts against the CPU reference ops, at tiny sizes and at V4-Flash
// sizes (E = 256, k = 6, H = 4096, I = 2048), with f32 and bf16 weights, for every router path
// (decode GEMV tiles, cuBLAS from 64 tokens, register and generic top-k) and exact ties. bf16
// weights are compared against the CPU op on the same bf16-rounded values (the CPU keeps f32). The
// prefill shape of moe_experts with bf16 weights runs on tensor cores with bf16-rounded
// activations, so it is held to a bf16 tolerance; every other path computes in f32 and must match
// to summation order.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"

namespace deepinfer::gpu_test {
namespace {

size_t sz(int64_t i) {
  return static_cast<size_t>(i);
}

// The values the CPU sees for a matrix stored as `dtype` on the device.
Tensor as_stored(const Tensor& host_f32, DType dtype) {
  return dtype == DType::kBF16 ? host_f32.to(DType::kBF16).to(DType::kF32) : host_f32;
}

Tensor upload_i32(Backend& be, const Tensor& host) {
  return be.upload(host, DType::kI32);
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// ---- moe_route ---------------------------------------------------------------------------------

struct RouteCase {
  int experts, top_k, hidden, tokens;
  DType gate_dtype;
  bool bias;
};

std::string route_name(const RouteCase& c) {
  return "E" + std::to_string(c.experts) + " k" + std::to_string(c.top_k) + " H" +
         std::to_string(c.hidden) + " T" + std::to_string(c.tokens) + " " +
         dtype_name(c.gate_dtype) + (c.bias ? " bias" : "");
}

// True when the top k + 1 routing keys of token t (in double, from the values both backends
// see) are separated by more than `gap`, so f32 rounding cannot reorder the chosen ids.
bool well_separated(const Tensor& x, const Tensor& gate, const Tensor& bias, int64_t t, int top_k,
                    double gap) {
  const int64_t experts = gate.size(0), hidden = gate.size(1);
  const float* xr = x.data<float>() + t * hidden;
  std::vector<double> keys(sz(experts));
  for (int64_t e = 0; e < experts; ++e) {
    double logit = 0;
    const float* g = gate.data<float>() + e * hidden;
    for (int64_t h = 0; h < hidden; ++h) logit += static_cast<double>(xr[h]) * g[h];
    const double sp = logit > 20 ? logit : std::log1p(std::exp(logit));
    keys[sz(e)] = std::sqrt(sp) + (bias.defined() ? bias.data<float>()[e] : 0.0f);
  }
  std::sort(keys.begin(), keys.end(), std::greater<>());
  const int64_t last = std::min<int64_t>(top_k, experts - 1);
  for (int64_t j = 0; j < last; ++j) {
    if (keys[sz(j)] - keys[sz(j + 1)] < gap) return false;
  }
  return true;
}

void run_route_case(Backends& b, const RouteCase& c, std::mt19937& rng) {
  SCOPED_TRACE(route_name(c));
  Tensor x = random_f32(rng, {c.tokens, c.hidden});
  // Logits ~ N(0, 1): scores spread over roughly [0.5, 2].
  Tensor gate =
      random_f32(rng, {c.experts, c.hidden}, 1.0f / std::sqrt(static_cast<float>(c.hidden)));
  Tensor gate_seen = as_stored(gate, c.gate_dtype);
  Tensor bias = c.bias ? random_f32(rng, {c.experts}, 0.1f) : Tensor();
  Pair xs = both(b, x);
  Tensor gate_cpu = b.cpu->upload_weight(gate_seen, DType::kF32);
  Tensor gate_cuda = b.cuda->upload_weight(gate_seen, c.gate_dtype);
  Pair bs = both(b, bias);
  const float scale = 1.5f;

  Routing rc = b.cpu->moe_route(xs.cpu, gate_cpu, bs.cpu, Tensor(), Tensor(), c.top_k, scale);
  Routing rg;
  {
    HostSyncForbidden guard(*b.cuda);
    rg = b.cuda->moe_route(xs.cuda, gate_cuda, bs.cuda, Tensor(), Tensor(), c.top_k, scale);
  }
  Tensor ids_c = b.cpu->to_host(rc.expert_ids), ids_g = b.cuda->to_host(rg.expert_ids);
  Tensor w_c = b.cpu->to_host(rc.weights), w_g = b.cuda->to_host(rg.weights);
  ASSERT_EQ(ids_g.shape(), (Shape{c.tokens, c.top_k}));
  int64_t compared = 0;
  for (int64_t t = 0; t < c.tokens; ++t) {
    if (!well_separated(x, gate_seen, bias, t, c.top_k, 1e-4)) continue;
    ++compared;
    for (int64_t j = 0; j < c.top_k; ++j) {
      const int64_t i = t * c.top_k + j;
      ASSERT_EQ(ids_g.data<int32_t>()[i], ids_c.data<int32_t>()[i])
          << "token " << t << " slot " << j;
      EXPECT_NEAR(w_g.data<float>()[i], w_c.data<float>()[i], 1e-5 * scale)
          << "token " << t << " slot " << j;
    }
  }
  // Near-ties are rare with these scales (about 1 token in 50 at E = 256 is skipped); most tokens
  // of a larger batch must be compared.
  if (c.tokens >= 8) {
    EXPECT_GE(2 * compared, c.tokens) << compared << " of " << c.tokens << " tokens well separated";
  }
}

// Router logits (ops_moe.cu): T <= 4 the one-expert GEMV tiles, 5 <= T < 64 the 8-expert tiles,
// T >= 64 cuBLAS SGEMM (bf16 weights widened to f32 first); selection in registers for E <= 256
// and k <= 32, the generic kernel otherwise.
TEST(CudaMoe, RouteTopKMatchesCpu) {
  DEEPINFER_REQUIRE_GPU();
  std::mt19937 rng(11);
  Backends b;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (bool bias : {false, true}) {
      for (int tokens : {1, 3, 4, 5, 17, 40, 63, 64, 100}) {
        run_route_case(b, {8, 2, 64, tokens, dt, bias}, rng);
      }
      for (int tokens : {1, 4, 5, 8, 63, 64, 200}) {
        run_route_case(b, {256, 6, 4096, tokens, dt, bias}, rng);
      }
    }
  }
  // Unaligned hidden size (scalar loads, scalar widening) and k = E, on both sides of the
  // crossover.
  for (int tokens : {9, 70}) {
    run_route_case(b, {5, 5, 37, tokens, DType::kF32, true}, rng);
    run_route_case(b, {5, 3, 37, tokens, DType::kBF16, false}, rng);
  }
  // The generic selection kernel: E > 256, k > 32.
  run_route_case(b, {300, 8, 64, 20, DType::kF32, true}, rng);
  run_route_case(b, {300, 8, 64, 70, DType::kBF16, false}, rng);
  run_route_case(b, {40, 36, 64, 5, DType::kBF16, true}, rng);
}

// A V4-Flash prefill chunk (cuBLAS logits, one warp per token for the selection).
TEST(CudaMoe, RoutePrefillMatchesCpu) {
  DEEPINFER_REQUIRE_GPU();
  std::mt19937 rng(14);
  Backends b;
  run_route_case(b, {256, 6, 4096, 4096, DType::kBF16, true}, rng);
  run_route_case(b, {256, 6, 4096, 1000, DType::kF32, false}, rng);
}

// Exact ties: x holds small integers and the gate rows are a few patterns of multiples of 1/64,
// so every logit is exact in f32 whatever the summation order (GEMV or cuBLAS) and experts of one
// pattern tie exactly. Ties must go to the lower expert id, as on the CPU, in every slot.
TEST(CudaMoe, RouteTiesPickLowerIds) {
  DEEPINFER_REQUIRE_GPU();
  std::mt19937 rng(15);
  Backends b;
  for (auto [experts, top_k, patterns] :
       {std::array<int, 3>{16, 4, 3}, {256, 6, 5}, {300, 8, 4}, {40, 36, 3}}) {
    for (int tokens : {1, 5, 64, 300}) {
      for (DType dt : {DType::kF32, DType::kBF16}) {
        for (bool bias : {false, true}) {
          SCOPED_TRACE("ties E" + std::to_string(experts) + " k" + std::to_string(top_k) + " T" +
                       std::to_string(tokens) + " " + dtype_name(dt) + (bias ? " bias" : ""));
          const int hidden = 64;
          std::uniform_int_distribution<int> xi(-2, 2), gi(-4, 4), pick(0, patterns - 1);
          std::vector<float> xv(sz(int64_t{tokens} * hidden)), pat(sz(patterns * hidden));
          for (float& v : xv) v = static_cast<float>(xi(rng));
          for (float& v : pat) v = static_cast<float>(gi(rng)) / 64.0f;
          std::vector<float> gv(sz(int64_t{experts} * hidden)), bv(sz(experts));
          for (int e = 0; e < experts; ++e) {
            const int q = pick(rng);
            std::copy(pat.begin() + q * hidden, pat.begin() + (q + 1) * hidden,
                      gv.begin() + int64_t{e} * hidden);
            bv[sz(e)] = 0.25f * static_cast<float>(q);  // equal within a pattern: ties remain
          }
          Tensor x = Tensor::from_vector(xv, {tokens, hidden});
          Tensor gate = Tensor::from_vector(gv, {experts, hidden});  // exact in bf16
          Tensor bt = bias ? Tensor::from_vector(bv, {experts}) : Tensor();
          Pair xs = both(b, x);
          Pair bs = both(b, bt);
          Routing rc = b.cpu->moe_route(xs.cpu, b.cpu->upload_weight(gate, DType::kF32), bs.cpu,
                                        Tensor(), Tensor(), top_k, 1.5f);
          Routing rg = b.cuda->moe_route(xs.cuda, b.cuda->upload_weight(gate, dt), bs.cuda,
                                         Tensor(), Tensor(), top_k, 1.5f);
          EXPECT_TRUE(bitwise_equal(b.cpu->to_host(rc.expert_ids), b.cuda->to_host(rg.expert_ids)));
          expect_close(b, rc.weights, rg.weights, 1e-5, 1e-6, "tied weights");
        }
      }
    }
  }
}

TEST(CudaMoe, RouteHashMatchesCpu) {
  DEEPINFER_REQUIRE_GPU();
  std::mt19937 rng(12);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (auto [experts, top_k, hidden, tokens] :
         {std::array<int, 4>{8, 2, 64, 1}, {8, 2, 64, 33}, {256, 6, 4096, 8}}) {
      SCOPED_TRACE("hash E" + std::to_string(experts) + " T" + std::to_string(tokens));
      Backends b;
      const int vocab = 50;
      std::vector<int32_t> table(sz(vocab * top_k));
      std::vector<int32_t> order(sz(experts));
      std::iota(order.begin(), order.end(), 0);
      for (int v = 0; v < vocab; ++v) {
        std::shuffle(order.begin(), order.end(), rng);
        std::copy(order.begin(), order.begin() + top_k, table.begin() + v * top_k);
      }
      std::vector<int32_t> toks(sz(tokens));
      for (auto& t : toks) t = static_cast<int32_t>(rng() % vocab);
      Tensor x = random_f32(rng, {tokens, hidden});
      Tensor gate = as_stored(
          random_f32(rng, {experts, hidden}, 1.0f / std::sqrt(static_cast<float>(hidden))), dt);
      Tensor tid2eid = Tensor::from_vector(table, {vocab, top_k});
      Pair xs = both(b, x);
      Tensor gate_cpu = b.cpu->upload_weight(gate, DType::kF32);
      Tensor gate_cuda = b.cuda->upload_weight(gate, dt);
      Routing rc = b.cpu->moe_route(xs.cpu, gate_cpu, Tensor(), upload_i32(*b.cpu, tid2eid),
                                    upload_i32(*b.cpu, i32(toks)), top_k, 2.5f);
      Routing rg = b.cuda->moe_route(xs.cuda, gate_cuda, Tensor(), upload_i32(*b.cuda, tid2eid),
                                     upload_i32(*b.cuda, i32(toks)), top_k, 2.5f);
      EXPECT_TRUE(bitwise_equal(b.cpu->to_host(rc.expert_ids), b.cuda->to_host(rg.expert_ids)));
      expect_close(b, rc.weights, rg.weights, 1e-5, 1e-6, "hash weights");
    }
  }
}

// Out-of-range hash entries are clamped on the device (the CPU op rejects them).
TEST(CudaMoe, RouteHashClampsInvalidIds) {
  DEEPINFER_REQUIRE_GPU();
  Backends b;
  std::mt19937 rng(13);
  Tensor x = random_f32(rng, {3, 16});
  Tensor gate = b.cuda->upload_weight(random_f32(rng, {4, 16}), DType::kF32);
  Tensor table =
      upload_i32(*b.cuda, Tensor::from_vector(std::vector<int32_t>{7, -2, 1, 2}, {2, 2}));
  Tensor toks = upload_i32(*b.cuda, i32({5, -1, 1}));
  Routing r =
      b.cuda->moe_route(b.cuda->upload(x, DType::kF32), gate, Tensor(), table, toks, 2, 1.0f);
  Tensor ids = b.cuda->to_host(r.expert_ids);
  // token 5 -> row 1, token -1 -> row 0 (clamped to [0, 2)); entries clamped to [0, 4).
  const std::vector<int32_t> want = {1, 2, 3, 0, 1, 2};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(ids.data<int32_t>()[i], want[i]) << i;
}

// ---- moe_experts -------------------------------------------------------------------------------

enum class Layout { kAlignedViews, kUnalignedViews, kSeparate };

struct ExpertCase {
  int experts, top_k, hidden, inter, tokens;
  DType dtype;
  Layout layout;
  float limit;
};

std::string expert_name(const ExpertCase& c) {
  const char* layouts[] = {"aligned views", "unaligned views", "separate"};
  return "E" + std::to_string(c.experts) + " k" + std::to_string(c.top_k) + " H" +
         std::to_string(c.hidden) + " I" + std::to_string(c.inter) + " T" +
         std::to_string(c.tokens) + " " + dtype_name(c.dtype) + " " +
         layouts[static_cast<int>(c.layout)] + " L" + std::to_string(c.limit);
}

// Expert weights for both backends: views into one shared random pool per matrix kind (expert e
// and matrix m start at their own offset, so every expert holds different values), or separate
// tensors per expert.
struct ExpertSet {
  ExpertWeights cpu, cuda;
  std::vector<Tensor> keep;  // pools
};

ExpertSet make_experts(Backends& b, const ExpertCase& c, std::mt19937& rng) {
  ExpertSet s;
  const int64_t H = c.hidden, I = c.inter;
  const float s13 = 1.0f / std::sqrt(static_cast<float>(H));
  const float s2 = 1.0f / std::sqrt(static_cast<float>(I));
  if (c.layout == Layout::kSeparate) {
    for (int e = 0; e < c.experts; ++e) {
      for (int m = 0; m < 3; ++m) {
        Tensor w = as_stored(random_f32(rng, m == 2 ? Shape{H, I} : Shape{I, H}, m == 2 ? s2 : s13),
                             c.dtype);
        auto& dc = m == 0 ? s.cpu.w1 : m == 1 ? s.cpu.w3 : s.cpu.w2;
        auto& dg = m == 0 ? s.cuda.w1 : m == 1 ? s.cuda.w3 : s.cuda.w2;
        dc.push_back(b.cpu->upload_weight(w, DType::kF32));
        dg.push_back(b.cuda->upload_weight(w, c.dtype));
      }
    }
    return s;
  }
  // Offsets (2e + m) * 37 mod 4096 are distinct for 2E <= 4096; * 8 keeps 16-byte alignment of
  // bf16 and f32 rows, + 1 breaks it.
  const int64_t spread = 8 * 4096 + 8;
  const int64_t unaligned = c.layout == Layout::kUnalignedViews ? 1 : 0;
  auto offset = [&](int e, int m) { return ((2 * e + m) * 37 % 4096) * 8 + unaligned; };
  for (int kind = 0; kind < 2; ++kind) {  // 0: w1 and w3 [I, H], 1: w2 [H, I]
    Tensor pool = as_stored(random_f32(rng, {I * H + spread}, kind == 0 ? s13 : s2), c.dtype);
    Tensor pool_cpu = b.cpu->upload_weight(pool, DType::kF32);
    Tensor pool_cuda = b.cuda->upload_weight(pool, c.dtype);  // bf16: exact, pool is rounded
    s.keep.push_back(pool_cpu);
    s.keep.push_back(pool_cuda);
    for (int e = 0; e < c.experts; ++e) {
      for (int m = (kind == 0 ? 0 : 2); m < (kind == 0 ? 2 : 3); ++m) {
        const Shape shape = m == 2 ? Shape{H, I} : Shape{I, H};
        const int64_t off = offset(e, m);
        auto& dc = m == 0 ? s.cpu.w1 : m == 1 ? s.cpu.w3 : s.cpu.w2;
        auto& dg = m == 0 ? s.cuda.w1 : m == 1 ? s.cuda.w3 : s.cuda.w2;
        dc.push_back(pool_cpu.narrow(0, off, I * H).reshape(shape));
        dg.push_back(pool_cuda.narrow(0, off, I * H).reshape(shape));
      }
    }
  }
  return s;
}

// Routing with k distinct random experts per token and positive weights.
struct HostRouting {
  Tensor ids, weights;
};

HostRouting random_routing(int tokens, int experts, int top_k, std::mt19937& rng) {
  std::vector<int32_t> ids(sz(int64_t{tokens} * top_k));
  std::vector<float> w(ids.size());
  std::vector<int32_t> order(sz(experts));
  std::iota(order.begin(), order.end(), 0);
  std::uniform_real_distribution<float> u(0.1f, 1.5f);
  for (int t = 0; t < tokens; ++t) {
    std::shuffle(order.begin(), order.end(), rng);
    for (int j = 0; j < top_k; ++j) {
      ids[sz(int64_t{t} * top_k + j)] = order[sz(j)];
      w[sz(int64_t{t} * top_k + j)] = u(rng);
    }
  }
  return {Tensor::from_vector(ids, {tokens, top_k}), Tensor::from_vector(w, {tokens, top_k})};
}

// Whether moe_experts takes the bf16 tensor-core path (ops_moe.cu) in some pass: bf16 weights,
// 16-byte aligned rows with H and I multiples of 8, and more than 4 pairs per expert on average
// in a pass of at most 4096 tokens (the first pass is the largest).
bool bf16_activations(const ExpertCase& c) {
  const bool vec = c.layout != Layout::kUnalignedViews && c.hidden % 8 == 0 && c.inter % 8 == 0;
  const int64_t first_pass = std::min(c.tokens, 4096);
  return c.dtype == DType::kBF16 && vec && first_pass * c.top_k > int64_t{4} * c.experts;
}

// Tolerance of the tensor-core path: x and the SwiGLU output are rounded to bf16 (relative error
// 2^-9 each) before f32-accumulated products, the CPU keeps them f32. Checks max |err| against
// max |ref| and mean |err| against mean |ref|.
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
    if (std::isnan(c) || std::isnan(r)) e = INFINITY;
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

// Runs moe_experts on both backends: the CPU with `cpu_routing`, CUDA with `cuda_routing` (the
// same, or with invalid ids where the CPU has a valid id and weight 0), twice on CUDA.
void check_experts(Backends& b, const ExpertCase& c, const ExpertSet& set, const Tensor& x,
                   const HostRouting& cpu_routing, const HostRouting& cuda_routing) {
  Pair xs = both(b, x);
  Routing rc{upload_i32(*b.cpu, cpu_routing.ids), b.cpu->upload(cpu_routing.weights, DType::kF32)};
  Routing rg{upload_i32(*b.cuda, cuda_routing.ids),
             b.cuda->upload(cuda_routing.weights, DType::kF32)};
  Tensor out_c = b.cpu->moe_experts(xs.cpu, rc, set.cpu, c.limit);
  Tensor out_g, again;
  {
    HostSyncForbidden guard(*b.cuda);
    out_g = b.cuda->moe_experts(xs.cuda, rg, set.cuda, c.limit);
    again = b.cuda->moe_experts(xs.cuda, rg, set.cuda, c.limit);
  }
  if (bf16_activations(c)) {
    expect_close_bf16(b, out_c, out_g, "moe_experts (bf16 tensor cores)");
  } else {
    // bf16 weights are widened exactly and the math is f32 on both sides, so both dtypes differ
    // from the CPU only by summation order.
    expect_close(b, out_c, out_g, c.dtype == DType::kBF16 ? 1e-3 : 1e-4, 1e-6, "moe_experts");
  }
  EXPECT_TRUE(bitwise_equal(b.cuda->to_host(out_g), b.cuda->to_host(again))) << "not deterministic";
}

void run_expert_case(Backends& b, const ExpertCase& c, std::mt19937& rng) {
  SCOPED_TRACE(expert_name(c));
  ExpertSet set = make_experts(b, c, rng);
  Tensor x = random_f32(rng, {c.tokens, c.hidden});
  HostRouting hr = random_routing(c.tokens, c.experts, c.top_k, rng);
  check_experts(b, c, set, x, hr, hr);
}

// Routing in which expert e gets exactly counts[e] pairs (a token may hold one expert twice) and
// `invalid` further pairs get out-of-range ids on CUDA (on the CPU: expert 0 with weight 0).
// c.tokens is set from the total; c.experts must equal counts.size().
void run_counted_case(Backends& b, ExpertCase c, const std::vector<int>& counts, int invalid,
                      std::mt19937& rng) {
  std::vector<int32_t> ids;
  for (size_t e = 0; e < counts.size(); ++e) ids.insert(ids.end(), sz(counts[e]), int32_t(e));
  const int32_t bad[] = {-1, c.experts, 1000, -2147483647 - 1};
  for (int i = 0; i < invalid || ids.size() % sz(c.top_k) != 0; ++i) ids.push_back(bad[i % 4]);
  std::shuffle(ids.begin(), ids.end(), rng);
  c.tokens = static_cast<int>(ids.size()) / c.top_k;
  SCOPED_TRACE(expert_name(c) + " counted");
  std::vector<float> w(ids.size()), w_cpu(ids.size());
  std::vector<int32_t> ids_cpu(ids);
  std::uniform_real_distribution<float> u(0.1f, 1.5f);
  for (size_t i = 0; i < ids.size(); ++i) {
    w[i] = w_cpu[i] = u(rng);
    if (ids[i] < 0 || ids[i] >= c.experts) {
      ids_cpu[i] = 0;
      w_cpu[i] = 0.0f;
    }
  }
  const Shape shape{c.tokens, c.top_k};
  const HostRouting cuda_r{Tensor::from_vector(ids, shape), Tensor::from_vector(w, shape)};
  const HostRouting cpu_r{Tensor::from_vector(ids_cpu, shape), Tensor::from_vector(w_cpu, shape)};
  ExpertSet set = make_experts(b, c, rng);
  Tensor x = random_f32(rng, {c.tokens, c.hidden});
  check_experts(b, c, set, x, cpu_r, cuda_r);
}

TEST(CudaMoe, ExpertsTinyMatchCpu) {
  DEEPINFER_REQUIRE_GPU();
  std::mt19937 rng(21);
  Backends b;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (Layout layout : {Layout::kAlignedViews, Layout::kUnalignedViews, Layout::kSeparate}) {
      // T <= 16 takes the decode kernels (P <= 4 E), larger T the tiled ones; unaligned views
      // always take the tiled ones.
      for (int tokens : {1, 2, 5, 16, 17, 40}) {
        for (float limit : {10.0f, 0.75f}) {
          run_expert_case(b, {8, 2, 64, 32, tokens, dt, layout, limit}, rng);
        }
      }
    }
  }
  // Sizes that are not multiples of the tile shapes (tiled kernel, every tail path).
  run_expert_case(b, {3, 2, 70, 45, 50, DType::kF32, Layout::kSeparate, 10.0f}, rng);
  run_expert_case(b, {3, 3, 70, 45, 2, DType::kBF16, Layout::kSeparate, 10.0f}, rng);
}

TEST(CudaMoe, ExpertsFlashSizesMatchCpu) {
  DEEPINFER_REQUIRE_GPU();
  std::mt19937 rng(22);
  Backends b;
  for (DType dt : {DType::kBF16, DType::kF32}) {
    // 1, 8, 64 tokens: decode kernels; 200 tokens (1200 pairs > 4 * 256): tiled kernels.
    for (int tokens : {1, 8, 64, 200}) {
      run_expert_case(b, {256, 6, 4096, 2048, tokens, dt, Layout::kAlignedViews, 10.0f}, rng);
    }
  }
  // Prefill on tensor cores: 3072 pairs, 12 per expert on average, some experts with 2 tiles.
  run_expert_case(b, {256, 6, 4096, 2048, 512, DType::kBF16, Layout::kAlignedViews, 10.0f}, rng);
}

// The bf16 tensor-core path with 64-row tiles (at most 64 pairs per expert on average in the
// pass): tiles with 0, 1, 63, 64, 65 and 129 rows, invalid ids, and sizes that are multiples of 8
// but not of the 32-deep K slices or of the 128 (gate/up) and 256 (down) output columns of a CTA.
TEST(CudaMoe, ExpertsBf16TensorCoresMatchCpu) {
  DEEPINFER_REQUIRE_GPU();
  std::mt19937 rng(25);
  Backends b;
  const std::vector<int> counts = {0, 1, 63, 64, 65, 129, 30, 34};  // 386 pairs
  for (auto [hidden, inter] : {std::array<int, 2>{256, 128}, {200, 72}, {520, 264}, {64, 8}}) {
    for (float limit : {10.0f, 0.75f}) {
      for (Layout layout : {Layout::kAlignedViews, Layout::kSeparate}) {
        const ExpertCase c{8, 2, hidden, inter, 0, DType::kBF16, layout, limit};
        run_counted_case(b, c, counts, 0, rng);
        run_counted_case(b, c, counts, 5, rng);
      }
    }
  }
  // One expert with 300 pairs (5 row tiles) among nearly empty ones: 39 pairs per expert.
  run_counted_case(b, {8, 2, 256, 136, 0, DType::kBF16, Layout::kSeparate, 10.0f},
                   {300, 0, 0, 0, 0, 0, 1, 10}, 3, rng);
  // k = 6 of 64 experts at 8 | H, I: 1536 pairs, 24 per expert.
  run_expert_case(b, {64, 6, 392, 168, 256, DType::kBF16, Layout::kAlignedViews, 10.0f}, rng);
  // Exactly 64 pairs per expert on average: still the 64-row tiles.
  run_counted_case(b, {8, 2, 200, 72, 0, DType::kBF16, Layout::kAlignedViews, 10.0f},
                   {64, 64, 64, 64, 64, 64, 64, 64}, 0, rng);
}

// The bf16 tensor-core path with 128-row tiles (more than 64 pairs per expert on average in the
// pass): tiles with 0, 1, 127, 128, 129 and 300 pairs (up to 3 row tiles of one expert), invalid
// ids, and sizes that are multiples of 8 but not of the 32-deep K slices or of the 64 (gate/up)
// and 128 (down) output columns of a CTA.
TEST(CudaMoe, ExpertsBf16WideTilesMatchCpu) {
  DEEPINFER_REQUIRE_GPU();
  std::mt19937 rng(27);
  Backends b;
  const std::vector<int> counts = {0, 1, 127, 128, 129, 300, 70, 90};  // 845 pairs
  for (auto [hidden, inter] :
       {std::array<int, 2>{256, 128}, {200, 72}, {520, 264}, {64, 8}, {136, 200}}) {
    for (float limit : {10.0f, 0.75f}) {
      for (Layout layout : {Layout::kAlignedViews, Layout::kSeparate}) {
        const ExpertCase c{8, 2, hidden, inter, 0, DType::kBF16, layout, limit};
        run_counted_case(b, c, counts, 0, rng);
        run_counted_case(b, c, counts, 7, rng);
      }
    }
  }
  // Just past the switch: 514 pairs over 8 experts.
  run_counted_case(b, {8, 2, 200, 72, 0, DType::kBF16, Layout::kAlignedViews, 10.0f},
                   {64, 64, 64, 64, 64, 64, 64, 66}, 0, rng);
  // Many pairs per expert (500), several row tiles of each.
  run_expert_case(b, {4, 2, 256, 136, 1000, DType::kBF16, Layout::kSeparate, 10.0f}, rng);
  // k = 4 of 16 experts at wider sizes: 1600 pairs, 100 per expert (one tile for most).
  run_expert_case(b, {16, 4, 1024, 512, 400, DType::kBF16, Layout::kAlignedViews, 10.0f}, rng);
}

// bf16 weights the tensor-core path cannot take (H or I not a multiple of 8, rows not 16-byte
// aligned) fall back to the f32 tiled kernel, which matches the CPU to summation order.
TEST(CudaMoe, ExpertsBf16FallbackMatchCpu) {
  DEEPINFER_REQUIRE_GPU();
  std::mt19937 rng(26);
  Backends b;
  const std::vector<int> counts = {0, 1, 63, 64, 65, 129, 30, 34};  // 386 pairs
  for (auto [hidden, inter] : {std::array<int, 2>{60, 36}, {64, 36}, {68, 32}}) {
    run_counted_case(b, {8, 2, hidden, inter, 0, DType::kBF16, Layout::kSeparate, 10.0f}, counts, 3,
                     rng);
  }
  run_counted_case(b, {8, 2, 256, 128, 0, DType::kBF16, Layout::kUnalignedViews, 10.0f}, counts, 3,
                   rng);
}

// Many tokens: more than one internal pass (4096 tokens each; bf16: the first on 128-row
// tensor-core tiles, the second on the decode kernels) and one expert with many pairs.
TEST(CudaMoe, ExpertsLongPrefillMatchCpu) {
  DEEPINFER_REQUIRE_GPU();
  std::mt19937 rng(23);
  Backends b;
  run_expert_case(b, {8, 2, 64, 32, 4100, DType::kBF16, Layout::kAlignedViews, 10.0f}, rng);
  run_expert_case(b, {2, 2, 64, 32, 300, DType::kF32, Layout::kSeparate, 10.0f}, rng);
}

// A slot whose expert id is out of range contributes nothing (the CPU op rejects it).
TEST(CudaMoe, ExpertsDropInvalidIds) {
  DEEPINFER_REQUIRE_GPU();
  std::mt19937 rng(24);
  Backends b;
  const ExpertCase c{8, 2, 64, 32, 5, DType::kF32, Layout::kAlignedViews, 10.0f};
  ExpertSet set = make_experts(b, c, rng);
  Tensor x = random_f32(rng, {c.tokens, c.hidden});
  HostRouting hr = random_routing(c.tokens, c.experts, c.top_k, rng);
  Tensor bad_ids = hr.ids.contiguous().to(DType::kI32);
  Tensor zero_w = hr.weights.to(DType::kF32);
  bad_ids.data<int32_t>()[1] = -1;
  bad_ids.data<int32_t>()[4] = 8;
  zero_w.data<float>()[1] = 0.0f;
  zero_w.data<float>()[4] = 0.0f;
  Pair xs = both(b, x);
  Tensor out_c = b.cpu->moe_experts(
      xs.cpu, Routing{upload_i32(*b.cpu, hr.ids), b.cpu->upload(zero_w, DType::kF32)}, set.cpu,
      c.limit);
  Tensor out_g = b.cuda->moe_experts(
      xs.cuda, Routing{upload_i32(*b.cuda, bad_ids), b.cuda->upload(hr.weights, DType::kF32)},
      set.cuda, c.limit);
  expect_close(b, out_c, out_g, 1e-4, 1e-6, "moe_experts with dropped slots");
}

}  // namespace
}  // namespace deepinfer::gpu_test
