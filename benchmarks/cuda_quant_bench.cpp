// Benchmarks of DeepSeek's quantized formats on CUDA, run by cuda_op_bench (`--only fp8`,
// `--only moe-quant`, `--only quant`): the FP8 block-scaled linears (cuda/gemm/
// gemm_fp8_heuristics.h) against a >= 1 GiB memcpy (decode, GB/s of weight bytes) and cuBLASLt's
// block-scaled FP8 GEMM at 8192^3 (prefill, TFLOP/s); the MXFP4 routed experts in GB/s of weight
// bytes at 1, 4 and 16 pairs per expert and TFLOP/s at 4096 and 16384 tokens, and the FP8 routed
// experts likewise (the "_vs_copy" lines name the kernel that ran; DEEPINFER_MOE_QUANT_DECODE=
// registers or prefill picks another for the decode shape; with the streaming kernel, the
// default, the decode lines run again on its lean variant, "streaming_lean" at the end of the
// shape, and the backend's choice is restored after). The prefill lines run once per
// prefill kernel, named at the end of the shape: "prefill" (mma.sync) and, on sm_90 with sm_90a
// code, "prefill_wgmma" (the backend's DEEPINFER_MOE_QUANT_PREFILL is restored after). Each line
// carries its ratio ("of_roofline").
#include "cuda_quant_bench.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
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
#include "cuda/gemm/gemm_fp8_heuristics.h"
#include "cuda/gemm/gemm_launch.h"
#include "deepinfer/weight.h"
#include "op_bench_util.h"

namespace deepinfer::bench {

namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "cuda_op_bench: %s failed: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void lt_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cuda_op_bench: %s failed with cuBLAS status %d\n", what,
                 static_cast<int>(s));
    std::exit(1);
  }
}

// Dense peak of cuBLASLt at n^3 in TFLOP/s: bf16 x bf16 -> bf16, or e4m3 x e4m3 -> f32 with
// DeepSeek's block scaling (VEC128 on B, BLK128x128 on A), f32 accumulation. Raw cuBLASLt on a
// stream of its own, timed with events after a warm-up.
double cublaslt_peak_tflops(Backend& be, bool fp8, int64_t n, int reps) {
  cublasLtHandle_t lt = nullptr;
  lt_check(cublasLtCreate(&lt), "cublasLtCreate");
  cudaStream_t stream = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const size_t ws_bytes = size_t{64} << 20;
  void* ws = nullptr;
  cuda_check(cudaMalloc(&ws, ws_bytes), "cudaMalloc");
  Tensor a, b, sa, sb;
  if (fp8) {
    a = be.upload(random_e4m3({n, n}, 1), DType::kF8E4M3);
    b = be.upload(random_e4m3({n, n}, 2), DType::kF8E4M3);
    const int64_t kb = n / 128;
    sa = be.upload(
        Tensor::from_vector(std::vector<float>(static_cast<size_t>(kb * kb), 1.0f / 64), {kb * kb}),
        DType::kF32);
    sb = be.upload(
        Tensor::from_vector(std::vector<float>(static_cast<size_t>(kb * n), 1.0f / 64), {kb * n}),
        DType::kF32);
  } else {
    a = rnd(be, {n, n}, DType::kBF16, 31);
    b = rnd(be, {n, n}, DType::kBF16, 32);
  }
  Tensor d = be.empty({n, n}, fp8 ? DType::kF32 : DType::kBF16);
  be.synchronize();
  const cudaDataType_t in_type = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  const cudaDataType_t out_type = fp8 ? CUDA_R_32F : CUDA_R_16BF;
  cublasLtMatmulDesc_t desc = nullptr;
  lt_check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "DescCreate");
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  lt_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "T");
  lt_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "T");
  if (fp8) {
    const int32_t mode_a = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    const int32_t mode_b = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    const void* pa = sa.raw_data();
    const void* pb = sb.raw_data();
    lt_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a,
                                            sizeof(mode_a)),
             "A_SCALE_MODE");
    lt_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b,
                                            sizeof(mode_b)),
             "B_SCALE_MODE");
    lt_check(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &pa, sizeof(pa)),
        "A_SCALE_POINTER");
    lt_check(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &pb, sizeof(pb)),
        "B_SCALE_POINTER");
  }
  const auto u = static_cast<uint64_t>(n);
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  lt_check(cublasLtMatrixLayoutCreate(&la, in_type, u, u, n), "LayoutCreate");
  lt_check(cublasLtMatrixLayoutCreate(&lb, in_type, u, u, n), "LayoutCreate");
  lt_check(cublasLtMatrixLayoutCreate(&ld, out_type, u, u, n), "LayoutCreate");
  cublasLtMatmulPreference_t pref = nullptr;
  lt_check(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
  lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &ws_bytes, sizeof(ws_bytes)),
           "PreferenceSetAttribute");
  cublasLtMatmulHeuristicResult_t h = {};
  int found = 0;
  lt_check(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &h, &found),
           "AlgoGetHeuristic");
  double tflops = 0.0;
  if (found > 0) {
    const float alpha = 1.0f, beta = 0.0f;
    auto run = [&] {
      lt_check(cublasLtMatmul(lt, desc, &alpha, a.raw_data(), la, b.raw_data(), lb, &beta,
                              d.raw_data(), ld, d.raw_data(), ld, &h.algo, ws, ws_bytes, stream),
               "cublasLtMatmul");
    };
    cudaEvent_t e0, e1;
    cuda_check(cudaEventCreate(&e0), "cudaEventCreate");
    cuda_check(cudaEventCreate(&e1), "cudaEventCreate");
    run();
    run();
    cuda_check(cudaEventRecord(e0, stream), "cudaEventRecord");
    for (int i = 0; i < reps; ++i) run();
    cuda_check(cudaEventRecord(e1, stream), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(e1), "cudaEventSynchronize");
    float ms = 0.0f;
    cuda_check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
    tflops = 2.0 * static_cast<double>(n) * n * n * reps / (ms * 1e-3) / 1e12;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
  cudaFree(ws);
  cudaStreamDestroy(stream);
  cublasLtDestroy(lt);
  return tflops;  // 0: cuBLASLt has no algorithm
}

