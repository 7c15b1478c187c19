// CUDA op microbenchmarks through the Backend API, with the device rooflines measured in the same
// run: device-to-device copy bandwidth and a large bf16 cuBLAS GEMM (our linear op).
// Each case enqueues `iters` calls back to back and synchronizes once, so the time is device time
// whenever a call's device work exceeds its launch cost (the small cases say so); cases marked
// "(graph)" replay the `iters` calls from one captured CUDA graph instead, as a decode step does.
//
// The quantized formats' cases (cuda_quant_bench.cpp) run first; `--only fp8`, `--only moe-quant`
// or `--only quant` (both) runs just those. `--only v41` runs the V4.1 ops (cuda_v41_bench.cpp),
// which the full run leaves out. `--only hc` runs the mHC ops (cuda_hc_bench.cpp) on backends
// created under DEEPINFER_HC_PRE=fused (twice: the default cluster choice and the widest), split
// and legacy (the A/B of the fused decode kernel and of the unfused path's split mix); the full
// run leaves it out too.
//
// `--only attention-trace` runs the overlap attention kernel's timing trace instead of timing
// rows (bench_attention_trace; `--match` picks its shapes too; `--ablate BITS` traces the ilp
// variant with and without the OverlapAblation work left out, attention_wgmma_trace.h).
// `--only hc-trace` runs the fused mHC kernel's (bench_mhc_trace, hc_fused_trace.h);
// `--only attention-mma-trace` the small-batch attention's, mma.sync and its combine
// (bench_attention_mma_trace, attention_mma_trace.h; `--match` picks its shapes).
//
// Usage: cuda_op_bench [--iters N]
//                     [--only fp8|moe-quant|quant|attention|attention-trace|
//                             attention-mma-trace|indexer|v41|hc|hc-trace|rope]
//                     [--match SHAPE] (attention and indexer rows whose shape label contains SHAPE;
//                     fp8: the weights whose name contains it, decode token counts only;
//                     `--only indexer --match roofline`: the copy roofline alone)
//                     [--ablate BITS] (attention-trace only)
// (one JSON object per line)
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/backend/cuda_backend.h"
#include "cuda_attention_bench.h"
#include "cuda_hc_bench.h"
#include "cuda_indexer_bench.h"
#include "cuda_quant_bench.h"
#include "cuda_v41_bench.h"
#include "deepinfer/backend.h"
#include "deepinfer/weight.h"
#include "op_bench_util.h"

using namespace deepinfer;
using namespace deepinfer::bench;

