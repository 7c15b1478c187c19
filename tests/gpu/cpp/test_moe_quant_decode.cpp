// The decode-shape kernels of the quantized routed experts (cuda/moe/sm80/
// experts_quant_stream.cu, chosen by DEEPINFER_MOE_QUANT_DECODE=streaming and the default for
// FP8, its lean variant chosen by =streaming_lean and the default for MXFP4, and
// experts_quant.cu's register-prefetch kernel,
// chosen by =registers at backend creation) reduce every output element over K in the same order
// with the same decoded values, so moe_experts gives bit-identical results on all three where the
// streaming kernels do not split K (expert_stream_splits: passes with few CTAs for the SMs, such
// as one token, split it over a cluster; both streaming kernels then split alike and stay
// bit-identical to each other): at V4-Flash widths with 1, 4 and 16 pairs per expert (and one
// token, split, for the two streaming kernels), and on small shapes with K and N tails and
// without activation quantization (three bf16 planes; the lean variant falls back to the default
// kernel where K is not whole 128-input slices). Each case first checks, on the heuristic the
// backend calls (cuda/moe/moe_heuristics.h) with this device's shared memory, that the backends
// do take the kernels compared at its shape (not the 64-row prefill tiles for both). Their
// agreement with the CPU reference is the op table's (tests/backend_ops/cases_moe_quant.cpp; run
// it with DEEPINFER_MOE_QUANT_DECODE=streaming_lean for the lean variant). Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/moe/moe_heuristics.h"
#include "deepinfer/backend.h"
#include "deepinfer/weight.h"
#include "device_backends.h"
#include "inputs.h"
#include "moe_inputs.h"
#include "scoped_env.h"

namespace deepinfer::backend_ops {
namespace {

struct DecodeCase {
  WeightFormat format;
  int block;      // kFp8Block: square scale blocks
  int act_group;  // 0: no activation quantization
  int experts, top_k, hidden, inter, tokens;
  int mx_scale = 120;  // MXFP4: e8m0 scale bytes mx_scale - 1 .. mx_scale + 1 (> 128: two factors)
};

// A random [n, k] weight in `format`: random e2m1 bytes with e8m0 scales near 2^(mx_scale - 127),
// or e4m3 bytes (exponent fields 0..10, no NaN) with power-of-two block scales near 2^-6.
MatrixWeight random_weight(std::mt19937& rng, WeightFormat format, int64_t n, int64_t k, int block,
                           int act_group, int mx_scale) {
  MatrixWeight w;
  w.format = format;
  w.act_group = act_group;
  std::uniform_int_distribution<int> jitter(-1, 1);
  if (format == WeightFormat::kMxfp4) {
    w.block_rows = 1;
    w.block_cols = 32;
    w.values = random_bytes(rng, {n, k / 2}, DType::kE2M1x2);
    w.scales = Tensor::zeros({n, k / 32}, DType::kE8M0);
    auto* s = static_cast<uint8_t*>(w.scales.raw_data());
    for (int64_t i = 0; i < w.scales.numel(); ++i)
      s[i] = static_cast<uint8_t>(mx_scale + jitter(rng));
    return w;
  }
  w.block_rows = block;
  w.block_cols = block;
  w.values = random_bytes(rng, {n, k}, DType::kF8E4M3);
  auto* v = static_cast<uint8_t*>(w.values.raw_data());
  std::uniform_int_distribution<int> exponent(0, 10);
  for (int64_t i = 0; i < w.values.numel(); ++i) {
    v[i] = static_cast<uint8_t>((v[i] & 0x87) | (exponent(rng) << 3));
  }
  w.scales = Tensor::zeros(weight_scale_shape(n, k, block, block), DType::kF32);
  float* s = w.scales.data<float>();
  for (int64_t i = 0; i < w.scales.numel(); ++i) s[i] = std::ldexp(1.0f, -6 + jitter(rng));
  return w;
}

// A CUDA backend created with DEEPINFER_MOE_QUANT_DECODE set to `decode` ("" for unset).
std::unique_ptr<Backend> cuda_backend_with_decode(const char* decode) {
  const ScopedEnv env("DEEPINFER_MOE_QUANT_DECODE", decode);
  return make_backend("cuda");
}

// The kernel moe_experts takes for case `c` on the current device with decode choice `choice`.
cuda::ExpertsKernel chosen_kernel(const DecodeCase& c, cuda::QuantDecodeChoice choice) {
  int device = 0, smem = 0;
  EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
            cudaSuccess);
  cuda::ExpertsPassProblem p{
      int64_t{c.tokens} * c.top_k, c.experts, c.hidden, c.inter, false, true};
  p.quantized = true;
  p.mxfp4 = c.format == WeightFormat::kMxfp4;
  p.quant_decode = choice;
  return cuda::choose_experts_pass(p, static_cast<size_t>(smem)).kernel;
}

Tensor run_experts(Backend& be, const std::vector<MatrixWeight>& w1,
                   const std::vector<MatrixWeight>& w3, const std::vector<MatrixWeight>& w2,
                   const Tensor& x, const HostRouting& routing) {
  ExpertWeights w;
  for (size_t e = 0; e < w1.size(); ++e) {
    w.w1.push_back(be.upload_matrix_weight(w1[e]));
    w.w3.push_back(be.upload_matrix_weight(w3[e]));
    w.w2.push_back(be.upload_matrix_weight(w2[e]));
  }
  const Routing r{be.upload(routing.ids, DType::kI32), be.upload(routing.weights, DType::kF32)};
  return be.to_host(be.moe_experts(be.upload(x, DType::kF32), r, w, 10.0f));
}

// The elements of a and b that differ (both f32 of one shape), after checking that a is not all
// zeros.
int64_t differing_elements(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.nbytes(), b.nbytes());
  double norm = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) norm += std::fabs(a.item(i));
  EXPECT_GT(norm, 0.0) << "all-zero output";
  int64_t differ = 0;
  for (int64_t i = 0; i < a.numel(); ++i) differ += a.item(i) != b.item(i) ? 1 : 0;
  return differ;
}

