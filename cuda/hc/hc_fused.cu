// The fused decode path of the mHC ops (hc_launch.h): at decode sizes (hc_fused_grid: T <= 256,
// n <= 4) hc_pre, hc_head and hc_post_pre are one kernel each, hc_fused_kernel: the GEMV split
// over the channels across the CTAs of a cluster per token group, the cluster's barrier, then
// each CTA finishes the mix, the weights and its channels of the collapse. DEEPINFER_HC_PRE
// chooses where it runs (CudaBackend::hc_pre_choice: by default up to kHcFusedAutoMaxTokens
// tokens). The weights and the collapse are the CPU's arithmetic (hc_weights.cuh); the mix
// differs from the CPU's GEMM by summation order only. With the sub-layer's RMSNorm of y
// (RowNorm) the kernel writes y normed, in rms_norm's arithmetic (rms_norm_math.cuh): no
// norm launch between the mix and the sub-layer.
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/hc/hc_fused_trace.cuh"
#include "cuda/hc/hc_heuristics.h"
#include "cuda/hc/hc_launch.h"
#include "cuda/hc/hc_weights.cuh"
#include "cuda/norm/rms_norm_math.cuh"

namespace deepinfer::cuda {

namespace {

namespace cg = cooperative_groups;

// The arguments of hc_fused_kernel. hc_pre: rows = (2 + n) * n, post and comb set; hc_head:
// rows = n, post and comb null (pre is its only weight). hc_post_pre: hc_pre's, plus `update`.
struct HcFusedArgs {
  const float* X;       // [T, n, hidden]
  const float* fn;      // [rows, n * hidden]
  const float* base;    // [rows]
  const float* scale;   // [3] (hc_pre) or [1] (hc_head)
  float* partial;       // [groups, splits, tokens_per_cta, rows + 1] scratch
  float* post;          // [T, n] or null
  float* comb;          // [T, n, n] or null
  float* y;             // [T, hidden]
  const float* y_norm;  // [hidden]: y is rms_norm(y, y_norm, y_norm_eps); null: y as collapsed
  float y_norm_eps;
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
  HcFusedTraceBuffer trace;  // the trace instantiations' records (hc_fused_trace.h)
};

// Channels [h, h + 4) of a token's collapse y = sum_s pre[s] * X[s] in the CPU's order and
// rounding. xt: the token's trunk row at channel h; kCoherent: the trunk was written in this
// kernel (by the cluster's CTAs; not the read-only path).
template <bool kCoherent>
__device__ __forceinline__ float4 hc_collapse_quad(const float* xt, const float* pt, int n,
                                                   int64_t hidden) {
  float4 xs[kHcFusedMaxN];
#pragma unroll
  for (int s = 0; s < kHcFusedMaxN; ++s) {
    if (s < n) {
      xs[s] = kCoherent ? __ldcg(reinterpret_cast<const float4*>(xt + s * hidden))
                        : __ldg(reinterpret_cast<const float4*>(xt + s * hidden));
    }
  }
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
  return y;
}

// hc_pre / hc_head of a decode batch in one launch. CTA (group, split) takes the TB tokens of
// its group and channels [split * chunk, +chunk) of every stream:
//  1. partial mix sums fn[r] . x and the sum of squares of its slice of each token's flattened
//     row (float4 loads of fn and X; thread rows: RG groups of ceil(24 / RG) fn rows), reduced
//     over the CTA in a fixed order and written to `partial`;
//  2. the cluster's barrier (release / acquire at cluster scope: the partials in global memory
//     are visible to the group's other CTAs after it);
//  3. every CTA sums the group's partials in split order (so all see the same mix), scales by
//     the inverse RMS (the CPU normalises first; the GEMM sum then differs by rounding only) and
//     computes pre; split 0 of hc_pre also computes post and comb (a warp per token, on the
//     last TB warps, alongside the collapse);
//  4. the collapse y = sum_s pre[s] * X[s] of its channels, in the CPU's order and rounding;
//     with y_norm, first the sum of squares of the token's whole y (every CTA collapses all
//     channels for it, the loads of kNormUnits quads in flight: the trunk is in L2 by now, and
//     no second cluster barrier is needed), then its channels normed as rms_norm does.
// kPost (hc_post_pre): step 1 reads the updated trunk, computing it from X, out, post and comb
// (row group 0 writes it), and step 4 collapses it: the trunk a CTA collapses is its own slice
// (with y_norm, its squares read the slices of the group's other CTAs too, ordered by step 2).
// kTrace: the trace instantiation, stamping each phase's end (hc_fused_trace.cuh).
template <int TB, int RG, bool kPost, int U, bool kTrace>
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
  __shared__ double norm_sums[kWarps][TB];

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
  const int quads = static_cast<int>((h_end - h_begin) / 4);  // float4 columns of a stream here
  const HcFusedTraceRecorder<kTrace> trace(a.trace);
  trace.start();
  {
    // Before the wait for the previous kernel (pdl.cuh; no kernel writes fn): this CTA's slice of
    // fn, rows x n segments of h_end - h_begin channels, into L2, a 128-byte line per prefetch.
    const int lines = (4 * quads + 31) / 32;
    for (int i = tid; i < rows * n * lines; i += kHcFusedThreads) {
      const int seg = i / lines;
      const int r = seg / n;
      const float* p = a.fn + r * width + (seg - r * n) * hidden + h_begin + 32 * (i - seg * lines);
      prefetch_l2(p);
    }
  }
  trace.stamp(kHcTracePrefetched);
  enter_dependent_grid();
  trace.stamp(kHcTraceWaited);
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
  trace.stamp(kHcTraceStaged);

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
  // U units per pass: all their loads are issued before the first multiply (a thread's units
  // are few, 4 at one token over 16 CTAs, and each was an L2/DRAM round trip of its own). The
  // units are still added in ascending order, so the bits do not depend on U.
  const int units = n * quads;
  for (int u0 = tid % kUnitsPerPass; u0 < units; u0 += U * kUnitsPerPass) {
    float4 x[U][TB];
    float4 w[U][kRowsPerThread];
#pragma unroll
    for (int v = 0; v < U; ++v) {
      const int u = u0 + v * kUnitsPerPass;
      const bool in = u < units;
      const int64_t k = hc_fused_column(in ? u : u0, quads, hidden, h_begin);
#pragma unroll
      for (int j = 0; j < TB; ++j) {
        const int64_t t = t0 + j;
        if (!in || t >= a.tokens) {
          x[v][j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        } else if constexpr (kPost) {
          const int s = u / quads;
          x[v][j] = hc_post_quad(a.X + t * width, a.update.out + t * hidden, update_post[j],
                                 update_comb[j], n, s, hidden, k - s * hidden);
        } else {
          x[v][j] = __ldg(reinterpret_cast<const float4*>(a.X + t * width + k));
        }
      }
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        const int r = row_group * kRowsPerThread + i;
        w[v][i] = in && r < rows ? __ldg(reinterpret_cast<const float4*>(a.fn + r * width + k))
                                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
#pragma unroll
    for (int v = 0; v < U; ++v) {
      const int u = u0 + v * kUnitsPerPass;
      if (u >= units) break;
      if constexpr (kPost) {
        if (row_group == 0) {
          const int64_t k = hc_fused_column(u, quads, hidden, h_begin);
#pragma unroll
          for (int j = 0; j < TB; ++j) {
            if (t0 + j < a.tokens) {
              *reinterpret_cast<float4*>(a.update.trunk + (t0 + j) * width + k) = x[v][j];
            }
          }
        }
      }
#pragma unroll
      for (int j = 0; j < TB; ++j) {
        if (row_group == 0) {
          squares[j] = fmaf(x[v][j].x, x[v][j].x, squares[j]);
          squares[j] = fmaf(x[v][j].y, x[v][j].y, squares[j]);
          squares[j] = fmaf(x[v][j].z, x[v][j].z, squares[j]);
          squares[j] = fmaf(x[v][j].w, x[v][j].w, squares[j]);
        }
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) {
          acc[j][i] = fmaf(w[v][i].x, x[v][j].x, acc[j][i]);
          acc[j][i] = fmaf(w[v][i].y, x[v][j].y, acc[j][i]);
          acc[j][i] = fmaf(w[v][i].z, x[v][j].z, acc[j][i]);
          acc[j][i] = fmaf(w[v][i].w, x[v][j].w, acc[j][i]);
        }
      }
    }
  }
  trace.stamp(kHcTraceMixed);
#pragma unroll
  for (int j = 0; j < TB; ++j) {
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const float v = warp_sum(acc[j][i]);
      if (lane == 0) warp_sums[warp][j][i] = v;
    }
    const float v = warp_sum(squares[j]);  // zero on warps past row group 0
    if (lane == 0) warp_sums[warp][j][kRowsPerThread] = v;
  }
  __syncthreads();
  trace.stamp(kHcTraceReduced);
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

