// Attention ops of the CUDA backend: the lightning indexer's top-k (model.md A.8) and the sliding
// + compressed attention with sinks (A.5-A.8) over the paged layout of D.2. Each matches the CPU
// reference op in cpp/src/backend/cpu_ops_attention.cpp on the same inputs; f32 math throughout.
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
// attention runs one kernel, grid (token, head group, split), plus a combine kernel when the
// keys are split (flash-decoding: few tokens then still spread over the SMs). A block takes up
// to 8192 / D heads of one token (the MQA heads share every key tile in shared memory) and walks
// its range of the token's key list in tiles of 32 keys with an online softmax. The key list of
// token t at position p is: the sliding keys max(0, p-W+1) .. p (this call's kv rows from
// ctx_len on, the ring before), then the compressed entries (dense: j < (p+1)/ratio; sparse:
// the K columns of topk[t], -1 masked).
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

namespace deepinfer::cuda {

namespace {

// ---- host-side checks ---------------------------------------------------------------------------

// A defined, contiguous CUDA tensor of `dtype` whose shape matches `shape` (-1: any size).
void check_tensor(const char* op, const char* arg, const Tensor& t, DType dtype,
                  const Shape& shape) {
  check_device(op, arg, t);
  check_dtype(op, arg, t, dtype);
  bool ok = t.dim() == static_cast<int64_t>(shape.size());
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] < 0 || shape[i] == t.shape()[i];
  if (!ok) {
    fail(op, std::string("argument ") + arg + " must have shape " + shape_str(shape) +
                 " (-1: any size), got " + t.describe());
  }
}

// The metadata of the layout tensors (as the CPU's check_layout).
void check_layout(const char* op, const BatchLayout& layout, bool need_block_table) {
  const int64_t t = layout.num_tokens;
  const int64_t b = layout.num_seqs;
  if (t < 0 || b < 0 || layout.block_size <= 0 || layout.max_blocks_per_seq < 0 ||
      (t > 0 && b == 0)) {
    fail(op, "layout has num_tokens " + std::to_string(t) + ", num_seqs " + std::to_string(b) +
                 ", block_size " + std::to_string(layout.block_size) + ", max_blocks_per_seq " +
                 std::to_string(layout.max_blocks_per_seq) +
                 " (expected >= 0, >= 1 when there are tokens, > 0, >= 0)");
  }
  check_tensor(op, "layout.positions", layout.positions, DType::kI32, {t});
  check_tensor(op, "layout.seq_q_start", layout.seq_q_start, DType::kI32, {b + 1});
  check_tensor(op, "layout.seq_ctx_len", layout.seq_ctx_len, DType::kI32, {b});
  check_tensor(op, "layout.seq_slot", layout.seq_slot, DType::kI32, {b});
  if (need_block_table) {
    check_tensor(op, "layout.block_table", layout.block_table, DType::kI32,
                 {b, layout.max_blocks_per_seq});
  }
}

void check_ratio(const char* op, int ratio, const BatchLayout& layout) {
  if (ratio < 1 || layout.block_size % ratio != 0) {
    fail(op, "compression ratio " + std::to_string(ratio) + " must be >= 1 and divide block_size " +
                 std::to_string(layout.block_size));
  }
}

// The float4 paths need 16-byte aligned rows: a width that is a multiple of 4 on an aligned base.
void check_vec4(const char* op, const char* arg, const Tensor& t) {
  if ((reinterpret_cast<uintptr_t>(t.raw_data()) & 15u) != 0) {
    throw Error(ErrorCode::kUnsupported, std::string(op) + ": argument " + arg + " " +
                                             t.describe() +
                                             " does not start on a 16-byte boundary");
  }
}

// Raises a kernel's dynamic shared memory limit when it needs more than the default 48 KiB.
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024) {
    DEEPINFER_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(bytes)));
  }
}

// ---- device-side layout -------------------------------------------------------------------------

