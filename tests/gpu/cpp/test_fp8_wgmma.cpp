// The Hopper weight stream of FP8 linears (cuda/gemm/sm90/fp8_wgmma.cu, DEEPINFER_FP8_LINEAR=wgmma)
// at decode batch sizes, on each of its maths (DEEPINFER_FP8_WGMMA_MATH: mma_sync, f16): linear,
// grouped_linear and linear_pair take it where choose_fp8_wgmma applies; the same bytes on a
// second run; a token's row does not depend on the other tokens of the batch (the K split is
// chosen without M, and the 8-, 16-, 32- and 64-token tiles add every output in the same order,
// whether the kernel quantizes x itself or a launch before it does); it agrees with the legacy
// paths (the GEMV to f32 summation order, the streaming kernel and cuBLASLt within the FP8
// tolerance) and the two maths with each other to f32 summation order. Agreement with the CPU
// reference is the op table's run with DEEPINFER_FP8_LINEAR=wgmma (tests/backend_ops/
// cases_gemm.cpp). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>

#include "compare.h"
#include "cuda/backend/cuda_backend.h"
#include "cuda/gemm/gemm_fp8_heuristics.h"
#include "deepinfer/backend.h"
#include "deepinfer/weight.h"
#include "device_backends.h"
#include "inputs.h"
#include "scoped_env.h"

namespace deepinfer::backend_ops {
namespace {

// The largest |a - b| over the largest |b|.
double relative_max_error(const Tensor& a, const Tensor& b) {
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  double err = 0.0, ref = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(pa[i]) - pb[i]));
    ref = std::max(ref, std::fabs(static_cast<double>(pb[i])));
  }
  return ref > 0 ? err / ref : err;
}

const char* math_name(cuda::Fp8WgmmaMath math) {
  return math == cuda::Fp8WgmmaMath::kF16 ? "f16" : "mma_sync";
}

// Tests on a CUDA backend created with DEEPINFER_FP8_LINEAR=wgmma and the parameter's math
// (own_), skipped where none can run the weight stream (a missing device fails under
// DEEPINFER_REQUIRE_DEVICE).
class Fp8Wgmma : public ::testing::TestWithParam<cuda::Fp8WgmmaMath> {
 protected:
  void SetUp() override {
    std::string why;
    Backend* shared = shared_backend("cuda", &why);
    if (shared == nullptr) {
      if (device_required()) FAIL() << why;
      GTEST_SKIP() << why;
    }
    if (!dynamic_cast<cuda::CudaBackend&>(*shared).wgmma_device()) {
      GTEST_SKIP() << "no wgmma on this device or build (sm_90a code on an sm_90 device)";
    }
    const ScopedEnv env("DEEPINFER_FP8_LINEAR", "wgmma");
    {
      const ScopedEnv math("DEEPINFER_FP8_WGMMA_MATH", math_name(GetParam()));
      own_ = make_backend("cuda");
    }
    const ScopedEnv math("DEEPINFER_FP8_WGMMA_MATH", math_name(other_math()));
    other_ = make_backend("cuda");
  }
  cuda::Fp8WgmmaMath other_math() const {
    return GetParam() == cuda::Fp8WgmmaMath::kF16 ? cuda::Fp8WgmmaMath::kMmaSync
                                                  : cuda::Fp8WgmmaMath::kF16;
  }
  // The most tokens a call of `groups` groups (0: linear) takes the stream for on `math`.
  static int64_t max_tokens(cuda::Fp8WgmmaMath math, int groups) {
    if (math == cuda::Fp8WgmmaMath::kF16) return cuda::kFp8WgmmaF16MaxTokens;
    return groups ? cuda::kFp8WgmmaGroupedMaxTokens : cuda::kFp8WgmmaMaxTokens;
  }
  std::unique_ptr<Backend> other_;  // the other math
  std::unique_ptr<Backend> own_;
};

