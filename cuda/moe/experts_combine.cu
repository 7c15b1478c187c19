// The last step of a moe_experts pass: out[t] = sum_j weight[t, j] * y[t, j], summed in slot
// order j; a grid over (hidden chunks, tokens) with float4 loads, so a decode step spreads over
// several CTAs. A routing.expert_ids entry outside [0, E) is dropped (that slot contributes
// nothing to its token), as group_pairs left it out of the GEMMs.
#include <cstdint>

#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/moe/moe_launch.h"

namespace deepinfer::cuda {

namespace {

// out[t, h] = sum over slots j in order of weight[t, j] * y[t * k + j, h]; dropped slots add
// nothing. Grid (hidden chunks, tokens): even one token spreads over ceil(H / 512) CTAs. A thread
// owns kCombineVec consecutive h (one float4 when kVec: H % 4 == 0, y and out 16-byte aligned) and
// loads kCombineSlots slots' rows before summing them, so those loads are in flight together; the
// sum itself stays in slot order (deterministic, the same arithmetic as one slot at a time).
template <bool kVec>
__global__ void __launch_bounds__(kCombineThreads)
    combine_kernel(const float* __restrict__ y, const int32_t* __restrict__ ids,
                   const float* __restrict__ weights, int top_k, int64_t hidden, int experts,
                   float* __restrict__ out) {
  enter_dependent_grid();
  const int64_t t = blockIdx.y;
  const int64_t h0 =
      (static_cast<int64_t>(blockIdx.x) * kCombineThreads + threadIdx.x) * kCombineVec;
  if (h0 >= hidden) return;
  float acc[kCombineVec] = {};
  for (int j0 = 0; j0 < top_k; j0 += kCombineSlots) {
    float v[kCombineSlots][kCombineVec] = {};
    float wt[kCombineSlots] = {};
    bool use[kCombineSlots];
#pragma unroll
    for (int s = 0; s < kCombineSlots; ++s) {
      const int64_t p = t * top_k + j0 + s;
      use[s] = false;
      if (j0 + s < top_k) {
        const int e = __ldg(ids + p);
        use[s] = e >= 0 && e < experts;
      }
      if (use[s]) {
        wt[s] = __ldg(weights + p);
        const float* src = y + p * hidden + h0;
        if constexpr (kVec) {
          const float4 q = __ldg(reinterpret_cast<const float4*>(src));
          v[s][0] = q.x;
          v[s][1] = q.y;
          v[s][2] = q.z;
          v[s][3] = q.w;
        } else {
#pragma unroll
          for (int c = 0; c < kCombineVec; ++c) {
            if (h0 + c < hidden) v[s][c] = __ldg(src + c);
          }
        }
      }
    }
#pragma unroll
    for (int s = 0; s < kCombineSlots; ++s) {
      if (use[s]) {
#pragma unroll
        for (int c = 0; c < kCombineVec; ++c) acc[c] += v[s][c] * wt[s];
      }
    }
  }
  float* dst = out + t * hidden + h0;
  if constexpr (kVec) {
    *reinterpret_cast<float4*>(dst) = make_float4(acc[0], acc[1], acc[2], acc[3]);
  } else {
#pragma unroll
    for (int c = 0; c < kCombineVec; ++c) {
      if (h0 + c < hidden) dst[c] = acc[c];
    }
  }
}

}  // namespace

void launch_experts_combine(const float* y, const int32_t* ids, const float* weights,
                            int64_t tokens, int top_k, int64_t hidden, int experts, float* out,
                            bool pdl, cudaStream_t stream) {
  // tokens <= kMaxPassTokens: within gridDim.y's limit.
  const dim3 grid3(ceil_div(hidden, kCombineThreads * kCombineVec), static_cast<unsigned>(tokens));
  if (hidden % kCombineVec == 0 && aligned16(out)) {  // y comes from empty(): aligned
    launch_programmatic("moe_experts", grid3, dim3(kCombineThreads), 0, stream, pdl,
                        combine_kernel<true>, y, ids, weights, top_k, hidden, experts, out);
  } else {
    launch_programmatic("moe_experts", grid3, dim3(kCombineThreads), 0, stream, pdl,
                        combine_kernel<false>, y, ids, weights, top_k, hidden, experts, out);
  }
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
}

}  // namespace deepinfer::cuda
