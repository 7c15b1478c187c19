// linear and grouped_linear. f32 weights run IEEE fp32 cuBLAS GEMMs (exact against the CPU
// reference up to summation order). bf16 weights: up to kGemvMaxTokens tokens the GEMV kernel of
// gemv_bf16.cu on f32 activations and exactly widened weights (f32 accumulation; the choice is
// gemv_heuristics.h's); from there on bf16 tensor-core cuBLAS GEMMs with f32 accumulation and f32
// output, after casting the f32 activations to bf16.
//
// Block-scaled FP8 weights (kFp8Block, kept as shipped: e4m3 values + f32 block scales) take one
// of the paths of gemm_fp8_heuristics.h: with act_group > 0, the FP8 tensor-core GEMV of
// gemv_fp8.cu up to kFp8GemvMaxTokens tokens (DEEPINFER_FP8_LINEAR=stream: the streaming kernel
// of fp8_stream.cu up to kFp8StreamMaxTokens instead; grouped linears take it above the GEMV's
// tokens by default); 128x128 blocks with act_group 128
// cuBLASLt's block-scaled W8A8 GEMM (gemm_fp8.cu); everything else dequantizes the weight into a
// bf16 scratch and runs the bf16 path above on the quantize-dequantized x (exact for power-of-two
// scales, DeepSeek's: e4m3 times 2^e, for weights and activations alike, is a bf16 value, so only
// the summation order differs from the CPU reference). linear_pair runs two FP8 weights of one x
// as one GEMV launch where it applies (linear_fp8_pair), else as two linears. A RowNorm of x is
// applied as the GEMV or the weight stream quantizes x (linear_fp8_pair, one weight or two),
// elsewhere by rms_norm first.
#include <cstdint>
#include <string>
#include <utility>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/gemm/gemm_launch.h"
#include "cuda/gemm/gemv_heuristics.h"
#include "cuda/quant/quant_launch.h"

namespace deepinfer::cuda {

namespace {

// `vec4`: `in` is 16-byte aligned (a view of a tensor may not be; a float4 load would fault).
__global__ void cast_f32_to_bf16(const float* __restrict__ in, __nv_bfloat16* __restrict__ out,
                                 int64_t n, bool vec4) {
  enter_dependent_grid();
  int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (vec4 && i + 3 < n) {
    float4 v = *reinterpret_cast<const float4*>(in + i);
    out[i] = __float2bfloat16(v.x);
    out[i + 1] = __float2bfloat16(v.y);
    out[i + 2] = __float2bfloat16(v.z);
    out[i + 3] = __float2bfloat16(v.w);
  } else {
    const int64_t end = i + 4 < n ? i + 4 : n;
    for (; i < end; ++i) out[i] = __float2bfloat16(in[i]);
  }
}

void cublas_check(cublasStatus_t s, const char* op) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw Error(ErrorCode::kInternal, std::string(op) + ": cuBLAS failed with status " +
                                          std::to_string(static_cast<int>(s)));
  }
}

