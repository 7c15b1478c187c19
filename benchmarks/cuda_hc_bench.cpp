// The mHC ops at V4-Flash widths (cuda_hc_bench.h), run by cuda_op_bench --only hc.
#include "cuda_hc_bench.h"

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "cuda/backend/cuda_backend.h"
#include "cuda/gemm/gemm_launch.h"
#include "cuda/hc/hc_fused_trace.h"
#include "cuda/hc/hc_heuristics.h"
#include "deepinfer/weight.h"
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

// The backend's fused mHC kernel traced into `buffer` while this lives.
class HcTraceScope {
 public:
  HcTraceScope(cuda::CudaBackend& be, const cuda::HcFusedTraceBuffer& buffer) : be_(be) {
    be_.set_hc_fused_trace(buffer);
  }
  ~HcTraceScope() { be_.set_hc_fused_trace({}); }
  HcTraceScope(const HcTraceScope&) = delete;
  HcTraceScope& operator=(const HcTraceScope&) = delete;

 private:
  cuda::CudaBackend& be_;
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

namespace {

// One JSON line of a traced op: the phases of the last traced call (hc_fused_trace.h); `timing`:
// the line's timing fields, already formatted.
void print_hc_trace(const char* op, const std::string& shape, const std::string& timing,
                    const cuda::HcFusedTraceSummary& t, int64_t clusters) {
  std::string phases;
  for (int ph = 0; ph < cuda::kHcPhases; ++ph) {
    const cuda::TracePhaseStats& s = t.phases[static_cast<size_t>(ph)];
    if (s.blocks == 0) continue;
    char buf[160];
    std::snprintf(buf, sizeof(buf), "%s\"%s\": {\"mean\": %.0f, \"max\": %lld, \"max_cta\": %d}",
                  phases.empty() ? "" : ", ", cuda::hc_fused_trace_phase_name(ph), s.mean,
                  static_cast<long long>(s.max), s.max_block);
    phases += buf;
  }
  std::printf(
      "{\"trace\": \"hc_fused\", \"op\": \"%s\", \"shape\": \"%s\", %s, \"ctas\": %d, "
      "\"clusters\": %lld, \"clock_ghz\": %.3f, \"end_spread_ns\": %lld, \"cycles\": {%s}}\n",
      op, shape.c_str(), timing.c_str(), t.ctas, static_cast<long long>(clusters), t.clock_ghz,
      static_cast<long long>(t.end_spread_ns), phases.c_str());
  std::fflush(stdout);
}

}  // namespace

void bench_mhc_trace(Backend& be, int iters) {
  auto& cuda_be = dynamic_cast<cuda::CudaBackend&>(be);
  const HcWeights pre_w{rnd(be, {kFnRows, kWidth}, DType::kF32, 100, 0.01f),
                        rnd(be, {kFnRows}, DType::kF32, 101), rnd(be, {3}, DType::kF32, 102)};
  const HcWeights head_w{rnd(be, {kHcMult, kWidth}, DType::kF32, 103, 0.01f),
                         rnd(be, {kHcMult}, DType::kF32, 104), rnd(be, {1}, DType::kF32, 105)};
  const RowNorm y_norm{rnd(be, {kHidden}, DType::kF32, 34), 1e-6f};
  const HcParams p;
  // The predecessor of the "after wo_b" rows: V4-Flash's wo_b (FP8, 4096 x 8192, 128 x 128
  // blocks), 8 copies in rotation (256 MB: past the L2, as the layers' weights stream in a step),
  // whose output is hc_post_pre's `out`, as in the model.
  constexpr int64_t kWoBIn = 2 * kHidden;
  constexpr int kWoBCopies = 8;
  std::vector<MatrixWeight> wo_b;
  {
    MatrixWeight host;
    host.values = random_e4m3({kHidden, kWoBIn}, 7);
    host.scales = Tensor::from_vector(
        std::vector<float>(static_cast<size_t>(kHidden / 128 * (kWoBIn / 128)), 1.0f / 64),
        {kHidden / 128, kWoBIn / 128});
    host.format = WeightFormat::kFp8Block;
    host.block_rows = 128;
    host.block_cols = 128;
    host.act_group = 128;
    for (int i = 0; i < kWoBCopies; ++i) {
      wo_b.push_back(be.upload_matrix_weight(host));
      cuda::prepare_fp8_wgmma_map(cuda_be, wo_b.back());  // before any capture
    }
  }
  for (const int64_t tokens : {1, 8}) {
    const Tensor X = rnd(be, {tokens, kHcMult, kHidden}, DType::kF32, 30);
    const Tensor out = rnd(be, {tokens, kHidden}, DType::kF32, 31);
    const Tensor post = rnd(be, {tokens, kHcMult}, DType::kF32, 32);
    const Tensor comb = rnd(be, {tokens, kHcMult, kHcMult}, DType::kF32, 33);
    const Tensor wo_b_in = rnd(be, {tokens, kWoBIn}, DType::kF32, 35);
    const std::string shape = "T=" + std::to_string(tokens) + " N=4 H=4096 ynorm (graph)";
    const cuda::HcFusedGrid g = cuda::hc_fused_grid(cuda_be.num_sms(), tokens, kHcMult, kHidden,
                                                    cuda_be.hc_fused_cluster(tokens));
    // The ops as the model calls them; `o`: hc_post_pre's sub-layer output.
    const std::vector<std::pair<const char*, std::function<void(const Tensor&)>>> ops = {
        {"hc_pre",
         [&](const Tensor&) { (void)be.hc_pre(X, pre_w.fn, pre_w.base, pre_w.scale, p, y_norm); }},
        {"hc_post_pre",
         [&](const Tensor& o) {
           (void)be.hc_post_pre(X, o, post, comb, pre_w.fn, pre_w.base, pre_w.scale, p, y_norm);
         }},
        {"hc_head",
         [&](const Tensor&) {
           (void)be.hc_head(X, head_w.fn, head_w.base, head_w.scale, p, y_norm);
         }},
    };
    int next = 0;
    const auto wo_b_call = [&] {
      return be.linear(wo_b_in, wo_b[static_cast<size_t>(next++ % kWoBCopies)]);
    };
    const double linear_us = time_graph_us(be, iters, [&] { (void)wo_b_call(); });
    for (const auto& [op, call] : ops) {
      if (!g.fused || !cuda::hc_fused_chosen(cuda_be.hc_pre_choice(), g, tokens)) {
        std::printf(
            "{\"trace\": \"hc_fused\", \"op\": \"%s\", \"shape\": \"%s\", "
            "\"skipped\": \"the fused kernel does not run here (DEEPINFER_HC_PRE)\"}\n",
            op, shape.c_str());
        continue;
      }
      const int ctas = static_cast<int>(g.groups * g.splits);
      const Tensor stamps = be.zeros({cuda::hc_fused_trace_words(ctas)}, DType::kI64);
      // `fn` timed untraced, then traced; the summary of the traced graph's last call.
      const auto traced = [&](const std::function<void()>& fn, double& untraced_us,
                              double& traced_us) {
        untraced_us = time_graph_us(be, iters, fn);
        {
          const HcTraceScope scope(cuda_be, {static_cast<int64_t*>(stamps.raw_data()), ctas});
          traced_us = time_graph_us(be, iters, fn);
        }
        const Tensor host = be.to_host(stamps);
        const int64_t* w = host.data<int64_t>();
        return cuda::summarize_hc_fused_trace(
            std::vector<int64_t>(w, w + cuda::hc_fused_trace_words(ctas)), ctas);
      };
      double alone_us = 0, alone_traced_us = 0;
      const cuda::HcFusedTraceSummary alone = traced([&] { call(out); }, alone_us, alone_traced_us);
      char timing[256];
      std::snprintf(timing, sizeof(timing), "\"us_untraced\": %.3f, \"us_traced\": %.3f", alone_us,
                    alone_traced_us);
      print_hc_trace(op, shape, timing, alone, g.groups);
      // After wo_b: what the op adds to a graph of those linears (us_pair - us_linear) against
      // its time alone, and its phases when its predecessor fills the GPU.
      double pair_us = 0, pair_traced_us = 0;
      const cuda::HcFusedTraceSummary after =
          traced([&] { call(wo_b_call()); }, pair_us, pair_traced_us);
      std::snprintf(timing, sizeof(timing),
                    "\"after\": \"wo_b (fp8 linear, 32 MiB, %d copies)\", \"us_linear\": %.3f, "
                    "\"us_pair\": %.3f, \"us_added\": %.3f, \"us_pair_traced\": %.3f",
                    kWoBCopies, linear_us, pair_us, pair_us - linear_us, pair_traced_us);
      print_hc_trace(op, shape, timing, after, g.groups);
    }
  }
}

}  // namespace deepinfer::bench
