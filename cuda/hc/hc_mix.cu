// The unfused mHC path's mix at decode and small prefill sizes (hc_heuristics.h:
// hc_mix_split_grid): mix = linear(rms_norm(flatten(X)), fn) as K-split partial sums, which
// hc_pre.cu's finish kernels sum in split order and scale by the inverse RMS (the fused kernel's
// arithmetic: the CPU normalises first, so the sums differ from its GEMM by rounding only).
//
// CTA (split, tile) takes kHcMixTokens tokens and `chunk` columns of their flattened rows. It
// stages kHcMixSubChunk columns of the tile's X rows and of fn's rows at a time in shared memory
// (one batch of float4 loads per thread; fn's first batch before the wait for the previous
// kernel, as no kernel writes fn), and each lane sums a 4-token x 3-row block of dot products over
// its warp's float4 columns (lanes of row group 0 also the tokens' squares). The warps' sums are
// added in warp order, so the partials depend on the launch geometry only. For hc_post_pre the
// staged token rows are the updated trunk, which the CTA computes from X, out, post and comb
// (hc_post's arithmetic) and writes: each (token, column) belongs to one CTA. The work is FMA issue
// more than bytes (64 tokens: ~25 M FMAs for ~10 MB, mostly L2), so a CTA is 16 warps.
#include <cstdint>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/hc/hc_heuristics.h"
#include "cuda/hc/hc_launch.h"
#include "cuda/hc/hc_weights.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kWarps = kHcMixThreads / 32;
static_assert(kWarps * 4 == kHcMixColumnStep, "a step: one float4 column per warp");
constexpr int kQuads = kHcMixSubChunk / 4;  // float4 columns of a staged sub-chunk
static_assert(kQuads % kWarps == 0);
// Staged rows are kHcMixSubChunk + 4 floats apart: the rows a load instruction's lanes read sit
// in different 16-byte bank groups.
constexpr int kLd = kHcMixSubChunk + 4;
// A lane's block: token group lane / 8 (kTokensPerLane tokens), row group lane % 8
// (kRowsPerLane fn rows).
constexpr int kTokensPerLane = 4;
constexpr int kRowsPerLane = 3;
constexpr int kRowGroups = 8;
static_assert(kRowGroups * kRowsPerLane == kHcFusedMaxRows, "the row groups cover 24 fn rows");
static_assert(32 / kRowGroups * kTokensPerLane == kHcMixTokens, "the token groups cover a tile");
// A lane's sums: kTokensPerLane x kRowsPerLane dot products, then kTokensPerLane squares.
constexpr int kLaneSums = kTokensPerLane * (kRowsPerLane + 1);
constexpr int kStagedRows = kHcMixTokens + kHcFusedMaxRows;
constexpr int kLoadsPerThread = kStagedRows * kQuads / kHcMixThreads;
static_assert(kLoadsPerThread * kHcMixThreads == kStagedRows * kQuads);
static_assert(kLaneSums * kWarps * 32 <= kStagedRows * kLd, "the warps' sums fit the stage");

struct HcMixArgs {
  const float* X;        // [T, width]
  const float* fn;       // [rows, width]
  float* partial;        // [splits, T, rows + 1]
  HcTrunkUpdate update;  // trunk null: X is the trunk; else X is the trunk before hc_post
  int64_t tokens;
  int64_t width;
  int64_t hidden;
  int64_t chunk;
  int n;
  int rows;
};