// Y[M, G*N] = per group g: X[:, gK:(g+1)K] . W[gN:(g+1)N, :]^T. Row-major Y^T is column-major
// (G*N) x M, so each group is C_g = op(A_g) B_g with A = W (column-major K x N, transposed) and
// B = X (column-major view, leading dimension G*K). The front checked that x and w split into
// `groups` groups and that w is f32 or bf16.
Tensor gemm(CudaBackend& be, const char* op, const Tensor& x, const Tensor& w, int groups) {
  const int64_t m = x.size(0);
  const int64_t gk = x.size(1);
  const int64_t k = w.size(1);
  const int64_t n = w.size(0) / groups;
  Tensor y = be.empty({m, groups * n}, DType::kF32);
  if (m == 0 || n == 0) return y;
  const GemvProblem problem{m,
                            n,
                            k,
                            groups,
                            w.dtype() == DType::kBF16,
                            aligned16(x.raw_data()) && aligned16(w.raw_data()),
                            static_cast<int64_t>(w.nbytes())};
  const GemvConfig gemv = choose_gemv(problem, be.num_sms());
  if (gemv.use) {
    launch_gemv_bf16(x.data<float>(), w.data<__nv_bfloat16>(), y.data<float>(), problem, gemv,
                     be.pdl(), be.stream());
    DEEPINFER_CUDA_LAUNCH_CHECK(op);
    return y;
  }
  const float alpha = 1.0f, beta = 0.0f;
  cublasHandle_t h = be.cublas();
  // Weights are whole allocations (aligned); a view that is not 16-byte aligned is copied so that
  // cuBLAS never sees an operand its vectorised kernels cannot load.
  Tensor aligned_w = w;
  if (reinterpret_cast<uintptr_t>(w.raw_data()) % 16 != 0) {
    aligned_w = be.empty(w.shape(), w.dtype());
    be.copy_into(aligned_w, w);
  }
  if (w.dtype() == DType::kF32) {
    cublas_check(cublasSgemmStridedBatched(
                     h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                     static_cast<int>(k), &alpha, aligned_w.data<float>(), static_cast<int>(k),
                     n * k, x.data<float>(), static_cast<int>(gk), k, &beta, y.data<float>(),
                     static_cast<int>(groups * n), n, groups),
                 op);
    return y;
  }
  Tensor xb = be.empty(x.shape(), DType::kBF16);
  const int64_t numel = x.numel();
  const bool vec4 = reinterpret_cast<uintptr_t>(x.raw_data()) % 16 == 0;
  launch_programmatic(op, dim3(ceil_div(numel, 4 * 256)), dim3(256), 0, be.stream(), be.pdl(),
                      cast_f32_to_bf16, x.data<float>(), xb.data<__nv_bfloat16>(), numel, vec4);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  cublas_check(cublasGemmStridedBatchedEx(
                   h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                   static_cast<int>(k), &alpha, aligned_w.raw_data(), CUDA_R_16BF,
                   static_cast<int>(k), n * k, xb.raw_data(), CUDA_R_16BF, static_cast<int>(gk), k,
                   &beta, y.raw_data(), CUDA_R_32F, static_cast<int>(groups * n), n, groups,
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               op);
  return y;
}

// x after w's activation quantization; each group's columns are quantized on their own.
Tensor quantized_input(CudaBackend& be, const Tensor& x, const MatrixWeight& w, int groups) {
  if (w.act_group == 0) return x;
  Tensor out = be.empty(x.shape(), DType::kF32);
  launch_quantize_activations(x.data<float>(), out.data<float>(), x.size(0) * groups,
                              x.size(1) / groups, w.act_group, be.pdl(), be.stream());
  DEEPINFER_CUDA_LAUNCH_CHECK("quantize_activations");
  return out;
}

// Any weight format: FP8 on its own kernels where they apply, else the dense GEMMs.
Tensor any_linear(CudaBackend& be, const char* op, const Tensor& x, const MatrixWeight& w,
                  int groups) {
  if (w.format == WeightFormat::kMxfp4) {
    // DeepSeek ships only the routed experts in MXFP4 (moe_experts reads them); the loader never
    // makes a linear of it.
    fail(op, "argument w is " + w.describe() + "; mxfp4 weights are read by moe_experts only");
  }
  if (w.format == WeightFormat::kFp8Block) {
    Tensor y = linear_fp8(be, op, x, w, groups);
    if (y.defined()) return y;
    // Quantized activations are exact in bf16, so the bf16 GEMM is exact up to summation order;
    // exact f32 activations (act_group 0) need the f32 GEMM, which keeps them unrounded.
    const DType dtype = w.act_group > 0 ? DType::kBF16 : DType::kF32;
    be.set_last_fp8_linear_path(Fp8LinearPath::kDequant);
    return gemm(be, op, quantized_input(be, x, w, groups), dequantize_fp8(be, w, dtype), groups);
  }
  return gemm(be, op, quantized_input(be, x, w, groups), w.values, groups);
}

}  // namespace

Tensor CudaBackend::linear_impl(const Tensor& x, const MatrixWeight& w, const RowNorm& x_norm) {
  if (!x_norm.weight.defined()) return any_linear(*this, "linear", x, w, 1);
  Tensor y, unused;
  if (linear_fp8_pair(*this, x, w, nullptr, x_norm, y, unused)) return y;
  return any_linear(*this, "linear", rms_norm_impl(x, x_norm.weight, x_norm.eps), w, 1);
}

Tensor CudaBackend::grouped_linear_impl(const Tensor& x, const MatrixWeight& w, int groups) {
  return any_linear(*this, "grouped_linear", x, w, groups);
}

std::pair<Tensor, Tensor> CudaBackend::linear_pair_impl(const Tensor& x, const MatrixWeight& a,
                                                        const MatrixWeight& b,
                                                        const RowNorm& x_norm) {
  Tensor ya, yb;
  if (linear_fp8_pair(*this, x, a, &b, x_norm, ya, yb)) return {ya, yb};
  const Tensor normed = x_norm.weight.defined() ? rms_norm_impl(x, x_norm.weight, x_norm.eps) : x;
  return {any_linear(*this, "linear_pair", normed, a, 1),
          any_linear(*this, "linear_pair", normed, b, 1)};
}

}  // namespace deepinfer::cuda
