// Hyper-connection (mHC) ops of the CUDA backend (docs/model.md#hyper-connections): expand, pre
// (weights + collapse), post (mix), head (final collapse), and V4.1's shifted pre and plain
// collapse (docs/model.md#v41-ops). They follow the CPU reference
// (cpp/src/backend/cpu_ops_hc.cpp) step by step, and reuse this backend's own ops where the CPU
// does the same computation:
//   mix = linear(rms_norm(flatten(X)), fn)   (the CPU's hc_mix: unweighted norm, then fp32 GEMM)
// then one kernel finishes hc_pre / hc_pre_shifted / hc_head. At decode (T = 1) its cost is
// latency, not work, so:
//  - comb (softmax + Sinkhorn over n x n) is a serial chain per token; one warp per token runs it
//    with lane = matrix element and shuffles for the row / column sums (a block in shared memory
//    when n * n > 32), in blocks of their own that run alongside the collapse;
//  - the collapse y = sum_s pre[s] * X[s] is split over the channels into many blocks (about one
//    channel per thread at small T), each recomputing the n sigmoids of pre it needs.
//
// At decode sizes (hc_fused_grid: T <= 256, n <= 4) hc_pre and hc_head are instead one kernel,
// hc_fused_kernel: the GEMV split over the channels across CTAs, a spin barrier per token group,
// then each CTA finishes the mix, the weights and its channels of the collapse. Opt-in
// (DEEPINFER_HC_PRE=fused, CudaBackend::hc_fused): the barrier assumes the whole grid resident.
//
// Products that feed sums are rounded separately (__fmul_rn / __fadd_rn) because the CPU build has
// no FMA contraction, and every sum runs in the CPU's order; the weights, the collapse and hc_post
// are then the CPU's arithmetic exactly. Differences come from the GEMM's summation order and from
// expf (within 2 ulp of glibc's).
#include <cstdint>
#include <string>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/activation.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/hc/hc_heuristics.h"

namespace deepinfer::cuda {

namespace {

// The shape of hc_pre's and hc_head's X [T, n, H], after the check that n fits the kernels.
struct HcShape {
  int64_t tokens;
  int n;
  int64_t hidden;
};

HcShape hc_shape(const char* op, const Tensor& X, const HcParams& params) {
  if (params.hc_mult > kMaxHcMult) {
    fail(op, "the CUDA backend supports hc_mult up to " + std::to_string(kMaxHcMult) + ", got " +
                 std::to_string(params.hc_mult));
  }
  return {X.size(0), params.hc_mult, X.size(2)};
}

// a * b + c with the product rounded first (no FMA), as the CPU computes it.
__device__ __forceinline__ float mul_add_rn(float a, float b, float c) {
  return __fadd_rn(__fmul_rn(a, b), c);
}

// out[t, s, h] = x[t, h].
__global__ void hc_expand_kernel(const float* __restrict__ x, float* __restrict__ out, int n,
                                 int64_t hidden, int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    const int64_t h = e % hidden;
    const int64_t t = e / (static_cast<int64_t>(n) * hidden);
    out[e] = x[t * hidden + h];
  }
}

// mHC weights of one token from its row of mix:
//   pre[s]  = sigmoid(mix[s] * scale[0] + base[s]) + eps
//   post[s] = 2 * sigmoid(mix[n + s] * scale[1] + base[n + s])
//   comb    = softmax over j of (mix[2n + i*n + j] * scale[2] + base[...]) + eps, then Sinkhorn:
//             columns once, then (rows, columns) iters - 1 times, each dividing by (sum + eps).
// Every sum runs in the CPU's order (index ascending, from 0.0f) so the results are the CPU's.
__device__ __forceinline__ float hc_pre_weight(const float* __restrict__ m,
                                               const float* __restrict__ base, float scale0, int s,
                                               float eps) {
  return sigmoid(mul_add_rn(m[s], scale0, base[s])) + eps;
}

// Sum of row `row` / column `col` of the N x N matrix held one element per lane (lane = i*N + j),
// index ascending as the CPU sums. Every lane of the warp must call these (full-mask shuffles).
template <int N>
__device__ __forceinline__ float warp_row_sum(float v, int row) {
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < N; ++j) sum += __shfl_sync(0xffffffffu, v, row * N + j);
  return sum;
}
template <int N>
__device__ __forceinline__ float warp_col_sum(float v, int col) {
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i) sum += __shfl_sync(0xffffffffu, v, i * N + col);
  return sum;
}

// post and comb (and pre, when `pre` is not null) of one token by one whole warp (N * N <= 32):
// lane i*N + j owns comb[i][j]; the row / column sums gather the N elements by shuffles. Lanes
// past N * N shadow element 0 (so every shuffle reads a real element) and write nothing.
template <int N>
__device__ void hc_comb_warp(const float* __restrict__ m, const float* __restrict__ base,
                             const float* __restrict__ scale, int iters, float eps,
                             float* __restrict__ pre, float* __restrict__ post,
                             float* __restrict__ comb) {
  static_assert(N >= 1 && N * N <= 32, "one element per lane");
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (lane < N) post[lane] = 2.0f * sigmoid(mul_add_rn(m[N + lane], scale[1], base[N + lane]));
  if (pre != nullptr && lane < N) pre[lane] = hc_pre_weight(m, base, scale[0], lane, eps);
  const bool owner = lane < N * N;
  const int e = owner ? lane : 0;
  const int row = e / N;
  const int col = e % N;
  const float logit = mul_add_rn(m[2 * N + e], scale[2], base[2 * N + e]);
  float mx = __shfl_sync(0xffffffffu, logit, row * N);
#pragma unroll
  for (int j = 1; j < N; ++j) mx = fmaxf(mx, __shfl_sync(0xffffffffu, logit, row * N + j));
  const float ex = expf(logit - mx);
  float v = ex / warp_row_sum<N>(ex, row) + eps;
  v = v / (warp_col_sum<N>(v, col) + eps);
  for (int it = 1; it < iters; ++it) {
    v = v / (warp_row_sum<N>(v, row) + eps);
    v = v / (warp_col_sum<N>(v, col) + eps);
  }
  if (owner) comb[lane] = v;
}

