// Hyper-connection (mHC) ops of the CUDA backend that mix the streams
// (docs/model.md#hyper-connections): pre (weights + collapse), head (final collapse), and V4.1's
// shifted pre and plain collapse (docs/model.md#v41-ops). They follow the CPU reference
// (cpp/src/backend/cpu_ops_hc.cpp) step by step, and reuse this backend's own ops where the CPU
// does the same computation:
//   mix = linear(rms_norm(flatten(X)), fn)   (the CPU's hc_mix: unweighted norm, then fp32 GEMM)
// (at decode and small prefill sizes as K-split partial sums instead: hc_mix.cu; the finish
// kernel sums them) then one kernel finishes hc_pre / hc_pre_shifted / hc_head. At decode (T = 1)
// its cost is latency, not work, so:
//  - comb (softmax + Sinkhorn over n x n) is a serial chain per token; one warp per token runs it
//    with lane = matrix element and shuffles for the row / column sums (a block in shared memory
//    when n * n > 32), in blocks of their own that run alongside the collapse;
//  - the collapse y = sum_s pre[s] * X[s] is split over the channels into many blocks (about one
//    channel per thread at small T), each recomputing the n sigmoids of pre it needs.
// At decode sizes hc_pre and hc_head may instead be one kernel (hc_fused.cu, opt-in). The
// weights and the collapse are the CPU's arithmetic exactly (hc_weights.cuh); differences come
// from the GEMM's summation order and from expf (within 2 ulp of glibc's). hc_expand and hc_post
// are in hc_post.cu.
#include <cstdint>
#include <string>
#include <utility>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/hc/hc_heuristics.h"
#include "cuda/hc/hc_launch.h"
#include "cuda/hc/hc_weights.cuh"

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

// Where a finish kernel reads the mix: rows [T, rows], or hc_mix_split_kernel's partial sums
// [splits, T, rows + 1] (the squares last) of a flattened row of `width` columns.
struct HcMixSource {
  const float* mix = nullptr;
  int64_t splits = 0;  // 0: mix holds the rows
  int64_t width = 0;
  float norm_eps = 0.0f;  // the rms_norm's (the partial sums are of X itself)
};

// Mix rows [0, count) of token t (count <= kHcFusedMaxRows) into `m` (shared memory) from the
// partial sums, by one whole warp: lane l sums splits l, l + 32, ... in order, the butterfly adds
// the lanes, and the squares give the inverse RMS, as hc_fused_kernel scales its totals. A row's
// value depends on neither count nor the calling block, so every block finishing the token sees
// the same mix.
__device__ void split_mix_rows(const HcMixSource& src, int rows, int64_t tokens, int64_t t,
                               int count, float* m) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int stride = rows + 1;
  float sums[kHcFusedMaxRows + 1];
#pragma unroll
  for (int r = 0; r <= kHcFusedMaxRows; ++r) sums[r] = 0.0f;
  for (int64_t sp = lane; sp < src.splits; sp += 32) {
    const float* p = src.mix + (sp * tokens + t) * stride;
#pragma unroll
    for (int r = 0; r < kHcFusedMaxRows; ++r) {
      if (r < count) sums[r] += p[r];
    }
    sums[kHcFusedMaxRows] += p[rows];
  }
  const float inv_rms =
      1.0f / sqrtf(warp_sum(sums[kHcFusedMaxRows]) / static_cast<float>(src.width) + src.norm_eps);
#pragma unroll
  for (int r = 0; r < kHcFusedMaxRows; ++r) {
    if (r < count) {
      const float total = warp_sum(sums[r]);
      if (lane == r) m[r] = total * inv_rms;
    }
  }
  __syncwarp();
}

