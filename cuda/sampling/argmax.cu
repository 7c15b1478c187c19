// argmax of the CUDA backend: the CPU's answer (cpp/src/backend/cpu_ops_dense.cpp; the lowest
// index of the largest non-NaN value, 0 when row[0] is NaN) by a partial scan of each row's
// chunks and, for long rows split over several blocks (argmax_heuristics.h), a final merge.
#include <cstdint>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/sampling/argmax_heuristics.h"

namespace deepinfer::cuda {

namespace {

// Argmax candidate: (value, index); index == `none` marks "no candidate yet".
struct ArgBest {
  float value;
  int64_t index;
};

// True when b beats a: larger value, or equal value and lower index. NaNs never become
// candidates. This is a maximum under a total order, so any reduction tree gives one answer.
__device__ __forceinline__ bool beats(const ArgBest& b, const ArgBest& a, int64_t none) {
  if (b.index == none) return false;
  if (a.index == none) return true;
  return b.value > a.value || (b.value == a.value && b.index < a.index);
}

// Best of the candidates held by the threads of a warp, returned to every lane.
__device__ __forceinline__ ArgBest warp_argmax(ArgBest best, int64_t none) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    ArgBest other;
    other.value = __shfl_xor_sync(0xffffffffu, best.value, offset);
    other.index = __shfl_xor_sync(0xffffffffu, best.index, offset);
    if (beats(other, best, none)) best = other;
  }
  return best;
}

// The CPU's answer from the best non-NaN candidate of a whole row. The CPU scans "best = 0; if
// row[c] > row[best]": when row[0] is NaN nothing ever beats it (result 0); otherwise NaNs are
// skipped and the result is the lowest index of the largest non-NaN value.
__device__ __forceinline__ int32_t argmax_result(const ArgBest& best, float first, int64_t none) {
  return isnan(first) || best.index == none ? 0 : static_cast<int32_t>(best.index);
}

// Grid (rows, chunks): block (r, c) scans tiles c, c + chunks, ... of row r in units of kWidth
// floats (4: float4 loads, the row a multiple of 4 floats and 16-byte aligned; 1: scalar). With
// one chunk it writes out[r]; otherwise its best candidate goes to partial[r * chunks + c] for
// argmax_final_kernel.
template <int kWidth>
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_partial_kernel(const float* __restrict__ x, ArgBest* __restrict__ partial,
                          int32_t* __restrict__ out, int64_t cols) {
  enter_dependent_grid();
  const int64_t r = blockIdx.x;
  const float* row = x + r * cols;
  const int64_t units = cols / kWidth;
  const int64_t none = cols;
  ArgBest best{0.0f, none};
  for (int64_t base = static_cast<int64_t>(blockIdx.y) * kArgmaxTile; base < units;
       base += static_cast<int64_t>(gridDim.y) * kArgmaxTile) {
    float v[kArgmaxUnroll][kWidth];
#pragma unroll
    for (int k = 0; k < kArgmaxUnroll; ++k) {
      const int64_t u = base + k * kArgmaxThreads + threadIdx.x;
      if (u >= units) continue;
      if constexpr (kWidth == 4) {
        const float4 q = reinterpret_cast<const float4*>(row)[u];
        v[k][0] = q.x;
        v[k][1] = q.y;
        v[k][2] = q.z;
        v[k][3] = q.w;
      } else {
        v[k][0] = row[u];
      }
    }
    // A thread's indices increase (over k, over j, over tiles), so strict > keeps the lowest
    // index among equal values.
#pragma unroll
    for (int k = 0; k < kArgmaxUnroll; ++k) {
      const int64_t u = base + k * kArgmaxThreads + threadIdx.x;
      if (u >= units) continue;
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        const float e = v[k][j];
        if (!isnan(e) && (best.index == none || e > best.value)) best = ArgBest{e, u * kWidth + j};
      }
    }
  }
  best = warp_argmax(best, none);
  __shared__ ArgBest warp_best[kArgmaxThreads / 32];
  const unsigned lane = threadIdx.x % 32;
  const unsigned warp = threadIdx.x / 32;
  if (lane == 0) warp_best[warp] = best;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (unsigned i = 1; i < kArgmaxThreads / 32; ++i) {
    if (beats(warp_best[i], best, none)) best = warp_best[i];
  }
  if (gridDim.y == 1) {
    out[r] = argmax_result(best, row[0], none);
  } else {
    partial[r * gridDim.y + blockIdx.y] = best;
  }
}

// One warp per row: the best of the row's `chunks` partial candidates. `beats` is a strict total
// order on candidates, so the split gives the same answer as one sequential scan.
constexpr int kArgmaxFinalThreads = 128;

__global__ void __launch_bounds__(kArgmaxFinalThreads)
    argmax_final_kernel(const float* __restrict__ x, const ArgBest* __restrict__ partial,
                        int32_t* __restrict__ out, int64_t rows, int64_t cols, int64_t chunks) {
  enter_dependent_grid();
  const int64_t r =
      static_cast<int64_t>(blockIdx.x) * (kArgmaxFinalThreads / 32) + threadIdx.x / 32;
  if (r >= rows) return;  // uniform over the warp, so warp_argmax sees full warps
  const int64_t none = cols;
  ArgBest best{0.0f, none};
  for (int64_t i = threadIdx.x % 32; i < chunks; i += 32) {
    const ArgBest p = partial[r * chunks + i];
    if (beats(p, best, none)) best = p;
  }
  best = warp_argmax(best, none);
  if (threadIdx.x % 32 == 0) out[r] = argmax_result(best, x[r * cols], none);
}

}  // namespace

Tensor CudaBackend::argmax_impl(const Tensor& x) {
  const char* op = "argmax";
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  Tensor out = empty({rows}, DType::kI32);
  if (rows == 0) return out;
  const float* xp = x.data<float>();
  const ArgmaxConfig c = choose_argmax(cols, aligned16(xp));
  const bool vec = c.vec;
  const int64_t chunks = c.chunks;
  Tensor partial;
  ArgBest* pp = nullptr;
  if (chunks > 1) {
    partial = scratch(static_cast<size_t>(rows * chunks) * sizeof(ArgBest));
    pp = static_cast<ArgBest*>(partial.raw_data());
  }
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(chunks));
  if (vec) {
    launch_programmatic(op, grid, dim3(kArgmaxThreads), 0, stream(), pdl(),
                        argmax_partial_kernel<4>, xp, pp, out.data<int32_t>(), cols);
  } else {
    launch_programmatic(op, grid, dim3(kArgmaxThreads), 0, stream(), pdl(),
                        argmax_partial_kernel<1>, xp, pp, out.data<int32_t>(), cols);
  }
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  if (chunks > 1) {
    launch_programmatic(op, dim3(ceil_div(rows, kArgmaxFinalThreads / 32)),
                        dim3(kArgmaxFinalThreads), 0, stream(), pdl(), argmax_final_kernel, xp, pp,
                        out.data<int32_t>(), rows, cols, chunks);
    DEEPINFER_CUDA_LAUNCH_CHECK(op);
  }
  return out;
}

}  // namespace deepinfer::cuda