// The slower general path (N * N > 32; DeepSeek-V4 has hc_mult 4): one whole block per
// token, the matrix in shared memory `c` [n * n], thread i normalising row i / column i in the
// CPU's order (needs blockDim.x >= n); pre too when it is not null. Every thread of the block
// must call it (__syncthreads).
__device__ void hc_comb_block(const float* __restrict__ m, const float* __restrict__ base,
                              const float* __restrict__ scale, int n, int iters, float eps,
                              float* __restrict__ pre, float* __restrict__ post,
                              float* __restrict__ comb, float* c) {
  const int tid = static_cast<int>(threadIdx.x);
  const int nn = n * n;
  if (tid < n) post[tid] = 2.0f * sigmoid(mul_add_rn(m[n + tid], scale[1], base[n + tid]));
  if (pre != nullptr && tid < n) pre[tid] = hc_pre_weight(m, base, scale[0], tid, eps);
  for (int k = tid; k < nn; k += blockDim.x) {
    c[k] = mul_add_rn(m[2 * n + k], scale[2], base[2 * n + k]);
  }
  __syncthreads();
  if (tid < n) {  // softmax of row tid, plus eps
    float* r = c + tid * n;
    float mx = r[0];
    for (int j = 1; j < n; ++j) mx = fmaxf(mx, r[j]);
    float sum = 0.0f;
    for (int j = 0; j < n; ++j) {
      r[j] = expf(r[j] - mx);
      sum += r[j];
    }
    for (int j = 0; j < n; ++j) r[j] = r[j] / sum + eps;
  }
  __syncthreads();
  for (int it = 0; it < iters; ++it) {
    if (it > 0) {
      if (tid < n) {  // row tid
        float sum = 0.0f;
        for (int j = 0; j < n; ++j) sum += c[tid * n + j];
        for (int j = 0; j < n; ++j) c[tid * n + j] /= sum + eps;
      }
      __syncthreads();
    }
    if (tid < n) {  // column tid
      float sum = 0.0f;
      for (int i = 0; i < n; ++i) sum += c[i * n + tid];
      for (int i = 0; i < n; ++i) c[i * n + tid] /= sum + eps;
    }
    __syncthreads();
  }
  for (int k = tid; k < nn; k += blockDim.x) comb[k] = c[k];
}

// Channels [h_begin, h_end) of one token's collapse, y[h] = sum_s pre[s] * X[s][h] over `streams`
// streams in the CPU's order (stream 0 first). xt = X[t] [streams, hidden], yt = y[t].
__device__ void collapse_range(const float* __restrict__ xt, const float* pre, int streams,
                               int64_t hidden, int64_t h_begin, int64_t h_end,
                               float* __restrict__ yt) {
  for (int64_t h = h_begin + threadIdx.x; h < h_end; h += blockDim.x) {
    float acc = 0.0f;
    for (int s0 = 0; s0 < streams; s0 += kStreamBatch) {
      // All loads of the batch first, so they are in flight together (not one per add).
      float xs[kStreamBatch];
#pragma unroll
      for (int k = 0; k < kStreamBatch; ++k) {
        xs[k] = s0 + k < streams ? xt[(s0 + k) * hidden + h] : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < kStreamBatch; ++k) {
        const int s = s0 + k;
        if (s < streams) acc = s == 0 ? __fmul_rn(pre[0], xs[k]) : mul_add_rn(pre[s], xs[k], acc);
      }
    }
    yt[h] = acc;
  }
}

// Where collapse block `block` of a launch with `splits` blocks per token works: token t,
// channels [h_begin, h_end).
struct CollapseSlice {
  int64_t t;
  int64_t h_begin;
  int64_t h_end;
};

__device__ CollapseSlice collapse_slice(int64_t block, int64_t splits, int64_t chunk,
                                        int64_t hidden) {
  const int64_t h_begin = block % splits * chunk;
  return {block / splits, h_begin, h_begin + chunk < hidden ? h_begin + chunk : hidden};
}

// The arguments of hc_pre_finish_kernel. hc_pre collapses with this token's own pre (pre and
// prev_pre null); hc_pre_shifted writes pre and collapses with prev_pre, or takes stream 0 when
// prev_pre is null (the first sub-layer).
struct HcFinishArgs {
  const float* X;         // [T, n, hidden]
  const float* mix;       // [T, (2 + n) * n]
  const float* base;      // [(2 + n) * n]
  const float* scale;     // [3]
  const float* prev_pre;  // [T, n] or null
  float* pre;             // [T, n] or null
  float* post;            // [T, n]
  float* comb;            // [T, n, n]
  float* y;               // [T, hidden]
  int n;
  int64_t tokens;
  int64_t hidden;
  int iters;
  float eps;
  int64_t weight_blocks;
  int64_t splits;
  int64_t chunk;
};

