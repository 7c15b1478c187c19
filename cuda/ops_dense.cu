// Dense ops of the CUDA backend: embedding, RMSNorm, elementwise ops, row gathers and copies,
// RoPE, argmax, token selection. Each matches the CPU reference op (cpp/src/backend/
// cpu_ops_dense.cpp, cpu_ops_sample.cpp) on the same inputs.
//
// Matching the CPU bit for bit where it is cheap: the CPU build has no FMA contraction, so a
// product that feeds a sum is written with __fmul_rn / __fadd_rn here (nvcc would otherwise fuse
// it into one fma with a different rounding). RMS statistics accumulate in double like the CPU's.
// Remaining differences: summation order of the double sums, and expf / cosf / sinf, which are
// within 2 ulp of glibc's.
//
// Content errors (an id or a row index out of range) cannot be seen on the host without a sync.
// The CPU ops throw for them; these kernels write a defined value instead (see each op).
#include <cooperative_groups.h>

#include <cstdint>

#include "cuda_backend.h"
#include "cuda_common.cuh"

namespace deepinfer::cuda {

namespace {

namespace cg = cooperative_groups;

// ---- launch geometry ----------------------------------------------------------------------------

constexpr int kElementwiseThreads = 256;

// Grid of a grid-stride elementwise kernel over n elements: enough blocks to fill the device,
// never more than the elements need.
unsigned elementwise_blocks(const CudaBackend& be, int64_t n) {
  const int64_t fill = static_cast<int64_t>(be.num_sms()) * 16;
  const int64_t need = (n + kElementwiseThreads - 1) / kElementwiseThreads;
  return static_cast<unsigned>(need < fill ? need : fill);
}

// Threads of a one-block-per-row kernel over rows of `width` elements (a multiple of 32).
int row_threads(int64_t width) {
  if (width >= 4096) return 512;
  if (width >= 1024) return 256;
  return 128;
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// ---- block reductions ---------------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the block, returned to every thread. blockDim.x must be a multiple of 32; call at most
// once per kernel (it reuses one shared buffer without a trailing barrier). The order is fixed by
// the launch geometry, so the result is deterministic.
template <typename T>
__device__ T block_sum(T v) {
  __shared__ T partial[32];
  const unsigned lane = threadIdx.x % 32;
  const unsigned warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const unsigned warps = blockDim.x / 32;
  return warp_sum(lane < warps ? partial[lane] : T(0));
}

// ---- kernels
// --------------------------------------------------------------------------------------

// One block per token. An id outside [0, vocab) gives a zero row (the CPU op throws).
template <typename T>
__global__ void embedding_kernel(const T* __restrict__ table, const int32_t* __restrict__ ids,
                                 float* __restrict__ out, int64_t vocab, int64_t hidden) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  const bool valid = id >= 0 && id < vocab;
  const T* src = table + (valid ? static_cast<int64_t>(id) : 0) * hidden;
  float* dst = out + t * hidden;
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
    dst[h] = valid ? load_as_float(src, h) : 0.0f;
  }
}

// ---- rms_norm ----------------------------------------------------------------------------------
//
// y = x * (1 / sqrt(float(mean(x^2)) + eps)) [* w], the sum of squares in double as on the CPU
// (each square is exact in double, so only the order of the additions differs). `w` may be null
// (unweighted). Three kernels, chosen by the row width and alignment in CudaBackend::rms_norm:
//   - rows of at most kNormWarpUnits float4s: one warp per row, several rows per block;
//   - rows of at most kNormBlockUnits float4s: one block per row, or, when there are few rows, a
//     cluster of blocks per row that add their partial sums through distributed shared memory;
//   - anything else (a width not a multiple of 4, an unaligned base, wider rows): the scalar
//     two-pass kernel.
// The vector kernels keep the row in registers between the sum and the scaling, so x is read once.

constexpr int kNormWarpThreads = 256;       // 8 rows per block
constexpr int64_t kNormWarpUnits = 32 * 8;  // 1024 floats
constexpr int kNormBlockVec = 8;            // float4s per thread in the block kernel
constexpr int kNormBlockMaxThreads = 512;   // so rows up to kNormBlockUnits
constexpr int64_t kNormBlockUnits = kNormBlockMaxThreads * kNormBlockVec;  // 16384 floats
constexpr int64_t kNormClusterUnits = 512;  // float4s per block of a cluster (target)
constexpr int kNormMaxCluster = 8;          // the portable cluster size limit

__device__ __forceinline__ double add_squares(double acc, float4 v) {
  const double a = v.x, b = v.y, c = v.z, d = v.w;
  acc += a * a;  // exact in double, so a fused multiply-add rounds the same
  acc += b * b;
  acc += c * c;
  acc += d * d;
  return acc;
}

__device__ __forceinline__ float rms_inv(double sum_squares, int64_t dim, float eps) {
  return 1.0f / sqrtf(static_cast<float>(sum_squares / static_cast<double>(dim)) + eps);
}

// (x * inv) * w in this order, as the CPU (two roundings; nvcc does not fuse two products).
__device__ __forceinline__ float4 norm_scale(float4 v, float inv, float4 g) {
  return make_float4((v.x * inv) * g.x, (v.y * inv) * g.y, (v.z * inv) * g.z, (v.w * inv) * g.w);
}
__device__ __forceinline__ float4 norm_scale(float4 v, float inv) {
  return make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv);
}