  trace.stamp(kHcTracePartials);

  // 2. Meet the group's other CTAs (the cluster is the group).
  if (a.splits > 1)
    cg::this_cluster().sync();
  else
    __syncthreads();
  trace.stamp(kHcTraceClusterMet);

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
    sum = warp_sum(sum);
    if (lane == 0) totals[j][r] = sum;
  }
  __syncthreads();
  trace.stamp(kHcTraceSummed);
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
  trace.stamp(kHcTracePre);
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
    if (j == 0 && lane == 0) trace.stamp_here(kHcTraceWeights);
    return;  // no barrier follows
  }

  // 4. The collapse of this CTA's channels, float4 at a time. kPost: the trunk this CTA wrote
  // (the barrier above orders it; coherent loads, not the read-only path).
  const float* collapsed = kPost ? a.update.trunk : a.X;
  const int collapse_threads = weights_cta ? kHcFusedThreads - 32 * TB : kHcFusedThreads;
  float inv[TB];
#pragma unroll
  for (int j = 0; j < TB; ++j) inv[j] = 1.0f;
  if (a.y_norm != nullptr) {
    // The squares of each token's whole y, in double; the collapse warps' sums meet at a named
    // barrier (split 0's weights warps have left).
    constexpr int kNormUnits = 4;
    const int all_quads = static_cast<int>(hidden / 4);
#pragma unroll
    for (int j = 0; j < TB; ++j) {
      if (t0 + j >= a.tokens) continue;
      double squares_y = 0.0;
      const float* xt = collapsed + (t0 + j) * width;
      for (int q0 = tid; q0 < all_quads; q0 += kNormUnits * collapse_threads) {
        float4 y[kNormUnits];
#pragma unroll
        for (int v = 0; v < kNormUnits; ++v) {
          const int q = q0 + v * collapse_threads;
          y[v] = q < all_quads
                     ? hc_collapse_quad<kPost>(xt + 4 * static_cast<int64_t>(q), pre[j], n, hidden)
                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int v = 0; v < kNormUnits; ++v) squares_y = add_squares(squares_y, y[v]);
      }
      squares_y = warp_sum(squares_y);
      if (lane == 0) norm_sums[warp][j] = squares_y;
    }
    named_barrier_sync(1, collapse_threads);
    trace.stamp(kHcTraceNormed);
#pragma unroll
    for (int j = 0; j < TB; ++j) {
      double total = 0.0;
      for (int w = 0; w < collapse_threads / 32; ++w) total += norm_sums[w][j];
      inv[j] = rms_inv(total, hidden, a.y_norm_eps);
    }
  }
  for (int o = tid; o < TB * quads; o += collapse_threads) {
    const int j = o / quads;
    const int64_t t = t0 + j;
    if (t >= a.tokens) break;  // o ascends with j
    const int64_t h = h_begin + static_cast<int64_t>(o - j * quads) * 4;
    float4 y = hc_collapse_quad<kPost>(collapsed + t * width + h, pre[j], n, hidden);
    if (a.y_norm != nullptr) {
      float inv_j = inv[0];
#pragma unroll
      for (int jj = 1; jj < TB; ++jj) inv_j = j == jj ? inv[jj] : inv_j;
      y = norm_scale(y, inv_j, __ldg(reinterpret_cast<const float4*>(a.y_norm + h)));
    }
    *reinterpret_cast<float4*>(a.y + t * hidden + h) = y;
  }
  trace.finish();
}

