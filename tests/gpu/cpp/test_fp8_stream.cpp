// The streaming FP8 linear (cuda/gemm/fp8_stream.cu, opt-in: DEEPINFER_FP8_LINEAR=stream
// or stream_pdl) at decode batch sizes: the same bytes on a second run and as a programmatic
// dependent launch, and a token's row does not depend on the other tokens of the batch (its K
// splits are chosen without M, and the 16- and 64-token tiles reduce every output in the same
// order), at tilings of 2, 4 and 8 warps, grouped and with ragged N and K. Agreement with the CPU
// reference is the op table's (tests/backend_ops/cases_gemm.cpp). Skips without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "compare.h"
#include "deepinfer/backend.h"
#include "deepinfer/weight.h"
#include "device_backends.h"
#include "inputs.h"
#include "scoped_env.h"

namespace deepinfer::backend_ops {
namespace {

// A CUDA backend created with DEEPINFER_FP8_LINEAR set to `path`.
std::unique_ptr<Backend> cuda_backend_with_path(const char* path) {
  const ScopedEnv env("DEEPINFER_FP8_LINEAR", path);
  return make_backend("cuda");
}

TEST(Fp8Stream, DeterministicPerTokenAndSameAsDependentLaunch) {
  std::string why;
  if (shared_backend("cuda", &why) == nullptr) {
    if (device_required()) FAIL() << why;
    GTEST_SKIP() << why;
  }
  std::unique_ptr<Backend> stream = cuda_backend_with_path("stream");
  std::unique_ptr<Backend> pdl = cuda_backend_with_path("stream_pdl");
  constexpr int64_t kTokens = 64;
  struct Shape2 {
    int64_t n, k;
    int groups;  // 0: linear
    int block;
  };
  std::mt19937 rng(20251202);
  // wq_a (2 warps, 8 splits), wo_b (4 warps), wo_a (8 warps, grouped), ragged N and K (32x32
  // blocks: 9 slices in 5 splits), one partial slice.
  for (const Shape2& s :
       {Shape2{1024, 4096, 0, 128}, Shape2{4096, 8192, 0, 128}, Shape2{1024, 4096, 8, 128},
        Shape2{300, 1040, 0, 32}, Shape2{200, 48, 2, 16}}) {
    const int g = s.groups ? s.groups : 1;
    const MatrixWeight host = random_fp8_block_weight(rng, g * s.n, s.k, s.block, s.block);
    const Tensor x = random_f32(rng, {kTokens, g * s.k});
    const auto run = [&](Backend& be, int64_t m) {
      const MatrixWeight w = be.upload_matrix_weight(host);
      const Tensor xm = be.upload(x.narrow(0, 0, m), DType::kF32);
      return be.to_host(s.groups ? be.grouped_linear(xm, w, s.groups) : be.linear(xm, w));
    };
    const std::string what = "n " + std::to_string(s.n) + " k " + std::to_string(s.k) + " groups " +
                             std::to_string(s.groups);
    const Tensor first = run(*stream, kTokens);
    EXPECT_TRUE(same_bytes(first, run(*stream, kTokens))) << what << ": two runs differ";
    EXPECT_TRUE(same_bytes(first, run(*pdl, kTokens))) << what << ": stream_pdl differs";
    for (const int64_t m : {1, 8, 9, 16, 17, 33}) {
      const Tensor few = run(*stream, m);
      EXPECT_EQ(std::memcmp(first.raw_data(), few.raw_data(), few.nbytes()), 0)
          << what << ": the first " << m << " tokens differ when run alone";
    }
  }
}

}  // namespace
}  // namespace deepinfer::backend_ops