// One warp per row of `units` float4s (at most 32 * kVec); lane l holds units l + 32k. The weight
// is loaded with the row so its latency overlaps the reduction.
template <int kVec>
__global__ void __launch_bounds__(kNormWarpThreads)
    rms_norm_warp_kernel(const float4* __restrict__ x, const float4* __restrict__ w,
                         float4* __restrict__ y, int64_t rows, int64_t units, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kNormWarpThreads / 32) + threadIdx.x / 32;
  if (row >= rows) return;  // uniform over the warp, so warp_sum below sees full warps
  const int lane = static_cast<int>(threadIdx.x % 32);
  const float4* xr = x + row * units;
  float4* yr = y + row * units;
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float4 v[kVec];
  float4 g[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const int64_t u = lane + 32 * k;
    v[k] = u < units ? xr[u] : zero;
    g[k] = w != nullptr && u < units ? w[u] : zero;
  }
  double acc = 0.0;
#pragma unroll
  for (int k = 0; k < kVec; ++k) acc = add_squares(acc, v[k]);  // padding adds exact zeros
  const float inv = rms_inv(warp_sum(acc), units * 4, eps);
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const int64_t u = lane + 32 * k;
    if (u < units) yr[u] = w != nullptr ? norm_scale(v[k], inv, g[k]) : norm_scale(v[k], inv);
  }
}

// One block per row (kCluster false), or a cluster of blocks per row (kCluster true; grid x =
// rows * cluster size, cluster dims (size, 1, 1)): block rank r of a row's cluster covers the
// float4s [r * per_block, (r + 1) * per_block) of it, thread t units begin + t + k * blockDim.x
// (k < kNormBlockVec). The blocks of a cluster add the partial sums of all ranks in rank order,
// so each computes the same total. kPreloadWeight loads w with x (few rows: the latency of the
// weight then overlaps the reduction); otherwise w is read in the store loop, which keeps the
// registers low enough for two blocks per SM when many rows stream through.
template <bool kCluster, bool kPreloadWeight>
__global__ void __launch_bounds__(kNormBlockMaxThreads)
    rms_norm_block_kernel(const float4* __restrict__ x, const float4* __restrict__ w,
                          float4* __restrict__ y, int64_t units, int64_t per_block, float eps) {
  int64_t row = blockIdx.x;
  int64_t begin = 0;
  if constexpr (kCluster) {
    const cg::cluster_group cluster = cg::this_cluster();
    row = blockIdx.x / cluster.num_blocks();
    begin = static_cast<int64_t>(cluster.block_rank()) * per_block;
  }
  const int64_t end = begin + per_block < units ? begin + per_block : units;
  const float4* xr = x + row * units;
  float4* yr = y + row * units;
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float4 v[kNormBlockVec];
  [[maybe_unused]] float4 g[kNormBlockVec];  // unused without kPreloadWeight
#pragma unroll
  for (int k = 0; k < kNormBlockVec; ++k) {
    const int64_t u = begin + threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    v[k] = u < end ? xr[u] : zero;
    if constexpr (kPreloadWeight) g[k] = w != nullptr && u < end ? w[u] : zero;
  }
  double acc = 0.0;
#pragma unroll
  for (int k = 0; k < kNormBlockVec; ++k) acc = add_squares(acc, v[k]);
  acc = block_sum(acc);
  if constexpr (kCluster) {
    const cg::cluster_group cluster = cg::this_cluster();
    __shared__ double block_total;
    if (threadIdx.x == 0) block_total = acc;
    cluster.sync();  // every rank's block_total is written
    acc = 0.0;
    for (unsigned r = 0; r < cluster.num_blocks(); ++r)
      acc += *cluster.map_shared_rank(&block_total, r);
  }
  const float inv = rms_inv(acc, units * 4, eps);
#pragma unroll
  for (int k = 0; k < kNormBlockVec; ++k) {
    const int64_t u = begin + threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (u < end) {
      if (w == nullptr) {
        yr[u] = norm_scale(v[k], inv);
      } else if constexpr (kPreloadWeight) {
        yr[u] = norm_scale(v[k], inv, g[k]);
      } else {
        yr[u] = norm_scale(v[k], inv, w[u]);
      }
    }
  }
  if constexpr (kCluster) {
    // No block may exit (releasing its shared memory) while another still reads its block_total.
    cg::this_cluster().sync();
  }
}