int main(int argc, char** argv) {
  int iters = 50;
  std::string only;
  std::string match;  // attention and indexer shapes: only labels containing it; fp8 weights
  int ablate = 0;     // attention-trace: OverlapAblation bits, traced next to the full kernel
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0) iters = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--only") == 0) only = argv[i + 1];
    if (std::strcmp(argv[i], "--match") == 0) match = argv[i + 1];
    if (std::strcmp(argv[i], "--ablate") == 0) ablate = std::atoi(argv[i + 1]);
  }
  if (!only.empty() && only != "fp8" && only != "moe-quant" && only != "quant" &&
      only != "attention" && only != "attention-trace" && only != "attention-mma-trace" &&
      only != "indexer" && only != "v41" && only != "hc" && only != "hc-trace" && only != "rope") {
    std::fprintf(stderr,
                 "cuda_op_bench: --only takes fp8, moe-quant, quant, attention, attention-trace, "
                 "attention-mma-trace, indexer, v41, hc, hc-trace or rope, got %s\n",
                 only.c_str());
    return 2;
  }
  if (only == "hc") {
    // The backend reads DEEPINFER_HC_PRE and DEEPINFER_HC_CLUSTER at creation: one backend per
    // path ("fused": the default cluster choice, "fused_widest": always the widest cluster).
    for (const char* path : {"fused", "fused_widest", "split", "legacy"}) {
      const bool widest = std::strcmp(path, "fused_widest") == 0;
      setenv("DEEPINFER_HC_PRE", widest ? "fused" : path, 1);
      setenv("DEEPINFER_HC_CLUSTER", widest ? "widest" : "auto", 1);
      auto hc_be = make_backend("cuda");
      if (std::strcmp(path, "fused") == 0) {
        const auto& cuda_be = dynamic_cast<const cuda::CudaBackend&>(*hc_be);
        std::printf(
            "{\"device\": \"%s\", \"hc_fused_cluster\": {\"T=1\": %lld, \"T=7\": %lld, "
            "\"T=8\": %lld, \"T=64\": %lld}}\n",
            hc_be->name().c_str(), static_cast<long long>(cuda_be.hc_fused_cluster(1)),
            static_cast<long long>(cuda_be.hc_fused_cluster(7)),
            static_cast<long long>(cuda_be.hc_fused_cluster(8)),
            static_cast<long long>(cuda_be.hc_fused_cluster(64)));
      }
      bench_mhc(*hc_be, iters, path);
    }
    unsetenv("DEEPINFER_HC_CLUSTER");
    return 0;
  }
  auto be = make_backend("cuda");
  std::printf("{\"device\": \"%s\"}\n", be->name().c_str());
  if (only.empty() || only == "fp8" || only == "quant") bench_fp8(*be, iters, match);
  if (only.empty() || only == "moe-quant" || only == "quant") {
    bench_moe_experts_mxfp4(*be, iters);
    bench_moe_experts_fp8(*be, iters);
  }
  if (only.empty() || only == "attention") bench_attention_decode(*be, iters, match);
  if (only == "attention-trace") bench_attention_trace(*be, match, ablate);
  if (only == "hc-trace") bench_mhc_trace(*be, iters);
  if (only == "attention-mma-trace") bench_attention_mma_trace(*be, iters, match);
  if (only.empty() || only == "indexer") bench_indexer(*be, iters, match);
  if (only == "v41") bench_v41(*be, iters);
  if (only.empty() || only == "rope") {
    // The inverse rotation of the attention output ([T, 64 heads, 512], 64 rope channels) at
    // decode batches and a prefill chunk; bytes: x read, y written.
    for (const int64_t tokens : {1, 64, 256, 4096}) {
      Tensor x = rnd(*be, {tokens, 64, 512}, DType::kF32, 23);
      std::vector<int32_t> pos(static_cast<size_t>(tokens));
      for (int64_t i = 0; i < tokens; ++i)
        pos[static_cast<size_t>(i)] = static_cast<int32_t>(4096 + i);
      Tensor positions = i32(*be, pos);
      std::vector<float> freq(32);
      for (size_t i = 0; i < freq.size(); ++i)
        freq[i] = std::pow(10000.0f, -static_cast<float>(i) / 32.0f);
      Tensor inv_freq = be->upload(Tensor::from_vector(freq, {32}), DType::kF32);
      // The same bytes one float past a 16-byte boundary take the element kernel.
      Tensor shifted =
          rnd(*be, {x.numel() + 4}, DType::kF32, 24).narrow(0, 1, x.numel()).reshape(x.shape());
      for (const bool aligned : {true, false}) {
        const Tensor& in = aligned ? x : shifted;
        const double us =
            time_graph_us(*be, iters, [&] { (void)be->rope(in, positions, inv_freq, true); });
        emit("rope_inverse",
             "T=" + std::to_string(tokens) + " 64x512 rope 64" +
                 (aligned ? "" : " unaligned (element kernel)") + " (graph)",
             us, 2.0 * static_cast<double>(x.nbytes()), 0);
      }
    }
  }
  if (!only.empty()) return 0;

  emit_copy_roofline(*be);
  {  // roofline: bf16 GEMM 8192^3 via linear (bf16 weights, f32 activations cast to bf16)
    Tensor x = rnd(*be, {8192, 8192}, DType::kF32, 2);
    Tensor w = rnd(*be, {8192, 8192}, DType::kBF16, 3);
    double us = time_us(*be, 10, [&] { (void)be->linear(x, w); });
    emit("roofline_gemm_bf16(linear)", "8192x8192x8192", us, 0, 2.0 * 8192.0 * 8192.0 * 8192.0);
  }
  for (int m : {1, 64, 4096}) {  // q_b projection: [m, 1024] x [32768, 1024]^T
    Tensor x = rnd(*be, {m, 1024}, DType::kF32, 4);
    Tensor w = rnd(*be, {32768, 1024}, DType::kBF16, 5);
    double us = time_us(*be, iters, [&] { (void)be->linear(x, w); });
    emit("linear_bf16", "M=" + std::to_string(m) + " N=32768 K=1024", us,
         32768.0 * 1024 * 2 + m * 1024.0 * 4 + m * 32768.0 * 4, 2.0 * m * 32768.0 * 1024);
  }
  // Decode-step bf16 linears at V4-Flash widths, M = 1 (the GEMV path, cuda/gemm/gemv_bf16.cu):
  // q_b, wo_b, shared expert, a 64-row projection and wo_a's 8 groups of [1024, 4096]. Timed in a
  // graph; bytes: weights + x + y (weights under ~50 MB stay in L2 across the replayed calls).
  for (auto [n, k, groups] : std::vector<std::tuple<int64_t, int64_t, int>>{
           {32768, 1024, 1}, {4096, 8192, 1}, {2048, 4096, 1}, {64, 4096, 1}, {1024, 4096, 8}}) {
    Tensor x = rnd(*be, {1, groups * k}, DType::kF32, 23);
    Tensor w = rnd(*be, {groups * n, k}, DType::kBF16, 24);
    double us = time_graph_us(*be, iters, [&] {
      (void)(groups > 1 ? be->grouped_linear(x, w, groups) : be->linear(x, w));
    });
    emit("linear_bf16",
         "M=1 N=" + std::to_string(n) + " K=" + std::to_string(k) +
             (groups > 1 ? " G=" + std::to_string(groups) : std::string()) + " (graph)",
         us, groups * (n * k * 2.0 + k * 4.0 + n * 4.0), 2.0 * groups * n * k);
  }
  {
    Tensor x = rnd(*be, {4096, 4096}, DType::kF32, 6);
    Tensor w = rnd(*be, {4096}, DType::kF32, 7);
    double us = time_us(*be, iters, [&] { (void)be->rms_norm(x, w, 1e-6f); });
    emit("rms_norm", "4096x4096", us, 2.0 * 4096 * 4096 * 4, 0);
  }
  // rms_norm at the V4-Flash decode widths (T = 1): the mHC norm over the 4 flattened streams
  // (unweighted), the hidden norm, a 1024-wide norm and the per-head q norm (64 rows of 512);
  // then prefill (T = 4096) of the mHC and the per-head norms. Bytes: x read, y written, the
  // weight read once. The decode cases are timed in a graph (time_graph_us).
  for (auto [rows, dim, weighted] :
       std::vector<std::tuple<int64_t, int64_t, bool>>{{1, 16384, false},
                                                       {1, 4096, true},
                                                       {1, 1024, true},
                                                       {64, 512, true},
                                                       {4096, 16384, false},
                                                       {4096 * 64, 512, true}}) {
    Tensor x = rnd(*be, {rows, dim}, DType::kF32, 20);
    Tensor w = weighted ? rnd(*be, {dim}, DType::kF32, 21) : Tensor();
    const bool decode = rows * dim <= 64 * 1024;
    auto fn = [&] { (void)be->rms_norm(x, w, 1e-6f); };
    double us = decode ? time_graph_us(*be, iters, fn) : time_us(*be, iters, fn);
    emit("rms_norm",
         std::to_string(rows) + "x" + std::to_string(dim) + (weighted ? "" : " unweighted") +
             (decode ? " (graph)" : ""),
         us, 2.0 * rows * dim * 4 + (weighted ? dim * 4.0 : 0.0), 0);
  }
  // Greedy next token over the V4-Flash vocabulary: one row (decode, batch 1) and a batch of 64.
  for (int64_t rows : {1, 64}) {
    const int64_t vocab = 129280;
    Tensor x = rnd(*be, {rows, vocab}, DType::kF32, 22);
    double us = time_graph_us(*be, iters, [&] { (void)be->argmax(x); });
    emit("argmax", std::to_string(rows) + "x" + std::to_string(vocab) + " (graph)", us,
         rows * vocab * 4.0, 0);
  }
  {  // mHC pre-mix at V4-Flash width
    Tensor X = rnd(*be, {4096, 4, 4096}, DType::kF32, 8);
    Tensor fn = rnd(*be, {24, 16384}, DType::kF32, 9, 0.01f),
           base = rnd(*be, {24}, DType::kF32, 10), scale = rnd(*be, {3}, DType::kF32, 11);
    HcParams p;
    double us = time_us(*be, iters, [&] { (void)be->hc_pre(X, fn, base, scale, p); });
    emit("hc_pre", "T=4096 N=4 H=4096", us, 4096.0 * 16384 * 4 + 4096.0 * 4096 * 4,
         4096.0 * 24 * 16384 * 2);
  }
  {  // MoE router at V4-Flash widths: logits of 256 experts (bf16 gate [256, 4096], f32 x), bias,
     // top-6. T = 1: decode GEMV (bytes: the gate weights, ~1 us at bandwidth); T = 64 and 4096:
     // f32 SGEMM after widening the gate to f32 (TFLOP/s of the logits).
    const int e = 256, h = 4096, kk = 6;
    Tensor gate = rnd(*be, {e, h}, DType::kBF16, 20, 1.0f / 64.0f);
    Tensor bias = rnd(*be, {e}, DType::kF32, 21, 0.1f);
    for (int tokens : {1, 64, 4096}) {
      Tensor x = rnd(*be, {tokens, h}, DType::kF32, 22);
      double us = time_us(
          *be, iters, [&] { (void)be->moe_route(x, gate, bias, Tensor(), Tensor(), kk, 2.5f); });
      emit("moe_route_bf16", "T=" + std::to_string(tokens) + " k=6 E=256 H=4096", us,
           e * h * 2.0 + tokens * h * 4.0, 2.0 * tokens * e * h);
    }
  }
  {  // MoE at V4-Flash widths: 6 experts of [2048, 4096] x2 + [4096, 2048] per token, bf16.
     // Decode (T = 1, 64: gemv kernels) and prefill on tensor cores with bf16-rounded activations
     // (T = 2048: 48 pairs per expert, 64-row tiles; T = 4096: 24576 pairs, 96 per expert,
     // 128-row tiles, one per expert).
    const int e = 256, i = 2048, h = 4096, kk = 6;
    Tensor gate_up = rnd(*be, {e, 2 * i, h}, DType::kBF16, 17, 0.02f),
           down = rnd(*be, {e, h, i}, DType::kBF16, 18, 0.02f);
    ExpertWeights ex;
    for (int j = 0; j < e; ++j) {
      Tensor gu = gate_up.select(0, j);
      ex.w1.push_back(gu.narrow(0, 0, i));
      ex.w3.push_back(gu.narrow(0, i, i));
      ex.w2.push_back(down.select(0, j));
    }
    for (int tokens : {1, 64, 2048, 4096}) {
      Tensor x = rnd(*be, {tokens, h}, DType::kF32, 19);
      std::vector<int32_t> ids;
      std::vector<float> wts;
      for (int tkn = 0; tkn < tokens; ++tkn)
        for (int j = 0; j < kk; ++j) {
          ids.push_back((tkn * 7 + j * 37) % e);
          wts.push_back(0.25f);
        }
      Routing r{be->upload(Tensor::from_vector(ids, {tokens, kk}), DType::kI32),
                be->upload(Tensor::from_vector(wts, {tokens, kk}), DType::kF32)};
      const int n = tokens >= 1024 ? std::min(iters, 10) : iters;  // prefill: ms per call
      double us = time_us(*be, n, [&] { (void)be->moe_experts(x, r, ex, 10.0f); });
      const double used = std::min<double>(e, tokens * kk);
      emit("moe_experts_bf16", "T=" + std::to_string(tokens) + " k=6 E=256 I=2048 H=4096", us,
           used * 3.0 * i * h * 2, tokens * kk * 3.0 * 2 * i * h);
    }
  }
  return 0;
}