TEST_P(Fp8Wgmma, DeterministicPerTokenAndCloseToTheLegacyPaths) {
  Backend& own = *own_;
  std::unique_ptr<Backend> legacy;
  {
    const ScopedEnv env("DEEPINFER_FP8_LINEAR", "legacy");
    legacy = make_backend("cuda");
  }
  auto& cuda_be = dynamic_cast<cuda::CudaBackend&>(own);
  struct Shape2 {
    int64_t n, k;
    int groups;  // 0: linear
  };
  std::mt19937 rng(20261206);
  // wq_a (8 splits of 4 blocks), wq_b (one split), wo_b (8 splits), wo_a (grouped, 4 splits),
  // ragged N and K (K 1040: 9 blocks, the last partial), a single partial block (K 48), grouped
  // with a ragged last block.
  for (const Shape2& s :
       {Shape2{1024, 4096, 0}, Shape2{32768, 1024, 0}, Shape2{4096, 8192, 0}, Shape2{1024, 4096, 8},
        Shape2{300, 1040, 0}, Shape2{200, 48, 0}, Shape2{128, 1040, 3}}) {
    const int g = s.groups ? s.groups : 1;
    const int64_t tokens = max_tokens(GetParam(), s.groups);
    const MatrixWeight host = random_fp8_block_weight(rng, g * s.n, s.k, 128, 128);
    const Tensor x = random_f32(rng, {tokens, g * s.k});
    const MatrixWeight w = own.upload_matrix_weight(host);
    const MatrixWeight w_legacy = legacy->upload_matrix_weight(host);
    const MatrixWeight w_other = other_->upload_matrix_weight(host);
    const auto run = [&](Backend& be, const MatrixWeight& wb, int64_t m) {
      const Tensor xm = be.upload(x.narrow(0, 0, m), DType::kF32);
      return be.to_host(s.groups ? be.grouped_linear(xm, wb, s.groups) : be.linear(xm, wb));
    };
    const std::string what = "n " + std::to_string(s.n) + " k " + std::to_string(s.k) + " groups " +
                             std::to_string(s.groups);
    const Tensor first = run(own, w, tokens);
    EXPECT_EQ(cuda_be.last_fp8_linear_path(), cuda::Fp8LinearPath::kWgmma) << what;
    EXPECT_TRUE(same_bytes(first, run(own, w, tokens))) << what << ": two runs differ";
    for (const int64_t m : {1, 2, 4, 7, 8, 9, 16, 17, 33}) {
      if (m > tokens) continue;
      const Tensor few = run(own, w, m);
      EXPECT_EQ(cuda_be.last_fp8_linear_path(), cuda::Fp8LinearPath::kWgmma) << what << " m " << m;
      EXPECT_EQ(std::memcmp(first.raw_data(), few.raw_data(), few.nbytes()), 0)
          << what << ": the first " << m << " tokens differ when run alone";
    }
    // The legacy paths: the GEMV (up to 16 tokens) sums the same exact products in f32, so the
    // two differ by summation order (the first version's FP8 wgmma sums were 5.7e-4 off, enough
    // to flip the real-format model test's top-k); a grouped linear's 64 tokens, and a linear's
    // past 16, take the streaming kernel or cuBLASLt there (whose FP8 wgmma sums keep fewer
    // bits): the op table's FP8 tolerance.
    const bool gemv = !s.groups && tokens <= cuda::kFp8GemvMaxTokens;
    const double err = relative_max_error(first, run(*legacy, w_legacy, tokens));
    EXPECT_LT(err, gemv ? 1e-5 : 1e-3) << what;
    // The other math, where it takes the stream too: the same exact products, summed in f32.
    for (const int64_t m : {int64_t{1}, int64_t{9}, tokens}) {
      if (m > max_tokens(other_math(), s.groups)) continue;
      const Tensor mine = run(own, w, m);
      const Tensor theirs = run(*other_, w_other, m);
      EXPECT_EQ(dynamic_cast<cuda::CudaBackend&>(*other_).last_fp8_linear_path(),
                cuda::Fp8LinearPath::kWgmma)
          << what << " m " << m;
      EXPECT_LT(relative_max_error(mine, theirs), 1e-5) << what << " m " << m;
    }
  }
}

TEST_P(Fp8Wgmma, LinearPairTakesOneLaunchOfTwoWeights) {
  Backend* be = own_.get();
  auto& cuda_be = dynamic_cast<cuda::CudaBackend&>(*be);
  std::mt19937 rng(20261207);
  // wq_a with wkv (whole tiles), and a first weight of 300 rows (its last tile partial).
  for (const auto& [na, nb] : {std::pair<int64_t, int64_t>{1024, 512}, {300, 200}}) {
    const int64_t k = 1040;
    const MatrixWeight a = be->upload_matrix_weight(random_fp8_block_weight(rng, na, k, 128, 128));
    const MatrixWeight b = be->upload_matrix_weight(random_fp8_block_weight(rng, nb, k, 128, 128));
    const Tensor x = be->upload(random_f32(rng, {5, k}), DType::kF32);
    auto [ya, yb] = be->linear_pair(x, a, b);
    EXPECT_EQ(cuda_be.last_fp8_linear_path(), cuda::Fp8LinearPath::kWgmma) << na << " + " << nb;
    const Tensor single_a = be->to_host(be->linear(x, a));
    const Tensor single_b = be->to_host(be->linear(x, b));
    EXPECT_LT(relative_max_error(be->to_host(ya), single_a), 1e-5) << na << " + " << nb;
    EXPECT_LT(relative_max_error(be->to_host(yb), single_b), 1e-5) << na << " + " << nb;
  }
}

INSTANTIATE_TEST_SUITE_P(Maths, Fp8Wgmma,
                         ::testing::Values(cuda::Fp8WgmmaMath::kMmaSync, cuda::Fp8WgmmaMath::kF16),
                         [](const ::testing::TestParamInfo<cuda::Fp8WgmmaMath>& param) {
                           return std::string(math_name(param.param));
                         });

}  // namespace
}  // namespace deepinfer::backend_ops
