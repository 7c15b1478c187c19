// launch_widen_bf16 (widen_bf16.h): a grid-stride copy, 8 elements per 16-byte load where the
// input allows it.
#include <algorithm>

#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/vec.cuh"
#include "cuda/elementwise/widen_bf16.h"

namespace deepinfer::cuda {

namespace {

template <bool kVec>
__global__ void widen_bf16_kernel(const __nv_bfloat16* __restrict__ in, float* __restrict__ out,
                                  int64_t n) {
  enter_dependent_grid();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if constexpr (kVec) {
    for (int64_t i = first; i < n / 8; i += stride) {
      float v[8];
      load16(in + 8 * i, v);
      float4* dst = reinterpret_cast<float4*>(out + 8 * i);
      dst[0] = make_float4(v[0], v[1], v[2], v[3]);
      dst[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
  } else {
    for (int64_t i = first; i < n; i += stride) out[i] = __bfloat162float(in[i]);
  }
}

}  // namespace

void launch_widen_bf16(const __nv_bfloat16* in, float* out, int64_t n, bool pdl,
                       cudaStream_t stream, const char* op) {
  if (n == 0) return;
  if (n % 8 == 0 && aligned16(in) && aligned16(out)) {
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n / 8 + 255) / 256, 4096));
    launch_programmatic(op, dim3(blocks), dim3(256), 0, stream, pdl, widen_bf16_kernel<true>, in,
                        out, n);
  } else {
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 4096));
    launch_programmatic(op, dim3(blocks), dim3(256), 0, stream, pdl, widen_bf16_kernel<false>, in,
                        out, n);
  }
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
}

}  // namespace deepinfer::cuda