// hc_pre / hc_pre_shifted after the mix GEMM. The first `weight_blocks` blocks compute post and
// comb (and pre for the shifted op; one warp per token when n * n <= 32, else one block per
// token); the rest collapse, each staging the n weights it applies (hc_pre recomputes its pre
// from mix). The two roles run concurrently, so the serial Sinkhorn chain of a token overlaps its
// collapse. Dynamic shared memory: n * n + n floats.
__global__ void __launch_bounds__(kHcThreads) hc_pre_finish_kernel(HcFinishArgs a) {
  extern __shared__ float shared[];
  const int n = a.n;
  const int64_t fn_rows = static_cast<int64_t>(2 + n) * n;
  const int64_t block = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x);
  if (block >= a.weight_blocks) {
    const CollapseSlice c = collapse_slice(block - a.weight_blocks, a.splits, a.chunk, a.hidden);
    int streams = n;
    if (a.pre == nullptr) {
      if (tid < n)
        shared[tid] = hc_pre_weight(a.mix + c.t * fn_rows, a.base, a.scale[0], tid, a.eps);
    } else if (a.prev_pre != nullptr) {
      if (tid < n) shared[tid] = a.prev_pre[c.t * n + tid];
    } else {
      // The first sub-layer reads stream 0: 1 * x is x exactly, as the CPU's copy.
      streams = 1;
      if (tid == 0) shared[0] = 1.0f;
    }
    __syncthreads();
    collapse_range(a.X + c.t * n * a.hidden, shared, streams, a.hidden, c.h_begin, c.h_end,
                   a.y + c.t * a.hidden);
    return;
  }
  if (n * n > 32) {
    const int64_t t = block;
    hc_comb_block(a.mix + t * fn_rows, a.base, a.scale, n, a.iters, a.eps,
                  a.pre != nullptr ? a.pre + t * n : nullptr, a.post + t * n, a.comb + t * n * n,
                  shared);
    return;
  }
  // One warp per token; the condition is uniform over the warp, as the shuffles need.
  const int64_t t = block * (kHcThreads / 32) + threadIdx.x / 32;
  if (t >= a.tokens) return;
  const float* m = a.mix + t * fn_rows;
  float* pr = a.pre != nullptr ? a.pre + t * n : nullptr;
  float* po = a.post + t * n;
  float* ct = a.comb + t * n * n;
  switch (n) {
    case 1:
      hc_comb_warp<1>(m, a.base, a.scale, a.iters, a.eps, pr, po, ct);
      break;
    case 2:
      hc_comb_warp<2>(m, a.base, a.scale, a.iters, a.eps, pr, po, ct);
      break;
    case 3:
      hc_comb_warp<3>(m, a.base, a.scale, a.iters, a.eps, pr, po, ct);
      break;
    case 4:
      hc_comb_warp<4>(m, a.base, a.scale, a.iters, a.eps, pr, po, ct);
      break;
    case 5:
      hc_comb_warp<5>(m, a.base, a.scale, a.iters, a.eps, pr, po, ct);
      break;
    default:
      break;  // n * n <= 32 means n <= 5
  }
}

// hc_head after the mix GEMM: collapse blocks only (pre is the only weight). Shared memory: n
// floats.
__global__ void __launch_bounds__(kHcThreads)
    hc_head_finish_kernel(const float* __restrict__ X, const float* __restrict__ mix,
                          const float* __restrict__ base, const float* __restrict__ scale, int n,
                          int64_t hidden, float eps, int64_t splits, int64_t chunk,
                          float* __restrict__ y) {
  extern __shared__ float pre[];
  const CollapseSlice c = collapse_slice(blockIdx.x, splits, chunk, hidden);
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < n) pre[tid] = hc_pre_weight(mix + c.t * n, base, scale[0], tid, eps);
  __syncthreads();
  collapse_range(X + c.t * n * hidden, pre, n, hidden, c.h_begin, c.h_end, y + c.t * hidden);
}

// hc_collapse: y[t] = sum_s pre[t, s] * X[t, s], collapse blocks with pre read from its tensor.
// Shared memory: n floats.
__global__ void __launch_bounds__(kHcThreads)
    hc_collapse_kernel(const float* __restrict__ X, const float* __restrict__ pre, int n,
                       int64_t hidden, int64_t splits, int64_t chunk, float* __restrict__ y) {
  extern __shared__ float weights[];
  const CollapseSlice c = collapse_slice(blockIdx.x, splits, chunk, hidden);
  for (int s = static_cast<int>(threadIdx.x); s < n; s += blockDim.x) {
    weights[s] = pre[c.t * n + s];
  }
  __syncthreads();
  collapse_range(X + c.t * n * hidden, weights, n, hidden, c.h_begin, c.h_end, y + c.t * hidden);
}

// One thread per (t, h): for each output stream j,
//   X_new[t, j, h] = post[t, j] * out[t, h] + sum_i comb[t, i, j] * X[t, i, h]   (i ascending).
__global__ void hc_post_kernel(const float* __restrict__ X, const float* __restrict__ out,
                               const float* __restrict__ post, const float* __restrict__ comb,
                               float* __restrict__ result, int n, int64_t hidden, int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    const int64_t t = e / hidden;
    const int64_t h = e % hidden;
    const float* xt = X + t * n * hidden;
    const float* c = comb + t * n * n;
    const float o = out[t * hidden + h];
    for (int j = 0; j < n; ++j) {
      float acc = __fmul_rn(post[t * n + j], o);
      for (int i = 0; i < n; ++i) acc = mul_add_rn(c[i * n + j], xt[i * hidden + h], acc);
      result[(t * n + j) * hidden + h] = acc;
    }
  }
}

