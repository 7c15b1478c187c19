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

#include <cstdint>
#include <random>
#include <string>

#include "cuda/backend/cuda_backend.h"
#include "cuda/gemm/gemm_fp8_heuristics.h"
#include "deepinfer/backend.h"
#include "deepinfer/weight.h"
#include "device_backends.h"
#include "inputs.h"

namespace deepinfer::backend_ops {
namespace {

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

TEST(Fp8CublasLt, TakesEveryTokenCountAboveTheDecodeKernels) {
  std::string why;
  Backend* be = shared_backend("cuda", &why);
  if (be == nullptr) {
    if (device_required()) FAIL() << why;
    GTEST_SKIP() << why;
  }
  auto& cuda_be = dynamic_cast<cuda::CudaBackend&>(*be);
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

}  // namespace
}  // namespace deepinfer::backend_ops
