// The inner loop the router GEMV and the decode expert GEMVs share: a group of kThreads threads
// splits K, each thread accumulating its share of M x R dot products.
#pragma once

#include <cstdint>

#include "cuda/common/vec.cuh"

namespace deepinfer::cuda {

// Thread `first` of kThreads: acc[m][r] += w[m][k] * x[r][k] for its k. kVec: 16-byte weight
// loads, threads strided by 16 bytes (a warp reads 512 contiguous bytes per row), which needs
// K % Vec16<W>::kN == 0 and 16-byte aligned rows; otherwise one element per thread and step.
// kUnroll steps of the vector loop are unrolled (their loads issued together). Rows r >= rows
// are skipped (their pointers are never dereferenced). The caller sums acc over the threads; the
// order of every sum is fixed, so results do not depend on the launch.
template <typename W, bool kVec, int M, int R, int kThreads, int kUnroll>
__device__ __forceinline__ void strided_dots(const W* (&w)[M], const float* (&x)[R], int rows,
                                             int64_t K, int first, float (&acc)[M][R]) {
  if constexpr (kVec) {
    constexpr int kN = Vec16<W>::kN;
#pragma unroll(kUnroll)
    for (int64_t k = static_cast<int64_t>(first) * kN; k < K; k += kThreads * kN) {
      float wv[M][kN];
#pragma unroll
      for (int m = 0; m < M; ++m) load16(w[m] + k, wv[m]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r < rows) {
          float xv[kN];
          load_f32<kN>(x[r] + k, xv);
#pragma unroll
          for (int m = 0; m < M; ++m) {
#pragma unroll
            for (int i = 0; i < kN; ++i) acc[m][r] = fmaf(wv[m][i], xv[i], acc[m][r]);
          }
        }
      }
    }
  } else {
    for (int64_t k = first; k < K; k += kThreads) {
      float wv[M];
#pragma unroll
      for (int m = 0; m < M; ++m) wv[m] = load_as_float(w[m], k);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r < rows) {
          const float xv = x[r][k];
#pragma unroll
          for (int m = 0; m < M; ++m) acc[m][r] = fmaf(wv[m], xv, acc[m][r]);
        }
      }
    }
  }
}

}  // namespace deepinfer::cuda
