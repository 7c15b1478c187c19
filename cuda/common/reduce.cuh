// Warp and block reductions and scans. Each runs in an order fixed by the launch geometry, so
// the results are deterministic.
#pragma once

#include <cuda_runtime.h>

namespace deepinfer::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

// Sum over the warp by an xor butterfly, returned to every lane (all 32 lanes must call it).
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

__device__ __forceinline__ int warp_inclusive_scan(int v) {
  const int lane = threadIdx.x & 31;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(kFullMask, v, o);
    if (lane >= o) v += y;
  }
  return v;
}

// Exclusive prefix sum of v over the block (blockDim.x a multiple of 32, at most 1024);
// `warp_sums` holds 32 ints. Contains block barriers: every thread must call it.
__device__ __forceinline__ int block_exclusive_scan(int v, int* warp_sums) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = blockDim.x >> 5;
  const int incl = warp_inclusive_scan(v);
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int total = lane < num_warps ? warp_sums[lane] : 0;
    const int scanned = warp_inclusive_scan(total);
    if (lane < num_warps) warp_sums[lane] = scanned - total;
  }
  __syncthreads();
  const int result = warp_sums[warp] + incl - v;
  __syncthreads();  // warp_sums may be reused
  return result;
}

// Sum over the block, returned to every thread. blockDim.x must be a multiple of 32; call at most
// once per kernel (it reuses one shared buffer without a trailing barrier).
template <typename T>
__device__ __forceinline__ T block_sum(T v) {
  __shared__ T partial[32];
  const unsigned lane = threadIdx.x % 32;
  const unsigned warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const unsigned warps = blockDim.x / 32;
  return warp_sum(lane < warps ? partial[lane] : T(0));
}

}  // namespace deepinfer::cuda