// The arguments of hc_pre_finish_kernel. hc_pre collapses with this token's own pre (pre and
// prev_pre null); hc_pre_shifted writes pre and collapses with prev_pre, or takes stream 0 when
// prev_pre is null (the first sub-layer).
struct HcFinishArgs {
  const float* X;         // [T, n, hidden]
  HcMixSource mix;        // rows (2 + n) * n
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
// collapse. Dynamic shared memory: n * n + n floats. From split partial sums (n <= kHcFusedMaxN)
// each warp that needs mix rows first sums them into mix_rows.
__global__ void __launch_bounds__(kHcThreads) hc_pre_finish_kernel(HcFinishArgs a) {
  enter_dependent_grid();
  extern __shared__ float shared[];
  __shared__ float mix_rows[kHcThreads / 32][kHcFusedMaxRows];
  const int n = a.n;
  const int64_t fn_rows = static_cast<int64_t>(2 + n) * n;
  const int64_t block = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  if (block >= a.weight_blocks) {
    const CollapseSlice c = collapse_slice(block - a.weight_blocks, a.splits, a.chunk, a.hidden);
    int streams = n;
    if (a.pre == nullptr) {
      const float* m = a.mix.mix + c.t * fn_rows;
      if (a.mix.splits > 0) {
        if (warp == 0)
          split_mix_rows(a.mix, static_cast<int>(fn_rows), a.tokens, c.t, n, mix_rows[0]);
        m = mix_rows[0];
      }
      if (tid < n) shared[tid] = hc_pre_weight(m, a.base, a.scale[0], tid, a.eps);
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
  if (n * n > 32) {  // never from split partial sums (n <= kHcFusedMaxN there)
    const int64_t t = block;
    hc_comb_block(a.mix.mix + t * fn_rows, a.base, a.scale, n, a.iters, a.eps,
                  a.pre != nullptr ? a.pre + t * n : nullptr, a.post + t * n, a.comb + t * n * n,
                  shared);
    return;
  }
  // One warp per token; the condition is uniform over the warp, as the shuffles need.
  const int64_t t = block * (kHcThreads / 32) + threadIdx.x / 32;
  if (t >= a.tokens) return;
  const float* m = a.mix.mix + t * fn_rows;
  if (a.mix.splits > 0) {
    split_mix_rows(a.mix, static_cast<int>(fn_rows), a.tokens, t, static_cast<int>(fn_rows),
                   mix_rows[warp]);
    m = mix_rows[warp];
  }
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
    hc_head_finish_kernel(const float* __restrict__ X, HcMixSource mix, int64_t tokens,
                          const float* __restrict__ base, const float* __restrict__ scale, int n,
                          int64_t hidden, float eps, int64_t splits, int64_t chunk,
                          float* __restrict__ y) {
  enter_dependent_grid();
  extern __shared__ float pre[];
  __shared__ float mix_row[kHcFusedMaxRows];
  const CollapseSlice c = collapse_slice(blockIdx.x, splits, chunk, hidden);
  const int tid = static_cast<int>(threadIdx.x);
  const float* m = mix.mix + c.t * n;
  if (mix.splits > 0) {
    if (tid < 32) split_mix_rows(mix, n, tokens, c.t, n, mix_row);
    m = mix_row;
  }
  if (tid < n) pre[tid] = hc_pre_weight(m, base, scale[0], tid, eps);
  __syncthreads();
  collapse_range(X + c.t * n * hidden, pre, n, hidden, c.h_begin, c.h_end, y + c.t * hidden);
}

// hc_collapse: y[t] = sum_s pre[t, s] * X[t, s], collapse blocks with pre read from its tensor.
// Shared memory: n floats.
__global__ void __launch_bounds__(kHcThreads)
    hc_collapse_kernel(const float* __restrict__ X, const float* __restrict__ pre, int n,
                       int64_t hidden, int64_t splits, int64_t chunk, float* __restrict__ y) {
  enter_dependent_grid();
  extern __shared__ float weights[];
  const CollapseSlice c = collapse_slice(blockIdx.x, splits, chunk, hidden);
  for (int s = static_cast<int>(threadIdx.x); s < n; s += blockDim.x) {
    weights[s] = pre[c.t * n + s];
  }
  __syncthreads();
  collapse_range(X + c.t * n * hidden, weights, n, hidden, c.h_begin, c.h_end, y + c.t * hidden);
}

// The mix of X and fn's `rows` rows, mix = linear(rms_norm(flatten(X)), fn), the CPU's hc_mix
// (unweighted norm, then fp32 GEMM): split partial sums where launch_hc_mix_split takes it, else
// the rows by rms_norm and cuBLAS. With no channels the CPU's GEMM sums nothing: mix = 0 (and
// cuBLAS rejects K = 0). `tensor` keeps the source's memory alive.
struct MixSums {
  Tensor tensor;
  HcMixSource source;
};

MixSums hc_mix(CudaBackend& be, const Tensor& X, const Tensor& fn, const HcParams& params, int rows,
               const char* op, const HcTrunkUpdate* update = nullptr) {
  const int64_t tokens = X.size(0);
  const int64_t width = X.size(1) * X.size(2);
  MixSums m;
  m.source.width = width;
  m.source.norm_eps = params.norm_eps;
  HcMixPartials partials = launch_hc_mix_split(be, X, fn, rows, op, update);
  if (partials.splits > 0) {
    m.tensor = std::move(partials.partial);
    m.source.splits = partials.splits;
  } else if (update != nullptr) {
    return m;  // tensor undefined: the caller takes another path
  } else {
    m.tensor =
        width > 0
            ? be.linear(be.rms_norm(X.reshape({tokens, width}), Tensor(), params.norm_eps), fn)
            : be.zeros({tokens, rows}, DType::kF32);
  }
  m.source.mix = m.tensor.data<float>();
  return m;
}

// hc_pre_finish_kernel's arguments for X [T, n, H] and its mix: hc_pre's (pre and prev_pre null;
// hc_pre_shifted sets them).
HcFinishArgs hc_finish_args(const Tensor& X, const MixSums& mix, const Tensor& base,
                            const Tensor& scale, const HcParams& params, const Tensor& post,
                            const Tensor& comb, const Tensor& y) {
  HcFinishArgs a{};
  a.X = X.data<float>();
  a.mix = mix.source;
  a.base = base.data<float>();
  a.scale = scale.data<float>();
  a.post = post.data<float>();
  a.comb = comb.data<float>();
  a.y = y.data<float>();
  a.n = params.hc_mult;
  a.tokens = X.size(0);
  a.hidden = X.size(2);
  a.iters = params.sinkhorn_iters;
  a.eps = params.hc_eps;
  return a;
}

// Launches hc_pre_finish_kernel for the mix of a.X; fills the launch shape of `a`.
void launch_hc_pre_finish(HcFinishArgs a, int num_sms, bool pdl, cudaStream_t stream,
                          const char* op) {
  const CollapseGrid g = collapse_grid(num_sms, a.tokens, a.hidden);
  a.weight_blocks = hc_weight_blocks(a.n, a.tokens);
  a.splits = g.splits;
  a.chunk = g.chunk;
  const size_t smem = static_cast<size_t>(a.n + a.n * a.n) * sizeof(float);
  launch_programmatic(op, dim3(static_cast<unsigned>(a.weight_blocks + a.tokens * g.splits)),
                      dim3(kHcThreads), smem, stream, pdl, hc_pre_finish_kernel, a);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
}

}  // namespace

bool hc_post_pre_split(CudaBackend& be, const Tensor& X, const Tensor& fn, const Tensor& base,
                       const Tensor& scale, const HcParams& params, const HcTrunkUpdate& update,
                       const Tensor& trunk, HcMix& mix) {
  const int n = params.hc_mult;
  const MixSums sums = hc_mix(be, X, fn, params, (2 + n) * n, "hc_post_pre", &update);
  if (!sums.tensor.defined()) return false;
  // The finish kernel collapses the trunk the mix kernel wrote (the launch before it).
  const HcFinishArgs a =
      hc_finish_args(trunk, sums, base, scale, params, mix.post, mix.comb, mix.y);
  launch_hc_pre_finish(a, be.num_sms(), be.pdl(), be.stream(), "hc_post_pre");
  return true;
}

HcMix CudaBackend::hc_pre_impl(const Tensor& X, const Tensor& fn, const Tensor& base,
                               const Tensor& scale, const HcParams& params, const RowNorm& y_norm) {
  const auto [tokens, n, hidden] = hc_shape("hc_pre", X, params);
  HcMix result{empty({tokens, n}, DType::kF32), empty({tokens, n, n}, DType::kF32),
               empty({tokens, hidden}, DType::kF32)};
  if (tokens == 0) return result;
  if (launch_hc_fused(*this, X, fn, base, scale, params, result.post.data<float>(),
                      result.comb.data<float>(), result.y.data<float>(), y_norm, "hc_pre")) {
    return result;
  }
  const int rows = (2 + n) * n;
  const MixSums mix = hc_mix(*this, X, fn, params, rows, "hc_pre");
  const HcFinishArgs a =
      hc_finish_args(X, mix, base, scale, params, result.post, result.comb, result.y);
  launch_hc_pre_finish(a, num_sms(), pdl(), stream(), "hc_pre");
  if (y_norm.weight.defined()) result.y = rms_norm_impl(result.y, y_norm.weight, y_norm.eps);
  return result;
}

HcShiftedMix CudaBackend::hc_pre_shifted_impl(const Tensor& X, const Tensor& fn, const Tensor& base,
                                              const Tensor& scale, const Tensor& prev_pre,
                                              const HcParams& params) {
  const auto [tokens, n, hidden] = hc_shape("hc_pre_shifted", X, params);
  HcShiftedMix result{empty({tokens, n}, DType::kF32), empty({tokens, n}, DType::kF32),
                      empty({tokens, n, n}, DType::kF32), empty({tokens, hidden}, DType::kF32)};
  if (tokens == 0) return result;
  const MixSums mix = hc_mix(*this, X, fn, params, (2 + n) * n, "hc_pre_shifted");
  HcFinishArgs a = hc_finish_args(X, mix, base, scale, params, result.post, result.comb, result.y);
  a.prev_pre = prev_pre.defined() ? prev_pre.data<float>() : nullptr;
  a.pre = result.pre.data<float>();
  launch_hc_pre_finish(a, num_sms(), pdl(), stream(), "hc_pre_shifted");
  return result;
}

Tensor CudaBackend::hc_head_impl(const Tensor& X, const Tensor& fn, const Tensor& base,
                                 const Tensor& scale, const HcParams& params,
                                 const RowNorm& y_norm) {
  const auto [tokens, n, hidden] = hc_shape("hc_head", X, params);
  Tensor y = empty({tokens, hidden}, DType::kF32);
  if (tokens == 0 || hidden == 0) return y;  // nothing to collapse (and no empty grid)
  if (launch_hc_fused(*this, X, fn, base, scale, params, nullptr, nullptr, y.data<float>(), y_norm,
                      "hc_head")) {
    return y;
  }
  const MixSums mix = hc_mix(*this, X, fn, params, n, "hc_head");  // width = n * hidden > 0 here
  const CollapseGrid g = collapse_grid(num_sms(), tokens, hidden);
  const size_t smem = static_cast<size_t>(n) * sizeof(float);
  launch_programmatic("hc_head", dim3(static_cast<unsigned>(tokens * g.splits)), dim3(kHcThreads),
                      smem, stream(), pdl(), hc_head_finish_kernel, X.data<float>(), mix.source,
                      tokens, base.data<float>(), scale.data<float>(), n, hidden, params.hc_eps,
                      g.splits, g.chunk, y.data<float>());
  DEEPINFER_CUDA_LAUNCH_CHECK("hc_head");
  return y_norm.weight.defined() ? rms_norm_impl(y, y_norm.weight, y_norm.eps) : y;
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
  launch_programmatic(op, dim3(static_cast<unsigned>(tokens * g.splits)), dim3(kHcThreads), smem,
                      stream(), pdl(), hc_collapse_kernel, X.data<float>(), pre.data<float>(),
                      static_cast<int>(n), hidden, g.splits, g.chunk, y.data<float>());
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return y;
}

}  // namespace deepinfer::cuda