// The FP8 block-scaled linears of V4-Flash (128x128 blocks, activations quantized per 128): the
// rooflines, then per weight GB/s at decode widths M = 1..64 (graph-timed; the calls cycle
// through copies of the weight totalling >= 256 MiB, so the weights come from HBM, not L2), each
// on each decode path ("(stream)": fp8_stream.cu with its tiling, "(stream_pdl)": the same as a
// programmatic dependent launch, "(legacy)": the FP8 GEMV up to 16 tokens and cuBLASLt above,
// "(legacy_lt_untuned)" or "(legacy_lt_tuned)": the legacy path under the other cuBLASLt
// algorithm choice (DEEPINFER_FP8_CUBLASLT_TUNE) where it takes cuBLASLt, "(wgmma)" and
// "(wgmma_f16)": the Hopper weight stream on either math where it applies;
// DEEPINFER_FP8_LINEAR, DEEPINFER_FP8_WGMMA_MATH), and
// TFLOP/s at prefill widths.
}  // namespace

void bench_fp8(Backend& be, int iters, const std::string& match) {
  auto& cuda_be = dynamic_cast<cuda::CudaBackend&>(be);
  double copy_gbps = 0.0;
  {  // roofline: device-to-device memcpy of 2 GiB (bytes read + written)
    const int64_t bytes = int64_t{2} << 30;
    Tensor a = be.empty({bytes / 4}, DType::kF32);
    Tensor b = be.empty({bytes / 4}, DType::kF32);
    be.fill_random_normal(a, 1, 0.0f, 1.0f);
    const double us = time_us(be, 10, [&] { be.copy_into(b, a); });
    copy_gbps = 2.0 * static_cast<double>(bytes) / us / 1e3;
    emit_ratio("roofline_memcpy", "2GiB d2d", us, 2.0 * static_cast<double>(bytes), 0, 1.0);
  }
  const int64_t n = 8192;
  const double flops = 2.0 * n * n * n;
  const bool decode_only = !match.empty();
  const double bf16_peak = decode_only ? 0.0 : cublaslt_peak_tflops(be, false, n, 20);
  // A peak of 0 (cuBLASLt found no algorithm) prints as us 0, TFLOPs 0.
  const auto peak_us = [flops](double tflops) { return tflops > 0 ? flops / tflops / 1e6 : 0.0; };
  emit_ratio("roofline_cublaslt_bf16", "8192^3 bf16 -> bf16", peak_us(bf16_peak), 0,
             bf16_peak > 0 ? flops : 0, 1.0);
  const double fp8_peak = decode_only ? 0.0 : cublaslt_peak_tflops(be, true, n, 20);
  emit_ratio("roofline_cublaslt_fp8_blockscaled", "8192^3 e4m3 1x128 x 128x128 -> f32",
             peak_us(fp8_peak), 0, fp8_peak > 0 ? flops : 0, 1.0);

  struct Shape3 {
    const char* name;
    int64_t n, k;
    int groups;
  };
  for (const Shape3& s : std::vector<Shape3>{{"wq_a", 1024, 4096, 1},
                                             {"wq_b", 32768, 1024, 1},
                                             {"wkv", 512, 4096, 1},
                                             {"wo_a", 1024, 4096, 8},
                                             {"wo_b", 4096, 8192, 1},
                                             {"shared_w13", 2048, 4096, 1},
                                             {"shared_w2", 4096, 2048, 1},
                                             {"indexer_wq_b", 8192, 1024, 1}}) {
    if (decode_only && std::string(s.name).find(match) == std::string::npos) continue;
    const int64_t rows = s.groups * s.n;
    MatrixWeight host;
    host.values = random_e4m3({rows, s.k}, 7);
    const int64_t sr = (rows + 127) / 128, sc = (s.k + 127) / 128;
    host.scales =
        Tensor::from_vector(std::vector<float>(static_cast<size_t>(sr * sc), 1.0f / 64), {sr, sc});
    host.format = WeightFormat::kFp8Block;
    host.block_rows = 128;
    host.block_cols = 128;
    host.act_group = 128;
    const double wbytes = static_cast<double>(rows * s.k);
    const int copies =
        static_cast<int>(std::clamp<double>(std::ceil(256.0 * (1 << 20) / wbytes), 1, 64));
    std::vector<MatrixWeight> w;
    for (int i = 0; i < copies; ++i) {
      w.push_back(be.upload_matrix_weight(host));
      // The wgmma rows switch the path after upload: their maps, before any graph capture.
      cuda::prepare_fp8_wgmma_map(cuda_be, w.back());
    }
    const std::string dims = "N=" + std::to_string(s.n) + " K=" + std::to_string(s.k) +
                             (s.groups > 1 ? " G=" + std::to_string(s.groups) : std::string());
    // 1387: a token count that is not a multiple of 16, as an agent turn's suffix is.
    for (int64_t m : {1, 4, 16, 32, 64, 1387, 4096, 16384}) {
      if (decode_only && m > 64) break;
      Tensor x = rnd(be, {m, s.groups * s.k}, DType::kF32, 40);
      int next = 0;
      auto call = [&] {
        const MatrixWeight& wi = w[static_cast<size_t>(next++ % copies)];
        (void)(s.groups > 1 ? be.grouped_linear(x, wi, s.groups) : be.linear(x, wi));
      };
      const double fl = 2.0 * m * rows * s.k;
      if (m <= 64) {
        // Every decode path (DEEPINFER_FP8_LINEAR; the weight stream on either math,
        // DEEPINFER_FP8_WGMMA_MATH), the backend's own choices restored after.
        const cuda::Fp8LinearChoice own = cuda_be.fp8_linear();
        const cuda::Fp8WgmmaMath own_math = cuda_be.fp8_wgmma_math();
        const bool own_tune = cuda_be.cublaslt_tune();
        struct Path {
          cuda::Fp8LinearChoice choice;
          cuda::Fp8WgmmaMath math;
          bool lt_tune;
          const char* tag;
        };
        for (const Path& path :
             {Path{cuda::Fp8LinearChoice::kStream, own_math, own_tune, "(stream)"},
              Path{cuda::Fp8LinearChoice::kStreamPdl, own_math, own_tune, "(stream_pdl)"},
              Path{cuda::Fp8LinearChoice::kLegacy, own_math, own_tune, "(legacy)"},
              Path{cuda::Fp8LinearChoice::kLegacy, own_math, !own_tune,
                   own_tune ? "(legacy_lt_untuned)" : "(legacy_lt_tuned)"},
              Path{cuda::Fp8LinearChoice::kWgmma, cuda::Fp8WgmmaMath::kMmaSync, own_tune,
                   "(wgmma)"},
              Path{cuda::Fp8LinearChoice::kWgmma, cuda::Fp8WgmmaMath::kF16, own_tune,
                   "(wgmma_f16)"}}) {
          // The other cuBLASLt choice only where the legacy path takes cuBLASLt.
          if (path.lt_tune != own_tune && m <= 16) continue;
          cuda_be.set_fp8_linear(path.choice);
          cuda_be.set_fp8_wgmma_math(path.math);
          cuda_be.set_cublaslt_tune(path.lt_tune);
          // Every copy once outside the capture: a weight's first weight-stream call makes its
          // tensor map, which a capture cannot (the call would take the legacy paths there).
          for (int i = 0; i < copies; ++i) call();
          const bool stream = path.choice == cuda::Fp8LinearChoice::kStream ||
                              path.choice == cuda::Fp8LinearChoice::kStreamPdl;
          const cuda::Fp8StreamConfig c =
              cuda::choose_fp8_stream({m, s.n, s.k, s.groups, 128, 128, 128}, cuda_be.num_sms());
          const std::string tiling =
              stream ? " warps=" + std::to_string(c.warps) + " splits=" + std::to_string(c.splits)
                     : std::string();
          const double us = time_graph_us(be, iters, call);
          // The path the last call took: a weight-stream row past the stream's tokens is the
          // legacy path's.
          const char* took =
              cuda_be.last_fp8_linear_path() == cuda::Fp8LinearPath::kWgmma      ? " took=wgmma"
              : cuda_be.last_fp8_linear_path() == cuda::Fp8LinearPath::kCublasLt ? " took=cublaslt"
              : cuda_be.last_fp8_linear_path() == cuda::Fp8LinearPath::kGemv     ? " took=gemv"
                                                                                 : "";
          const std::string lt_algo =
              cuda_be.last_fp8_linear_path() == cuda::Fp8LinearPath::kCublasLt
                  ? " [" + cuda_be.last_cublaslt_algo() + "]"
                  : std::string();
          emit_ratio(std::string("linear_fp8_") + s.name + path.tag,
                     "M=" + std::to_string(m) + " " + dims + tiling + took + lt_algo +
                         " (graph, weight GB/s vs memcpy)",
                     us, wbytes, fl, wbytes / us / 1e3 / copy_gbps);
        }
        cuda_be.set_fp8_wgmma_math(own_math);
        cuda_be.set_fp8_linear(own);
        cuda_be.set_cublaslt_tune(own_tune);
      } else {
        const double us = time_us(be, m >= 16384 ? 3 : 5, call);
        const char* path = cuda_be.last_fp8_linear_path() == cuda::Fp8LinearPath::kCublasLt
                               ? "cublaslt"
                           : cuda_be.last_fp8_linear_path() == cuda::Fp8LinearPath::kDequant
                               ? "dequantized to bf16"
                               : "other";
        emit_ratio(
            std::string("linear_fp8_") + s.name,
            "M=" + std::to_string(m) + " " + dims + " " + path + " (TFLOP/s vs cuBLASLt fp8 peak)",
            us, wbytes, fl, fp8_peak > 0 ? fl / us / 1e6 / fp8_peak : 0.0);
      }
    }
  }
}

