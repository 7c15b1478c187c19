// Router logits of moe_route (docs/model.md#mixture-of-experts): logits = x . gate_w^T in f32
// (gate_w f32 or bf16, the activations stay f32).
//  - T < kRouteGemmTokens (decode): router_gemv_kernel, CTAs over (experts, tokens) tiles whose
//    threads split K, so one token's 2 MB of bf16 gate weights (V4-Flash) are read by every SM at
//    once, at memory latency rather than in per-warp chains of loads.
//  - larger T (prefill): the backend's own f32 linear (cuBLAS SGEMM, IEEE f32, no TF32), bf16
//    weights first widened exactly into an [E, H] f32 temporary (elementwise/widen_bf16.h). f32
//    FMA on CUDA cores in a hand-written kernel reached ~5 TFLOP/s here; the GEMM only changes
//    the summation order.
#include <algorithm>
#include <cstdint>

#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/common/vec.cuh"
#include "cuda/moe/moe_launch.h"
#include "cuda/moe/strided_dots.cuh"

namespace deepinfer::cuda {

namespace {

// logits[t, e] = x[t] . gate[e] for tokens < kRouteGemmTokens (decode): a CTA computes kE
// experts x kR tokens over the whole of K. Its threads split K (kVec: 16 bytes of each weight row
// per thread and step, strided_dots.cuh) so every load of the CTA is in flight at once: the op is
// one pass over the gate weights at memory latency, not a chain of dependent loads per warp. The kE
// weight vectors a thread loads are used for all kR tokens and each x vector for all kE experts.
// Reduction in a fixed order (each thread over its k ascending, then lane partials of one output
// in thread order through shared memory and a warp-wide sum): deterministic, f32 like the CPU op up
// to summation order (bf16 weights widen exactly). Experts past E read row E - 1 and tokens past T
// read row T - 1; neither is stored.
template <typename W, bool kVec, int kE, int kR>
__global__ void __launch_bounds__(kRouteThreads)
    router_gemv_kernel(const float* __restrict__ x, const W* __restrict__ gate, int64_t tokens,
                       int64_t hidden, int experts, float* __restrict__ logits) {
  enter_dependent_grid();
  __shared__ float part[kE * kR][kRouteThreads];
  const int tid = static_cast<int>(threadIdx.x);
  const int e0 = static_cast<int>(blockIdx.x) * kE;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kR;
  const int rows = static_cast<int>(min(static_cast<int64_t>(kR), tokens - t0));  // CTA-uniform
  const W* w[kE];
#pragma unroll
  for (int e = 0; e < kE; ++e)
    w[e] = gate + static_cast<int64_t>(min(e0 + e, experts - 1)) * hidden;
  const float* xr[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) xr[r] = x + (t0 + min(r, rows - 1)) * hidden;
  float acc[kE][kR] = {};
  // One expert: 4 steps unrolled so a thread's loads of several steps are issued together
  // (H = 4096 bf16 is 2 steps); more experts already have kE loads per step in flight.
  strided_dots<W, kVec, kE, kR, kRouteThreads, kE == 1 ? 4 : 1>(w, xr, rows, hidden, tid, acc);
#pragma unroll
  for (int e = 0; e < kE; ++e) {
#pragma unroll
    for (int r = 0; r < kR; ++r) part[e * kR + r][tid] = acc[e][r];
  }
  __syncthreads();
  // Warp w reduces outputs w, w + 8, ...: lane l sums the partials of threads l, l + 32, ... in
  // order, then the warp sums the lanes. The loop bound is warp-uniform (shuffles inside).
  const int warp = tid / 32;
  const int lane = tid & 31;
  for (int o = warp; o < kE * kR; o += kRouteThreads / 32) {
    float v = 0.0f;
#pragma unroll
    for (int i = lane; i < kRouteThreads; i += 32) v += part[o][i];
    v = warp_sum(v);
    const int e = e0 + o / kR;
    const int r = o % kR;
    if (lane == 0 && e < experts && r < rows) logits[(t0 + r) * experts + e] = v;
  }
}

template <typename W, int kE, int kR>
void launch_router_tiles(const Tensor& x, const Tensor& gate_w, float* logits, bool pdl,
                         cudaStream_t stream) {
  const int64_t tokens = x.size(0);
  const int64_t hidden = x.size(1);
  const int experts = static_cast<int>(gate_w.size(0));
  const dim3 grid(ceil_div(experts, kE), ceil_div(tokens, kR));
  const W* gate = gate_w.data<W>();
  const bool vec = hidden % Vec16<W>::kN == 0 && aligned16(gate) && aligned16(x.raw_data());
  if (vec) {
    launch_programmatic("moe_route", grid, dim3(kRouteThreads), 0, stream, pdl,
                        router_gemv_kernel<W, true, kE, kR>, x.data<float>(), gate, tokens, hidden,
                        experts, logits);
  } else {
    launch_programmatic("moe_route", grid, dim3(kRouteThreads), 0, stream, pdl,
                        router_gemv_kernel<W, false, kE, kR>, x.data<float>(), gate, tokens, hidden,
                        experts, logits);
  }
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_route");
}

template <typename W>
void launch_router_path(const Tensor& x, const Tensor& gate_w, RouterLogits path, float* logits,
                        bool pdl, cudaStream_t stream) {
  if (path == RouterLogits::kGemvSmall) {
    launch_router_tiles<W, kRouteSmallE, kRouteSmallR>(x, gate_w, logits, pdl, stream);
  } else {
    launch_router_tiles<W, kRouteWideE, kRouteWideR>(x, gate_w, logits, pdl, stream);
  }
}

}  // namespace

void launch_router_gemv(const Tensor& x, const Tensor& gate_w, RouterLogits path, float* logits,
                        bool pdl, cudaStream_t stream) {
  if (gate_w.dtype() == DType::kBF16) {
    launch_router_path<__nv_bfloat16>(x, gate_w, path, logits, pdl, stream);
  } else {
    launch_router_path<float>(x, gate_w, path, logits, pdl, stream);
  }
}

}  // namespace deepinfer::cuda
