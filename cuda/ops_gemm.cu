// linear and grouped_linear through cuBLAS. f32 weights run IEEE fp32 GEMMs (exact against the
// CPU reference up to summation order); bf16 weights run bf16 tensor-core GEMMs with f32
// accumulation and f32 output, after casting the f32 activations to bf16.
#include "cuda_backend.h"
#include "cuda_common.cuh"

namespace deepinfer::cuda {

namespace {

__global__ void cast_f32_to_bf16(const float* __restrict__ in, __nv_bfloat16* __restrict__ out,
                                 int64_t n) {
  int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (i + 3 < n) {
    float4 v = *reinterpret_cast<const float4*>(in + i);
    out[i] = __float2bfloat16(v.x);
    out[i + 1] = __float2bfloat16(v.y);
    out[i + 2] = __float2bfloat16(v.z);
    out[i + 3] = __float2bfloat16(v.w);
  } else {
    for (; i < n; ++i) out[i] = __float2bfloat16(in[i]);
  }
}

void cublas_check(cublasStatus_t s, const char* op) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw Error(ErrorCode::kInternal, std::string(op) + ": cuBLAS failed with status " +
                                          std::to_string(static_cast<int>(s)));
  }
}

}  // namespace

// Y[M, G*N] = per group g: X[:, gK:(g+1)K] . W[gN:(g+1)N, :]^T. Row-major Y^T is column-major
// (G*N) x M, so each group is C_g = op(A_g) B_g with A = W (column-major K x N, transposed) and
// B = X (column-major view, leading dimension G*K).
static Tensor gemm(CudaBackend& be, const char* op, const Tensor& x, const Tensor& w, int groups) {
  check_device(op, "x", x);
  check_device(op, "w", w);
  check_dtype(op, "x", x, DType::kF32);
  check_rank(op, "x", x, 2);
  check_rank(op, "w", w, 2);
  if (w.dtype() != DType::kF32 && w.dtype() != DType::kBF16) {
    fail(op, "argument w must be f32 or bf16, got " + w.describe());
  }
  const int64_t m = x.size(0);
  const int64_t gk = x.size(1);
  const int64_t k = w.size(1);
  if (groups < 1 || gk != groups * k || w.size(0) % groups != 0) {
    fail(op, "x " + x.describe() + " and w " + w.describe() + " do not fit " +
                 std::to_string(groups) + " groups");
  }
  const int64_t n = w.size(0) / groups;
  Tensor y = be.empty({m, groups * n}, DType::kF32);
  if (m == 0 || n == 0) return y;
  const float alpha = 1.0f, beta = 0.0f;
  cublasHandle_t h = be.cublas();
  if (w.dtype() == DType::kF32) {
    cublas_check(cublasSgemmStridedBatched(
                     h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                     static_cast<int>(k), &alpha, w.data<float>(), static_cast<int>(k), n * k,
                     x.data<float>(), static_cast<int>(gk), k, &beta, y.data<float>(),
                     static_cast<int>(groups * n), n, groups),
                 op);
    return y;
  }
  Tensor xb = be.empty(x.shape(), DType::kBF16);
  const int64_t numel = x.numel();
  cast_f32_to_bf16<<<ceil_div(numel, 4 * 256), 256, 0, be.stream()>>>(
      x.data<float>(), xb.data<__nv_bfloat16>(), numel);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  cublas_check(
      cublasGemmStridedBatchedEx(
          h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
          static_cast<int>(k), &alpha, w.raw_data(), CUDA_R_16BF, static_cast<int>(k), n * k,
          xb.raw_data(), CUDA_R_16BF, static_cast<int>(gk), k, &beta, y.raw_data(), CUDA_R_32F,
          static_cast<int>(groups * n), n, groups, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      op);
  return y;
}

Tensor CudaBackend::linear(const Tensor& x, const Tensor& w) {
  return gemm(*this, "linear", x, w, 1);
}

Tensor CudaBackend::grouped_linear(const Tensor& x, const Tensor& w, int groups) {
  return gemm(*this, "grouped_linear", x, w, groups);
}

}  // namespace deepinfer::cuda