// kUpdate: a.update is set (hc_post_pre).
template <bool kUpdate>
__global__ void __launch_bounds__(kHcMixThreads, 1) hc_mix_split_kernel(HcMixArgs a) {
  // Staged rows: the tile's tokens, then fn's rows (zero past T and past `rows`).
  __shared__ __align__(16) float staged[kStagedRows][kLd];
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int64_t split = blockIdx.x;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kHcMixTokens;
  const int64_t c_begin = split * a.chunk;
  const int64_t c_end = c_begin + a.chunk < a.width ? c_begin + a.chunk : a.width;

  // Staged row `row`, float4 column q of the sub-chunk at column c: the global float4, or zero.
  auto source = [&](int row, int q, int64_t c, int64_t cols) -> const float4* {
    if (4 * q >= cols) return nullptr;
    if (row < kHcMixTokens) {
      const int64_t t = t0 + row;
      return t < a.tokens ? reinterpret_cast<const float4*>(a.X + t * a.width + c + 4 * q)
                          : nullptr;
    }
    const int r = row - kHcMixTokens;
    return r < a.rows ? reinterpret_cast<const float4*>(a.fn + r * a.width + c + 4 * q) : nullptr;
  };
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float4 v[kLoadsPerThread];
  // fn's loads (rows >= kHcMixTokens) and X's; the fn ones of the first sub-chunk go before the
  // wait for the previous kernel.
  auto load = [&](int64_t c, bool fn_rows) {
    const int64_t cols = c_end - c;
#pragma unroll
    for (int i = 0; i < kLoadsPerThread; ++i) {
      const int idx = tid + i * kHcMixThreads;
      const int row = idx / kQuads;
      if ((row >= kHcMixTokens) != fn_rows) continue;
      const float4* p = source(row, idx % kQuads, c, cols);
      if (p == nullptr) {
        v[i] = zero;
      } else if (kUpdate && !fn_rows) {
        // The trunk's column col = s * hidden + h (hidden % 4 == 0: a quad is in one stream).
        const int64_t t = t0 + row;
        const int64_t col = c + 4 * (idx % kQuads);
        const int s = static_cast<int>(col / a.hidden);
        v[i] = hc_post_quad(a.X + t * a.width, a.update.out + t * a.hidden, a.update.post + t * a.n,
                            a.update.comb + t * a.n * a.n, a.n, s, a.hidden, col - s * a.hidden);
        *reinterpret_cast<float4*>(a.update.trunk + t * a.width + col) = v[i];
      } else {
        v[i] = __ldg(p);
      }
    }
  };

  float acc[kLaneSums];
#pragma unroll
  for (int i = 0; i < kLaneSums; ++i) acc[i] = 0.0f;
  const int token_group = lane / kRowGroups;
  const int row_group = lane % kRowGroups;
  if (c_begin < c_end) load(c_begin, true);
  enter_dependent_grid();
  for (int64_t c = c_begin; c < c_end; c += kHcMixSubChunk) {
    if (c > c_begin) {
      __syncthreads();  // the previous sub-chunk's reads are done
      load(c, true);
    }
    load(c, false);
#pragma unroll
    for (int i = 0; i < kLoadsPerThread; ++i) {
      const int idx = tid + i * kHcMixThreads;
      *reinterpret_cast<float4*>(&staged[idx / kQuads][4 * (idx % kQuads)]) = v[i];
    }
    __syncthreads();
    const int64_t rest = c_end - c;
    const int quads = static_cast<int>((rest < kHcMixSubChunk ? rest : kHcMixSubChunk) + 3) / 4;
    for (int q = warp; q < quads; q += kWarps) {
      float4 x[kTokensPerLane];
      float4 w[kRowsPerLane];
#pragma unroll
      for (int j = 0; j < kTokensPerLane; ++j) {
        x[j] = *reinterpret_cast<const float4*>(&staged[token_group * kTokensPerLane + j][4 * q]);
      }
#pragma unroll
      for (int i = 0; i < kRowsPerLane; ++i) {
        w[i] = *reinterpret_cast<const float4*>(
            &staged[kHcMixTokens + row_group * kRowsPerLane + i][4 * q]);
      }
#pragma unroll
      for (int j = 0; j < kTokensPerLane; ++j) {
#pragma unroll
        for (int i = 0; i < kRowsPerLane; ++i) {
          float& s = acc[j * kRowsPerLane + i];
          s = fmaf(w[i].x, x[j].x, s);
          s = fmaf(w[i].y, x[j].y, s);
          s = fmaf(w[i].z, x[j].z, s);
          s = fmaf(w[i].w, x[j].w, s);
        }
        if (row_group == 0) {
          float& s = acc[kTokensPerLane * kRowsPerLane + j];
          s = fmaf(x[j].x, x[j].x, s);
          s = fmaf(x[j].y, x[j].y, s);
          s = fmaf(x[j].z, x[j].z, s);
          s = fmaf(x[j].w, x[j].w, s);
        }
      }
    }
  }
  // The warps' sums through the stage: sum k of warp w, lane l at (k * kWarps + w) * 32 + l.
  __syncthreads();
  float* sums = &staged[0][0];
#pragma unroll
  for (int k = 0; k < kLaneSums; ++k) sums[(k * kWarps + warp) * 32 + lane] = acc[k];
  __syncthreads();
  const int stride = a.rows + 1;
  for (int p = tid; p < kHcMixTokens * stride; p += kHcMixThreads) {
    const int j = p / stride;
    const int r = p % stride;
    const int64_t t = t0 + j;
    if (t >= a.tokens) break;  // p ascends with j
    // The lane and sum holding (token j, row r); the squares are in row group 0's lanes.
    const int jj = j % kTokensPerLane;
    const int src_lane = j / kTokensPerLane * kRowGroups + (r < a.rows ? r / kRowsPerLane : 0);
    const int k =
        r < a.rows ? jj * kRowsPerLane + r % kRowsPerLane : kTokensPerLane * kRowsPerLane + jj;
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += sums[(k * kWarps + w) * 32 + src_lane];
    a.partial[(split * a.tokens + t) * stride + r] = total;
  }
}

}  // namespace

HcMixPartials launch_hc_mix_split(CudaBackend& be, const Tensor& X, const Tensor& fn, int rows,
                                  const char* op, const HcTrunkUpdate* update) {
  const int64_t tokens = X.size(0);
  const int n = static_cast<int>(X.size(1));
  const int64_t hidden = X.size(2);
  const HcMixSplitGrid g = hc_mix_split_grid(be.num_sms(), tokens, n, hidden);
  if (!hc_mix_split_chosen(be.hc_pre_choice(), g) || rows > kHcFusedMaxRows ||
      !aligned16(X.raw_data()) || !aligned16(fn.raw_data())) {
    return {};
  }
  if (update != nullptr &&
      (hidden % 4 != 0 || !aligned16(update->out) || !aligned16(update->trunk))) {
    return {};
  }
  HcMixPartials m;
  m.splits = g.splits;
  m.partial = be.scratch(static_cast<size_t>(g.splits * tokens * (rows + 1)) * sizeof(float));
  HcMixArgs a{};
  a.X = X.data<float>();
  a.fn = fn.data<float>();
  a.partial = reinterpret_cast<float*>(m.partial.raw_data());
  if (update != nullptr) a.update = *update;
  a.tokens = tokens;
  a.width = n * hidden;
  a.hidden = hidden;
  a.chunk = g.chunk;
  a.n = n;
  a.rows = rows;
  launch_programmatic(op, dim3(static_cast<unsigned>(g.splits), static_cast<unsigned>(g.tiles)),
                      dim3(kHcMixThreads), 0, be.stream(), be.pdl(),
                      update != nullptr ? hc_mix_split_kernel<true> : hc_mix_split_kernel<false>,
                      a);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return m;
}

}  // namespace deepinfer::cuda