// Runs every case on backends `a` and `b` (their decode choices `choice_a`, `choice_b`, checked to
// take kernels `kernel_a`, `kernel_b`) and expects bit-identical outputs.
void expect_bit_identical(Backend& a, cuda::QuantDecodeChoice choice_a,
                          cuda::ExpertsKernel kernel_a, Backend& b,
                          cuda::QuantDecodeChoice choice_b, cuda::ExpertsKernel kernel_b,
                          const std::vector<DecodeCase>& cases) {
  std::mt19937 rng(20261201);
  for (const DecodeCase& c : cases) {
    SCOPED_TRACE("format " + std::to_string(static_cast<int>(c.format)) + " act " +
                 std::to_string(c.act_group) + " H " + std::to_string(c.hidden) + " I " +
                 std::to_string(c.inter) + " T " + std::to_string(c.tokens));
    ASSERT_EQ(chosen_kernel(c, choice_a), kernel_a);
    ASSERT_EQ(chosen_kernel(c, choice_b), kernel_b);
    std::vector<MatrixWeight> w1, w3, w2;
    for (int e = 0; e < c.experts; ++e) {
      w1.push_back(
          random_weight(rng, c.format, c.inter, c.hidden, c.block, c.act_group, c.mx_scale));
      w3.push_back(
          random_weight(rng, c.format, c.inter, c.hidden, c.block, c.act_group, c.mx_scale));
      w2.push_back(
          random_weight(rng, c.format, c.hidden, c.inter, c.block, c.act_group, c.mx_scale));
    }
    const Tensor x = random_f32(rng, {c.tokens, c.hidden});
    const HostRouting routing = random_routing(c.tokens, c.experts, c.top_k, rng);
    const Tensor out_a = run_experts(a, w1, w3, w2, x, routing);
    const Tensor out_b = run_experts(b, w1, w3, w2, x, routing);
    EXPECT_EQ(differing_elements(out_a, out_b), 0)
        << "elements that differ between " << cuda::experts_kernel_name(kernel_a) << " and "
        << cuda::experts_kernel_name(kernel_b) << ", of " << out_a.numel();
  }
}

constexpr WeightFormat kMx = WeightFormat::kMxfp4, kFp8 = WeightFormat::kFp8Block;

