// The mHC ops at V4-Flash widths (cuda_hc_bench.h), run by cuda_op_bench --only hc.
#include "cuda_hc_bench.h"

#include <cstdint>
#include <string>
#include <vector>

#include "op_bench_util.h"

namespace deepinfer::bench {

namespace {

constexpr int64_t kHidden = 4096;  // V4-Flash
constexpr int kHcMult = 4;
constexpr int64_t kWidth = kHcMult * kHidden;
constexpr int64_t kFnRows = (2 + kHcMult) * kHcMult;
// Weight sets of the cold rows: 48 x 1.5 MB of fn, more than the H200's 50 MB L2.
constexpr int kColdSets = 48;

struct HcWeights {
  Tensor fn;
  Tensor base;
  Tensor scale;
};

}  // namespace

void bench_mhc(Backend& be, int iters, const std::string& path) {
  std::vector<HcWeights> pre_sets, head_sets;
  for (int i = 0; i < kColdSets; ++i) {
    const uint64_t seed = 100 + 6 * static_cast<uint64_t>(i);
    pre_sets.push_back({rnd(be, {kFnRows, kWidth}, DType::kF32, seed, 0.01f),
                        rnd(be, {kFnRows}, DType::kF32, seed + 1),
                        rnd(be, {3}, DType::kF32, seed + 2)});
    head_sets.push_back({rnd(be, {kHcMult, kWidth}, DType::kF32, seed + 3, 0.01f),
                         rnd(be, {kHcMult}, DType::kF32, seed + 4),
                         rnd(be, {1}, DType::kF32, seed + 5)});
  }
  HcParams p;
  // T = 7 and 8: seven and eight token groups (clusters of the fused kernel).
  for (const int64_t tokens : {1, 7, 8, 64, 256}) {
    Tensor X = rnd(be, {tokens, kHcMult, kHidden}, DType::kF32, 30);
    Tensor out = rnd(be, {tokens, kHidden}, DType::kF32, 31);
    Tensor post = rnd(be, {tokens, kHcMult}, DType::kF32, 32);
    Tensor comb = rnd(be, {tokens, kHcMult, kHcMult}, DType::kF32, 33);
    const std::string shape = "T=" + std::to_string(tokens) + " N=4 H=4096 (graph)";
    // Bytes: X read twice (mix, collapse), fn once, y written; FLOPs: the mix.
    const double x_bytes = tokens * kWidth * 4.0;
    const double y_bytes = tokens * kHidden * 4.0;
    for (const bool cold : {false, true}) {
      const std::string label = shape + (cold ? " cold fn" : " warm fn");
      int call = 0;
      const double pre_us = time_graph_us(be, iters, [&] {
        const HcWeights& w = pre_sets[cold ? call++ % kColdSets : 0];
        (void)be.hc_pre(X, w.fn, w.base, w.scale, p);
      });
      emit("hc_pre[" + path + "]", label, pre_us, 2 * x_bytes + kFnRows * kWidth * 4.0 + y_bytes,
           2.0 * tokens * kFnRows * kWidth);
      call = 0;
      const double head_us = time_graph_us(be, iters, [&] {
        const HcWeights& w = head_sets[cold ? call++ % kColdSets : 0];
        (void)be.hc_head(X, w.fn, w.base, w.scale, p);
      });
      emit("hc_head[" + path + "]", label, head_us, 2 * x_bytes + kHcMult * kWidth * 4.0 + y_bytes,
           2.0 * tokens * kHcMult * kWidth);
      // hc_post_pre: X and out read, the new trunk written (and read back by the collapse).
      call = 0;
      const double post_pre_us = time_graph_us(be, iters, [&] {
        const HcWeights& w = pre_sets[cold ? call++ % kColdSets : 0];
        (void)be.hc_post_pre(X, out, post, comb, w.fn, w.base, w.scale, p);
      });
      emit("hc_post_pre[" + path + "]", label, post_pre_us,
           3 * x_bytes + 2 * y_bytes + kFnRows * kWidth * 4.0, 2.0 * tokens * kFnRows * kWidth);
    }
    if (tokens <= 8) {
      // As the model calls them at decode sizes: y normed for the sub-layer (RowNorm). The
      // "sinkhorn 1" rows run one Sinkhorn iteration (one column normalisation) instead of the
      // config's 20 (39 normalisations): the difference bounds what the Sinkhorn warp adds to
      // the kernel's tail.
      const RowNorm y_norm{rnd(be, {kHidden}, DType::kF32, 34), 1e-6f};
      HcParams one = p;
      one.sinkhorn_iters = 1;
      for (const bool cold : {false, true}) {
        for (const HcParams* params : {&p, &one}) {
          const std::string label = shape + (cold ? " cold fn" : " warm fn") + " ynorm" +
                                    (params == &one ? " sinkhorn 1" : "");
          int call = 0;
          emit("hc_pre[" + path + "]", label,
               time_graph_us(be, iters,
                             [&] {
                               const HcWeights& w = pre_sets[cold ? call++ % kColdSets : 0];
                               (void)be.hc_pre(X, w.fn, w.base, w.scale, *params, y_norm);
                             }),
               2 * x_bytes + kFnRows * kWidth * 4.0 + y_bytes, 2.0 * tokens * kFnRows * kWidth);
          call = 0;
          emit("hc_post_pre[" + path + "]", label,
               time_graph_us(be, iters,
                             [&] {
                               const HcWeights& w = pre_sets[cold ? call++ % kColdSets : 0];
                               (void)be.hc_post_pre(X, out, post, comb, w.fn, w.base, w.scale,
                                                    *params, y_norm);
                             }),
               3 * x_bytes + 2 * y_bytes + kFnRows * kWidth * 4.0, 2.0 * tokens * kFnRows * kWidth);
        }
      }
    }
    // hc_post alone: X and out read, the new trunk written.
    emit("hc_post[" + path + "]", shape,
         time_graph_us(be, iters, [&] { (void)be.hc_post(X, out, post, comb); }),
         2 * x_bytes + y_bytes, 0);
  }
}

}  // namespace deepinfer::bench