// ---- The fused decode path (hc_fused_grid): one kernel per hc_pre / hc_head call. ----

// Sum over the 32 lanes by a butterfly: a fixed tree, so the same bits every run (every lane
// ends with the same value).
__device__ __forceinline__ float warp_sum_fixed(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Waits until all `ctas` CTAs of a group have arrived. slot = {count, generation} in persistent
// device memory (zero at creation): the last CTA to arrive resets the count and bumps the
// generation the others wait on, so the slot is ready for the next launch (and a graph replay)
// without a reset. The fences publish each CTA's partial sums before its arrival. Every thread
// of the CTA must call it; all CTAs of the group must be resident (hc_fused_grid).
__device__ void group_barrier(unsigned* slot, unsigned ctas) {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned* generation = slot + 1;
    const unsigned seen = *generation;  // before arriving: the bump comes after all arrivals
    __threadfence();
    if (atomicAdd(slot, 1u) == ctas - 1) {
      atomicExch(slot, 0u);
      __threadfence();
      atomicAdd(slot + 1, 1u);
    } else {
      while (*generation == seen) __nanosleep(32);
    }
    __threadfence();
  }
  __syncthreads();
}

// The trunk update of hc_post_pre: trunk = hc_post(X, out, post, comb), which the fused kernel
// computes as it reads the trunk for the mix.
struct HcTrunkUpdate {
  const float* out;   // [T, hidden]
  const float* post;  // [T, n]
  const float* comb;  // [T, n, n]
  float* trunk;       // [T, n, hidden]
};

// The arguments of hc_fused_kernel. hc_pre: rows = (2 + n) * n, post and comb set; hc_head:
// rows = n, post and comb null (pre is its only weight). hc_post_pre: hc_pre's, plus `update`.
struct HcFusedArgs {
  const float* X;        // [T, n, hidden]
  const float* fn;       // [rows, n * hidden]
  const float* base;     // [rows]
  const float* scale;    // [3] (hc_pre) or [1] (hc_head)
  float* partial;        // [groups, splits, tokens_per_cta, rows + 1] scratch
  unsigned* barrier;     // [2 * groups] {count, generation}, persistent
  float* post;           // [T, n] or null
  float* comb;           // [T, n, n] or null
  float* y;              // [T, hidden]
  HcTrunkUpdate update;  // kPost only
  int n;
  int rows;
  int64_t tokens;
  int64_t hidden;
  int64_t splits;
  int64_t chunk;
  int iters;
  float hc_eps;
  float norm_eps;
};

// Channels [h, h + 4) of stream s of token t's updated trunk (hc_post's formula in the CPU's order
// and rounding): post[s] * out[h] + sum_i comb[i][s] * X[i][h], i ascending. pw / cw: the token's
// post [n] and comb [n * n] (shared memory).
__device__ __forceinline__ float4 hc_post_quad(const float* __restrict__ xt,
                                               const float* __restrict__ ot, const float* pw,
                                               const float* cw, int n, int s, int64_t hidden,
                                               int64_t h) {
  const float4 o = __ldg(reinterpret_cast<const float4*>(ot + h));
  float4 xs[kHcFusedMaxN];
#pragma unroll
  for (int i = 0; i < kHcFusedMaxN; ++i) {
    if (i < n) xs[i] = __ldg(reinterpret_cast<const float4*>(xt + i * hidden + h));
  }
  const float p = pw[s];
  float4 v =
      make_float4(__fmul_rn(p, o.x), __fmul_rn(p, o.y), __fmul_rn(p, o.z), __fmul_rn(p, o.w));
#pragma unroll
  for (int i = 0; i < kHcFusedMaxN; ++i) {
    if (i < n) {
      const float c = cw[i * n + s];
      v.x = mul_add_rn(c, xs[i].x, v.x);
      v.y = mul_add_rn(c, xs[i].y, v.y);
      v.z = mul_add_rn(c, xs[i].z, v.z);
      v.w = mul_add_rn(c, xs[i].w, v.w);
    }
  }
  return v;
}