TEST(MoeQuantDecode, StreamingAndRegisterKernelsAreBitIdentical) {
  std::string why;
  if (shared_backend("cuda", &why) == nullptr) {
    if (device_required()) FAIL() << why;
    GTEST_SKIP() << why;
  }
  std::unique_ptr<Backend> streaming = cuda_backend_with_decode("streaming");
  std::unique_ptr<Backend> registers = cuda_backend_with_decode("registers");
  // 16 experts, top-6: 3, 11 and 43 tokens are about 1, 4 and 16 pairs per expert (43: 258
  // pairs, the benchmark's ceil(16 E / 6) tokens, which the decode shape must still take).
  const std::vector<DecodeCase> cases = {
      {kMx, 32, 32, 16, 6, 4096, 2048, 3},     {kMx, 32, 32, 16, 6, 4096, 2048, 11},
      {kMx, 32, 32, 16, 6, 4096, 2048, 43},    {kFp8, 128, 128, 16, 6, 4096, 2048, 3},
      {kFp8, 128, 128, 16, 6, 4096, 2048, 42}, {kMx, 32, 0, 8, 2, 96, 352, 5},
      {kMx, 32, 32, 8, 2, 352, 96, 7},         {kFp8, 32, 0, 8, 2, 160, 96, 5},
      {kFp8, 16, 16, 8, 2, 64, 32, 1},
  };
  expect_bit_identical(
      *streaming, cuda::QuantDecodeChoice::kStreaming, cuda::ExpertsKernel::kQuantStream,
      *registers, cuda::QuantDecodeChoice::kRegisters, cuda::ExpertsKernel::kQuantDecode, cases);
}

// The lean streaming variant against the default one: MXFP4 (its own word decode) and FP8 at
// V4-Flash widths with 1, 4 and 16 pairs per expert, MXFP4 without activation quantization
// (three planes) at whole slices, with scales past 2^1 (multipliers of two factors), a K tail
// (H 352: the gate/up GEMM falls back to the default kernel, the down GEMM at I 256 takes the
// lean one), for MXFP4's operands read a slice ahead: an odd slice count (K 384) and a single
// slice (K 128); and one token, where both kernels split K (two splits at top-6 on 132 SMs, four
// at top-2). At most 8 tokens on one activation plane (here 1, 3 and 6) the lean one runs MXFP4
// on 8-row tiles and the narrow shape (expert_stream_narrow_tiles: 4-warp CTAs of 128 weight
// rows, which split K alike at these widths).
TEST(MoeQuantDecode, LeanStreamingKernelIsBitIdenticalToStreaming) {
  std::string why;
  if (shared_backend("cuda", &why) == nullptr) {
    if (device_required()) FAIL() << why;
    GTEST_SKIP() << why;
  }
  std::unique_ptr<Backend> streaming = cuda_backend_with_decode("streaming");
  std::unique_ptr<Backend> lean = cuda_backend_with_decode("streaming_lean");
  const std::vector<DecodeCase> cases = {
      {kMx, 32, 32, 16, 6, 4096, 2048, 3},     {kMx, 32, 32, 16, 6, 4096, 2048, 11},
      {kMx, 32, 32, 16, 6, 4096, 2048, 43},    {kFp8, 128, 128, 16, 6, 4096, 2048, 3},
      {kFp8, 128, 128, 16, 6, 4096, 2048, 11}, {kFp8, 128, 128, 16, 6, 4096, 2048, 43},
      {kMx, 32, 0, 8, 2, 256, 384, 5},         {kMx, 32, 32, 8, 2, 256, 384, 9, 128},
      {kMx, 32, 32, 8, 2, 352, 256, 7},        {kFp8, 128, 0, 8, 2, 256, 384, 9},
      {kMx, 32, 32, 8, 2, 128, 128, 6},        {kMx, 32, 32, 16, 6, 4096, 2048, 1},
      {kFp8, 128, 128, 16, 6, 4096, 2048, 1},  {kMx, 32, 0, 8, 2, 1024, 1024, 1},
  };
  expect_bit_identical(
      *lean, cuda::QuantDecodeChoice::kStreamingLean, cuda::ExpertsKernel::kQuantStreamLean,
      *streaming, cuda::QuantDecodeChoice::kStreaming, cuda::ExpertsKernel::kQuantStream, cases);
}

}  // namespace
}  // namespace deepinfer::backend_ops