// Fallback for any row: one block per row, scalar loads, x read twice.
__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                float* __restrict__ y, int64_t dim, float eps) {
  const int64_t row = blockIdx.x;
  const float* xr = x + row * dim;
  float* yr = y + row * dim;
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const double v = xr[i];
    acc += v * v;  // exact in double, so a fused multiply-add rounds the same
  }
  acc = block_sum(acc);
  const float inv = rms_inv(acc, dim, eps);
  if (w != nullptr) {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = (xr[i] * inv) * w[i];
  } else {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * inv;
  }
}

__global__ void scale_kernel(const float* __restrict__ x, float* __restrict__ y, float factor,
                             int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] = x[i] * factor;
  }
}

__global__ void add_kernel(const float* __restrict__ a, const float* __restrict__ b,
                           float* __restrict__ y, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] = a[i] + b[i];
  }
}

// silu(min(gate, L)) * clamp(up, -L, L) as cpu::swiglu: comparisons (not fminf/fmaxf) so a NaN
// propagates; silu(g) = g * (1 / (1 + exp(-g))).
__device__ __forceinline__ float swiglu_value(float gate, float up, float limit) {
  const float g = gate > limit ? limit : gate;
  const float u = up > limit ? limit : (up < -limit ? -limit : up);
  const float sigmoid = 1.0f / (1.0f + expf(-g));
  return (g * sigmoid) * u;
}

__global__ void swiglu_kernel(const float* __restrict__ gate, const float* __restrict__ up,
                              float* __restrict__ y, float limit, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] = swiglu_value(gate[i], up[i], limit);
  }
}

// Row copies in units of U (16, 8, 4, 2 or 1 bytes, whatever divides the row and both bases).
// Grid: x = output row, y = chunks of a long row.
template <typename U>
__global__ void gather_rows_kernel(const U* __restrict__ src, const int32_t* __restrict__ rows,
                                   U* __restrict__ dst, int64_t src_rows, int64_t row_units) {
  const int64_t i = blockIdx.x;
  const int32_t r = rows[i];
  U* d = dst + i * row_units;
  const int64_t stride = static_cast<int64_t>(gridDim.y) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (r < 0 || r >= src_rows) {
    // Out of range (the CPU op throws): a zero row.
    for (int64_t k = first; k < row_units; k += stride) d[k] = U{};
    return;
  }
  const U* s = src + static_cast<int64_t>(r) * row_units;
  for (int64_t k = first; k < row_units; k += stride) d[k] = s[k];
}

// In place: rows[dst[i]] = rows[src[i]]. A pair with an index outside [0, num_rows) is skipped
// (the CPU op throws and copies nothing). No __restrict__: source and destination share `base`.
template <typename U>
__global__ void copy_rows_kernel(U* base, const int32_t* __restrict__ src,
                                 const int32_t* __restrict__ dst, int64_t num_rows,
                                 int64_t row_units) {
  const int64_t i = blockIdx.x;
  const int32_t s = src[i];
  const int32_t d = dst[i];
  if (s < 0 || s >= num_rows || d < 0 || d >= num_rows) return;
  const U* from = base + static_cast<int64_t>(s) * row_units;
  U* to = base + static_cast<int64_t>(d) * row_units;
  const int64_t stride = static_cast<int64_t>(gridDim.y) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; k < row_units;
       k += stride) {
    to[k] = from[k];
  }
}