// hc_pre / hc_head of a decode batch in one launch. CTA (group, split) takes the TB tokens of
// its group and channels [split * chunk, +chunk) of every stream:
//  1. partial mix sums fn[r] . x and the sum of squares of its slice of each token's flattened
//     row (float4 loads of fn and X; thread rows: RG groups of ceil(24 / RG) fn rows), reduced
//     over the CTA in a fixed order and written to `partial`;
//  2. the group's barrier;
//  3. every CTA sums the group's partials in split order (so all see the same mix), scales by
//     the inverse RMS (the CPU normalises first; the GEMM sum then differs by rounding only) and
//     computes pre; split 0 of hc_pre also computes post and comb (a warp per token, on the
//     last TB warps, alongside the collapse);
//  4. the collapse y = sum_s pre[s] * X[s] of its channels, in the CPU's order and rounding.
// kPost (hc_post_pre): step 1 reads the updated trunk, computing it from X, out, post and comb
// (row group 0 writes it), and step 4 collapses it: the trunk a CTA collapses is its own slice.
template <int TB, int RG, bool kPost>
__global__ void __launch_bounds__(kHcFusedThreads, 1) hc_fused_kernel(HcFusedArgs a) {
  constexpr int kWarps = kHcFusedThreads / 32;
  constexpr int kUnitsPerPass = kHcFusedThreads / RG;
  constexpr int kWarpsPerRowGroup = kWarps / RG;
  constexpr int kRowsPerThread = (kHcFusedMaxRows + RG - 1) / RG;
  static_assert(kUnitsPerPass % 32 == 0, "a warp takes rows of one row group");
  static_assert(TB < kWarps, "one weights warp per token, and warps left to collapse");
  __shared__ float warp_sums[kWarps][TB][kRowsPerThread + 1];
  __shared__ float totals[TB][kHcFusedMaxRows + 1];  // mix row, then the sum of squares
  __shared__ float pre[TB][kHcFusedMaxN];
  __shared__ float update_post[kPost ? TB : 1][kHcFusedMaxN];
  __shared__ float update_comb[kPost ? TB : 1][kHcFusedMaxN * kHcFusedMaxN];

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int n = a.n;
  const int rows = a.rows;
  const int64_t hidden = a.hidden;
  const int64_t width = n * hidden;
  const int64_t group = blockIdx.x / a.splits;
  const int64_t split = blockIdx.x % a.splits;
  const int64_t t0 = group * TB;
  const int64_t h_begin = split * a.chunk;
  const int64_t h_end = h_begin + a.chunk < hidden ? h_begin + a.chunk : hidden;
  const int64_t quads = (h_end - h_begin) / 4;  // float4 columns of one stream in this slice
  if constexpr (kPost) {
    for (int p = tid; p < TB * n; p += kHcFusedThreads) {
      const int64_t t = t0 + p / n;
      update_post[p / n][p % n] = t < a.tokens ? a.update.post[t * n + p % n] : 0.0f;
    }
    for (int p = tid; p < TB * n * n; p += kHcFusedThreads) {
      const int64_t t = t0 + p / (n * n);
      update_comb[p / (n * n)][p % (n * n)] =
          t < a.tokens ? a.update.comb[t * n * n + p % (n * n)] : 0.0f;
    }
    __syncthreads();
  }

  // 1. Partial sums. Unit u = (stream, float4 column); thread rows r = row_group * RPT + i.
  const int row_group = tid / kUnitsPerPass;
  float acc[TB][kRowsPerThread];
  float squares[TB];
#pragma unroll
  for (int j = 0; j < TB; ++j) {
    squares[j] = 0.0f;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) acc[j][i] = 0.0f;
  }
  for (int64_t u = tid % kUnitsPerPass; u < n * quads; u += kUnitsPerPass) {
    const int64_t k = hc_fused_column(u, quads, hidden, h_begin);
    float4 x[TB];
#pragma unroll
    for (int j = 0; j < TB; ++j) {
      const int64_t t = t0 + j;
      if (t >= a.tokens) {
        x[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      } else if constexpr (kPost) {
        const int s = static_cast<int>(u / quads);
        x[j] = hc_post_quad(a.X + t * width, a.update.out + t * hidden, update_post[j],
                            update_comb[j], n, s, hidden, k - s * hidden);
        if (row_group == 0) *reinterpret_cast<float4*>(a.update.trunk + t * width + k) = x[j];
      } else {
        x[j] = __ldg(reinterpret_cast<const float4*>(a.X + t * width + k));
      }
    }
    float4 w[kRowsPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int r = row_group * kRowsPerThread + i;
      w[i] = r < rows ? __ldg(reinterpret_cast<const float4*>(a.fn + r * width + k))
                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int j = 0; j < TB; ++j) {
      if (row_group == 0) {
        squares[j] = fmaf(x[j].x, x[j].x, squares[j]);
        squares[j] = fmaf(x[j].y, x[j].y, squares[j]);
        squares[j] = fmaf(x[j].z, x[j].z, squares[j]);
        squares[j] = fmaf(x[j].w, x[j].w, squares[j]);
      }
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        acc[j][i] = fmaf(w[i].x, x[j].x, acc[j][i]);
        acc[j][i] = fmaf(w[i].y, x[j].y, acc[j][i]);
        acc[j][i] = fmaf(w[i].z, x[j].z, acc[j][i]);
        acc[j][i] = fmaf(w[i].w, x[j].w, acc[j][i]);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < TB; ++j) {
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const float v = warp_sum_fixed(acc[j][i]);
      if (lane == 0) warp_sums[warp][j][i] = v;
    }
    const float v = warp_sum_fixed(squares[j]);  // zero on warps past row group 0
    if (lane == 0) warp_sums[warp][j][kRowsPerThread] = v;
  }
  __syncthreads();
  const int stride = rows + 1;
  float* part = a.partial + (group * a.splits + split) * TB * stride;
  for (int p = tid; p < TB * stride; p += kHcFusedThreads) {
    const int j = p / stride;
    const int r = p % stride;
    const int g = r < rows ? r / kRowsPerThread : 0;
    const int slot = r < rows ? r % kRowsPerThread : kRowsPerThread;
    float sum = 0.0f;
    for (int w = g * kWarpsPerRowGroup; w < (g + 1) * kWarpsPerRowGroup; ++w) {
      sum += warp_sums[w][j][slot];
    }
    part[p] = sum;
  }

  // 2. Meet the group's other CTAs.
  if (a.splits > 1)
    group_barrier(a.barrier + 2 * group, static_cast<unsigned>(a.splits));
  else
    __syncthreads();

  // 3. The mix rows this CTA needs (all for split 0 of hc_pre, else pre's n) and the squares,
  // summed over the splits in order: lanes take splits, then the fixed butterfly.
  const bool weights_cta = a.post != nullptr && split == 0;
  const int needed = weights_cta ? rows : n;
  const float* group_part = a.partial + group * a.splits * TB * stride;
  for (int p = warp; p < TB * (needed + 1); p += kWarps) {
    const int j = p / (needed + 1);
    const int r = p % (needed + 1) < needed ? p % (needed + 1) : rows;
    float sum = 0.0f;
    for (int64_t sp = lane; sp < a.splits; sp += 32) {
      sum += __ldcg(group_part + (sp * TB + j) * stride + r);
    }
    sum = warp_sum_fixed(sum);
    if (lane == 0) totals[j][r] = sum;
  }
  __syncthreads();
  for (int p = tid; p < TB * needed; p += kHcFusedThreads) {
    const int j = p / needed;
    const float inv_rms = 1.0f / sqrtf(totals[j][rows] / static_cast<float>(width) + a.norm_eps);
    totals[j][p % needed] *= inv_rms;
  }
  __syncthreads();
  for (int p = tid; p < TB * n; p += kHcFusedThreads) {
    pre[p / n][p % n] = hc_pre_weight(totals[p / n], a.base, a.scale[0], p % n, a.hc_eps);
  }
  __syncthreads();
  // Split 0 of hc_pre: post and comb, token j on warp kWarps - TB + j (hc_comb_warp, as the
  // unfused finish kernel), while the other warps collapse.
  if (weights_cta && warp >= kWarps - TB) {
    const int j = warp - (kWarps - TB);
    const int64_t t = t0 + j;
    if (t >= a.tokens) return;  // uniform over the warp, as the shuffles need
    const float* m = totals[j];
    float* post = a.post + t * n;
    float* comb = a.comb + t * n * n;
    switch (n) {
      case 1:
        hc_comb_warp<1>(m, a.base, a.scale, a.iters, a.hc_eps, nullptr, post, comb);
        break;
      case 2:
        hc_comb_warp<2>(m, a.base, a.scale, a.iters, a.hc_eps, nullptr, post, comb);
        break;
      case 3:
        hc_comb_warp<3>(m, a.base, a.scale, a.iters, a.hc_eps, nullptr, post, comb);
        break;
      case 4:
        hc_comb_warp<4>(m, a.base, a.scale, a.iters, a.hc_eps, nullptr, post, comb);
        break;
      default:
        break;  // n <= kHcFusedMaxN (hc_fused_grid)
    }
    return;  // no barrier follows
  }

  // 4. The collapse of this CTA's channels, float4 at a time. kPost: the trunk this CTA wrote
  // (the barrier above orders it; coherent loads, not the read-only path).
  const float* collapsed = kPost ? a.update.trunk : a.X;
  const int collapse_threads = weights_cta ? kHcFusedThreads - 32 * TB : kHcFusedThreads;
  for (int64_t o = tid; o < TB * quads; o += collapse_threads) {
    const int j = static_cast<int>(o / quads);
    const int64_t t = t0 + j;
    if (t >= a.tokens) break;  // o ascends with j
    const int64_t h = h_begin + o % quads * 4;
    const float* xt = collapsed + t * width + h;
    float4 xs[kHcFusedMaxN];
#pragma unroll
    for (int s = 0; s < kHcFusedMaxN; ++s) {
      if (s < n) {
        xs[s] = kPost ? __ldcg(reinterpret_cast<const float4*>(xt + s * hidden))
                      : __ldg(reinterpret_cast<const float4*>(xt + s * hidden));
      }
    }
    const float* pt = pre[j];
    float4 y = make_float4(__fmul_rn(pt[0], xs[0].x), __fmul_rn(pt[0], xs[0].y),
                           __fmul_rn(pt[0], xs[0].z), __fmul_rn(pt[0], xs[0].w));
#pragma unroll
    for (int s = 1; s < kHcFusedMaxN; ++s) {
      if (s < n) {
        y.x = mul_add_rn(pt[s], xs[s].x, y.x);
        y.y = mul_add_rn(pt[s], xs[s].y, y.y);
        y.z = mul_add_rn(pt[s], xs[s].z, y.z);
        y.w = mul_add_rn(pt[s], xs[s].w, y.w);
      }
    }
    *reinterpret_cast<float4*>(a.y + t * hidden + h) = y;
  }
}

