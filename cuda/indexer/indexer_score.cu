// The indexer's scoring kernel: score(t, j) for every slot of token t (its visible entries, or
// the entries of its candidate list: indexer_launch.h), written to a scratch row of `row` floats
// (for all visible entries, `bound` = max_blocks_per_seq * epb: no sequence can address more
// entries than its block table has columns). Grid (token, split): each block stages the token's
// q [h, Di] in shared memory and scores tiles of 32 slots (one per lane; the warps split the
// heads). Key tiles are staged as f32: an f32 cache with cp.async, a bf16, fp8 or V4.1 FP4 one
// decoded (exactly: decode_kv4) on the way into shared memory.
#include <cstdint>

#include "cuda/common/launch.cuh"
#include "cuda/common/layout.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/vec.cuh"
#include "cuda/indexer/indexer_launch.h"

namespace deepinfer::cuda {

namespace {

// score(t, j) = sum_h (weights[t,h] * weight_scale) * (relu(q[t,h] . k_j) * score_scale).
// Block (token of the group, split); the split walks tiles of slots first = split*32,
// + splits*32, ...
// F is a.key.format, fixed at compile time so that the f32 path keeps its plain cp.async staging.
template <KvFormat F>
__global__ void __launch_bounds__(kScoreThreads) indexer_score_kernel(ScoreArgs a, DeviceLayout l) {
  extern __shared__ float4 smem4[];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = static_cast<int>(blockIdx.x);
  const int t = a.token0 + g;
  const int b = seq_of_row(l, t);
  const int64_t slots = a.list.blocks != nullptr
                            ? a.list.counts[g]
                            : visible_entries(l.positions[t], a.ratio, a.bound);
  const int64_t first = static_cast<int64_t>(blockIdx.y) * kScoreKeys;
  if (first >= slots) return;  // uniform over the block
  const int dim = a.dim;
  const int d4 = dim / 4;
  const int heads = a.heads;
  const int kstride = dim + 4;  // padded key rows: lanes' float4 reads hit distinct banks
  float* qs = reinterpret_cast<float*>(smem4);         // [heads][dim]
  float* ks = qs + static_cast<int64_t>(heads) * dim;  // [kScoreKeys][kstride]
  float* ws = ks + kScoreKeys * kstride;               // [heads], times weight_scale
  float* red = ws + (heads + 3) / 4 * 4;               // [kScoreWarps][kScoreKeys]
  int64_t* rows = reinterpret_cast<int64_t*>(red + kScoreWarps * kScoreKeys);  // [kScoreKeys]

  const float4* q4 = reinterpret_cast<const float4*>(a.q + static_cast<int64_t>(t) * heads * dim);
  for (int i = tid; i < heads * d4; i += blockDim.x) cp_async_16(qs + 4 * i, q4 + i);
  for (int h = tid; h < heads; h += blockDim.x) {
    ws[h] = a.weights[static_cast<int64_t>(t) * heads + h] * a.weight_scale;
  }
  // Heads [h_begin, h_end) of this warp.
  const int per_warp = (heads + kScoreWarps - 1) / kScoreWarps;
  const int h_begin = warp * per_warp;
  const int h_end = min(heads, h_begin + per_warp);
  KvRowFormat key_format = a.key;
  key_format.format = F;
  const int64_t row_bytes = key_format.row_bytes;
  float* out = a.scores + static_cast<int64_t>(g) * a.row;

  for (int64_t j0 = first; j0 < slots; j0 += static_cast<int64_t>(gridDim.y) * kScoreKeys) {
    if (tid < kScoreKeys) {
      const int64_t j = j0 + tid;
      rows[tid] = j < slots ? entry_row(l, b, slot_entry(a.list, g, j), a.epb, a.cache_rows) : -1;
    }
    __syncthreads();
    for (int i = tid; i < kScoreKeys * d4; i += blockDim.x) {
      const int r = i / d4;
      const int c4 = i - r * d4;
      const int64_t row = rows[r];
      float* dst = ks + r * kstride + c4 * 4;
      if (row < 0) {
        *reinterpret_cast<float4*>(dst) = make_float4(0.f, 0.f, 0.f, 0.f);
      } else if constexpr (F == KvFormat::kF32) {
        cp_async_16(dst, a.cache + row * row_bytes + 16 * c4);
      } else {
        *reinterpret_cast<float4*>(dst) = decode_kv4(a.cache + row * row_bytes, key_format, 4 * c4);
      }
    }
    cp_async_wait_all();  // this tile's keys (and q, the first time)
    __syncthreads();
    // Lane = entry; this warp's heads in register groups of kScoreHeads.
    const float4* key = reinterpret_cast<const float4*>(ks + lane * kstride);
    float part = 0.0f;
    for (int h0 = h_begin; h0 < h_end; h0 += kScoreHeads) {
      float acc[kScoreHeads];
      const float4* qh[kScoreHeads];
#pragma unroll
      for (int i = 0; i < kScoreHeads; ++i) {
        acc[i] = 0.0f;
        // Past h_end: re-read the last head (in bounds) and drop the result below.
        qh[i] = reinterpret_cast<const float4*>(qs + min(h0 + i, h_end - 1) * dim);
      }
      for (int c4 = 0; c4 < d4; ++c4) {
        const float4 k = key[c4];
#pragma unroll
        for (int i = 0; i < kScoreHeads; ++i) acc[i] = dot4(qh[i][c4], k, acc[i]);
      }
#pragma unroll
      for (int i = 0; i < kScoreHeads; ++i) {
        if (h0 + i < h_end) part += ws[h0 + i] * (fmaxf(acc[i], 0.0f) * a.score_scale);
      }
    }
    red[warp * kScoreKeys + lane] = part;
    __syncthreads();
    if (warp == 0) {
      const int64_t j = j0 + lane;
      float s = 0.0f;
      for (int w = 0; w < kScoreWarps; ++w) s += red[w * kScoreKeys + lane];
      if (rows[lane] < 0 || isnan(s)) s = -INFINITY;  // unmapped entry / NaN: ranks last
      if (s == 0.0f) s = 0.0f;                        // -0 ties with +0, as in a float compare
      if (j < slots) out[j] = s;
    }
    // The next tile's first barrier orders warp 0's reads of rows/red before their rewrite.
  }
}

}  // namespace

void launch_indexer_score(const ScoreArgs& a, const DeviceLayout& l, int64_t n, int64_t splits,
                          size_t smem, KernelSmemLimits& smem_limits, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(splits));
  auto launch = [&](auto kernel) {
    smem_limits.allow(kernel, smem);
    kernel<<<grid, kScoreThreads, smem, stream>>>(a, l);
  };
  switch (a.key.format) {
    case KvFormat::kF32:
      launch(indexer_score_kernel<KvFormat::kF32>);
      break;
    case KvFormat::kBf16:
      launch(indexer_score_kernel<KvFormat::kBf16>);
      break;
    case KvFormat::kFp8:
      launch(indexer_score_kernel<KvFormat::kFp8>);
      break;
    case KvFormat::kV41Fp4Index:
      launch(indexer_score_kernel<KvFormat::kV41Fp4Index>);
      break;
    case KvFormat::kV41Fp8:
    case KvFormat::kV41Fp4Main:
      // Not index-key formats: the front checks (supports_index_cache_dtype) admit neither.
      throw Error(ErrorCode::kUnsupported,
                  "indexer score: V4.1's FP8 and FP4 main records are not index keys");
  }
  DEEPINFER_CUDA_LAUNCH_CHECK("indexer score");
}

}  // namespace deepinfer::cuda