namespace {

// Random bytes on the device, each (LCG byte & mask) | bits (a fast LCG on the host: the values
// only need to be varied).
Tensor random_device_bytes(Backend& be, const Shape& shape, DType dtype, uint64_t seed,
                           uint8_t mask, uint8_t bits) {
  Tensor h = Tensor::zeros(shape, dtype);
  auto* p = static_cast<uint8_t*>(h.raw_data());
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (size_t i = 0; i < h.nbytes(); ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    p[i] = static_cast<uint8_t>(((x >> 56) & mask) | bits);
  }
  return be.upload_weight(h, dtype);
}

// The kernel the latest quantized moe_experts pass of `be` ran (cuda/moe/moe_heuristics.h; the
// backend's DEEPINFER_MOE_QUANT_DECODE picks streaming, registers or prefill for the decode shape).
const char* quant_experts_kernel_ran(Backend& be) {
  auto* cuda_be = dynamic_cast<cuda::CudaBackend*>(&be);
  return cuda_be == nullptr ? "?" : cuda::experts_kernel_name(cuda_be->last_quant_experts_kernel());
}

// Runs `body` once per decode kernel to compare: under the default choice (auto) or "streaming",
// the streaming kernel with suffix "" and its lean variant with suffix " streaming_lean" (auto
// takes the lean one for MXFP4 and the other for FP8); under another DEEPINFER_MOE_QUANT_DECODE,
// that choice alone (suffix " streaming_lean" for the lean one). Restores the choice. Other
// backends run it once.
template <class Body>
void for_each_decode_kernel(Backend& be, const Body& body) {
  auto* cuda_be = dynamic_cast<cuda::CudaBackend*>(&be);
  if (cuda_be == nullptr) {
    body("");
    return;
  }
  const cuda::QuantDecodeChoice configured = cuda_be->moe_quant_decode();
  if (configured != cuda::QuantDecodeChoice::kStreaming &&
      configured != cuda::QuantDecodeChoice::kAuto) {
    body(configured == cuda::QuantDecodeChoice::kStreamingLean ? " streaming_lean" : "");
    return;
  }
  cuda_be->set_moe_quant_decode(cuda::QuantDecodeChoice::kStreaming);
  body("");
  cuda_be->set_moe_quant_decode(cuda::QuantDecodeChoice::kStreamingLean);
  body(" streaming_lean");
  cuda_be->set_moe_quant_decode(configured);
}

// Runs `body` once per prefill kernel of the quantized experts (DEEPINFER_MOE_QUANT_PREFILL:
// mma_sync, then wgmma where it runs), passing the name of the kernel the backend takes; restores
// the backend's choice. Other backends run it once.
template <class Body>
void for_each_prefill_kernel(Backend& be, const Body& body) {
  auto* cuda_be = dynamic_cast<cuda::CudaBackend*>(&be);
  if (cuda_be == nullptr) {
    body("?");
    return;
  }
  const cuda::QuantPrefillChoice configured = cuda_be->moe_quant_prefill();
  for (const cuda::QuantPrefillChoice c :
       {cuda::QuantPrefillChoice::kMmaSync, cuda::QuantPrefillChoice::kWgmma}) {
    if (c == cuda::QuantPrefillChoice::kWgmma && !cuda_be->wgmma_device()) continue;
    cuda_be->set_moe_quant_prefill(c);
    body(c == cuda::QuantPrefillChoice::kWgmma ? "prefill_wgmma" : "prefill");
  }
  cuda_be->set_moe_quant_prefill(configured);
}

// The routed experts on MXFP4 weights at V4-Flash shapes (E 256, top-6, H 4096, I 2048; act
// groups of 32 as DeepSeek's W4A8 experts): GB/s of the weight bytes touched (values + scales,
// 13.4 MB per expert) at 1, 4 and 16 pairs per expert (every expert exactly that many: tokens
// ceil(256 m / 6), the slots past 256 m dropped by an out-of-range id), and TFLOP/s at 4096 and
// 16384 tokens (experts evenly loaded), next to the copy roofline.
}  // namespace