// Whether the fused kernel takes a call on X [T, n, H] with weights fn: the backend's switch, a
// decode size (hc_fused_grid) and 16-byte aligned rows (float4 loads).
bool hc_fused_applies(const CudaBackend& be, const Tensor& X, const Tensor& fn,
                      const HcParams& params) {
  return be.hc_fused() && hc_fused_grid(be.num_sms(), X.size(0), params.hc_mult, X.size(2)).fused &&
         aligned16(X.raw_data()) && aligned16(fn.raw_data());
}

// Launches hc_fused_kernel when hc_fused_applies; false leaves the call to the unfused path.
// post / comb null: hc_head. update set (hc_post_pre): X is the trunk before hc_post.
bool launch_hc_fused(CudaBackend& be, const Tensor& X, const Tensor& fn, const Tensor& base,
                     const Tensor& scale, const HcParams& params, float* post, float* comb,
                     float* y, const char* op, const HcTrunkUpdate* update = nullptr) {
  if (!hc_fused_applies(be, X, fn, params)) return false;
  const int64_t tokens = X.size(0);
  const int n = params.hc_mult;
  const int64_t hidden = X.size(2);
  const HcFusedGrid g = hc_fused_grid(be.num_sms(), tokens, n, hidden);
  HcFusedArgs a{};
  a.rows = post != nullptr ? (2 + n) * n : n;
  Tensor partial = be.scratch(static_cast<size_t>(g.groups * g.splits * g.tokens_per_cta) *
                              static_cast<size_t>(a.rows + 1) * sizeof(float));
  a.X = X.data<float>();
  a.fn = fn.data<float>();
  a.base = base.data<float>();
  a.scale = scale.data<float>();
  a.partial = reinterpret_cast<float*>(partial.raw_data());
  a.barrier = be.hc_barrier();
  a.post = post;
  a.comb = comb;
  a.y = y;
  if (update != nullptr) a.update = *update;
  a.n = n;
  a.tokens = tokens;
  a.hidden = hidden;
  a.splits = g.splits;
  a.chunk = g.chunk;
  a.iters = params.sinkhorn_iters;
  a.hc_eps = params.hc_eps;
  a.norm_eps = params.norm_eps;
  const unsigned blocks = static_cast<unsigned>(g.groups * g.splits);
  // 4 tokens per CTA: 2 row groups of 12 fn rows; hc_post_pre's trunk update holds more
  // registers, so 4 row groups of 6 there.
  if (g.tokens_per_cta == 1) {
    if (update != nullptr) {
      hc_fused_kernel<1, 4, true><<<blocks, kHcFusedThreads, 0, be.stream()>>>(a);
    } else {
      hc_fused_kernel<1, 4, false><<<blocks, kHcFusedThreads, 0, be.stream()>>>(a);
    }
  } else if (update != nullptr) {
    hc_fused_kernel<4, 4, true><<<blocks, kHcFusedThreads, 0, be.stream()>>>(a);
  } else {
    hc_fused_kernel<4, 2, false><<<blocks, kHcFusedThreads, 0, be.stream()>>>(a);
  }
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return true;
}

