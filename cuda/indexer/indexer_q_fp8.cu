// The indexer's fp8 q on the CUDA backend (Backend::quantize_indexer_q; the rule and why:
// cpp/src/tensor/indexer_q.h): one warp per (token, head) row, its amax by shuffles, the
// power-of-two scale as kv_record::fp8_scale computes it, the codes by cvt.rn.satfinite (nearest
// even, as f32_to_f8e4m3; |q / s| <= 448). Bytes equal to the CPU op's. Also the f32 values of
// the codes for the score kernels (indexer_q_values).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/indexer/indexer_args.h"

namespace deepinfer::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // one warp per row
constexpr int kDecodeThreads = 256;

// 2^ceil(log2(max(amax, 1e-4) / 448)), kv_record::fp8_scale's arithmetic (IEEE division: this
// file is built without fast math).
__device__ __forceinline__ float fp8_pow2_scale(float amax) {
  const float ratio = fmaxf(amax, 1e-4f) / 448.0f;
  int e = 0;
  const float m = frexpf(ratio, &e);  // ratio = m 2^e, m in [1/2, 1)
  return ldexpf(1.0f, min(max(m == 0.5f ? e - 1 : e, -127), 127));
}

__global__ void __launch_bounds__(kRowsPerBlock * 32)
    quantize_indexer_q_kernel(const float* q, const float* weights, uint8_t* codes,
                              float* scaled_weights, int64_t rows, int dim) {
  enter_dependent_grid();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  if (r >= rows) return;  // uniform over the warp
  const float* qr = q + r * dim;
  float amax = 0.0f;
  for (int c = lane; c < dim; c += 32) amax = fmaxf(amax, fabsf(qr[c]));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = fp8_pow2_scale(amax);
  const float inv = 1.0f / s;  // a power of two in [2^-120, 2^22]: q * inv is q / s exactly
  for (int c = lane; c < dim; c += 32) {
    codes[r * dim + c] = __nv_cvt_float_to_fp8(qr[c] * inv, __NV_SATFINITE, __NV_E4M3);
  }
  if (lane == 0) scaled_weights[r] = weights[r] * s;
}

__global__ void __launch_bounds__(kDecodeThreads)
    decode_e4m3_kernel(const uint8_t* codes, float* out, int64_t n) {
  enter_dependent_grid();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kDecodeThreads + threadIdx.x;
  if (i >= n) return;
  out[i] = __half2float(__half(__nv_cvt_fp8_to_halfraw(codes[i], __NV_E4M3)));
}

}  // namespace

IndexerQFp8 CudaBackend::quantize_indexer_q_impl(const Tensor& q, const Tensor& weights) {
  IndexerQFp8 out{empty(q.shape(), DType::kF8E4M3), empty(weights.shape(), DType::kF32)};
  const int64_t rows = q.size(0) * q.size(1);
  if (rows == 0 || q.size(2) == 0) return out;
  const auto blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  launch_programmatic("quantize_indexer_q", dim3(blocks), dim3(kRowsPerBlock * 32), 0, stream(),
                      pdl(), quantize_indexer_q_kernel, q.data<float>(), weights.data<float>(),
                      static_cast<uint8_t*>(out.q.raw_data()), out.weights.data<float>(), rows,
                      static_cast<int>(q.size(2)));
  DEEPINFER_CUDA_LAUNCH_CHECK("quantize_indexer_q");
  return out;
}

Tensor indexer_q_values(CudaBackend& be, const Tensor& q) {
  if (q.dtype() != DType::kF8E4M3) return q;
  Tensor values = be.empty(q.shape(), DType::kF32);
  const int64_t n = q.numel();
  if (n == 0) return values;
  launch_programmatic("indexer_topk",
                      dim3(static_cast<unsigned>((n + kDecodeThreads - 1) / kDecodeThreads)),
                      dim3(kDecodeThreads), 0, be.stream(), be.pdl(), decode_e4m3_kernel,
                      static_cast<const uint8_t*>(q.raw_data()), values.data<float>(), n);
  DEEPINFER_CUDA_LAUNCH_CHECK("indexer_topk");
  return values;
}

}  // namespace deepinfer::cuda