struct DeviceLayout {
  const int32_t* positions;    // [T]
  const int32_t* q_start;      // [B + 1]
  const int32_t* ctx_len;      // [B]
  const int32_t* slot;         // [B]
  const int32_t* block_table;  // [B, max_blocks] or null
  int num_tokens;
  int num_seqs;
  int max_blocks;
};

DeviceLayout device_layout(const BatchLayout& layout) {
  return {layout.positions.data<int32_t>(),
          layout.seq_q_start.data<int32_t>(),
          layout.seq_ctx_len.data<int32_t>(),
          layout.seq_slot.data<int32_t>(),
          layout.block_table.defined() ? layout.block_table.data<int32_t>() : nullptr,
          layout.num_tokens,
          layout.num_seqs,
          layout.max_blocks_per_seq};
}

// Sequence of row t: the last b in [0, B) with q_start[b] <= t (the CPU's seq_of_rows). B >= 1.
__device__ int seq_of_row(const DeviceLayout& l, int t) {
  int lo = 0;
  int hi = l.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (l.q_start[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Entries visible at position p: (p + 1) / ratio, at most `bound` (the block table's reach).
__device__ int64_t visible_entries(int64_t pos, int ratio, int64_t bound) {
  const int64_t v = pos < 0 ? 0 : (pos + 1) / ratio;
  return v < bound ? v : bound;
}

// Row of entry j of sequence b in a paged cache of `rows` rows with `epb` entries per block, or
// -1 when the block table does not map it inside the cache.
__device__ int64_t entry_row(const DeviceLayout& l, int b, int64_t j, int epb, int64_t rows) {
  const int64_t logical = j / epb;
  if (j < 0 || logical >= l.max_blocks) return -1;
  const int64_t block = l.block_table[static_cast<int64_t>(b) * l.max_blocks + logical];
  const int64_t row = block * epb + j % epb;
  if (block < 0 || row >= rows) return -1;
  return row;
}

constexpr unsigned kFullMask = 0xffffffffu;

__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ int warp_inclusive_scan(int v) {
  const int lane = threadIdx.x & 31;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(kFullMask, v, o);
    if (lane >= o) v += y;
  }
  return v;
}

// Exclusive prefix sum of v over the block (blockDim.x a multiple of 32, at most 1024);
// `warp_sums` holds 32 ints. Contains block barriers: every thread must call it.
__device__ int block_exclusive_scan(int v, int* warp_sums) {
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

// Asynchronous global -> shared copies (cp.async): a thread issues all its copies back to back
// and waits once, so a tile's loads are in flight together instead of one latency each.
__device__ void cp_async16(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem));
}

__device__ void cp_async4(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(gmem));
}

// Waits for this thread's copies; a __syncthreads() after it publishes them to the block.
__device__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

__device__ float4 fma4(float a, float4 x, float4 acc) {
  acc.x = fmaf(a, x.x, acc.x);
  acc.y = fmaf(a, x.y, acc.y);
  acc.z = fmaf(a, x.z, acc.z);
  acc.w = fmaf(a, x.w, acc.w);
  return acc;
}

// acc + a * b, per component.
__device__ float4 fma4v(float4 a, float4 b, float4 acc) {
  acc.x = fmaf(a.x, b.x, acc.x);
  acc.y = fmaf(a.y, b.y, acc.y);
  acc.z = fmaf(a.z, b.z, acc.z);
  acc.w = fmaf(a.w, b.w, acc.w);
  return acc;
}

__device__ float dot4(float4 a, float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

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

// ================================================================================================
// attention
// ================================================================================================

constexpr int kAttnThreads = 256;
constexpr int kAttnWarps = kAttnThreads / 32;
constexpr int kAttnKeys = 32;           // keys per tile: one per lane in the score phase
constexpr int kAttnHeadsPerThread = 8;  // heads of one thread in the P.V phase
constexpr int kAttnQFloats = 8192;      // q floats per block: heads per block = 8192 / D
constexpr int kAttnMaxDim = 1024;       // D/4 column groups must fit the block's threads

struct AttnArgs {
  const float* q;        // [T, heads, dim]
  const float* kv;       // [T, dim]
  const float* ring;     // [slots, ring_len, dim]
  const float* entries;  // [entry_rows, dim] or null
  const int32_t* topk;   // [T, topk_cols] or null
  const float* sinks;    // [heads]
  float* out;            // [T, heads, dim] when there is one split
  float* part_acc;       // [splits, T, heads, dim] otherwise
  float* part_md;        // [splits, T, heads, 2]: running max, denominator
  int64_t slots;
  int64_t ring_len;
  int64_t entry_rows;
  int64_t entry_bound;  // max_blocks_per_seq * epb
  int heads;
  int dim;              // a multiple of 4, at most kAttnMaxDim
  int heads_per_block;  // HB
  int hb_stride;        // HB rounded up to a multiple of 8: row stride of the probability tile
  int window;
  int ratio;  // 0: sliding only
  int epb;
  int topk_cols;
  bool sparse;
  float scale;
};

size_t attn_smem_bytes(int64_t dim, int64_t hb, int64_t hb_stride) {
  const int64_t floats = hb * dim + kAttnKeys * (dim + 4) + kAttnKeys * hb_stride + 3 * hb_stride;
  return static_cast<size_t>(floats) * sizeof(float) + kAttnKeys * sizeof(const float*);
}

// Block (token t, head group, split). Shared memory: q of the group's heads [HB][D], the key tile
// [32][D+4], the tile's probabilities [32][hb_stride], key pointers [32], and per head the
// running max, denominator and the tile's rescale factor.
//  - score phase: warp w owns heads w, w+8, ...; lane = key. It computes the logits, updates the
//    head's online softmax with warp reductions and writes p = exp(logit - max) to the tile.
//  - P.V phase: thread (column group c4 = tid % (D/4), head subgroup tid / (D/4)) keeps acc for
//    8 heads x 4 channels in registers.
__global__ void __launch_bounds__(kAttnThreads, 2) attention_kernel(AttnArgs a, DeviceLayout l) {
  extern __shared__ float4 smem4[];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int t = blockIdx.x;
  const int h_first = blockIdx.y * a.heads_per_block;
  const int nhb = min(a.heads_per_block, a.heads - h_first);
  const int split = blockIdx.z;
  const int splits = gridDim.z;
  const int dim = a.dim;
  const int d4 = dim / 4;
  const int kstride = dim + 4;
  const int hbs = a.hb_stride;

  float* qs = reinterpret_cast<float*>(smem4);                        // [HB][dim]
  float* ks = qs + static_cast<int64_t>(a.heads_per_block) * dim;     // [kAttnKeys][kstride]
  float* ps = ks + kAttnKeys * kstride;                               // [kAttnKeys][hbs]
  float* m_run = ps + kAttnKeys * hbs;                                // [hbs]
  float* d_run = m_run + hbs;                                         // [hbs]
  float* alpha = d_run + hbs;                                         // [hbs]
  const float** kptr = reinterpret_cast<const float**>(alpha + hbs);  // [kAttnKeys]

  // This token's key list.
  const int b = seq_of_row(l, t);
  const int64_t p = l.positions[t];
  const int64_t ctx = l.ctx_len[b];
  const int64_t row0 = l.q_start[b];
  const int64_t slot = l.slot[b];
  const int64_t lo = p - a.window + 1 > 0 ? p - a.window + 1 : 0;
  const int64_t n_sliding = p >= 0 ? p - lo + 1 : 0;
  const int64_t visible = a.ratio > 0 ? visible_entries(p, a.ratio, a.entry_bound) : 0;
  const int64_t n_comp = a.ratio == 0 ? 0 : (a.sparse ? a.topk_cols : visible);
  const int64_t n_keys = n_sliding + n_comp;
  // This split's range, whole tiles.
  const int64_t per_split =
      ((n_keys + splits - 1) / splits + kAttnKeys - 1) / kAttnKeys * kAttnKeys;
  const int64_t k_begin = min(n_keys, per_split * split);
  const int64_t k_end = min(n_keys, k_begin + per_split);

  // Key i of the list, or null when it is masked.
  auto key_at = [&](int64_t i) -> const float* {
    if (i >= k_end) return nullptr;
    if (i < n_sliding) {
      const int64_t j = lo + i;
      if (j >= ctx) {
        const int64_t row = row0 + j - ctx;
        return row >= 0 && row < l.num_tokens ? a.kv + row * dim : nullptr;
      }
      if (slot < 0 || slot >= a.slots || a.ring_len <= 0) return nullptr;
      return a.ring + (slot * a.ring_len + j % a.ring_len) * dim;
    }
    const int64_t c = i - n_sliding;
    const int64_t j = a.sparse ? a.topk[static_cast<int64_t>(t) * a.topk_cols + c] : c;
    if (j < 0 || j >= visible) return nullptr;
    const int64_t row = entry_row(l, b, j, a.epb, a.entry_rows);
    return row >= 0 ? a.entries + row * dim : nullptr;
  };

  const float4* q4 =
      reinterpret_cast<const float4*>(a.q + (static_cast<int64_t>(t) * a.heads + h_first) * dim);
  for (int i = tid; i < a.heads_per_block * d4; i += blockDim.x) {
    if (i < nhb * d4) {
      cp_async16(qs + 4 * i, q4 + i);
    } else {
      reinterpret_cast<float4*>(qs)[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  for (int i = tid; i < kAttnKeys * hbs; i += blockDim.x) ps[i] = 0.0f;
  for (int h = tid; h < hbs; h += blockDim.x) {
    m_run[h] = -INFINITY;
    d_run[h] = 0.0f;
    alpha[h] = 1.0f;
  }
  // q lands with the first tile's copies; an empty key range must not exit with copies pending.
  if (k_begin >= k_end) cp_async_wait_all();
  __syncthreads();  // an empty key range reads m_run / d_run right away

  // P.V ownership.
  const int c4 = tid % d4;
  const int hsub = tid / d4;
  const bool pv_thread = hsub * kAttnHeadsPerThread < nhb;
  float4 acc[kAttnHeadsPerThread];
#pragma unroll
  for (int i = 0; i < kAttnHeadsPerThread; ++i) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);

  for (int64_t i0 = k_begin; i0 < k_end; i0 += kAttnKeys) {
    if (tid < kAttnKeys) kptr[tid] = key_at(i0 + tid);
    __syncthreads();
    for (int i = tid; i < kAttnKeys * d4; i += blockDim.x) {
      const int r = i / d4;
      const int c = i - r * d4;
      const float* src = kptr[r];
      float* dst = ks + r * kstride + c * 4;
      if (src != nullptr) {
        cp_async16(dst, src + 4 * c);
      } else {
        *reinterpret_cast<float4*>(dst) = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
    cp_async_wait_all();
    __syncthreads();

    // Score phase: heads hA = warp + 16m and hB = hA + 8 share each key read.
    const bool key_valid = kptr[lane] != nullptr;
    const float4* key = reinterpret_cast<const float4*>(ks + lane * kstride);
    for (int ha = warp; ha < nhb; ha += 2 * kAttnWarps) {
      const int hb = ha + kAttnWarps;
      const bool has_b = hb < nhb;  // uniform over the warp
      const float4* qa = reinterpret_cast<const float4*>(qs + ha * dim);
      const float4* qb = reinterpret_cast<const float4*>(qs + (has_b ? hb : ha) * dim);
      // Four partial sums per head (one per float4 lane) keep the FMA chains short.
      float4 part_a = make_float4(0.f, 0.f, 0.f, 0.f), part_b = part_a;
      for (int c = 0; c < d4; ++c) {
        const float4 k = key[c];
        part_a = fma4v(qa[c], k, part_a);
        part_b = fma4v(qb[c], k, part_b);
      }
      const float sa = (part_a.x + part_a.y) + (part_a.z + part_a.w);
      const float sb = (part_b.x + part_b.y) + (part_b.z + part_b.w);
      for (int pass = 0; pass < (has_b ? 2 : 1); ++pass) {
        const int h = pass == 0 ? ha : hb;
        const float s = key_valid ? (pass == 0 ? sa : sb) * a.scale : -INFINITY;
        const float m_old = m_run[h];
        const float m_new = fmaxf(m_old, warp_max(s));
        float pr = 0.0f, al = 1.0f;
        if (m_new != -INFINITY) {  // else no valid key yet: nothing to add, nothing to rescale
          pr = expf(s - m_new);
          al = expf(m_old - m_new);
        }
        const float sum = warp_sum(pr);
        ps[lane * hbs + h] = pr;
        __syncwarp();  // every lane has read m_run[h]
        if (lane == 0) {
          d_run[h] = d_run[h] * al + sum;
          m_run[h] = m_new;
          alpha[h] = al;
        }
      }
    }
    __syncthreads();

    // P.V phase.
    if (pv_thread) {
      const int h0 = hsub * kAttnHeadsPerThread;
#pragma unroll
      for (int i = 0; i < kAttnHeadsPerThread; ++i) {
        const float al = alpha[h0 + i];
        acc[i].x *= al;
        acc[i].y *= al;
        acc[i].z *= al;
        acc[i].w *= al;
      }
      for (int k = 0; k < kAttnKeys; ++k) {
        const float4 v = *reinterpret_cast<const float4*>(ks + k * kstride + c4 * 4);
        const float4 pa = *reinterpret_cast<const float4*>(ps + k * hbs + h0);
        const float4 pb = *reinterpret_cast<const float4*>(ps + k * hbs + h0 + 4);
        acc[0] = fma4(pa.x, v, acc[0]);
        acc[1] = fma4(pa.y, v, acc[1]);
        acc[2] = fma4(pa.z, v, acc[2]);
        acc[3] = fma4(pa.w, v, acc[3]);
        acc[4] = fma4(pb.x, v, acc[4]);
        acc[5] = fma4(pb.y, v, acc[5]);
        acc[6] = fma4(pb.z, v, acc[6]);
        acc[7] = fma4(pb.w, v, acc[7]);
      }
    }
    __syncthreads();
  }

  if (!pv_thread) return;
  const int h0 = hsub * kAttnHeadsPerThread;
#pragma unroll
  for (int i = 0; i < kAttnHeadsPerThread; ++i) {
    const int h = h0 + i;
    if (h >= nhb) break;
    const int64_t head = h_first + h;
    const float m = m_run[h];
    const float d = d_run[h];
    if (splits == 1) {
      // softmax(logits ++ sink) without the sink column: divide by d e^(m-M) + e^(sink-M).
      const float sink = a.sinks[head];
      const float mx = fmaxf(m, sink);
      const float em = m == -INFINITY ? 0.0f : expf(m - mx);
      const float f = em / (d * em + expf(sink - mx));
      const float4 r = make_float4(acc[i].x * f, acc[i].y * f, acc[i].z * f, acc[i].w * f);
      reinterpret_cast<float4*>(a.out + (static_cast<int64_t>(t) * a.heads + head) * dim)[c4] = r;
    } else {
      const int64_t idx = (static_cast<int64_t>(split) * l.num_tokens + t) * a.heads + head;
      reinterpret_cast<float4*>(a.part_acc + idx * dim)[c4] = acc[i];
      if (c4 == 0) {
        a.part_md[2 * idx] = m;
        a.part_md[2 * idx + 1] = d;
      }
    }
  }
}

constexpr int kAttnMaxSplits = 64;

// Block (token, head): merges the splits' (max, denominator, unnormalised sum) with the sink.
// The splits' statistics are staged in shared memory so each is loaded once, and the sums are
// loaded a few splits at a time.
__global__ void attention_combine_kernel(const float* __restrict__ part_acc,
                                         const float* __restrict__ part_md,
                                         const float* __restrict__ sinks, float* __restrict__ out,
                                         int num_tokens, int heads, int dim, int splits) {
  __shared__ float m_s[kAttnMaxSplits];
  __shared__ float d_s[kAttnMaxSplits];
  __shared__ float w_s[kAttnMaxSplits];
  const int64_t t = blockIdx.x;
  const int64_t h = blockIdx.y;
  const int64_t stride = static_cast<int64_t>(num_tokens) * heads;  // between splits
  const int64_t idx = t * heads + h;
  for (int s = threadIdx.x; s < splits; s += blockDim.x) {
    m_s[s] = part_md[2 * (s * stride + idx)];
    d_s[s] = part_md[2 * (s * stride + idx) + 1];
  }
  __syncthreads();
  const float sink = sinks[h];
  float mx = sink;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, m_s[s]);
  for (int s = threadIdx.x; s < splits; s += blockDim.x) {
    w_s[s] = m_s[s] == -INFINITY ? 0.0f : expf(m_s[s] - mx);  // an empty split weighs 0
  }
  __syncthreads();
  float den = expf(sink - mx);
  for (int s = 0; s < splits; ++s) den += d_s[s] * w_s[s];
  const float inv = 1.0f / den;
  for (int c4 = threadIdx.x; c4 < dim / 4; c4 += blockDim.x) {
    float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
    for (int s = 0; s < splits; ++s) {
      const float4 v = reinterpret_cast<const float4*>(part_acc + (s * stride + idx) * dim)[c4];
      r = fma4(w_s[s], v, r);
    }
    r.x *= inv;
    r.y *= inv;
    r.z *= inv;
    r.w *= inv;
    reinterpret_cast<float4*>(out + idx * dim)[c4] = r;
  }
}

}  // namespace

Tensor CudaBackend::indexer_topk(const Tensor& q, const Tensor& weights, const Tensor& index_cache,
                                 const BatchLayout& layout, int ratio, int top_k, float score_scale,
                                 float weight_scale) {
  const char* op = "indexer_topk";
  check_layout(op, layout, true);
  check_ratio(op, ratio, layout);
  if (top_k < 0) fail(op, "top_k must be >= 0, got " + std::to_string(top_k));
  check_tensor(op, "q", q, DType::kF32, {layout.num_tokens, -1, -1});
  const int64_t heads = q.size(1);
  const int64_t dim = q.size(2);
  check_tensor(op, "weights", weights, DType::kF32, {layout.num_tokens, heads});
  check_tensor(op, "index_cache", index_cache, DType::kF32, {-1, dim});
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

Tensor CudaBackend::attention(const Tensor& q, const Tensor& kv, const Tensor& swa_ring,
                              const Tensor& entries, const Tensor& topk, const Tensor& sinks,
                              const BatchLayout& layout, const AttentionSpec& spec) {
  const char* op = "attention";
  const bool compressed = spec.ratio > 0;
  check_layout(op, layout, compressed);
  if (spec.window < 1) fail(op, "spec.window must be >= 1, got " + std::to_string(spec.window));
  const int64_t tokens = layout.num_tokens;
  check_tensor(op, "q", q, DType::kF32, {tokens, -1, -1});
  const int64_t heads = q.size(1);
  const int64_t dim = q.size(2);
  check_tensor(op, "kv", kv, DType::kF32, {tokens, dim});
  check_tensor(op, "swa_ring", swa_ring, DType::kF32, {-1, -1, dim});
  check_tensor(op, "sinks", sinks, DType::kF32, {heads});
  const bool sparse = compressed && spec.sparse;
  if (compressed) {
    check_ratio(op, spec.ratio, layout);
    check_tensor(op, "entries", entries, DType::kF32, {-1, dim});
    if (sparse) check_tensor(op, "topk", topk, DType::kI32, {tokens, -1});
  }
  Tensor out = empty({tokens, heads, dim}, DType::kF32);
  if (tokens == 0 || heads == 0 || dim == 0) return out;
  if (dim % 4 != 0 || dim > kAttnMaxDim) {
    throw Error(ErrorCode::kUnsupported, std::string(op) +
                                             ": the head dim must be a multiple of 4 up to " +
                                             std::to_string(kAttnMaxDim) + ", got " + q.describe());
  }
  check_vec4(op, "q", q);
  check_vec4(op, "kv", kv);
  check_vec4(op, "swa_ring", swa_ring);
  if (compressed) check_vec4(op, "entries", entries);
  check_vec4(op, "out", out);

  // Heads per block: the most whose q fits kAttnQFloats, a multiple of 8 (so the P.V phase's
  // (D/4) x (HB/8) threads fit the block), or all heads when fewer.
  const int64_t hb_cap = std::max<int64_t>(
      kAttnHeadsPerThread, kAttnQFloats / dim / kAttnHeadsPerThread * kAttnHeadsPerThread);
  const int64_t hb = std::min(heads, hb_cap);
  const int64_t hb_stride = (hb + 7) / 8 * 8;
  const int64_t head_groups = (heads + hb - 1) / hb;
  const size_t smem = attn_smem_bytes(dim, hb, hb_stride);
  if (smem > max_shared_memory_per_block() || head_groups > 65535) {
    throw Error(ErrorCode::kUnsupported, std::string(op) + ": " + std::to_string(heads) +
                                             " heads of " + std::to_string(dim) +
                                             " channels do not fit the kernel's blocks");
  }
  allow_smem(attention_kernel, smem);

  const int64_t epb = compressed ? layout.block_size / spec.ratio : 0;
  const int64_t entry_bound = static_cast<int64_t>(layout.max_blocks_per_seq) * epb;
  const int64_t topk_cols = sparse ? topk.size(1) : 0;
  // Splits of each token's key list: enough blocks for two waves when tokens are few, at least
  // one tile of keys per split (by the host's bound on the list: W + entries).
  const int64_t max_keys = spec.window + (compressed ? (sparse ? topk_cols : entry_bound) : 0);
  const int64_t blocks = tokens * head_groups;
  const int64_t target = 2 * static_cast<int64_t>(num_sms());
  int64_t splits = 1;
  if (blocks < target) {
    splits = std::min({(target + blocks - 1) / blocks, (max_keys + kAttnKeys - 1) / kAttnKeys,
                       int64_t{kAttnMaxSplits}});
    splits = std::max<int64_t>(1, splits);
  }

  AttnArgs a{};
  a.q = q.data<float>();
  a.kv = kv.data<float>();
  a.ring = swa_ring.data<float>();
  a.entries = compressed ? entries.data<float>() : nullptr;
  a.topk = sparse ? topk.data<int32_t>() : nullptr;
  a.sinks = sinks.data<float>();
  a.out = out.data<float>();
  a.slots = swa_ring.size(0);
  a.ring_len = swa_ring.size(1);
  a.entry_rows = compressed ? entries.size(0) : 0;
  a.entry_bound = entry_bound;
  a.heads = static_cast<int>(heads);
  a.dim = static_cast<int>(dim);
  a.heads_per_block = static_cast<int>(hb);
  a.hb_stride = static_cast<int>(hb_stride);
  a.window = spec.window;
  a.ratio = compressed ? spec.ratio : 0;
  a.epb = static_cast<int>(epb);
  a.topk_cols = static_cast<int>(topk_cols);
  a.sparse = sparse;
  a.scale = spec.scale;
  Tensor partials;
  if (splits > 1) {
    const int64_t rows = splits * tokens * heads;
    partials = scratch(static_cast<size_t>(rows * (dim + 2)) * sizeof(float));
    a.part_acc = reinterpret_cast<float*>(partials.raw_data());
    a.part_md = a.part_acc + rows * dim;
  }
  const DeviceLayout dl = device_layout(layout);
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(head_groups),
                  static_cast<unsigned>(splits));
  attention_kernel<<<grid, kAttnThreads, smem, stream()>>>(a, dl);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  if (splits > 1) {
    attention_combine_kernel<<<dim3(static_cast<unsigned>(tokens), static_cast<unsigned>(heads)),
                               128, 0, stream()>>>(a.part_acc, a.part_md, a.sinks, a.out,
                                                   static_cast<int>(tokens), a.heads, a.dim,
                                                   static_cast<int>(splits));
    DEEPINFER_CUDA_LAUNCH_CHECK(op);
  }
  return out;
}

}  // namespace deepinfer::cuda