// One thread per output element of x viewed as [rows = T * heads, dim]. Channels before `first`
// are copied; channel first + 2i (+1) is the first (second) element of rotated pair i. Both
// threads of a pair compute the same angle, cos and sin as the CPU: float(pos) * inv_freq[i],
// cosf, sinf (not the __cosf intrinsics), products rounded separately.
__global__ void rope_kernel(const float* __restrict__ x, const int32_t* __restrict__ positions,
                            const float* __restrict__ inv_freq, float* __restrict__ y,
                            int64_t heads, int64_t dim, int64_t first, bool inverse, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += stride) {
    const int64_t c = e % dim;
    if (c < first) {
      y[e] = x[e];
      continue;
    }
    const int64_t row = e / dim;
    const int64_t k = c - first;
    const int64_t i = k / 2;
    const int64_t pair = e - (k % 2);  // flat index of the pair's first element
    const float a = x[pair];
    const float b = x[pair + 1];
    const float angle = static_cast<float>(positions[row / heads]) * inv_freq[i];
    const float co = cosf(angle);
    const float si = inverse ? -sinf(angle) : sinf(angle);
    y[e] = (k % 2 == 0) ? __fsub_rn(__fmul_rn(a, co), __fmul_rn(b, si))
                        : __fadd_rn(__fmul_rn(b, co), __fmul_rn(a, si));
  }
}

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

constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxUnroll = 4;  // units per thread of a tile, all loaded before any compare
constexpr int64_t kArgmaxTile = static_cast<int64_t>(kArgmaxThreads) * kArgmaxUnroll;  // units
constexpr int64_t kArgmaxMaxChunks = 1024;

// Grid (rows, chunks): block (r, c) scans tiles c, c + chunks, ... of row r in units of kWidth
// floats (4: float4 loads, the row a multiple of 4 floats and 16-byte aligned; 1: scalar). With
// one chunk it writes out[r]; otherwise its best candidate goes to partial[r * chunks + c] for
// argmax_final_kernel.
template <int kWidth>
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_partial_kernel(const float* __restrict__ x, ArgBest* __restrict__ partial,
                          int32_t* __restrict__ out, int64_t cols) {
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

// tokens[i] = previous[remap[i]] where remap[i] >= 0; other entries keep their value. A remap
// past `previous` (the CPU op throws) leaves tokens[i] as it was.
__global__ void select_tokens_kernel(int32_t* __restrict__ tokens,
                                     const int32_t* __restrict__ remap,
                                     const int32_t* __restrict__ previous, int64_t num_previous,
                                     int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int32_t r = remap[i];
    if (r >= 0 && r < num_previous) tokens[i] = previous[r];
  }
}

// ---- row-copy dispatch
// ----------------------------------------------------------------------------

// The widest unit (16, 8, 4, 2, 1 bytes) that divides the row and both base addresses.
int copy_unit(size_t row_bytes, const void* a, const void* b) {
  const uintptr_t bits = static_cast<uintptr_t>(row_bytes) | reinterpret_cast<uintptr_t>(a) |
                         reinterpret_cast<uintptr_t>(b);
  for (int unit : {16, 8, 4, 2}) {
    if (bits % static_cast<uintptr_t>(unit) == 0) return unit;
  }
  return 1;
}

constexpr int kCopyThreads = 256;

// Chunks of a row (grid y) so that a few long rows still spread over the device.
dim3 copy_grid(int64_t rows, int64_t row_units) {
  int64_t chunks = (row_units + kCopyThreads * 4 - 1) / (kCopyThreads * 4);
  if (chunks < 1) chunks = 1;
  if (chunks > 65535) chunks = 65535;
  return dim3(static_cast<unsigned>(rows), static_cast<unsigned>(chunks), 1);
}

