// Warp and block reductions and scans. Each runs in an order fixed by the launch geometry, so
// the results are deterministic.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

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

// One step of a radix select over a 256-bin histogram of the candidates' next 8 key bits, by
// one warp: the bin at which the count of keys in it and the bins above first reaches
// `remaining` goes to select[0], the count still to take from that bin to select[1]. Lane l owns
// bins 255 - 8l down to 248 - 8l; every lane of the warp calls it.
__device__ __forceinline__ void radix_select_bin(const uint32_t* hist, int remaining, int* select) {
  const int lane = threadIdx.x & 31;
  int local = 0;
  for (int q = 0; q < 8; ++q) local += static_cast<int>(hist[255 - 8 * lane - q]);
  const int incl = warp_inclusive_scan(local);
  const unsigned hit = __ballot_sync(kFullMask, incl >= remaining);
  if (lane == __ffs(hit) - 1) {
    int cum = incl - local;
    for (int q = 0; q < 8; ++q) {
      const int bin = 255 - 8 * lane - q;
      const int c = static_cast<int>(hist[bin]);
      if (cum + c >= remaining) {
        select[0] = bin;
        select[1] = remaining - cum;
        break;
      }
      cum += c;
    }
  }
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
