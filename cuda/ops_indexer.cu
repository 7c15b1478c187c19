// The lightning indexer's top-k on the CUDA backend (model.md A.8), over the paged layout of D.2.
// It matches the CPU reference op in cpp/src/backend/cpu_ops_attention.cpp on the same inputs;
// f32 math throughout. Shared helpers: layout.cuh.
//
// Every per-token quantity (sequence, position, context length, visible entries, which keys) is
// computed in the kernels from the device BatchLayout; the host only sizes grids and scratch from
// metadata it knows (shapes, layout.max_blocks_per_seq), so no op waits for the stream.
//
// indexer_topk runs two kernels per group of tokens:
//  1. indexer_score_kernel, grid (token, split): each block stages the token's q [h, Di] in shared
//     memory and scores tiles of 32 visible entries (one per lane; the warps split the heads),
//     writing score[t][j] to a scratch row of `bound` = max_blocks_per_seq * epb floats (no
//     sequence can address more entries than its block table has columns).
//  2. indexer_select_kernel, one block per token: an exact radix select of the top
//     min(top_k, visible) keys, then a rank sort of the chosen (score, index) pairs by score
//     descending, index ascending. The token's scores are copied into shared memory when `bound`
//     floats fit there; otherwise the same code reads them from the global scratch row. Scores
//     compare as floats (the CPU's order): NaN becomes -inf and -0 becomes +0 before the select.
//  Tokens are grouped so that the scratch stays under kScoreScratchBytes.
//
// Content errors cannot be raised without a host sync. Where the CPU op throws, these kernels
// stay inside their buffers and do the following instead:
//  - entries past the block table's columns (j >= max_blocks_per_seq * epb) are not visible.
//  - an entry whose block is negative or maps past the cache: the indexer scores it -inf (it
//    ranks last); attention masks it.
//  - a sparse topk index >= the visible count: masked (the CPU throws "not visible").
//  - a sliding key in the ring whose slot is outside the ring: masked. A position that fell out
//    of the ring (the CPU's kInternal error) reads whatever its ring slot holds.
#include <cstdint>
#include <string>

#include "cuda_backend.h"
#include "cuda_common.cuh"
#include "layout.cuh"