// The kernel's instantiations: one token per CTA (4 units' loads at once) or 4 (2 at once);
// hc_post_pre's trunk update holds more registers, so 4 row groups of 6 fn rows there, and 2 row
// groups of 12 for hc_pre / hc_head at 4 tokens. kTrace: the same, traced.
template <bool kTrace>
struct HcFusedKernels {
  static constexpr auto kOne = hc_fused_kernel<1, 4, false, 4, kTrace>;
  static constexpr auto kOnePost = hc_fused_kernel<1, 4, true, 4, kTrace>;
  static constexpr auto kFour = hc_fused_kernel<4, 2, false, 2, kTrace>;
  static constexpr auto kFourPost = hc_fused_kernel<4, 4, true, 2, kTrace>;
};

}  // namespace

HcFusedClusters hc_fused_max_cluster(KernelSmemLimits& limits) {
  HcFusedClusters c{static_cast<int>(kHcFusedWideCluster), 0};
  using Traced = HcFusedKernels<true>;
  for (const auto kernel : {Traced::kOne, Traced::kOnePost, Traced::kFour, Traced::kFourPost}) {
    // The trace instantiations run at the size the ordinary ones get (benchmarks only).
    DEEPINFER_CUDA_THROW_IF_ERROR(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
        "allowing the traced fused hc kernel a non-portable cluster");
  }
  using Kernels = HcFusedKernels<false>;
  for (const auto kernel : {Kernels::kOne, Kernels::kOnePost, Kernels::kFour, Kernels::kFourPost}) {
    DEEPINFER_CUDA_THROW_IF_ERROR(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
        "allowing the fused hc kernel a non-portable cluster");
    try {
      const int n = limits.max_active_clusters(kernel, dim3(kHcFusedThreads),
                                               dim3(static_cast<unsigned>(kHcFusedWideCluster)), 0);
      c.at_once = c.at_once == 0 ? n : std::min(c.at_once, n);
    } catch (const Error&) {
      // None fits, or the device refuses the size: the portable clusters.
      (void)cudaGetLastError();
      c.max_cluster = static_cast<int>(kHcFusedPortableCluster);
      c.at_once = 0;
      break;
    }
  }
  return c;
}

