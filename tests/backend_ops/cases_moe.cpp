// Rows of moe_route and moe_experts, at tiny sizes and at V4-Flash sizes (E = 256, k = 6,
// H = 4096, I = 2048), with f32 and bf16 weights (drawn bf16-rounded, so the f32 reference and a
// bf16 device copy hold the same values), for every router path of the CUDA backend (decode GEMV
// tiles, cuBLAS from 64 tokens, register and generic top-k), exact ties, hash routing and every
// expert kernel (decode, tiled f32, bf16 tensor cores with 64- and 128-row tiles, several passes).
#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "cases.h"
#include "deepinfer/weight.h"
#include "inputs.h"
#include "moe_inputs.h"

namespace deepinfer::backend_ops {
namespace {

size_t sz(int64_t i) {
  return static_cast<size_t>(i);
}

std::string bias_tag(bool bias) {
  return bias ? "_bias" : "";
}

Outputs routing_outputs(const Routing& r) {
  return {{"expert_ids", r.expert_ids}, {"weights", r.weights}};
}

// ---- moe_route: top-k of scores + bias ----------------------------------------------------------

struct Route {
  int experts, top_k, hidden, tokens;
  DType gate_dtype;
  bool bias;
};

struct RouteIn {
  Tensor x, gate, bias;  // gate as stored: bf16-rounded for a bf16 gate
};

constexpr float kRouteScale = 1.5f;

// True when the top k + 1 routing keys of token t (in double, from the values both backends
// see) are separated by more than `gap`, so f32 rounding cannot reorder the chosen ids.
bool well_separated(const RouteIn& in, int64_t t, int top_k, double gap) {
  const int64_t experts = in.gate.size(0), hidden = in.gate.size(1);
  const float* xr = in.x.data<float>() + t * hidden;
  std::vector<double> keys(sz(experts));
  for (int64_t e = 0; e < experts; ++e) {
    double logit = 0;
    const float* g = in.gate.data<float>() + e * hidden;
    for (int64_t h = 0; h < hidden; ++h) logit += static_cast<double>(xr[h]) * g[h];
    const double sp = logit > 20 ? logit : std::log1p(std::exp(logit));
    keys[sz(e)] = std::sqrt(sp) + (in.bias.defined() ? in.bias.data<float>()[e] : 0.0f);
  }
  std::sort(keys.begin(), keys.end(), std::greater<>());
  const int64_t last = std::min<int64_t>(top_k, experts - 1);
  for (int64_t j = 0; j < last; ++j) {
    if (keys[sz(j)] - keys[sz(j + 1)] < gap) return false;
  }
  return true;
}

// Random scores can nearly tie, and then f32 summation order may legitimately swap two experts:
// only tokens whose top k + 1 keys are 1e-4 apart are compared, and most tokens of a larger batch
// must be (about 1 token in 50 at E = 256 is skipped).
void check_route(const Route& c, const RouteIn& in, const Outputs& ref, const Outputs& dev) {
  const Tensor& ids_c = ref[0].value;
  const Tensor& ids_g = dev[0].value;
  const Tensor& w_c = ref[1].value;
  const Tensor& w_g = dev[1].value;
  ASSERT_EQ(ids_g.shape(), (Shape{c.tokens, c.top_k}));
  int64_t compared = 0;
  for (int64_t t = 0; t < c.tokens; ++t) {
    if (!well_separated(in, t, c.top_k, 1e-4)) continue;
    ++compared;
    for (int64_t j = 0; j < c.top_k; ++j) {
      const int64_t i = t * c.top_k + j;
      ASSERT_EQ(ids_g.data<int32_t>()[i], ids_c.data<int32_t>()[i])
          << "token " << t << " slot " << j;
      EXPECT_NEAR(w_g.data<float>()[i], w_c.data<float>()[i], 1e-5 * kRouteScale)
          << "token " << t << " slot " << j;
    }
  }
  if (c.tokens >= 8) {
    EXPECT_GE(2 * compared, c.tokens) << compared << " of " << c.tokens << " tokens well separated";
  }
}

void add_route(std::vector<OpCase>& t, const Route& c, const std::string& variant = "") {
  add(t, Case<RouteIn>{
             .op = "moe_route",
             .label = variant + dtype_name(c.gate_dtype) + bias_tag(c.bias) + "_e" +
                      std::to_string(c.experts) + "_k" + std::to_string(c.top_k) + "_h" +
                      std::to_string(c.hidden) + "_t" + std::to_string(c.tokens),
             .draw =
                 [c](Rng& rng) {
                   RouteIn in;
                   in.x = random_f32(rng, {c.tokens, c.hidden});
                   // Logits ~ N(0, 1): scores spread over roughly [0.5, 2].
                   in.gate = random_f32(rng, {c.experts, c.hidden},
                                        1.0f / std::sqrt(static_cast<float>(c.hidden)));
                   if (c.gate_dtype == DType::kBF16) in.gate = round_bf16(in.gate);
                   if (c.bias) in.bias = random_f32(rng, {c.experts}, 0.1f);
                   return in;
                 },
             .run =
                 [c](Backend& be, const RouteIn& in) {
                   return routing_outputs(
                       be.moe_route(up(be, in.x), up_weight(be, in.gate, c.gate_dtype),
                                    up(be, in.bias), Tensor(), Tensor(), c.top_k, kRouteScale));
                 },
             .expect = [c](const RouteIn& in, const Outputs& ref,
                           const Outputs& dev) { check_route(c, in, ref, dev); },
             .bf16_weights = c.gate_dtype == DType::kBF16,
         });
}

// Exact ties: x holds small integers and the gate rows are a few patterns of multiples of 1/64,
// so every logit is exact in f32 whatever the summation order (GEMV or cuBLAS) and experts of one
// pattern tie exactly. Ties must go to the lower expert id, as on the CPU, in every slot.
void add_route_ties(std::vector<OpCase>& t, int experts, int top_k, int patterns, int tokens,
                    DType dt, bool bias) {
  add(t, Case<RouteIn>{
             .op = "moe_route",
             .label = "ties_" + std::string(dtype_name(dt)) + bias_tag(bias) + "_e" +
                      std::to_string(experts) + "_k" + std::to_string(top_k) + "_p" +
                      std::to_string(patterns) + "_t" + std::to_string(tokens),
             .draw =
                 [=](Rng& rng) {
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
                     bv[sz(e)] = 0.25f * static_cast<float>(q);  // equal within a pattern
                   }
                   return RouteIn{Tensor::from_vector(xv, {tokens, hidden}),
                                  Tensor::from_vector(gv, {experts, hidden}),  // exact in bf16
                                  bias ? Tensor::from_vector(bv, {experts}) : Tensor()};
                 },
             .run =
                 [=](Backend& be, const RouteIn& in) {
                   return routing_outputs(be.moe_route(up(be, in.x), up_weight(be, in.gate, dt),
                                                       up(be, in.bias), Tensor(), Tensor(), top_k,
                                                       kRouteScale));
                 },
             .expect = {bytes(), close(1e-5, 1e-6)},
             .bf16_weights = dt == DType::kBF16,
         });
}

struct HashIn {
  Tensor x, gate, tid2eid, tokens;
};

// Hash routing: experts from tid2eid[token id], weights from the scores of those experts.
void add_route_hash(std::vector<OpCase>& t, int experts, int top_k, int hidden, int tokens,
                    DType dt) {
  add(t, Case<HashIn>{
             .op = "moe_route",
             .label = "hash_" + std::string(dtype_name(dt)) + "_e" + std::to_string(experts) +
                      "_k" + std::to_string(top_k) + "_h" + std::to_string(hidden) + "_t" +
                      std::to_string(tokens),
             .draw =
                 [=](Rng& rng) {
                   const int vocab = 50;
                   std::vector<int32_t> table(sz(vocab * top_k));
                   std::vector<int32_t> order(sz(experts));
                   std::iota(order.begin(), order.end(), 0);
                   for (int v = 0; v < vocab; ++v) {
                     std::shuffle(order.begin(), order.end(), rng);
                     std::copy(order.begin(), order.begin() + top_k, table.begin() + v * top_k);
                   }
                   std::vector<int32_t> toks(sz(tokens));
                   for (auto& tok : toks) tok = static_cast<int32_t>(rng() % vocab);
                   HashIn in;
                   in.x = random_f32(rng, {tokens, hidden});
                   in.gate = random_f32(rng, {experts, hidden},
                                        1.0f / std::sqrt(static_cast<float>(hidden)));
                   if (dt == DType::kBF16) in.gate = round_bf16(in.gate);
                   in.tid2eid = Tensor::from_vector(table, {vocab, top_k});
                   in.tokens = i32(toks);
                   return in;
                 },
             .run =
                 [=](Backend& be, const HashIn& in) {
                   return routing_outputs(be.moe_route(up(be, in.x), up_weight(be, in.gate, dt),
                                                       Tensor(), up(be, in.tid2eid),
                                                       up(be, in.tokens), top_k, 2.5f));
                 },
             .expect = {bytes(), close(1e-5, 1e-6)},
             .bf16_weights = dt == DType::kBF16,
         });
}

void add_routes(std::vector<OpCase>& t) {
  // Router logits (CUDA cuda/moe/router_logits.cu): T <= 4 the one-expert GEMV tiles,
  // 5 <= T < 64 the 8-expert tiles, T >= 64 cuBLAS SGEMM (bf16 weights widened to f32 first);
  // selection (cuda/moe/route_select.cu) in registers for E <= 256 and k <= 32, the generic
  // kernel otherwise.
  for (const DType dt : {DType::kF32, DType::kBF16}) {
    for (const bool bias : {false, true}) {
      for (const int tokens : {1, 3, 4, 5, 17, 40, 63, 64, 100}) {
        add_route(t, {8, 2, 64, tokens, dt, bias});
      }
      for (const int tokens : {1, 4, 5, 8, 63, 64, 200}) {
        add_route(t, {256, 6, 4096, tokens, dt, bias});
      }
    }
  }
  // Unaligned hidden size (scalar loads, scalar widening) and k = E, on both sides of the
  // crossover.
  for (const int tokens : {9, 70}) {
    add_route(t, {5, 5, 37, tokens, DType::kF32, true});
    add_route(t, {5, 3, 37, tokens, DType::kBF16, false});
  }
  // The generic selection kernel: E > 256, k > 32.
  add_route(t, {300, 8, 64, 20, DType::kF32, true});
  add_route(t, {300, 8, 64, 70, DType::kBF16, false});
  add_route(t, {40, 36, 64, 5, DType::kBF16, true});
  // A V4-Flash prefill chunk (cuBLAS logits, one warp per token for the selection).
  add_route(t, {256, 6, 4096, 4096, DType::kBF16, true}, "prefill_");
  add_route(t, {256, 6, 4096, 1000, DType::kF32, false}, "prefill_");

  for (const auto& [experts, top_k, patterns] :
       {std::array<int, 3>{16, 4, 3}, {256, 6, 5}, {300, 8, 4}, {40, 36, 3}}) {
    for (const int tokens : {1, 5, 64, 300}) {
      for (const DType dt : {DType::kF32, DType::kBF16}) {
        for (const bool bias : {false, true}) {
          add_route_ties(t, experts, top_k, patterns, tokens, dt, bias);
        }
      }
    }
  }
  for (const DType dt : {DType::kF32, DType::kBF16}) {
    for (const auto& [experts, top_k, hidden, tokens] :
         {std::array<int, 4>{8, 2, 64, 1}, {8, 2, 64, 33}, {256, 6, 4096, 8}}) {
      add_route_hash(t, experts, top_k, hidden, tokens, dt);
    }
  }
}

// ---- moe_experts --------------------------------------------------------------------------------

enum class Layout { kAlignedViews, kUnalignedViews, kSeparate };

struct Experts {
  int experts, top_k, hidden, inter, tokens;
  DType dtype;
  Layout layout;
  float limit;