// mix = linear(rms_norm(flatten(X)), fn), the CPU's hc_mix: unweighted norm, then fp32 GEMM. With
// no channels the CPU's GEMM sums nothing: mix = 0 (and cuBLAS rejects K = 0).
Tensor hc_mix(Backend& be, const Tensor& X, const Tensor& fn, const HcParams& params) {
  const int64_t tokens = X.size(0);
  const int64_t width = X.size(1) * X.size(2);
  const int64_t fn_rows = static_cast<int64_t>(2 + params.hc_mult) * params.hc_mult;
  return width > 0
             ? be.linear(be.rms_norm(X.reshape({tokens, width}), Tensor(), params.norm_eps), fn)
             : be.zeros({tokens, fn_rows}, DType::kF32);
}

// Launches hc_pre_finish_kernel for the mix of a.X; fills the launch shape of `a`.
void launch_hc_pre_finish(HcFinishArgs a, int num_sms, cudaStream_t stream, const char* op) {
  const CollapseGrid g = collapse_grid(num_sms, a.tokens, a.hidden);
  a.weight_blocks = hc_weight_blocks(a.n, a.tokens);
  a.splits = g.splits;
  a.chunk = g.chunk;
  const size_t smem = static_cast<size_t>(a.n + a.n * a.n) * sizeof(float);
  hc_pre_finish_kernel<<<static_cast<unsigned>(a.weight_blocks + a.tokens * g.splits), kHcThreads,
                         smem, stream>>>(a);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
}

}  // namespace