bool hc_fused_applies(const CudaBackend& be, const Tensor& X, const Tensor& fn,
                      const HcParams& params) {
  const HcFusedGrid g = hc_fused_grid(be.num_sms(), X.size(0), params.hc_mult, X.size(2),
                                      be.hc_fused_cluster(X.size(0)));
  return hc_fused_chosen(be.hc_pre_choice(), g, X.size(0)) && aligned16(X.raw_data()) &&
         aligned16(fn.raw_data());
}

bool launch_hc_fused(CudaBackend& be, const Tensor& X, const Tensor& fn, const Tensor& base,
                     const Tensor& scale, const HcParams& params, float* post, float* comb,
                     float* y, const RowNorm& y_norm, const char* op, const HcTrunkUpdate* update) {
  const bool norm = y_norm.weight.defined();
  if (!hc_fused_applies(be, X, fn, params) || (norm && !aligned16(y_norm.weight.raw_data()))) {
    return false;
  }
  const int64_t tokens = X.size(0);
  const int n = params.hc_mult;
  const int64_t hidden = X.size(2);
  const HcFusedGrid g = hc_fused_grid(be.num_sms(), tokens, n, hidden, be.hc_fused_cluster(tokens));
  HcFusedArgs a{};
  a.rows = post != nullptr ? (2 + n) * n : n;
  Tensor partial = be.scratch(static_cast<size_t>(g.groups * g.splits * g.tokens_per_cta) *
                              static_cast<size_t>(a.rows + 1) * sizeof(float));
  a.X = X.data<float>();
  a.fn = fn.data<float>();
  a.base = base.data<float>();
  a.scale = scale.data<float>();
  a.partial = reinterpret_cast<float*>(partial.raw_data());
  a.post = post;
  a.comb = comb;
  a.y = y;
  a.y_norm = norm ? y_norm.weight.data<float>() : nullptr;
  a.y_norm_eps = y_norm.eps;
  if (update != nullptr) a.update = *update;
  a.n = n;
  a.tokens = tokens;
  a.hidden = hidden;
  a.splits = g.splits;
  a.chunk = g.chunk;
  a.iters = params.sinkhorn_iters;
  a.hc_eps = params.hc_eps;
  a.norm_eps = params.norm_eps;
  ClusterLaunch l;
  l.grid = dim3(static_cast<unsigned>(g.groups * g.splits));
  l.block = dim3(kHcFusedThreads);
  l.cluster = dim3(static_cast<unsigned>(g.splits), 1, 1);
  l.stream = be.stream();
  l.pdl = be.pdl();
  a.trace = be.hc_fused_trace();
  const auto launch = [&]<bool kTrace>() {
    using K = HcFusedKernels<kTrace>;
    if (g.tokens_per_cta == 1) {
      launch_clustered(op, l, update != nullptr ? K::kOnePost : K::kOne, a);
    } else {
      launch_clustered(op, l, update != nullptr ? K::kFourPost : K::kFour, a);
    }
  };
  if (a.trace.stamps != nullptr) {
    launch.template operator()<true>();
  } else {
    launch.template operator()<false>();
  }
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return true;
}

