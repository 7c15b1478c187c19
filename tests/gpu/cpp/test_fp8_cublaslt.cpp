// Block-scaled FP8 linears above the GEMV's token counts take cuBLASLt's W8A8 GEMM at every token
// count: its heuristic finds no algorithm unless M is a multiple of 4, and such a call fell back
// to dequantizing the whole weight to bf16 (the agent trace's prefill suffixes have any length;
// with the fix its rate went from 15.9x to 18.7x of uncached on the H200). gemm_fp8.cu pads M to
// a multiple of 4. Agreement with the CPU reference is the op table's
// (tests/backend_ops/cases_gemm.cpp: rows at 17, 33 and 65 tokens). Where the weight stream takes
// a call instead (gemm_fp8_heuristics.h: choose_fp8_wgmma; by default, past 16 tokens, grouped
// linears and linears of at most 1536 rows on its f16 math, to 64 tokens) it does, and a grouped
// linear (wo_a) with 17..kFp8StreamMaxTokens tokens that the stream does not take takes the
// streaming kernel (fp8_grouped_takes_stream; cuBLASLt runs one GEMM per group). Skips without a
// GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/backend/cuda_backend.h"
#include "cuda/gemm/gemm_fp8_heuristics.h"
#include "cuda_test.h"
#include "deepinfer/backend.h"
#include "deepinfer/weight.h"
#include "inputs.h"

namespace deepinfer::backend_ops {
namespace {

// The shared CUDA backend (CudaTest: skipped without a GPU, failed where the device is required).
class Fp8CublasLt : public CudaTest {};

const char* path_name(cuda::Fp8LinearPath p) {
  switch (p) {
    case cuda::Fp8LinearPath::kNone:
      return "none";
    case cuda::Fp8LinearPath::kStream:
      return "stream";
    case cuda::Fp8LinearPath::kWgmma:
      return "wgmma";
    case cuda::Fp8LinearPath::kGemv:
      return "gemv";
    case cuda::Fp8LinearPath::kCublasLt:
      return "cublaslt";
    case cuda::Fp8LinearPath::kDequant:
      return "dequant";
  }
  return "?";
}

TEST_F(Fp8CublasLt, TakesEveryTokenCountAboveTheDecodeKernels) {
  Backend* be = &gpu();
  auto& cuda_be = dynamic_cast<cuda::CudaBackend&>(gpu());
  std::mt19937 rng(20261202);
  // wq_a-like (linear), shared-w13-like (a linear past the f16 math's rows: cuBLASLt from 17
  // tokens) and wo_a-like (8 groups).
  struct Shape2 {
    int64_t n, k;
    int groups;  // 0: linear
  };
  for (const Shape2& s : {Shape2{1024, 4096, 0}, Shape2{2048, 4096, 0}, Shape2{1024, 4096, 8}}) {
    const int g = s.groups ? s.groups : 1;
    const MatrixWeight w =
        be->upload_matrix_weight(random_fp8_block_weight(rng, g * s.n, s.k, 128, 128));
    for (const int64_t m : {17, 18, 19, 33, 64, 65, 127, 1387}) {
      const Tensor x = be->upload(random_f32(rng, {m, g * s.k}), DType::kF32);
      const Tensor y = s.groups ? be->grouped_linear(x, w, s.groups) : be->linear(x, w);
      be->synchronize();
      EXPECT_EQ(y.size(0), m);
      EXPECT_EQ(y.size(1), g * s.n);
      // The weight stream where the backend's choices take it (an sm_90a device), else grouped
      // linears up to kFp8StreamMaxTokens tokens the streaming kernel.
      const cuda::Fp8Problem p{m, s.n, s.k, g, 128, 128, 128};
      const bool wgmma =
          cuda_be.wgmma_device() && cuda::fp8_choice_tries_wgmma(cuda_be.fp8_linear(), m) &&
          cuda::choose_fp8_wgmma(p, cuda_be.num_sms(), true, cuda_be.fp8_wgmma_math()).use;
      const bool grouped_decode = s.groups > 0 && m <= cuda::kFp8StreamMaxTokens;
      EXPECT_EQ(cuda_be.last_fp8_linear_path(), wgmma            ? cuda::Fp8LinearPath::kWgmma
                                                : grouped_decode ? cuda::Fp8LinearPath::kStream
                                                                 : cuda::Fp8LinearPath::kCublasLt)
          << "m " << m << " groups " << s.groups << ": took "
          << path_name(cuda_be.last_fp8_linear_path());
    }
  }
}

// At decode widths cuBLASLt takes the algorithm timed fastest on the shape's first call
// (DEEPINFER_FP8_CUBLASLT_TUNE, fp8_linear_choice.h): the candidates differ in tiles and K splits,
// so its result may differ from the heuristic pick's in f32 summation order only; later calls keep
// the same algorithm, so they repeat the first tuned call's bytes.
TEST_F(Fp8CublasLt, TunedAlgorithmSumsLikeTheHeuristicsPick) {
  Backend* be = &gpu();
  auto& cuda_be = dynamic_cast<cuda::CudaBackend&>(gpu());
  const cuda::Fp8LinearChoice own = cuda_be.fp8_linear();
  const bool own_tune = cuda_be.cublaslt_tune();
  cuda_be.set_fp8_linear(cuda::Fp8LinearChoice::kLegacy);
  std::mt19937 rng(20261207);
  // shared-w13-like and wo_b-like: K of 32 and 64 blocks, where the timed K splits apply.
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{2048, 4096}, {4096, 8192}}) {
    const MatrixWeight w = be->upload_matrix_weight(random_fp8_block_weight(rng, n, k, 128, 128));
    for (const int64_t m : {33, 64}) {
      const Tensor x = be->upload(random_f32(rng, {m, k}), DType::kF32);
      const auto run = [&](bool tune) {
        cuda_be.set_cublaslt_tune(tune);
        const Tensor y = be->to_host(be->linear(x, w));
        EXPECT_EQ(cuda_be.last_fp8_linear_path(), cuda::Fp8LinearPath::kCublasLt)
            << "n " << n << " m " << m;
        return std::vector<float>(y.data<float>(), y.data<float>() + y.numel());
      };
      const std::vector<float> pick = run(false);
      const std::vector<float> tuned = run(true);
      const std::string tuned_algo = cuda_be.last_cublaslt_algo();
      const std::vector<float> again = run(true);
      EXPECT_EQ(cuda_be.last_cublaslt_algo(), tuned_algo) << "n " << n << " m " << m;
      EXPECT_EQ(again, tuned) << "n " << n << " m " << m << ": the kept algorithm changed";
      float largest = 0.0f, diff = 0.0f;
      for (size_t i = 0; i < pick.size(); ++i) {
        largest = std::max(largest, std::fabs(pick[i]));
        diff = std::max(diff, std::fabs(pick[i] - tuned[i]));
      }
      EXPECT_LE(diff, 1e-5f * largest)
          << "n " << n << " m " << m << " tuned " << tuned_algo << ": max |tuned - pick| " << diff
          << " of max |y| " << largest;
    }
  }
  cuda_be.set_cublaslt_tune(own_tune);
  cuda_be.set_fp8_linear(own);
}

}  // namespace
}  // namespace deepinfer::backend_ops