  std::string label() const {
    const char* layouts[] = {"aligned", "unaligned", "separate"};
    return std::string(dtype_name(dtype)) + "_" + layouts[static_cast<int>(layout)] + "_e" +
           std::to_string(experts) + "_k" + std::to_string(top_k) + "_h" + std::to_string(hidden) +
           "_i" + std::to_string(inter) + "_t" + std::to_string(tokens) + "_l" + num(limit);
  }
};

// Whether the CUDA moe_experts takes the bf16 tensor-core path in some pass: bf16 weights,
// 16-byte aligned rows with H and I multiples of 8, and more than 4 pairs per expert on average
// in a pass of at most 4096 tokens (the first pass is the largest).
bool bf16_activations(const Experts& c) {
  const bool vec = c.layout != Layout::kUnalignedViews && c.hidden % 8 == 0 && c.inter % 8 == 0;
  const int64_t first_pass = std::min(c.tokens, 4096);
  return c.dtype == DType::kBF16 && vec && first_pass * c.top_k > int64_t{4} * c.experts;
}

// Host inputs of a moe_experts row. Weights are views into one random pool per matrix kind
// (expert e and matrix m start at their own offset, so every expert holds different values), or
// separate tensors per expert; as stored (bf16-rounded for bf16).
struct ExpertsIn {
  std::vector<Tensor> pools;     // views: [w1 and w3 pool, w2 pool]
  std::vector<Tensor> separate;  // separate: w1, w3, w2 of expert 0, then of expert 1, ...
  Tensor x;
  HostRouting routing;  // what the device gets
  HostRouting
      reference;  // what the CPU gets: the same, or weight 0 where the device's id is invalid
};

Tensor as_stored(const Tensor& host_f32, DType dtype) {
  return dtype == DType::kBF16 ? round_bf16(host_f32) : host_f32;
}

void draw_weights(const Experts& c, Rng& rng, ExpertsIn& in) {
  const int64_t H = c.hidden, I = c.inter;
  const float s13 = 1.0f / std::sqrt(static_cast<float>(H));
  const float s2 = 1.0f / std::sqrt(static_cast<float>(I));
  if (c.layout == Layout::kSeparate) {
    for (int e = 0; e < c.experts; ++e) {
      for (int m = 0; m < 3; ++m) {
        in.separate.push_back(as_stored(
            random_f32(rng, m == 2 ? Shape{H, I} : Shape{I, H}, m == 2 ? s2 : s13), c.dtype));
      }
    }
    return;
  }
  const int64_t spread = 8 * 4096 + 8;    // room for the offsets below
  for (int kind = 0; kind < 2; ++kind) {  // 0: w1 and w3 [I, H], 1: w2 [H, I]
    in.pools.push_back(as_stored(random_f32(rng, {I * H + spread}, kind == 0 ? s13 : s2), c.dtype));
  }
}

ExpertWeights upload_experts(Backend& be, const Experts& c, const ExpertsIn& in) {
  ExpertWeights w;
  auto dest = [&w](int m) -> std::vector<MatrixWeight>& {
    return m == 0 ? w.w1 : m == 1 ? w.w3 : w.w2;
  };
  const int64_t H = c.hidden, I = c.inter;
  if (c.layout == Layout::kSeparate) {
    for (size_t i = 0; i < in.separate.size(); ++i) {
      dest(static_cast<int>(i % 3)).push_back(up_weight(be, in.separate[i], c.dtype));
    }
    return w;
  }
  // Offsets (2e + m) * 37 mod 4096 are distinct for 2E <= 4096; * 8 keeps 16-byte alignment of
  // bf16 and f32 rows, + 1 breaks it.
  const int64_t unaligned = c.layout == Layout::kUnalignedViews ? 1 : 0;
  auto offset = [&](int e, int m) { return ((2 * e + m) * 37 % 4096) * 8 + unaligned; };
  for (int kind = 0; kind < 2; ++kind) {
    const Tensor pool = up_weight(be, in.pools[sz(kind)], c.dtype);
    for (int e = 0; e < c.experts; ++e) {
      for (int m = (kind == 0 ? 0 : 2); m < (kind == 0 ? 2 : 3); ++m) {
        const Shape shape = m == 2 ? Shape{H, I} : Shape{I, H};
        dest(m).push_back(pool.narrow(0, offset(e, m), I * H).reshape(shape));
      }
    }
  }
  return w;
}

Outputs run_experts(Backend& be, const Experts& c, const ExpertsIn& in, const HostRouting& r) {
  const Routing routing{up(be, r.ids), up(be, r.weights)};
  return out(be.moe_experts(up(be, in.x), routing, upload_experts(be, c, in), c.limit));
}

// Routing with k distinct random experts per token and positive weights.
// The tensor-core path rounds x and the SwiGLU output to bf16: bf16 tolerance. Every other path
// computes in f32 (bf16 weights are widened exactly) and differs from the reference by summation
// order only. Which path runs is the CUDA backend's choice, so bf16 rows held to the f32
// tolerance apply to it only. `invalid_ids`: the device routing has out-of-range ids, the
// reference its own routing.
void add_experts_row(std::vector<OpCase>& t, const Experts& c, const std::string& label,
                     std::function<ExpertsIn(Rng&)> draw, bool invalid_ids = false) {
  const bool tensor_cores = bf16_activations(c);
  const bool cuda_only = c.dtype == DType::kBF16 && !tensor_cores;
  std::function<Outputs(Backend&, const ExpertsIn&)> reference;
  if (invalid_ids) {
    reference = [c](Backend& cpu, const ExpertsIn& in) {
      return run_experts(cpu, c, in, in.reference);
    };
  }
  add(t,
      Case<ExpertsIn>{
          .op = "moe_experts",
          .label = label,
          .draw = std::move(draw),
          .run = [c](Backend& be,
                     const ExpertsIn& in) { return run_experts(be, c, in, in.routing); },
          .expect = tensor_cores ? bf16_math() : close(c.dtype == DType::kBF16 ? 1e-3 : 1e-4, 1e-6),
          .reference = reference,
          .only_backends =
              cuda_only ? std::vector<std::string>{"cuda"} : std::vector<std::string>{},
          .only_why = "the f32 tolerance assumes the CUDA backend's f32 path for this shape",
          .bf16_weights = c.dtype == DType::kBF16,
          .deterministic = true,
      });
}

void add_experts(std::vector<OpCase>& t, const Experts& c) {
  add_experts_row(t, c, c.label(), [c](Rng& rng) {
    ExpertsIn in;
    draw_weights(c, rng, in);
    in.x = random_f32(rng, {c.tokens, c.hidden});
    in.routing = random_routing(c.tokens, c.experts, c.top_k, rng);
    return in;
  });
}

// Routing in which expert e gets exactly counts[e] pairs (a token may hold one expert twice) and
// `invalid` further pairs (more to fill the last token) get out-of-range ids on the device (for
// the reference: expert 0 with weight 0). c.tokens is set from the total; c.experts must equal
// counts.size().
void add_counted(std::vector<OpCase>& t, Experts c, const std::string& profile,
                 const std::vector<int>& counts, int invalid) {
  const int valid = std::accumulate(counts.begin(), counts.end(), 0);
  int pairs = valid + invalid;
  while (pairs % c.top_k != 0) ++pairs;
  c.tokens = pairs / c.top_k;
  const std::string label =
      "counted_" + profile + "_inv" + std::to_string(pairs - valid) + "_" + c.label();
  const auto draw = [c, counts, invalid](Rng& rng) {
    std::vector<int32_t> ids;
    for (size_t e = 0; e < counts.size(); ++e) ids.insert(ids.end(), sz(counts[e]), int32_t(e));
    const int32_t bad[] = {-1, c.experts, 1000, -2147483647 - 1};
    for (int i = 0; i < invalid || ids.size() % sz(c.top_k) != 0; ++i) ids.push_back(bad[i % 4]);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<float> w(ids.size()), w_ref(ids.size());
    std::vector<int32_t> ids_ref(ids);
    std::uniform_real_distribution<float> u(0.1f, 1.5f);
    for (size_t i = 0; i < ids.size(); ++i) {
      w[i] = w_ref[i] = u(rng);
      if (ids[i] < 0 || ids[i] >= c.experts) {
        ids_ref[i] = 0;
        w_ref[i] = 0.0f;
      }
    }
    const Shape shape{c.tokens, c.top_k};
    ExpertsIn in;
    in.routing = {Tensor::from_vector(ids, shape), Tensor::from_vector(w, shape)};
    in.reference = {Tensor::from_vector(ids_ref, shape), Tensor::from_vector(w_ref, shape)};
    draw_weights(c, rng, in);
    in.x = random_f32(rng, {c.tokens, c.hidden});
    return in;
  };
  add_experts_row(t, c, label, draw, pairs > valid);
}

// bf16 tensor-core rows of 8 experts, k = 2, with `counts` pairs per expert, for each (H, I) of
// `sizes`, both limits and both aligned layouts, without and with `invalid` invalid ids.
void add_tile_sweep(std::vector<OpCase>& t, const std::string& profile,
                    const std::vector<int>& counts, const std::vector<std::array<int, 2>>& sizes,
                    int invalid) {
  for (const auto& [hidden, inter] : sizes) {
    for (const float limit : {10.0f, 0.75f}) {
      for (const Layout layout : {Layout::kAlignedViews, Layout::kSeparate}) {
        const Experts c{8, 2, hidden, inter, 0, DType::kBF16, layout, limit};
        add_counted(t, c, profile, counts, 0);
        add_counted(t, c, profile, counts, invalid);
      }
    }
  }
}

void add_all_experts(std::vector<OpCase>& t) {
  constexpr DType kF32 = DType::kF32, kBF16 = DType::kBF16;
  constexpr Layout kAligned = Layout::kAlignedViews, kSeparate = Layout::kSeparate;
  for (const DType dt : {kF32, kBF16}) {
    for (const Layout layout : {kAligned, Layout::kUnalignedViews, kSeparate}) {
      // T <= 16 takes the decode kernels (P <= 4 E), larger T the tiled ones; unaligned views
      // always take the tiled ones.
      for (const int tokens : {1, 2, 5, 16, 17, 40}) {
        for (const float limit : {10.0f, 0.75f}) {
          add_experts(t, {8, 2, 64, 32, tokens, dt, layout, limit});
        }
      }
    }
  }
  // Sizes that are not multiples of the tile shapes (tiled kernel, every tail path).
  add_experts(t, {3, 2, 70, 45, 50, kF32, kSeparate, 10.0f});
  add_experts(t, {3, 3, 70, 45, 2, kBF16, kSeparate, 10.0f});

  // V4-Flash sizes. 1, 8, 64 tokens: decode kernels; 200 tokens (1200 pairs > 4 * 256): tiled
  // kernels (bf16: tensor cores).
  for (const DType dt : {kBF16, kF32}) {
    for (const int tokens : {1, 8, 64, 200}) {
      add_experts(t, {256, 6, 4096, 2048, tokens, dt, kAligned, 10.0f});
    }
  }
  // Prefill on tensor cores: 3072 pairs, 12 per expert on average, some experts with 2 tiles.
  add_experts(t, {256, 6, 4096, 2048, 512, kBF16, kAligned, 10.0f});

  // The bf16 tensor-core path with 64-row tiles (at most 64 pairs per expert on average in the
  // pass): tiles with 0, 1, 63, 64, 65 and 129 rows, invalid ids, and sizes that are multiples
  // of 8 but not of the 32-deep K slices or of the 128 (gate/up) and 256 (down) output columns
  // of a CTA.
  const std::vector<int> tiles64 = {0, 1, 63, 64, 65, 129, 30, 34};  // 386 pairs
  add_tile_sweep(t, "tiles64", tiles64, {{256, 128}, {200, 72}, {520, 264}, {64, 8}}, 5);
  // One expert with 300 pairs (5 row tiles) among nearly empty ones: 39 pairs per expert.
  add_counted(t, {8, 2, 256, 136, 0, kBF16, kSeparate, 10.0f}, "one300",
              {300, 0, 0, 0, 0, 0, 1, 10}, 3);
  // k = 6 of 64 experts at 8 | H, I: 1536 pairs, 24 per expert.
  add_experts(t, {64, 6, 392, 168, 256, kBF16, kAligned, 10.0f});
  // Exactly 64 pairs per expert on average: still the 64-row tiles.
  add_counted(t, {8, 2, 200, 72, 0, kBF16, kAligned, 10.0f}, "even64",
              {64, 64, 64, 64, 64, 64, 64, 64}, 0);

  // The bf16 tensor-core path with 128-row tiles (more than 64 pairs per expert on average in
  // the pass): tiles with 0, 1, 127, 128, 129 and 300 pairs (up to 3 row tiles of one expert),
  // invalid ids, and sizes that are multiples of 8 but not of the 32-deep K slices or of the 64
  // (gate/up) and 128 (down) output columns of a CTA.
  const std::vector<int> tiles128 = {0, 1, 127, 128, 129, 300, 70, 90};  // 845 pairs
  add_tile_sweep(t, "tiles128", tiles128, {{256, 128}, {200, 72}, {520, 264}, {64, 8}, {136, 200}},
                 7);
  // Just past the switch: 514 pairs over 8 experts.
  add_counted(t, {8, 2, 200, 72, 0, kBF16, kAligned, 10.0f}, "even64plus2",
              {64, 64, 64, 64, 64, 64, 64, 66}, 0);
  // Many pairs per expert (500), several row tiles of each.
  add_experts(t, {4, 2, 256, 136, 1000, kBF16, kSeparate, 10.0f});
  // k = 4 of 16 experts at wider sizes: 1600 pairs, 100 per expert (one tile for most).
  add_experts(t, {16, 4, 1024, 512, 400, kBF16, kAligned, 10.0f});

  // bf16 weights the tensor-core path cannot take (H or I not a multiple of 8, rows not 16-byte
  // aligned) fall back to the f32 tiled kernel, which matches the reference to summation order.
  for (const auto& [hidden, inter] : {std::array<int, 2>{60, 36}, {64, 36}, {68, 32}}) {
    add_counted(t, {8, 2, hidden, inter, 0, kBF16, kSeparate, 10.0f}, "tiles64", tiles64, 3);
  }
  add_counted(t, {8, 2, 256, 128, 0, kBF16, Layout::kUnalignedViews, 10.0f}, "tiles64", tiles64, 3);

  // Many tokens: more than one internal pass (4096 tokens each; bf16: the first on 128-row
  // tensor-core tiles, the second on the decode kernels) and one expert with many pairs.
  add_experts(t, {8, 2, 64, 32, 4100, kBF16, kAligned, 10.0f});
  add_experts(t, {2, 2, 64, 32, 300, kF32, kSeparate, 10.0f});

  // A slot whose expert id is out of range contributes nothing on the device (the CPU op rejects
  // it; its reference has a valid id with weight 0).
  const Experts dropped{8, 2, 64, 32, 5, kF32, kAligned, 10.0f};
  add_experts_row(
      t, dropped, "dropped_slots_" + dropped.label(),
      [dropped](Rng& rng) {
        ExpertsIn in;
        draw_weights(dropped, rng, in);
        in.x = random_f32(rng, {dropped.tokens, dropped.hidden});
        const HostRouting hr = random_routing(dropped.tokens, dropped.experts, dropped.top_k, rng);
        Tensor bad_ids = hr.ids.contiguous().to(DType::kI32);
        Tensor zero_w = hr.weights.to(DType::kF32);
        bad_ids.data<int32_t>()[1] = -1;
        bad_ids.data<int32_t>()[4] = 8;
        zero_w.data<float>()[1] = 0.0f;
        zero_w.data<float>()[4] = 0.0f;
        in.routing = {bad_ids, hr.weights};
        in.reference = {hr.ids, zero_w};
        return in;
      },
      true);
}

}  // namespace

std::vector<OpCase> moe_cases() {
  std::vector<OpCase> t;
  add_routes(t);
  add_all_experts(t);
  return t;
}

}  // namespace deepinfer::backend_ops