namespace deepinfer::cuda {

namespace {

// ================================================================================================
// indexer_topk
// ================================================================================================

constexpr int kScoreThreads = 256;
constexpr int kScoreWarps = kScoreThreads / 32;
constexpr int kScoreKeys = 32;  // entries per tile: one per lane
constexpr int kScoreHeads = 8;  // heads per register group of a thread
constexpr int kSelectThreads = 512;
constexpr int64_t kScoreScratchBytes = int64_t{256} << 20;

struct ScoreArgs {
  const float* q;        // [T, heads, dim]
  const float* weights;  // [T, heads]
  const float* cache;    // [cache_rows, dim]
  float* scores;         // [tokens of the group, bound]
  int64_t bound;         // max entries of a sequence: max_blocks_per_seq * epb
  int64_t cache_rows;
  int token0;  // first token of the group
  int heads;
  int dim;  // a multiple of 4
  int ratio;
  int epb;
  float score_scale;
  float weight_scale;
};

size_t score_smem_bytes(int64_t heads, int64_t dim) {
  const int64_t floats =
      heads * dim + kScoreKeys * (dim + 4) + (heads + 3) / 4 * 4 + kScoreWarps * kScoreKeys;
  return static_cast<size_t>(floats) * sizeof(float) + kScoreKeys * sizeof(int64_t);
}

// score(t, j) = sum_h (weights[t,h] * weight_scale) * (relu(q[t,h] . k_j) * score_scale).
// Block (token of the group, split); the split walks tiles first = split*32, + splits*32, ...
__global__ void __launch_bounds__(kScoreThreads) indexer_score_kernel(ScoreArgs a, DeviceLayout l) {
  extern __shared__ float4 smem4[];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int t = a.token0 + static_cast<int>(blockIdx.x);
  const int b = seq_of_row(l, t);
  const int64_t visible = visible_entries(l.positions[t], a.ratio, a.bound);
  const int64_t first = static_cast<int64_t>(blockIdx.y) * kScoreKeys;
  if (first >= visible) return;  // uniform over the block
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
  for (int i = tid; i < heads * d4; i += blockDim.x) cp_async16(qs + 4 * i, q4 + i);
  for (int h = tid; h < heads; h += blockDim.x) {
    ws[h] = a.weights[static_cast<int64_t>(t) * heads + h] * a.weight_scale;
  }
  // Heads [h_begin, h_end) of this warp.
  const int per_warp = (heads + kScoreWarps - 1) / kScoreWarps;
  const int h_begin = warp * per_warp;
  const int h_end = min(heads, h_begin + per_warp);
  const float4* cache4 = reinterpret_cast<const float4*>(a.cache);
  float* out = a.scores + static_cast<int64_t>(blockIdx.x) * a.bound;

  for (int64_t j0 = first; j0 < visible; j0 += static_cast<int64_t>(gridDim.y) * kScoreKeys) {
    if (tid < kScoreKeys) {
      const int64_t j = j0 + tid;
      rows[tid] = j < visible ? entry_row(l, b, j, a.epb, a.cache_rows) : -1;
    }
    __syncthreads();
    for (int i = tid; i < kScoreKeys * d4; i += blockDim.x) {
      const int r = i / d4;
      const int c4 = i - r * d4;
      const int64_t row = rows[r];
      float* dst = ks + r * kstride + c4 * 4;
      if (row >= 0) {
        cp_async16(dst, cache4 + row * d4 + c4);
      } else {
        *reinterpret_cast<float4*>(dst) = make_float4(0.f, 0.f, 0.f, 0.f);
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
      if (j < visible) out[j] = s;
    }
    // The next tile's first barrier orders warp 0's reads of rows/red before their rewrite.
  }
}

// A float's bits mapped so that unsigned order is float order (for non-NaN values).
__device__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// (score, index) packed so that a larger value ranks first: score descending, index ascending.
__device__ uint64_t pack_pair(uint32_t key, int64_t j) {
  return (static_cast<uint64_t>(key) << 32) | (0xffffffffu - static_cast<uint32_t>(j));
}

struct SelectArgs {
  const float* scores;  // [tokens of the group, bound]
  int32_t* out;         // [T, top_k]
  int64_t bound;
  int64_t cap;  // pairs buf can hold: min(top_k, bound)
  int token0;
  int top_k;
  int ratio;
  bool scores_in_smem;
};

size_t select_smem_bytes(int64_t cap, int64_t bound, bool scores_in_smem) {
  size_t bytes =
      static_cast<size_t>(cap) * sizeof(uint64_t) + 256 * sizeof(uint32_t) + 40 * sizeof(int);
  if (scores_in_smem) bytes += static_cast<size_t>(bound) * sizeof(float);
  return bytes;
}

// One block per token: the top k = min(top_k, n) of the token's n visible scores.
//  1. Radix select (8 bits per pass, most significant first) finds the k-th largest key `thr`
//     and how many keys equal to it are taken (`take_eq`, the lowest indices among them).
//  2. Every key > thr and the first take_eq keys == thr (in index order, by a block scan) are
//     packed into `buf`.
//  3. A rank sort writes them out by score descending, then index ascending.
__global__ void __launch_bounds__(kSelectThreads, 2)
    indexer_select_kernel(SelectArgs a, DeviceLayout l) {
  extern __shared__ float4 smem4[];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int nthreads = blockDim.x;
  const int t = a.token0 + static_cast<int>(blockIdx.x);
  uint64_t* buf = reinterpret_cast<uint64_t*>(smem4);         // [cap]
  uint32_t* hist = reinterpret_cast<uint32_t*>(buf + a.cap);  // [256]
  int* misc = reinterpret_cast<int*>(hist + 256);  // [0, 32): scan; 32, 33: select; 34: count
  float* scores_smem = reinterpret_cast<float*>(misc + 40);

  const int64_t n = visible_entries(l.positions[t], a.ratio, a.bound);
  const int k = static_cast<int>(n < a.top_k ? n : a.top_k);
  int32_t* out = a.out + static_cast<int64_t>(t) * a.top_k;
  if (k == 0) {
    for (int i = tid; i < a.top_k; i += nthreads) out[i] = -1;
    return;
  }
  const float* sc = a.scores + static_cast<int64_t>(blockIdx.x) * a.bound;
  if (a.scores_in_smem) {
    for (int64_t i = tid; i < n; i += nthreads) cp_async4(scores_smem + i, sc + i);
    cp_async_wait_all();
    sc = scores_smem;
  }
  if (tid == 0) misc[34] = 0;
  __syncthreads();

  // 1. Radix select. Invariant: `remaining` (>= 1) of the keys matching `prefix` under `mask`
  //    are still to be taken, and at least that many match.
  uint32_t thr = 0;  // with k == n every key is taken: order_key of a non-NaN is never 0
  int take_eq = 0;
  if (k < n) {
    uint32_t prefix = 0, mask = 0;
    int remaining = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = tid; i < 256; i += nthreads) hist[i] = 0;
      __syncthreads();
      // Four keys per thread per step, loaded together (the scores may be in global memory).
      for (int64_t base = 0; base < n; base += 4 * nthreads) {
        int bins[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int64_t i = base + u * nthreads + tid;
          bins[u] = 256;  // none
          if (i < n) {
            const uint32_t key = order_key(sc[i]);
            if ((key & mask) == prefix) bins[u] = static_cast<int>((key >> shift) & 0xffu);
          }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          // One atomic per distinct bin of the warp: many keys often share the top bits.
          const unsigned peers = __match_any_sync(kFullMask, bins[u]);
          if (bins[u] < 256 && lane == __ffs(peers) - 1) atomicAdd(&hist[bins[u]], __popc(peers));
        }
      }
      __syncthreads();
      if (warp == 0) {
        // Lane l owns bins 255 - 8l down to 248 - 8l; counts accumulate from the top bin down.
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
              misc[32] = bin;
              misc[33] = remaining - cum;
              break;
            }
            cum += c;
          }
        }
      }
      __syncthreads();
      prefix |= static_cast<uint32_t>(misc[32]) << shift;
      mask |= 0xffu << shift;
      remaining = misc[33];
      // misc[32..33] are rewritten only after the next pass's two barriers.
    }
    thr = prefix;
    take_eq = remaining;
  }

  // 2. Collect. Thread tid owns the contiguous range [lo, hi) so that equal keys are ranked in
  //    index order by one block scan.
  const int64_t seg = (n + nthreads - 1) / nthreads;
  const int64_t lo = min(n, seg * tid);
  const int64_t hi = min(n, lo + seg);
  int eq = 0;
  if (take_eq > 0) {
    for (int64_t i = lo; i < hi; ++i) eq += order_key(sc[i]) == thr;
  }
  int eq_before = block_exclusive_scan(eq, misc);
  for (int64_t i = lo; i < hi; ++i) {
    const uint32_t key = order_key(sc[i]);
    bool take = key > thr;
    if (key == thr && eq_before < take_eq) {
      take = true;
      ++eq_before;
    }
    if (take) buf[atomicAdd(&misc[34], 1)] = pack_pair(key, i);
  }
  __syncthreads();

  // 3. Rank sort: the k packed pairs are distinct (distinct indices), so the number of pairs
  //    ranking above a pair is its output column. The loop over j reads the same buf[j] in
  //    every thread (a broadcast); O(k^2 / threads) comparisons, no barriers.
  for (int i = tid; i < k; i += nthreads) {
    const uint64_t mine = buf[i];
    int rank = 0;
#pragma unroll 4
    for (int j = 0; j < k; ++j) rank += buf[j] > mine;
    out[rank] = static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(mine));
  }
  for (int i = k + tid; i < a.top_k; i += nthreads) out[i] = -1;
}

}  // namespace