HcPostPre CudaBackend::hc_post_pre_impl(const Tensor& X, const Tensor& out, const Tensor& post,
                                        const Tensor& comb, const Tensor& fn, const Tensor& base,
                                        const Tensor& scale, const HcParams& params,
                                        const RowNorm& y_norm) {
  if (!hc_fused_applies(*this, X, fn, params) || !aligned16(out.raw_data())) {
    return hc_post_pre_unfused(X, out, post, comb, fn, base, scale, params, y_norm);
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
                       result.mix.comb.data<float>(), result.mix.y.data<float>(), y_norm,
                       "hc_post_pre", &update)) {
    return hc_post_pre_unfused(X, out, post, comb, fn, base, scale, params, y_norm);
  }
  return result;
}

HcPostPre CudaBackend::hc_post_pre_unfused(const Tensor& X, const Tensor& out, const Tensor& post,
                                           const Tensor& comb, const Tensor& fn, const Tensor& base,
                                           const Tensor& scale, const HcParams& params,
                                           const RowNorm& y_norm) {
  const int64_t tokens = X.size(0);
  const int64_t n = params.hc_mult;
  const int64_t hidden = X.size(2);
  const HcMixSplitGrid g = hc_mix_split_grid(num_sms(), tokens, params.hc_mult, hidden);
  if (hc_mix_split_chosen(hc_pre_choice(), g)) {
    HcPostPre result{empty(X.shape(), DType::kF32),
                     HcMix{empty({tokens, n}, DType::kF32), empty({tokens, n, n}, DType::kF32),
                           empty({tokens, hidden}, DType::kF32)}};
    const HcTrunkUpdate update{out.data<float>(), post.data<float>(), comb.data<float>(),
                               result.trunk.data<float>()};
    if (hc_post_pre_split(*this, X, fn, base, scale, params, update, result.trunk, result.mix)) {
      if (y_norm.weight.defined()) {
        result.mix.y = rms_norm_impl(result.mix.y, y_norm.weight, y_norm.eps);
      }
      return result;
    }
  }
  return Backend::hc_post_pre_impl(X, out, post, comb, fn, base, scale, params, y_norm);
}

}  // namespace deepinfer::cuda