Tensor CudaBackend::hc_expand_impl(const Tensor& x, int hc_mult) {
  const char* op = "hc_expand";
  const int64_t tokens = x.size(0);
  const int64_t hidden = x.size(1);
  Tensor out = empty({tokens, hc_mult, hidden}, DType::kF32);
  const int64_t total = out.numel();
  if (total == 0) return out;
  hc_expand_kernel<<<elementwise_blocks(num_sms(), total), kElementwiseThreads, 0, stream()>>>(
      x.data<float>(), out.data<float>(), hc_mult, hidden, total);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

HcMix CudaBackend::hc_pre_impl(const Tensor& X, const Tensor& fn, const Tensor& base,
                               const Tensor& scale, const HcParams& params) {
  const auto [tokens, n, hidden] = hc_shape("hc_pre", X, params);
  HcMix result{empty({tokens, n}, DType::kF32), empty({tokens, n, n}, DType::kF32),
               empty({tokens, hidden}, DType::kF32)};
  if (tokens == 0) return result;
  if (launch_hc_fused(*this, X, fn, base, scale, params, result.post.data<float>(),
                      result.comb.data<float>(), result.y.data<float>(), "hc_pre")) {
    return result;
  }
  Tensor mix = hc_mix(*this, X, fn, params);
  HcFinishArgs a{};
  a.X = X.data<float>();
  a.mix = mix.data<float>();
  a.base = base.data<float>();
  a.scale = scale.data<float>();
  a.post = result.post.data<float>();
  a.comb = result.comb.data<float>();
  a.y = result.y.data<float>();
  a.n = n;
  a.tokens = tokens;
  a.hidden = hidden;
  a.iters = params.sinkhorn_iters;
  a.eps = params.hc_eps;
  launch_hc_pre_finish(a, num_sms(), stream(), "hc_pre");
  return result;
}

HcShiftedMix CudaBackend::hc_pre_shifted_impl(const Tensor& X, const Tensor& fn, const Tensor& base,
                                              const Tensor& scale, const Tensor& prev_pre,
                                              const HcParams& params) {
  const auto [tokens, n, hidden] = hc_shape("hc_pre_shifted", X, params);
  HcShiftedMix result{empty({tokens, n}, DType::kF32), empty({tokens, n}, DType::kF32),
                      empty({tokens, n, n}, DType::kF32), empty({tokens, hidden}, DType::kF32)};
  if (tokens == 0) return result;
  Tensor mix = hc_mix(*this, X, fn, params);
  HcFinishArgs a{};
  a.X = X.data<float>();
  a.mix = mix.data<float>();
  a.base = base.data<float>();
  a.scale = scale.data<float>();
  a.prev_pre = prev_pre.defined() ? prev_pre.data<float>() : nullptr;
  a.pre = result.pre.data<float>();
  a.post = result.post.data<float>();
  a.comb = result.comb.data<float>();
  a.y = result.y.data<float>();
  a.n = n;
  a.tokens = tokens;
  a.hidden = hidden;
  a.iters = params.sinkhorn_iters;
  a.eps = params.hc_eps;
  launch_hc_pre_finish(a, num_sms(), stream(), "hc_pre_shifted");
  return result;
}

Tensor CudaBackend::hc_post_impl(const Tensor& X, const Tensor& out, const Tensor& post,
                                 const Tensor& comb) {
  const char* op = "hc_post";
  const int64_t tokens = X.size(0);
  const int64_t n = X.size(1);
  const int64_t hidden = X.size(2);
  Tensor result = empty(X.shape(), DType::kF32);
  const int64_t total = tokens * hidden;
  if (total == 0 || n == 0) return result;
  hc_post_kernel<<<elementwise_blocks(num_sms(), total), kElementwiseThreads, 0, stream()>>>(
      X.data<float>(), out.data<float>(), post.data<float>(), comb.data<float>(),
      result.data<float>(), static_cast<int>(n), hidden, total);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return result;
}

HcPostPre CudaBackend::hc_post_pre_impl(const Tensor& X, const Tensor& out, const Tensor& post,
                                        const Tensor& comb, const Tensor& fn, const Tensor& base,
                                        const Tensor& scale, const HcParams& params) {
  if (!hc_fused_applies(*this, X, fn, params) || !aligned16(out.raw_data())) {
    return Backend::hc_post_pre_impl(X, out, post, comb, fn, base, scale, params);
  }
  const int64_t tokens = X.size(0);
  const int64_t n = params.hc_mult;
  const int64_t hidden = X.size(2);
  HcPostPre result{empty(X.shape(), DType::kF32),
                   HcMix{empty({tokens, n}, DType::kF32), empty({tokens, n, n}, DType::kF32),
                         empty({tokens, hidden}, DType::kF32)}};
  const HcTrunkUpdate update{out.data<float>(), post.data<float>(), comb.data<float>(),
                             result.trunk.data<float>()};
  if (!launch_hc_fused(*this, X, fn, base, scale, params, result.mix.post.data<float>(),
                       result.mix.comb.data<float>(), result.mix.y.data<float>(), "hc_post_pre",
                       &update)) {
    return Backend::hc_post_pre_impl(X, out, post, comb, fn, base, scale, params);
  }
  return result;
}

Tensor CudaBackend::hc_head_impl(const Tensor& X, const Tensor& fn, const Tensor& base,
                                 const Tensor& scale, const HcParams& params) {
  const auto [tokens, n, hidden] = hc_shape("hc_head", X, params);
  Tensor y = empty({tokens, hidden}, DType::kF32);
  if (tokens == 0 || hidden == 0) return y;  // nothing to collapse (and no empty grid)
  if (launch_hc_fused(*this, X, fn, base, scale, params, nullptr, nullptr, y.data<float>(),
                      "hc_head")) {
    return y;
  }
  Tensor mix = hc_mix(*this, X, fn, params);  // width = n * hidden > 0 here
  const CollapseGrid g = collapse_grid(num_sms(), tokens, hidden);
  const size_t smem = static_cast<size_t>(n) * sizeof(float);
  hc_head_finish_kernel<<<static_cast<unsigned>(tokens * g.splits), kHcThreads, smem, stream()>>>(
      X.data<float>(), mix.data<float>(), base.data<float>(), scale.data<float>(), n, hidden,
      params.hc_eps, g.splits, g.chunk, y.data<float>());
  DEEPINFER_CUDA_LAUNCH_CHECK("hc_head");
  return y;
}

Tensor CudaBackend::hc_collapse_impl(const Tensor& X, const Tensor& pre) {
  const char* op = "hc_collapse";
  const int64_t tokens = X.size(0);
  const int64_t n = X.size(1);
  const int64_t hidden = X.size(2);
  if (n > kMaxHcMult) {
    fail(op, "the CUDA backend supports up to " + std::to_string(kMaxHcMult) + " streams, got X " +
                 X.describe());
  }
  Tensor y = empty({tokens, hidden}, DType::kF32);
  if (tokens == 0 || hidden == 0) return y;
  const CollapseGrid g = collapse_grid(num_sms(), tokens, hidden);
  const size_t smem = static_cast<size_t>(n) * sizeof(float);
  hc_collapse_kernel<<<static_cast<unsigned>(tokens * g.splits), kHcThreads, smem, stream()>>>(
      X.data<float>(), pre.data<float>(), static_cast<int>(n), hidden, g.splits, g.chunk,
      y.data<float>());
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return y;
}

}  // namespace deepinfer::cuda