Tensor CudaBackend::indexer_topk_impl(const Tensor& q, const Tensor& weights,
                                      const Tensor& index_cache, const BatchLayout& layout,
                                      int ratio, int top_k, float score_scale, float weight_scale) {
  const char* op = "indexer_topk";
  const int64_t heads = q.size(1);
  const int64_t dim = q.size(2);
  const int64_t tokens = layout.num_tokens;
  Tensor out = empty({tokens, top_k}, DType::kI32);
  if (tokens == 0 || top_k == 0) return out;
  const int64_t epb = layout.block_size / ratio;
  const int64_t bound = static_cast<int64_t>(layout.max_blocks_per_seq) * epb;
  if (bound == 0 || index_cache.size(0) == 0) {
    // No entry is addressable: every row is all -1.
    DEEPINFER_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0xff, out.nbytes(), stream()));
    return out;
  }
  if (dim % 4 != 0) {
    throw Error(
        ErrorCode::kUnsupported,
        std::string(op) + ": the index head dim must be a multiple of 4, got " + q.describe());
  }
  if (bound > 0x7fffffff) fail(op, "layout.max_blocks_per_seq * entries per block overflows");
  check_vec4(op, "q", q);
  check_vec4(op, "index_cache", index_cache);
  const size_t smem_max = max_shared_memory_per_block();
  const size_t score_smem = score_smem_bytes(heads, dim);
  const int64_t cap = std::min<int64_t>(top_k, bound);
  const size_t select_min = select_smem_bytes(cap, bound, false);
  if (score_smem > smem_max || select_min > smem_max) {
    throw Error(ErrorCode::kUnsupported,
                std::string(op) + ": " + std::to_string(heads) + " heads of " +
                    std::to_string(dim) + " channels and top_k " + std::to_string(top_k) +
                    " need " + std::to_string(std::max(score_smem, select_min)) +
                    " bytes of shared memory per block, the device has " +
                    std::to_string(smem_max));
  }
  const bool in_smem = select_smem_bytes(cap, bound, true) <= smem_max;
  const size_t select_smem = select_smem_bytes(cap, bound, in_smem);
  allow_smem(indexer_score_kernel, score_smem);
  allow_smem(indexer_select_kernel, select_smem);

  // Tokens per launch, so that the scratch scores stay within kScoreScratchBytes.
  const int64_t group =
      std::max<int64_t>(1, std::min<int64_t>(tokens, kScoreScratchBytes / (bound * 4)));
  Tensor scores = scratch(static_cast<size_t>(group * bound) * sizeof(float));
  // Splits per token: enough blocks for two waves, no more than the tiles of the bound.
  const int64_t tiles = (bound + kScoreKeys - 1) / kScoreKeys;
  const int64_t want = (2 * static_cast<int64_t>(num_sms()) + group - 1) / group;
  const int64_t splits = std::max<int64_t>(1, std::min({want, tiles, int64_t{65535}}));

  const DeviceLayout dl = device_layout(layout);
  ScoreArgs sa{};
  sa.q = q.data<float>();
  sa.weights = weights.data<float>();
  sa.cache = index_cache.data<float>();
  sa.scores = reinterpret_cast<float*>(scores.raw_data());
  sa.bound = bound;
  sa.cache_rows = index_cache.size(0);
  sa.heads = static_cast<int>(heads);
  sa.dim = static_cast<int>(dim);
  sa.ratio = ratio;
  sa.epb = static_cast<int>(epb);
  sa.score_scale = score_scale;
  sa.weight_scale = weight_scale;
  SelectArgs se{};
  se.scores = sa.scores;
  se.out = out.data<int32_t>();
  se.bound = bound;
  se.cap = cap;
  se.top_k = top_k;
  se.ratio = ratio;
  se.scores_in_smem = in_smem;
  for (int64_t t0 = 0; t0 < tokens; t0 += group) {
    const int64_t n = std::min(group, tokens - t0);
    sa.token0 = static_cast<int>(t0);
    se.token0 = static_cast<int>(t0);
    indexer_score_kernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(splits)),
                           kScoreThreads, score_smem, stream()>>>(sa, dl);
    DEEPINFER_CUDA_LAUNCH_CHECK(op);
    indexer_select_kernel<<<static_cast<unsigned>(n), kSelectThreads, select_smem, stream()>>>(se,
                                                                                               dl);
    DEEPINFER_CUDA_LAUNCH_CHECK(op);
  }
  return out;
}

}  // namespace deepinfer::cuda