void bench_moe_experts_mxfp4(Backend& be, int iters) {
  const int e = 256, inter = 2048, h = 4096, kk = 6;
  const double copy_gbps = copy_roofline_gbps(be, kCopyRooflineBytes);
  std::printf("{\"op\": \"roofline_copy(copy_into)\", \"shape\": \"2GiB f32\", \"GBps\": %.1f}\n",
              copy_gbps);
  // One pool per matrix kind; experts are row ranges of it. Scale bytes 116..119: weights of
  // magnitude ~2^-12 .. 2^-5.
  Tensor gu_v =
      random_device_bytes(be, {int64_t{e} * 2 * inter, h / 2}, DType::kE2M1x2, 1, 0xff, 0);
  Tensor gu_s = random_device_bytes(be, {int64_t{e} * 2 * inter, h / 32}, DType::kE8M0, 2, 3, 116);
  Tensor dn_v = random_device_bytes(be, {int64_t{e} * h, inter / 2}, DType::kE2M1x2, 3, 0xff, 0);
  Tensor dn_s = random_device_bytes(be, {int64_t{e} * h, inter / 32}, DType::kE8M0, 4, 3, 116);
  auto mx = [](Tensor v, Tensor s) {
    MatrixWeight w;
    w.values = std::move(v);
    w.scales = std::move(s);
    w.format = WeightFormat::kMxfp4;
    w.block_rows = 1;
    w.block_cols = 32;
    w.act_group = 32;
    return w;
  };
  ExpertWeights ex;
  for (int j = 0; j < e; ++j) {
    const int64_t r = int64_t{j} * 2 * inter;
    ex.w1.push_back(mx(gu_v.narrow(0, r, inter), gu_s.narrow(0, r, inter)));
    ex.w3.push_back(mx(gu_v.narrow(0, r + inter, inter), gu_s.narrow(0, r + inter, inter)));
    ex.w2.push_back(mx(dn_v.narrow(0, int64_t{j} * h, h), dn_s.narrow(0, int64_t{j} * h, h)));
  }
  const double expert_bytes = 3.0 * inter * h * (0.5 + 1.0 / 32);
  auto run = [&](int tokens, int64_t valid, bool graph) {
    std::vector<int32_t> ids;
    std::vector<float> wts;
    for (int64_t p = 0; p < int64_t{tokens} * kk; ++p) {
      ids.push_back(p < valid ? static_cast<int32_t>(p % e) : -1);  // p % e: distinct per token
      wts.push_back(0.25f);
    }
    Tensor x = rnd(be, {tokens, h}, DType::kF32, 43);
    Routing r{be.upload(Tensor::from_vector(ids, {tokens, kk}), DType::kI32),
              be.upload(Tensor::from_vector(wts, {tokens, kk}), DType::kF32)};
    const int n = tokens >= 1024 ? std::min(iters, 10) : iters;
    auto fn = [&] { (void)be.moe_experts(x, r, ex, 10.0f); };
    return graph ? time_graph_us(be, n, fn) : time_us(be, n, fn);
  };
  for_each_decode_kernel(be, [&](const char* suffix) {
    for (int m : {1, 4, 16}) {
      const int tokens = (e * m + kk - 1) / kk;
      const double us = run(tokens, int64_t{e} * m, true);
      const double bytes = e * expert_bytes;
      emit("moe_experts_mxfp4(graph)",
           std::to_string(m) + " pairs/expert T=" + std::to_string(tokens) +
               " k=6 E=256 I=2048 H=4096 act32" + suffix,
           us, bytes, static_cast<double>(e) * m * 3.0 * 2 * inter * h);
      std::printf(
          "{\"op\": \"moe_experts_mxfp4_vs_copy\", \"decode_kernel\": \"%s\", "
          "\"pairs_per_expert\": %d, \"fraction_of_copy_GBps\": %.3f}\n",
          quant_experts_kernel_ran(be), m, bytes / us / 1e3 / copy_gbps);
    }
  });
  for (int tokens : {4096, 16384}) {
    for_each_prefill_kernel(be, [&](const char* kernel) {
      const double us = run(tokens, int64_t{tokens} * kk, false);
      emit("moe_experts_mxfp4",
           "T=" + std::to_string(tokens) + " k=6 E=256 I=2048 H=4096 act32 " + kernel, us,
           e * expert_bytes * ((tokens + 4095) / 4096),
           static_cast<double>(tokens) * kk * 3.0 * 2 * inter * h);
    });
  }
}