template <typename U>
void launch_gather(cudaStream_t stream, const void* src, const int32_t* rows, void* dst,
                   int64_t out_rows, int64_t src_rows, size_t row_bytes) {
  const int64_t units = static_cast<int64_t>(row_bytes / sizeof(U));
  gather_rows_kernel<U><<<copy_grid(out_rows, units), kCopyThreads, 0, stream>>>(
      static_cast<const U*>(src), rows, static_cast<U*>(dst), src_rows, units);
}

template <typename U>
void launch_copy(cudaStream_t stream, void* base, const int32_t* src, const int32_t* dst,
                 int64_t pairs, int64_t num_rows, size_t row_bytes) {
  const int64_t units = static_cast<int64_t>(row_bytes / sizeof(U));
  copy_rows_kernel<U><<<copy_grid(pairs, units), kCopyThreads, 0, stream>>>(
      static_cast<U*>(base), src, dst, num_rows, units);
}

size_t row_bytes_of(const Tensor& t) {
  size_t bytes = dtype_size(t.dtype());
  for (int64_t d = 1; d < t.dim(); ++d) bytes *= static_cast<size_t>(t.size(d));
  return bytes;
}

}  // namespace

// ---- ops
// ------------------------------------------------------------------------------------------

Tensor CudaBackend::embedding_impl(const Tensor& table, const Tensor& ids) {
  const char* op = "embedding";
  const int64_t vocab = table.size(0);
  const int64_t hidden = table.size(1);
  const int64_t tokens = ids.size(0);
  Tensor out = empty({tokens, hidden}, DType::kF32);
  if (tokens == 0 || hidden == 0) return out;
  const int threads = row_threads(hidden);
  if (table.dtype() == DType::kF32) {
    embedding_kernel<float><<<static_cast<unsigned>(tokens), threads, 0, stream()>>>(
        table.data<float>(), ids.data<int32_t>(), out.data<float>(), vocab, hidden);
  } else {
    embedding_kernel<__nv_bfloat16><<<static_cast<unsigned>(tokens), threads, 0, stream()>>>(
        table.data<__nv_bfloat16>(), ids.data<int32_t>(), out.data<float>(), vocab, hidden);
  }
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

Tensor CudaBackend::rms_norm_impl(const Tensor& x, const Tensor& weight, float eps) {
  const char* op = "rms_norm";
  const int64_t dim = x.size(-1);
  const int64_t rows = dim > 0 ? x.numel() / dim : 0;
  Tensor out = empty(x.shape(), DType::kF32);
  if (rows == 0) return out;
  const float* xp = x.data<float>();
  const float* wp = weight.defined() ? weight.data<float>() : nullptr;
  float* yp = out.data<float>();
  const int64_t units = dim / 4;
  const bool vec =
      dim % 4 == 0 && aligned16(xp) && aligned16(yp) && (wp == nullptr || aligned16(wp));
  const auto* x4 = reinterpret_cast<const float4*>(xp);
  const auto* w4 = reinterpret_cast<const float4*>(wp);
  auto* y4 = reinterpret_cast<float4*>(yp);
  if (vec && units <= kNormWarpUnits) {
    const unsigned blocks = ceil_div(rows, kNormWarpThreads / 32);
    if (units <= 32) {
      rms_norm_warp_kernel<1>
          <<<blocks, kNormWarpThreads, 0, stream()>>>(x4, w4, y4, rows, units, eps);
    } else if (units <= 64) {
      rms_norm_warp_kernel<2>
          <<<blocks, kNormWarpThreads, 0, stream()>>>(x4, w4, y4, rows, units, eps);
    } else if (units <= 128) {
      rms_norm_warp_kernel<4>
          <<<blocks, kNormWarpThreads, 0, stream()>>>(x4, w4, y4, rows, units, eps);
    } else {
      rms_norm_warp_kernel<8>
          <<<blocks, kNormWarpThreads, 0, stream()>>>(x4, w4, y4, rows, units, eps);
    }
  } else if (vec && units <= kNormBlockUnits) {
    // Few long rows would leave all but a few SMs idle and each row latency-bound on one SM:
    // split each over a cluster of 4 or 8 blocks of about kNormClusterUnits float4s.
    int64_t cluster = 1;
    while (cluster < kNormMaxCluster && cluster * kNormClusterUnits < units) cluster *= 2;
    if (units > 2 * kNormClusterUnits && rows * cluster <= num_sms()) {
      const int64_t per_block = (units + cluster - 1) / cluster;
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(static_cast<unsigned>(rows * cluster));
      config.blockDim = dim3(static_cast<unsigned>(32 * ceil_div(per_block, 32 * kNormBlockVec)));
      config.dynamicSmemBytes = 0;
      config.stream = stream();
      cudaLaunchAttribute attribute[1] = {};
      attribute[0].id = cudaLaunchAttributeClusterDimension;
      attribute[0].val.clusterDim.x = static_cast<unsigned>(cluster);
      attribute[0].val.clusterDim.y = 1;
      attribute[0].val.clusterDim.z = 1;
      config.attrs = attribute;
      config.numAttrs = 1;
      DEEPINFER_CUDA_CHECK(cudaLaunchKernelEx(&config, rms_norm_block_kernel<true, true>, x4, w4,
                                              y4, units, per_block, eps));
    } else {
      const unsigned threads = 32 * ceil_div(units, 32 * kNormBlockVec);
      if (rows <= num_sms()) {
        rms_norm_block_kernel<false, true>
            <<<static_cast<unsigned>(rows), threads, 0, stream()>>>(x4, w4, y4, units, units, eps);
      } else {
        rms_norm_block_kernel<false, false>
            <<<static_cast<unsigned>(rows), threads, 0, stream()>>>(x4, w4, y4, units, units, eps);
      }
    }
  } else {
    rms_norm_kernel<<<static_cast<unsigned>(rows), row_threads(dim), 0, stream()>>>(xp, wp, yp, dim,
                                                                                    eps);
  }
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

Tensor CudaBackend::scale_impl(const Tensor& x, float factor) {
  const char* op = "scale";
  Tensor out = empty(x.shape(), DType::kF32);
  const int64_t n = x.numel();
  if (n == 0) return out;
  scale_kernel<<<elementwise_blocks(*this, n), kElementwiseThreads, 0, stream()>>>(
      x.data<float>(), out.data<float>(), factor, n);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

Tensor CudaBackend::add_impl(const Tensor& a, const Tensor& b) {
  const char* op = "add";
  Tensor out = empty(a.shape(), DType::kF32);
  const int64_t n = a.numel();
  if (n == 0) return out;
  add_kernel<<<elementwise_blocks(*this, n), kElementwiseThreads, 0, stream()>>>(
      a.data<float>(), b.data<float>(), out.data<float>(), n);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

Tensor CudaBackend::swiglu_impl(const Tensor& gate, const Tensor& up, float swiglu_limit) {
  const char* op = "swiglu";
  Tensor out = empty(gate.shape(), DType::kF32);
  const int64_t n = gate.numel();
  if (n == 0) return out;
  swiglu_kernel<<<elementwise_blocks(*this, n), kElementwiseThreads, 0, stream()>>>(
      gate.data<float>(), up.data<float>(), out.data<float>(), swiglu_limit, n);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

Tensor CudaBackend::gather_rows_impl(const Tensor& x, const Tensor& rows) {
  const char* op = "gather_rows";
  Shape shape = x.shape();
  const int64_t src_rows = shape[0];
  shape[0] = rows.size(0);
  Tensor out = empty(shape, x.dtype());
  const size_t row_bytes = row_bytes_of(x);
  if (shape[0] == 0 || row_bytes == 0) return out;
  const void* src = x.raw_data();
  void* dst = out.raw_data();
  const int32_t* r = rows.data<int32_t>();
  switch (copy_unit(row_bytes, src, dst)) {
    case 16:
      launch_gather<uint4>(stream(), src, r, dst, shape[0], src_rows, row_bytes);
      break;
    case 8:
      launch_gather<uint2>(stream(), src, r, dst, shape[0], src_rows, row_bytes);
      break;
    case 4:
      launch_gather<uint32_t>(stream(), src, r, dst, shape[0], src_rows, row_bytes);
      break;
    case 2:
      launch_gather<uint16_t>(stream(), src, r, dst, shape[0], src_rows, row_bytes);
      break;
    default:
      launch_gather<uint8_t>(stream(), src, r, dst, shape[0], src_rows, row_bytes);
      break;
  }
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

void CudaBackend::copy_rows_impl(const Tensor& t, const Tensor& src, const Tensor& dst) {
  // The copies run concurrently, so, as on the CPU, the result is defined only when no row is a
  // destination twice and no destination is also a source. The CPU op checks that (it needs the
  // indices' contents); here it is the caller's contract and a violation races.
  const char* op = "copy_rows";
  const int64_t n = src.size(0);
  const int64_t num_rows = t.size(0);
  const size_t row_bytes = row_bytes_of(t);
  if (n == 0 || row_bytes == 0) return;
  void* base = t.raw_data();
  const int32_t* s = src.data<int32_t>();
  const int32_t* d = dst.data<int32_t>();
  switch (copy_unit(row_bytes, base, base)) {
    case 16:
      launch_copy<uint4>(stream(), base, s, d, n, num_rows, row_bytes);
      break;
    case 8:
      launch_copy<uint2>(stream(), base, s, d, n, num_rows, row_bytes);
      break;
    case 4:
      launch_copy<uint32_t>(stream(), base, s, d, n, num_rows, row_bytes);
      break;
    case 2:
      launch_copy<uint16_t>(stream(), base, s, d, n, num_rows, row_bytes);
      break;
    default:
      launch_copy<uint8_t>(stream(), base, s, d, n, num_rows, row_bytes);
      break;
  }
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
}

Tensor CudaBackend::rope_impl(const Tensor& x, const Tensor& positions, const Tensor& inv_freq,
                              bool inverse) {
  const char* op = "rope";
  const int64_t heads = x.dim() == 3 ? x.size(1) : 1;
  const int64_t dim = x.size(-1);
  const int64_t half = inv_freq.size(0);
  Tensor out = empty(x.shape(), DType::kF32);
  const int64_t n = x.numel();
  if (n == 0) return out;
  rope_kernel<<<elementwise_blocks(*this, n), kElementwiseThreads, 0, stream()>>>(
      x.data<float>(), positions.data<int32_t>(), inv_freq.data<float>(), out.data<float>(), heads,
      dim, dim - 2 * half, inverse, n);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

Tensor CudaBackend::argmax_impl(const Tensor& x) {
  const char* op = "argmax";
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  Tensor out = empty({rows}, DType::kI32);
  if (rows == 0) return out;
  const float* xp = x.data<float>();
  const bool vec = cols % 4 == 0 && aligned16(xp);
  const int64_t units = vec ? cols / 4 : cols;
  // A long row is split over up to kArgmaxMaxChunks blocks, so one row (the greedy token of a
  // decode step) still spreads over the device.
  int64_t chunks = (units + kArgmaxTile - 1) / kArgmaxTile;
  if (chunks > kArgmaxMaxChunks) chunks = kArgmaxMaxChunks;
  Tensor partial;
  ArgBest* pp = nullptr;
  if (chunks > 1) {
    partial = scratch(static_cast<size_t>(rows * chunks) * sizeof(ArgBest));
    pp = static_cast<ArgBest*>(partial.raw_data());
  }
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(chunks));
  if (vec) {
    argmax_partial_kernel<4>
        <<<grid, kArgmaxThreads, 0, stream()>>>(xp, pp, out.data<int32_t>(), cols);
  } else {
    argmax_partial_kernel<1>
        <<<grid, kArgmaxThreads, 0, stream()>>>(xp, pp, out.data<int32_t>(), cols);
  }
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  if (chunks > 1) {
    argmax_final_kernel<<<ceil_div(rows, kArgmaxFinalThreads / 32), kArgmaxFinalThreads, 0,
                          stream()>>>(xp, pp, out.data<int32_t>(), rows, cols, chunks);
    DEEPINFER_CUDA_LAUNCH_CHECK(op);
  }
  return out;
}

void CudaBackend::select_tokens_impl(const Tensor& tokens, const Tensor& remap,
                                     const Tensor& previous) {
  const int64_t n = tokens.size(0);
  if (n == 0) return;
  select_tokens_kernel<<<elementwise_blocks(*this, n), kElementwiseThreads, 0, stream()>>>(
      tokens.data<int32_t>(), remap.data<int32_t>(), previous.data<int32_t>(), previous.size(0), n);
  DEEPINFER_CUDA_LAUNCH_CHECK("select_tokens");
}

}  // namespace deepinfer::cuda
