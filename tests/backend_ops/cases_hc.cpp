// Rows of the hyper-connection ops: hc_expand (exact), hc_pre, hc_post, hc_post_pre, hc_head
// (summation order and expf ulps: ~1e-5 of the largest reference value); hc_pre, hc_post_pre and
// hc_head also with the sub-layer's RMSNorm of y (RowNorm; labels ending in _ynorm).
#include <cmath>
#include <string>
#include <vector>

#include "cases.h"
#include "inputs.h"

namespace deepinfer::backend_ops {
namespace {

struct HcDims {
  int64_t tokens;
  int n;
  int64_t hidden;
  int sinkhorn_iters;

  std::string label() const {
    return "t" + std::to_string(tokens) + "_n" + std::to_string(n) + "_h" + std::to_string(hidden) +
           "_iters" + std::to_string(sinkhorn_iters);
  }
  HcParams params() const {
    HcParams p;
    p.hc_mult = n;
    p.sinkhorn_iters = sinkhorn_iters;
    return p;
  }
};

// n = 5: the largest n * n <= 32 (one warp per token in hc_pre, idle lanes); n = 6 and 9: the
// block path of hc_pre's weights (n = 9 also takes two batches of stream loads in the collapse);
// T = 203 at full width: several channel chunks per token, the last one partial.
// The fused CUDA decode path of hc_pre / hc_post_pre / hc_head (cuda/hc/hc_heuristics.h:
// hc_fused_grid, n <= 4, T <= 256; by default up to 8 tokens, DEEPINFER_HC_PRE=fused for all):
// full width at T = 1 (a cluster of 16 splits where the device schedules one, else 8), 2, 7 and 8
// (one token per CTA group), 9 (4 per group, the last group one token), 64 (16 groups of 8
// splits), 256 (the largest fused T) and 257 (the first unfused one, as 203); H = 64 splits in
// two, H = 32 and 40 take one CTA per group (no barrier).
const std::vector<HcDims> kHcDims = {{1, kHcMult, kHidden, 20},
                                     {2, kHcMult, kHidden, 20},
                                     {7, kHcMult, kHidden, 20},
                                     {8, kHcMult, kHidden, 20},
                                     {9, kHcMult, kHidden, 20},
                                     {64, kHcMult, kHidden, 20},
                                     {256, kHcMult, kHidden, 20},
                                     {257, kHcMult, kHidden, 20},
                                     {2, 4, 32, 20},
                                     {1, 4, 64, 20},
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

// hc_pre's mix weights for X of `c` (fn scaled so that the mix is O(1) and the sigmoids / softmax
// are not saturated, base, scale), appended to `in`; then y_norm's weight where `norm`.
void add_mix_weights(Tensors& in, Rng& rng, const HcDims& c, bool norm) {
  const int64_t width = c.n * c.hidden;
  const int64_t fn_rows = static_cast<int64_t>(2 + c.n) * c.n;
  in.push_back(random_f32(rng, {fn_rows, width}, 1.0f / std::sqrt(static_cast<float>(width))));
  in.push_back(random_f32(rng, {fn_rows}, 0.5f));
  in.push_back(Tensor::from_vector(std::vector<float>{0.8f, 1.3f, 2.0f}, {3}));
  if (norm) in.push_back(random_f32(rng, {c.hidden}));
}

// The sub-layer norm of y where `norm` (its weight in[index], eps as the V4 configs'), else none.
RowNorm y_norm(Backend& be, const Tensors& in, bool norm, size_t index) {
  return norm ? RowNorm{up(be, in[index]), 1e-6f} : RowNorm{};
}

}  // namespace

std::vector<OpCase> hc_cases() {
  std::vector<OpCase> t;
  for (const HcDims& c : kHcDims) {
    const int64_t width = c.n * c.hidden;
    // fn scaled so that the mix is O(1) and the sigmoids / softmax are not saturated.
    const float fn_scale = 1.0f / std::sqrt(static_cast<float>(width));
    add(t, Case<Tensors>{
               .op = "hc_expand",
               .label = c.label(),
               .draw =
                   [c](Rng& rng) {
                     return Tensors{random_f32(rng, {c.tokens, c.hidden})};
                   },
               .run = [c](Backend& be,
                          const Tensors& in) { return out(be.hc_expand(up(be, in[0]), c.n)); },
               .expect = exact(),
           });
    for (const bool norm : {false, true}) {
      add(t, Case<Tensors>{
                 .op = "hc_pre",
                 .label = c.label() + (norm ? "_ynorm" : ""),
                 .draw =
                     [c, norm](Rng& rng) {
                       Tensors in{random_f32(rng, {c.tokens, c.n, c.hidden})};
                       add_mix_weights(in, rng, c, norm);
                       return in;
                     },
                 .run =
                     [c, norm](Backend& be, const Tensors& in) {
                       HcMix m = be.hc_pre(up(be, in[0]), up(be, in[1]), up(be, in[2]),
                                           up(be, in[3]), c.params(), y_norm(be, in, norm, 4));
                       return Outputs{{"post", m.post}, {"comb", m.comb}, {"y", m.y}};
                     },
                 .expect = close(kRtol, kAtol),
             });
    }
    add(t, Case<Tensors>{
               .op = "hc_post",
               .label = c.label(),
               .draw =
                   [c](Rng& rng) {
                     return Tensors{random_f32(rng, {c.tokens, c.n, c.hidden}),
                                    random_f32(rng, {c.tokens, c.hidden}),
                                    random_f32(rng, {c.tokens, c.n}),
                                    random_f32(rng, {c.tokens, c.n, c.n}, 0.5f)};
                   },
               .run =
                   [](Backend& be, const Tensors& in) {
                     return out(
                         be.hc_post(up(be, in[0]), up(be, in[1]), up(be, in[2]), up(be, in[3])));
                   },
               .expect = close(kRtol, kAtol),
           });
    for (const bool norm : {false, true}) {
      add(t, Case<Tensors>{
                 .op = "hc_post_pre",
                 .label = c.label() + (norm ? "_ynorm" : ""),
                 .draw =
                     [c, norm](Rng& rng) {
                       Tensors in{random_f32(rng, {c.tokens, c.n, c.hidden}),
                                  random_f32(rng, {c.tokens, c.hidden}),
                                  random_f32(rng, {c.tokens, c.n}),
                                  random_f32(rng, {c.tokens, c.n, c.n}, 0.5f)};
                       add_mix_weights(in, rng, c, norm);
                       return in;
                     },
                 .run =
                     [c, norm](Backend& be, const Tensors& in) {
                       HcPostPre r =
                           be.hc_post_pre(up(be, in[0]), up(be, in[1]), up(be, in[2]),
                                          up(be, in[3]), up(be, in[4]), up(be, in[5]),
                                          up(be, in[6]), c.params(), y_norm(be, in, norm, 7));
                       return Outputs{{"trunk", r.trunk},
                                      {"post", r.mix.post},
                                      {"comb", r.mix.comb},
                                      {"y", r.mix.y}};
                     },
                 .expect = close(kRtol, kAtol),
             });
      add(t, Case<Tensors>{
                 .op = "hc_head",
                 .label = c.label() + (norm ? "_ynorm" : ""),
                 .draw =
                     [c, width, fn_scale, norm](Rng& rng) {
                       Tensors in{random_f32(rng, {c.tokens, c.n, c.hidden}),
                                  random_f32(rng, {c.n, width}, fn_scale),
                                  random_f32(rng, {c.n}, 0.5f),
                                  Tensor::from_vector(std::vector<float>{1.1f}, {1})};
                       if (norm) in.push_back(random_f32(rng, {c.hidden}));
                       return in;
                     },
                 .run =
                     [c, norm](Backend& be, const Tensors& in) {
                       // hc_head takes the default sinkhorn_iters (it has no Sinkhorn step).
                       HcParams p;
                       p.hc_mult = c.n;
                       return out(be.hc_head(up(be, in[0]), up(be, in[1]), up(be, in[2]),
                                             up(be, in[3]), p, y_norm(be, in, norm, 4)));
                     },
                 .expect = close(kRtol, kAtol),
             });
    }
  }
  return t;
}

}  // namespace deepinfer::backend_ops