// The routed experts on FP8 weights (e4m3, 128 x 128 f32 block scales, activations quantized per
// 128) at V4-Flash shapes: GB/s of the weight bytes touched (values + scales, 25.2 MB per
// expert) at 1, 4 and 16 pairs per expert, as the MXFP4 cases, and TFLOP/s at 4096 and 16384
// tokens on each prefill kernel.
void bench_moe_experts_fp8(Backend& be, int iters) {
  const int e = 256, inter = 2048, h = 4096, kk = 6, blk = 128;
  const double copy_gbps = copy_roofline_gbps(be, kCopyRooflineBytes);
  // e4m3 bytes with exponent fields <= 7 (no NaN), block scales 2^-6.
  Tensor gu_v = random_device_bytes(be, {int64_t{e} * 2 * inter, h}, DType::kF8E4M3, 5, 0xbf, 0);
  Tensor dn_v = random_device_bytes(be, {int64_t{e} * h, inter}, DType::kF8E4M3, 6, 0xbf, 0);
  auto scales = [&](int64_t rows, int64_t cols) {
    const int64_t n = rows / blk * (cols / blk);
    return be.upload_weight(
        Tensor::from_vector(std::vector<float>(static_cast<size_t>(n), 1.0f / 64),
                            {rows / blk, cols / blk}),
        DType::kF32);
  };
  Tensor gu_s = scales(int64_t{e} * 2 * inter, h);
  Tensor dn_s = scales(int64_t{e} * h, inter);
  auto fp8 = [blk](Tensor v, Tensor s) {
    MatrixWeight w;
    w.values = std::move(v);
    w.scales = std::move(s);
    w.format = WeightFormat::kFp8Block;
    w.block_rows = blk;
    w.block_cols = blk;
    w.act_group = blk;
    return w;
  };
  ExpertWeights ex;
  const int64_t gb = inter / blk, db = h / blk;  // scale rows per expert matrix
  for (int j = 0; j < e; ++j) {
    const int64_t r = int64_t{j} * 2 * inter;
    ex.w1.push_back(fp8(gu_v.narrow(0, r, inter), gu_s.narrow(0, 2 * j * gb, gb)));
    ex.w3.push_back(fp8(gu_v.narrow(0, r + inter, inter), gu_s.narrow(0, (2 * j + 1) * gb, gb)));
    ex.w2.push_back(fp8(dn_v.narrow(0, int64_t{j} * h, h), dn_s.narrow(0, j * db, db)));
  }
  const double expert_bytes = 3.0 * inter * h * (1.0 + 4.0 / (blk * blk));
  for_each_decode_kernel(be, [&](const char* suffix) {
    for (int m : {1, 4, 16}) {
      const int tokens = (e * m + kk - 1) / kk;
      std::vector<int32_t> ids;
      std::vector<float> wts;
      for (int64_t p = 0; p < int64_t{tokens} * kk; ++p) {
        ids.push_back(p < int64_t{e} * m ? static_cast<int32_t>(p % e) : -1);
        wts.push_back(0.25f);
      }
      Tensor x = rnd(be, {tokens, h}, DType::kF32, 44);
      Routing r{be.upload(Tensor::from_vector(ids, {tokens, kk}), DType::kI32),
                be.upload(Tensor::from_vector(wts, {tokens, kk}), DType::kF32)};
      const double us = time_graph_us(be, iters, [&] { (void)be.moe_experts(x, r, ex, 10.0f); });
      const double bytes = e * expert_bytes;
      emit("moe_experts_fp8(graph)",
           std::to_string(m) + " pairs/expert T=" + std::to_string(tokens) +
               " k=6 E=256 I=2048 H=4096 blk128 act128" + suffix,
           us, bytes, static_cast<double>(e) * m * 3.0 * 2 * inter * h);
      std::printf(
          "{\"op\": \"moe_experts_fp8_vs_copy\", \"decode_kernel\": \"%s\", "
          "\"pairs_per_expert\": %d, \"fraction_of_copy_GBps\": %.3f}\n",
          quant_experts_kernel_ran(be), m, bytes / us / 1e3 / copy_gbps);
    }
  });
  // Prefill: TFLOP/s at 4096 and 16384 tokens (experts evenly loaded), on each prefill kernel.
  for (int tokens : {4096, 16384}) {
    std::vector<int32_t> ids;
    std::vector<float> wts;
    for (int64_t p = 0; p < int64_t{tokens} * kk; ++p) {
      ids.push_back(static_cast<int32_t>(p % e));
      wts.push_back(0.25f);
    }
    Tensor x = rnd(be, {tokens, h}, DType::kF32, 45);
    Routing r{be.upload(Tensor::from_vector(ids, {tokens, kk}), DType::kI32),
              be.upload(Tensor::from_vector(wts, {tokens, kk}), DType::kF32)};
    for_each_prefill_kernel(be, [&](const char* kernel) {
      const double us =
          time_us(be, std::min(iters, 10), [&] { (void)be.moe_experts(x, r, ex, 10.0f); });
      emit("moe_experts_fp8",
           "T=" + std::to_string(tokens) + " k=6 E=256 I=2048 H=4096 blk128 act128 " + kernel, us,
           e * expert_bytes * ((tokens + 4095) / 4096),
           static_cast<double>(tokens) * kk * 3.0 * 2 * inter * h);
    });
  }
}

}  // namespace deepinfer::bench
