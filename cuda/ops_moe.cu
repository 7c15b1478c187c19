// Mixture-of-experts ops of the CUDA backend: moe_route and moe_experts. They match the CPU
// reference ops (cpp/src/backend/cpu_ops_moe.cpp) on the same inputs.
//
// moe_route: router logits x . gate_w^T in f32 (gate_w f32 or bf16, the activations stay f32),
// scores sqrt(softplus(logit)), then per token either the top-k of scores + bias (ties: lower
// expert id) or the hash table row tid2eid[token]; the chosen scores are renormalised in slot
// order and scaled. Ids come out in the CPU's order (key descending, then id ascending).
//  - logits, T < kRouteGemmTokens (decode): router_gemv_kernel, CTAs over (experts, tokens)
//    tiles whose threads split K, so one token's 2 MB of bf16 gate weights (V4-Flash) are read by
//    every SM at once, at memory latency rather than in per-warp chains of loads.
//  - logits, larger T (prefill): the backend's own f32 linear (cuBLAS SGEMM, IEEE f32, no TF32),
//    bf16 weights first widened exactly into an [E, H] f32 temporary. f32 FMA on CUDA cores in a
//    hand-written kernel reached ~5 TFLOP/s here; the GEMM only changes the summation order.
//  - selection: one warp per token; route_select_warp_kernel holds the token's scores in
//    registers (E <= 256, k <= 32) and takes k rounds of a warp-wide argmax; other shapes take the
//    generic route_select_kernel. Both give the CPU's ids and bitwise the same weights.
//
// moe_experts, all on the device and in stream order (no host sync, no host-side routing):
//  1. group_pairs (one CTA): the (token, slot) pairs are counted per expert, the counts
//     exclusive-scanned into row offsets, the pairs scattered into expert order, and the list of
//     row tiles (expert, first sorted row, rows) the GEMMs run over is written with its length.
//  2. gate/up GEMM + SwiGLU over the tile list -> act [pairs, I], rows in expert order.
//  3. down GEMM over the tile list -> y [pairs, H], rows in (token, slot) order.
//  4. out[t] = sum_j weight[t, j] * y[t, j], summed in slot order j; a grid over (hidden chunks,
//     tokens) with float4 loads, so a decode step spreads over several CTAs.
// The GEMM grids are sized from a host bound on the tile count (ceil(P / rows) + min(E, P));
// CTAs past the count the device wrote exit at once. Each output element depends only on its own
// row and weight column, reduced over K in a fixed order whatever else shares its tile, and step
// 4 sums in slot order: the result is deterministic even though the scatter of step 1 (shared
// atomics) puts the pairs of one expert in run-dependent order.
//
// The GEMM shapes (each with its own tile size in the tile list):
//  - decode (few pairs per expert): tiles of kGemvRows pairs; one warp streams kGemvWeightRows
//    weight rows with 16-byte loads, coalesced across the warp, so each used expert's weights are
//    read once per tile (once in total when an expert has <= kGemvRows pairs). Memory-bound.
//  - prefill, bf16 weights (rows 16-byte aligned, H and I multiples of 8): tensor cores
//    (mma.sync m16n8k16, f32 accumulation), cp.async pipelines of 32-deep K slices. CTAs of 64
//    pair rows x 256 weight rows (3 stages) while experts average at most kMmaWideMinPairs pairs
//    in the pass, else of 128 pair rows x 128 weight rows (4 stages; the tile list is then built
//    with 128-row tiles), so an expert with up to 128 pairs streams its weights once per pass.
//    The grid is tile-major (all the weight column blocks of a tile, then the next tile), so the
//    row tiles of one expert, and the column blocks sharing a tile's A rows, run together and
//    share those reads through L2. The activations are rounded to bf16 (x once, before the
//    gate/up GEMM; act, the SwiGLU output, when it is stored), as the dense linear op feeds
//    cuBLAS for bf16 weights: the backend's precision policy for bf16 weights. The gate/up CTA
//    holds the w1 and w3 columns of the same outputs, so SwiGLU is applied in f32 on the
//    accumulators. Without the tensor cores these GEMMs ran at ~3% of the bf16 peak.
//  - prefill otherwise (f32 weights, odd sizes, unaligned rows): tiles of kTileM pair rows,
//    64 x 64 output tiles with 32-deep K steps through shared memory, 4 x 4 results per thread,
//    f32 FMA on CUDA cores (activations stay f32, bf16 weights are widened exactly, so results
//    equal the CPU op on bf16-rounded weights up to summation order).
// In both prefill shapes rows past a tile's pairs, weight rows past the matrix and k past K are
// zero-filled in shared memory, never read from global memory.
//
// Robustness where the CPU op throws (a device op cannot): a routing.expert_ids entry outside
// [0, E) is dropped (that slot contributes nothing to its token); in hash routing a token id
// outside [0, V) is clamped into that range and a table entry outside [0, E) is clamped too, so no
// read is ever out of bounds. NaN router scores give an unspecified (but in-range) choice.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <cub/block/block_scan.cuh>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_backend.h"
#include "cuda_common.cuh"
#include "mma.cuh"

namespace deepinfer::cuda {

namespace {

constexpr unsigned kFullMask = 0xffffffffu;

// Largest expert count: group_pairs keeps two ints per expert in shared memory.
constexpr int kMaxExperts = 4096;
// Token rows per moe_experts pass: bounds the [pairs, I] and [pairs, H] intermediates (y is
// 400 MB at 4096 tokens, top-6, H = 4096). Every pass streams all the used experts' weights, so
// fewer, larger passes read them fewer times (a 4096-token prefill chunk is one pass).
constexpr int64_t kMaxPassTokens = 4096;

// Decode GEMM shape.
constexpr int kGemvRows = 4;        // pairs per tile
constexpr int kGemvWarps = 4;       // warps per CTA
constexpr int kGemvWeightRows = 4;  // weight rows one warp streams together

// Prefill GEMM shape.
constexpr int kTileM = 64;
constexpr int kTileN = 64;
constexpr int kTileK = 32;
constexpr int kTileThreads = 256;

constexpr int kGroupThreads = 256;

// Router logits: from kRouteGemmTokens tokens on, cuBLAS SGEMM; below, router_gemv_kernel with
// CTAs of kRouteThreads threads over (kE experts, kR tokens) tiles, the small tile while
// T <= kRouteSmallTokens (T = 1: one CTA per expert, every SM busy), the wider one above (each x
// row read from L2 by fewer CTAs).
constexpr int64_t kRouteGemmTokens = 64;
constexpr int64_t kRouteSmallTokens = 4;
constexpr int kRouteThreads = 256;
constexpr int kRouteSmallE = 1, kRouteSmallR = 4;
constexpr int kRouteWideE = 8, kRouteWideR = 4;
// Tokens per CTA of the top-k selection (one warp each).
constexpr int kSelectWarps = 4;
// Experts per lane held in registers by route_select_warp_kernel: E <= 32 * kSelectSlots.
constexpr int kSelectSlots = 8;
// Picks one lane of route_select_warp_kernel holds: top_k <= 32.
constexpr int kSelectMaxK = 32;

// combine: hidden elements per thread (one float4), threads per CTA, slots loaded together.
constexpr int kCombineVec = 4;
constexpr int kCombineThreads = 128;
constexpr int kCombineSlots = 8;

// ---- small device helpers ----------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off);
  return v;
}

// torch.nn.functional.softplus (beta 1, threshold 20), as cpu::softplus.
__device__ __forceinline__ float softplus(float x) {
  return x > 20.0f ? x : log1pf(expf(x));
}

__device__ __forceinline__ float router_score(float logit) {
  return sqrtf(softplus(logit));
}

// silu(min(gate, L)) * clamp(up, -L, L), as cpu::swiglu (comparisons so NaN propagates).
__device__ __forceinline__ float swiglu(float gate, float up, float limit) {
  const float g = gate > limit ? limit : gate;
  const float u = up > limit ? limit : (up < -limit ? -limit : up);
  return g * (1.0f / (1.0f + expf(-g))) * u;
}

// Elements of W in one 16-byte load.
template <typename W>
struct Vec16;
template <>
struct Vec16<float> {
  static constexpr int kN = 4;
};
template <>
struct Vec16<__nv_bfloat16> {
  static constexpr int kN = 8;
};

__device__ __forceinline__ void load16(const float* p, float (&v)[4]) {
  const float4 q = __ldg(reinterpret_cast<const float4*>(p));
  v[0] = q.x;
  v[1] = q.y;
  v[2] = q.z;
  v[3] = q.w;
}

__device__ __forceinline__ void load16(const __nv_bfloat16* p, float (&v)[8]) {
  const uint4 q = __ldg(reinterpret_cast<const uint4*>(p));
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    // bf16 -> f32 is exact: the bf16 bits are the high half of the f32.
    v[2 * i] = __uint_as_float(words[i] << 16);
    v[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

// N consecutive f32 activations (N a multiple of 4, p 16-byte aligned).
template <int N>
__device__ __forceinline__ void load_f32(const float* p, float (&v)[N]) {
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    const float4 q = __ldg(reinterpret_cast<const float4*>(p) + i);
    v[4 * i] = q.x;
    v[4 * i + 1] = q.y;
    v[4 * i + 2] = q.z;
    v[4 * i + 3] = q.w;
  }
}

// Lane partials of M x R dot products over K: acc[m][r] += w[m][k] * x[r][k] for this lane's k.
// kVec: 16-byte weight loads, lanes strided by 16 bytes (a warp reads 512 contiguous bytes per
// row), which needs K % Vec16<W>::kN == 0 and 16-byte aligned rows; otherwise one element per
// lane. Rows r >= rows are skipped (their pointers are never dereferenced). The caller sums acc
// over the warp; the order of every sum is fixed, so results do not depend on the launch.
template <typename W, bool kVec, int M, int R>
__device__ __forceinline__ void lane_dots(const W* (&w)[M], const float* (&x)[R], int rows,
                                          int64_t K, float (&acc)[M][R]) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  if constexpr (kVec) {
    constexpr int kN = Vec16<W>::kN;
#pragma unroll 2
    for (int64_t k = static_cast<int64_t>(lane) * kN; k < K; k += 32 * kN) {
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
    for (int64_t k = lane; k < K; k += 32) {
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

// ---- routing -----------------------------------------------------------------------------------

// logits[t, e] = x[t] . gate[e] for tokens < kRouteGemmTokens (decode): a CTA computes kE
// experts x kR tokens over the whole of K. Its threads split K (kVec: 16 bytes of each weight row
// per thread and step, as lane_dots) so every load of the CTA is in flight at once: the op is one
// pass over the gate weights at memory latency, not a chain of dependent loads per warp. The kE
// weight vectors a thread loads are used for all kR tokens and each x vector for all kE experts.
// Reduction in a fixed order (each thread over its k ascending, then lane partials of one output
// in thread order through shared memory and a warp-wide sum): deterministic, f32 like the CPU op up
// to summation order (bf16 weights widen exactly). Experts past E read row E - 1 and tokens past T
// read row T - 1; neither is stored.
template <typename W, bool kVec, int kE, int kR>
__global__ void __launch_bounds__(kRouteThreads)
    router_gemv_kernel(const float* __restrict__ x, const W* __restrict__ gate, int64_t tokens,
                       int64_t hidden, int experts, float* __restrict__ logits) {
  __shared__ float part[kE * kR][kRouteThreads];
  const int tid = static_cast<int>(threadIdx.x);
  const int e0 = static_cast<int>(blockIdx.x) * kE;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kR;
  const int rows = static_cast<int>(min(static_cast<int64_t>(kR), tokens - t0));  // CTA-uniform
  const W* w[kE];
#pragma unroll
  for (int e = 0; e < kE; ++e)
    w[e] = gate + static_cast<int64_t>(min(e0 + e, experts - 1)) * hidden;
  const float* xr[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) xr[r] = x + (t0 + min(r, rows - 1)) * hidden;
  float acc[kE][kR] = {};
  if constexpr (kVec) {
    constexpr int kN = Vec16<W>::kN;
    // One expert: unrolled so a thread's loads of several steps are issued together (H = 4096
    // bf16 is 2 steps); more experts already have kE loads per step in flight.
#pragma unroll(kE == 1 ? 4 : 1)
    for (int64_t k = static_cast<int64_t>(tid) * kN; k < hidden; k += kRouteThreads * kN) {
      float wv[kE][kN];
#pragma unroll
      for (int e = 0; e < kE; ++e) load16(w[e] + k, wv[e]);
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        if (r < rows) {
          float xv[kN];
          load_f32<kN>(xr[r] + k, xv);
#pragma unroll
          for (int e = 0; e < kE; ++e) {
#pragma unroll
            for (int i = 0; i < kN; ++i) acc[e][r] = fmaf(wv[e][i], xv[i], acc[e][r]);
          }
        }
      }
    }
  } else {
    for (int64_t k = tid; k < hidden; k += kRouteThreads) {
      float wv[kE];
#pragma unroll
      for (int e = 0; e < kE; ++e) wv[e] = load_as_float(w[e], k);
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        if (r < rows) {
          const float xv = xr[r][k];
#pragma unroll
          for (int e = 0; e < kE; ++e) acc[e][r] = fmaf(wv[e], xv, acc[e][r]);
        }
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kE; ++e) {
#pragma unroll
    for (int r = 0; r < kR; ++r) part[e * kR + r][tid] = acc[e][r];
  }
  __syncthreads();
  // Warp w reduces outputs w, w + 8, ...: lane l sums the partials of threads l, l + 32, ... in
  // order, then the warp sums the lanes. The loop bound is warp-uniform (shuffles inside).
  const int warp = tid / 32;
  const int lane = tid & 31;
  for (int o = warp; o < kE * kR; o += kRouteThreads / 32) {
    float v = 0.0f;
#pragma unroll
    for (int i = lane; i < kRouteThreads; i += 32) v += part[o][i];
    v = warp_sum(v);
    const int e = e0 + o / kR;
    const int r = o % kR;
    if (lane == 0 && e < experts && r < rows) logits[(t0 + r) * experts + e] = v;
  }
}

// bf16 -> f32 (exact) copy of the gate weights, so the prefill router logits run as an IEEE f32
// SGEMM (the linear op with f32 weights) instead of a bf16 GEMM that would round x. kVec: 8
// elements (one 16-byte load) per thread and step (n % 8 == 0, 16-byte aligned input).
template <bool kVec>
__global__ void widen_bf16_kernel(const __nv_bfloat16* __restrict__ in, float* __restrict__ out,
                                  int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if constexpr (kVec) {
    for (int64_t i = first; i < n / 8; i += stride) {
      float v[8];
      load16(in + 8 * i, v);
      float4* dst = reinterpret_cast<float4*>(out + 8 * i);
      dst[0] = make_float4(v[0], v[1], v[2], v[3]);
      dst[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
  } else {
    for (int64_t i = first; i < n; i += stride) out[i] = __bfloat162float(in[i]);
  }
}

// Candidate of the top-k selection; id -1 = none.
struct Pick {
  float key;
  int id;
};

// a ranks before b: key descending, then id ascending; "none" ranks last.
__device__ __forceinline__ bool ranks_before(const Pick& a, const Pick& b) {
  if (a.id < 0) return false;
  if (b.id < 0) return true;
  return a.key > b.key || (a.key == b.key && a.id < b.id);
}

// Generic selection, for shapes route_select_warp_kernel does not hold in registers
// (E > 32 * kSelectSlots or top_k > kSelectMaxK): one warp per token, scores recomputed from the
// logits every round. Round j picks the best (key, id) ranking strictly after the pick of round
// j-1, which is the CPU's partial_sort order without a "taken" set. NaN keys are never candidates.
__global__ void __launch_bounds__(kSelectWarps * 32)
    route_select_kernel(const float* __restrict__ logits, const float* __restrict__ bias,
                        const int32_t* __restrict__ tid2eid, const int32_t* __restrict__ token_ids,
                        int64_t tokens, int experts, int top_k, int64_t vocab, float routed_scale,
                        int32_t* __restrict__ ids_out, float* __restrict__ weights_out) {
  const int64_t t =
      static_cast<int64_t>(blockIdx.x) * kSelectWarps + static_cast<int64_t>(threadIdx.x / 32);
  if (t >= tokens) return;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const float* row = logits + t * experts;
  int32_t* ids = ids_out + t * top_k;
  float* weights = weights_out + t * top_k;
  if (tid2eid != nullptr) {
    if (lane == 0) {
      // Clamped rather than rejected: see the file comment.
      const int64_t tok = min(max(static_cast<int64_t>(token_ids[t]), int64_t{0}), vocab - 1);
      for (int j = 0; j < top_k; ++j) {
        ids[j] = min(max(tid2eid[tok * top_k + j], 0), experts - 1);
      }
    }
  } else {
    Pick prev{0.0f, -1};
    for (int j = 0; j < top_k; ++j) {
      Pick best{0.0f, -1};
      for (int e = lane; e < experts; e += 32) {
        const float s = router_score(row[e]);
        const Pick c{bias != nullptr ? s + bias[e] : s, e};
        if (c.key != c.key) continue;                          // NaN
        if (prev.id >= 0 && !ranks_before(prev, c)) continue;  // not after the previous pick
        if (ranks_before(c, best)) best = c;
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        const Pick o{__shfl_xor_sync(kFullMask, best.key, off),
                     __shfl_xor_sync(kFullMask, best.id, off)};
        if (ranks_before(o, best)) best = o;
      }
      if (best.id >= 0) prev = best;
      if (lane == 0) ids[j] = best.id >= 0 ? best.id : 0;  // < k non-NaN scores: unspecified
    }
  }
  __syncwarp();
  if (lane == 0) {
    // As the CPU: the chosen scores summed in slot order, then score / (sum + 1e-20) * scale.
    float sum = 0.0f;
    for (int j = 0; j < top_k; ++j) sum += router_score(row[ids[j]]);
    for (int j = 0; j < top_k; ++j) {
      weights[j] = router_score(row[ids[j]]) / (sum + 1e-20f) * routed_scale;
    }
  }
}

// One warp per token, the selection in registers (E <= 32 * kSlots, top_k <= kSelectMaxK): lane l
// holds the scores and keys of experts l, l + 32, ... (one coalesced read of the logits row).
// Round j: each lane's best untaken (key, id), then a butterfly argmax over the warp (a total order
// on (key, id), so every lane ends with the same pick); the owner lane retires the pick (its key
// becomes NaN, which is never a candidate) and broadcasts its score. This is the CPU's order (key
// descending, then id ascending), the bias steering the choice only. Lane j keeps slot j; the
// chosen scores are summed in slot order, as the CPU, so the weights are bitwise those of the
// generic kernel. Fewer than top_k non-NaN keys: the missing slots get expert 0 (unspecified).
// Hash routing: lane j reads table entry j (clamped, see the file comment).
template <int kSlots>
__global__ void __launch_bounds__(kSelectWarps * 32)
    route_select_warp_kernel(const float* __restrict__ logits, const float* __restrict__ bias,
                             const int32_t* __restrict__ tid2eid,
                             const int32_t* __restrict__ token_ids, int64_t tokens, int experts,
                             int top_k, int64_t vocab, float routed_scale,
                             int32_t* __restrict__ ids_out, float* __restrict__ weights_out) {
  const int64_t t =
      static_cast<int64_t>(blockIdx.x) * kSelectWarps + static_cast<int64_t>(threadIdx.x / 32);
  if (t >= tokens) return;  // the whole warp leaves; no CTA barrier follows
  const int lane = static_cast<int>(threadIdx.x & 31);
  const float* row = logits + t * experts;
  int my_id = 0;          // slot `lane`'s expert (lane < top_k)
  float my_score = 0.0f;  // and its score
  float sum = 0.0f;
  if (tid2eid != nullptr) {
    if (lane < top_k) {
      const int64_t tok = min(max(static_cast<int64_t>(token_ids[t]), int64_t{0}), vocab - 1);
      my_id = min(max(tid2eid[tok * top_k + lane], 0), experts - 1);
      my_score = router_score(row[my_id]);
    }
    for (int j = 0; j < top_k; ++j) sum += __shfl_sync(kFullMask, my_score, j);
  } else {
    float score[kSlots];
    float key[kSlots];
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const int e = lane + 32 * i;
      score[i] = 0.0f;
      key[i] = __int_as_float(0x7fc00000);  // NaN: not an expert
      if (e < experts) {
        score[i] = router_score(row[e]);
        key[i] = bias != nullptr ? score[i] + bias[e] : score[i];
      }
    }
    for (int j = 0; j < top_k; ++j) {  // top_k is warp-uniform: the shuffles see every lane
      Pick best{0.0f, -1};
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        const Pick c{key[i], lane + 32 * i};
        if (c.key == c.key && ranks_before(c, best)) best = c;  // ids ascending within a lane
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        const Pick o{__shfl_xor_sync(kFullMask, best.key, off),
                     __shfl_xor_sync(kFullMask, best.id, off)};
        if (ranks_before(o, best)) best = o;
      }
      const int id = best.id >= 0 ? best.id : 0;
      float owned = 0.0f;
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        if (lane + 32 * i == id) {
          owned = score[i];
          key[i] = __int_as_float(0x7fc00000);
        }
      }
      const float s = __shfl_sync(kFullMask, owned, id & 31);
      sum += s;
      if (lane == j) {
        my_id = id;
        my_score = s;
      }
    }
  }
  if (lane < top_k) {
    // As the CPU: score / (sum + 1e-20) * scale, the sum taken in slot order above.
    ids_out[t * top_k + lane] = my_id;
    weights_out[t * top_k + lane] = my_score / (sum + 1e-20f) * routed_scale;
  }
}

// ---- grouping by expert ------------------------------------------------------------------------

// The device-built work list of the expert GEMMs.
struct TileList {
  const int32_t* expert;  // [max_tiles] expert of the tile
  const int32_t* start;   // [max_tiles] first row of the tile in the expert-sorted pair order
  const int32_t* rows;    // [max_tiles] rows of the tile (1..tile_rows)
  const int32_t* count;   // [1] tiles written
};

// One CTA. sorted_pair[i] = the pair index (t * k + j) of sorted row i; the rows of expert e are
// [offset_e, offset_e + count_e), offsets the exclusive scan of the counts. Pairs with an id
// outside [0, E) are left out. Needs 2 * E ints of dynamic shared memory.
__global__ void __launch_bounds__(kGroupThreads)
    group_pairs_kernel(const int32_t* __restrict__ ids, int pairs, int experts, int tile_rows,
                       int max_tiles, int32_t* __restrict__ sorted_pair,
                       int32_t* __restrict__ tile_expert, int32_t* __restrict__ tile_start,
                       int32_t* __restrict__ tile_count_rows, int32_t* __restrict__ num_tiles) {
  using BlockScan = cub::BlockScan<int, kGroupThreads>;
  __shared__ typename BlockScan::TempStorage scan_tmp;
  extern __shared__ int group_smem[];
  int* counts = group_smem;          // [E]
  int* fill = group_smem + experts;  // [E] next free sorted row of each expert
  const int tid = static_cast<int>(threadIdx.x);
  for (int e = tid; e < experts; e += kGroupThreads) counts[e] = 0;
  __syncthreads();
  for (int p = tid; p < pairs; p += kGroupThreads) {
    const int e = ids[p];
    if (e >= 0 && e < experts) atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  // Row offsets and tile offsets: exclusive scans over experts, a CTA-wide chunk at a time.
  int row_carry = 0;
  int tile_carry = 0;
  for (int base = 0; base < experts; base += kGroupThreads) {
    const int e = base + tid;
    const int c = e < experts ? counts[e] : 0;
    const int nt = (c + tile_rows - 1) / tile_rows;
    int row_off = 0, row_total = 0, tile_off = 0, tile_total = 0;
    BlockScan(scan_tmp).ExclusiveSum(c, row_off, row_total);
    __syncthreads();
    BlockScan(scan_tmp).ExclusiveSum(nt, tile_off, tile_total);
    __syncthreads();
    if (e < experts) {
      const int first_row = row_carry + row_off;
      fill[e] = first_row;
      for (int i = 0; i < nt; ++i) {
        const int tile = tile_carry + tile_off + i;
        if (tile < max_tiles) {  // never false: max_tiles is an upper bound
          tile_expert[tile] = e;
          tile_start[tile] = first_row + i * tile_rows;
          tile_count_rows[tile] = min(tile_rows, c - i * tile_rows);
        }
      }
    }
    row_carry += row_total;
    tile_carry += tile_total;
  }
  if (tid == 0) *num_tiles = min(tile_carry, max_tiles);
  __syncthreads();
  for (int p = tid; p < pairs; p += kGroupThreads) {
    const int e = ids[p];
    if (e >= 0 && e < experts) sorted_pair[atomicAdd(&fill[e], 1)] = p;
  }
}

// ---- decode GEMMs ------------------------------------------------------------------------------

// act[row] = swiglu(x[token] . w1_e^T, x[token] . w3_e^T) for the rows of one tile; one warp per
// kGemvWeightRows / 2 intermediate columns (their w1 and w3 rows).
template <typename W>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gate_up_gemv_kernel(const float* __restrict__ x, int64_t hidden, int64_t inter, int top_k,
                        const int32_t* __restrict__ sorted_pair, TileList tiles,
                        const W* const* __restrict__ w1s, const W* const* __restrict__ w3s,
                        float limit, float* __restrict__ act) {
  constexpr int kCols = kGemvWeightRows / 2;
  const int tile = static_cast<int>(blockIdx.x);
  if (tile >= *tiles.count) return;
  const int64_t col0 = (static_cast<int64_t>(blockIdx.y) * kGemvWarps + threadIdx.x / 32) * kCols;
  if (col0 >= inter) return;  // the whole warp leaves; no CTA barrier follows
  const int e = tiles.expert[tile];
  const int start = tiles.start[tile];
  const int rows = tiles.rows[tile];
  const W* w[2 * kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int64_t col = min(col0 + c, inter - 1);  // tail columns read a valid row, never stored
    w[c] = w1s[e] + col * hidden;
    w[kCols + c] = w3s[e] + col * hidden;
  }
  const float* xr[kGemvRows];
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r) {
    xr[r] = x + static_cast<int64_t>(sorted_pair[start + min(r, rows - 1)] / top_k) * hidden;
  }
  float acc[2 * kCols][kGemvRows] = {};
  lane_dots<W, true>(w, xr, rows, hidden, acc);
  const int lane = static_cast<int>(threadIdx.x & 31);
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) {
      const float g = warp_sum(acc[c][r]);
      const float u = warp_sum(acc[kCols + c][r]);
      if (lane == c * kGemvRows + r && r < rows && col0 + c < inter) {
        act[static_cast<int64_t>(start + r) * inter + col0 + c] = swiglu(g, u, limit);
      }
    }
  }
}

// y[pair] = act[row] . w2_e^T for the rows of one tile; one warp per kGemvWeightRows columns.
template <typename W>
__global__ void __launch_bounds__(kGemvWarps * 32)
    down_gemv_kernel(const float* __restrict__ act, int64_t hidden, int64_t inter,
                     const int32_t* __restrict__ sorted_pair, TileList tiles,
                     const W* const* __restrict__ w2s, float* __restrict__ y) {
  constexpr int kCols = kGemvWeightRows;
  const int tile = static_cast<int>(blockIdx.x);
  if (tile >= *tiles.count) return;
  const int64_t col0 = (static_cast<int64_t>(blockIdx.y) * kGemvWarps + threadIdx.x / 32) * kCols;
  if (col0 >= hidden) return;
  const int e = tiles.expert[tile];
  const int start = tiles.start[tile];
  const int rows = tiles.rows[tile];
  const W* w[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) w[c] = w2s[e] + min(col0 + c, hidden - 1) * inter;
  const float* xr[kGemvRows];
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r) {
    xr[r] = act + static_cast<int64_t>(start + min(r, rows - 1)) * inter;
  }
  float acc[kCols][kGemvRows] = {};
  lane_dots<W, true>(w, xr, rows, inter, acc);
  const int lane = static_cast<int>(threadIdx.x & 31);
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) {
      const float v = warp_sum(acc[c][r]);
      if (lane == c * kGemvRows + r && r < rows && col0 + c < hidden) {
        y[static_cast<int64_t>(sorted_pair[start + r]) * hidden + col0 + c] = v;
      }
    }
  }
}

// ---- prefill GEMMs -----------------------------------------------------------------------------

// Shared-memory tile of one operand, K-major; the +1 pad keeps both the transposing stores and
// the reads free of bank conflicts.
using TileBuf = float[kTileK][kTileM + 1];
static_assert(kTileM == kTileN, "one buffer type serves both operands");

// Loads k in [k0, k0 + kTileK) of the 64 rows whose pointers are in `rows` (shared memory; null
// = a row outside the tile) into s[k - k0][row]: thread t loads k0 + t % 32 of rows t / 32 + 8 i
// (a warp reads 32 consecutive elements of one row). Null rows and k >= K load 0.
template <typename T>
__device__ __forceinline__ void load_tile(TileBuf& s, const T* const* rows, int64_t k0, int64_t K) {
  const int lk = static_cast<int>(threadIdx.x % 32);
  const int lr = static_cast<int>(threadIdx.x / 32);
  const int64_t k = k0 + lk;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const T* p = rows[lr + 8 * i];
    s[lk][lr + 8 * i] = (p != nullptr && k < K) ? load_as_float(p, k) : 0.0f;
  }
}

// acc[i][j] += sum_kk a[kk][ty + 16 i] * b[kk][tx + 16 j] for the thread's 4 x 4 results.
__device__ __forceinline__ void tile_fma(const TileBuf& a, const TileBuf& b, float (&acc)[4][4]) {
  const int ty = static_cast<int>(threadIdx.x / 16);
  const int tx = static_cast<int>(threadIdx.x % 16);
#pragma unroll 8
  for (int kk = 0; kk < kTileK; ++kk) {
    float av[4], bv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) av[i] = a[kk][ty + 16 * i];
#pragma unroll
    for (int j = 0; j < 4; ++j) bv[j] = b[kk][tx + 16 * j];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
  }
}

// act[row, n] = swiglu(x[token] . w1_e[n], x[token] . w3_e[n]) for a 64 x 64 block of one tile.
template <typename W>
__global__ void __launch_bounds__(kTileThreads)
    gate_up_tiled_kernel(const float* __restrict__ x, int64_t hidden, int64_t inter, int top_k,
                         const int32_t* __restrict__ sorted_pair, TileList tiles,
                         const W* const* __restrict__ w1s, const W* const* __restrict__ w3s,
                         float limit, float* __restrict__ act) {
  __shared__ TileBuf xs, gs, us;
  const int tile = static_cast<int>(blockIdx.x);
  if (tile >= *tiles.count) return;  // uniform over the CTA: before any barrier
  const int e = tiles.expert[tile];
  const int start = tiles.start[tile];
  const int rows = tiles.rows[tile];
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kTileN;
  // Row pointers live in shared memory rather than in 3 x 8 registers per thread.
  __shared__ const float* xrow[kTileM];
  __shared__ const W* grow[kTileN];
  __shared__ const W* urow[kTileN];
  if (threadIdx.x < kTileM) {
    const int r = static_cast<int>(threadIdx.x);
    xrow[r] =
        r < rows ? x + static_cast<int64_t>(sorted_pair[start + r] / top_k) * hidden : nullptr;
    const int64_t n = n0 + r;
    grow[r] = n < inter ? w1s[e] + n * hidden : nullptr;
    urow[r] = n < inter ? w3s[e] + n * hidden : nullptr;
  }
  __syncthreads();
  float g[4][4] = {}, u[4][4] = {};
  for (int64_t k0 = 0; k0 < hidden; k0 += kTileK) {
    load_tile(xs, xrow, k0, hidden);
    load_tile(gs, grow, k0, hidden);
    load_tile(us, urow, k0, hidden);
    __syncthreads();
    tile_fma(xs, gs, g);
    tile_fma(xs, us, u);
    __syncthreads();
  }
  const int ty = static_cast<int>(threadIdx.x / 16);
  const int tx = static_cast<int>(threadIdx.x % 16);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = ty + 16 * i;
    if (r >= rows) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + tx + 16 * j;
      if (n < inter)
        act[static_cast<int64_t>(start + r) * inter + n] = swiglu(g[i][j], u[i][j], limit);
    }
  }
}

// y[pair, n] = act[row] . w2_e[n] for a 64 x 64 block of one tile.
template <typename W>
__global__ void __launch_bounds__(kTileThreads)
    down_tiled_kernel(const float* __restrict__ act, int64_t hidden, int64_t inter,
                      const int32_t* __restrict__ sorted_pair, TileList tiles,
                      const W* const* __restrict__ w2s, float* __restrict__ y) {
  __shared__ TileBuf as, ws;
  const int tile = static_cast<int>(blockIdx.x);
  if (tile >= *tiles.count) return;
  const int e = tiles.expert[tile];
  const int start = tiles.start[tile];
  const int rows = tiles.rows[tile];
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kTileN;
  __shared__ const float* arow[kTileM];
  __shared__ const W* wrow[kTileN];
  if (threadIdx.x < kTileM) {
    const int r = static_cast<int>(threadIdx.x);
    arow[r] = r < rows ? act + static_cast<int64_t>(start + r) * inter : nullptr;
    const int64_t n = n0 + r;
    wrow[r] = n < hidden ? w2s[e] + n * inter : nullptr;
  }
  __syncthreads();
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < inter; k0 += kTileK) {
    load_tile(as, arow, k0, inter);
    load_tile(ws, wrow, k0, inter);
    __syncthreads();
    tile_fma(as, ws, acc);
    __syncthreads();
  }
  const int ty = static_cast<int>(threadIdx.x / 16);
  const int tx = static_cast<int>(threadIdx.x % 16);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = ty + 16 * i;
    if (r >= rows) continue;
    const int64_t pair = sorted_pair[start + r];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + tx + 16 * j;
      if (n < hidden) y[pair * hidden + n] = acc[i][j];
    }
  }
}

// ---- prefill GEMMs on tensor cores (bf16 weights) ----------------------------------------------
//
// Each CTA multiplies the rows of one tile (MmaTile<kRows>::kM pair rows) by kN weight rows
// (gate/up: kN / 2 rows of w1 and the same kN / 2 rows of w3; down: kN rows of w2) with mma.sync
// m16n8k16 (bf16 x bf16 -> f32). A = bf16 rows (gate/up: x rounded to bf16 by
// round_to_bf16_kernel, gathered through sorted_pair; down: act, which the gate/up kernel writes
// as bf16), B = the weight rows, both K-contiguous in global memory, so both are "row" A / "col"
// B operands as stored and ldmatrix (without .trans) loads every fragment. The fragment layouts
// and address patterns are those of attention_mma_kernel (ops_attention_mma.cu).
//
// Two CTA shapes, the tile list built with the matching tile_rows:
//  - 64 pair rows x 256 weight rows, 3 stages: passes with at most kMmaWideMinPairs pairs per
//    expert on average;
//  - 128 pair rows x 128 weight rows, 4 stages: larger passes. An expert with up to 128 pairs is
//    one row tile, so its weights are streamed from memory once per pass (with 64-row tiles an
//    expert of 65..128 pairs reads them twice, from L2 at best), and each CTA moves 20% fewer
//    operand bytes per FLOP (128 + 128 rows per stage instead of 64 + 256).
// The grid is 1-D and tile-major: CTA b works on tile b / cols and weight column block b % cols,
// so the column blocks of one tile, and the tiles of one expert, run at about the same time: the
// A rows of a tile and the weight blocks shared by the row tiles of one expert are re-read from
// L2, not from memory.
//
// Shared memory: kStages stages of [kM + kN][kMmaStride] bf16, filled with cp.async 16-byte
// chunks; the 8-element (16-byte) pad puts the 8 rows one ldmatrix reads in 8 different bank
// groups. Chunks outside the operand (rows past the tile's pairs or the weight's columns, k past
// K) are zero-filled with plain stores and never read from global memory; K % 8 == 0 makes every
// chunk wholly inside or outside. Each output element is reduced over K in k-tile order, with the
// fixed order of the mma within a k-tile: it depends on its A row and weight row only.
//
// 8 warps of 32 pair rows x 64 weight rows each: warp w holds rows 32 (w % kWarpsM) .. + 31 (two
// m16 tiles) and, with wn = w / kWarpsM, weight rows: gate/up 32 wn .. + 31 of the CTA's w1 rows
// (the gate n8 tiles 0..3) and the same of its w3 rows (tiles 4..7), so one thread holds the gate
// and up value of the same (row, column) and applies SwiGLU in f32 before rounding act to bf16;
// down: 64 wn .. + 63 of w2 (tiles 0..7), written to y in f32. A warp whose 32 rows are all past
// the tile's pairs skips the ldmatrix and mma (it still copies and meets every barrier).

constexpr int kMmaK = 32;              // K per stage
constexpr int kMmaThreads = 256;       // 8 warps
constexpr int kMmaStride = kMmaK + 8;  // bf16 row stride in shared memory (80 bytes)
// The 128-row shape from this many pairs per expert on average (exclusive).
constexpr int64_t kMmaWideMinPairs = 64;

template <int kRows>
struct MmaTile {
  static constexpr int kM = kRows;                     // pair rows per CTA (the tile list's)
  static constexpr int kN = kRows == 64 ? 256 : 128;   // weight rows per CTA
  static constexpr int kStages = kRows == 64 ? 3 : 4;  // cp.async pipeline depth
  static constexpr int kWarpsM = kM / 32;              // warps over pair rows
  static constexpr int kStageElems = (kM + kN) * kMmaStride;
  static constexpr size_t kSmemBytes = size_t{kStages} * kStageElems * sizeof(__nv_bfloat16);
  static_assert(kRows == 64 || kRows == 128, "two shapes");
  static_assert((kMmaThreads / 32 / kWarpsM) * 64 == kN, "8 warps of 32 x 64 cover the tile");
  static_assert(kMmaK == 32 && kMmaThreads == 256 && kM % 64 == 0 && kN % 64 == 0,
                "the copy role below: 4 threads per 64-byte row slice, 64 rows per pass");
  static_assert((kMmaStride * sizeof(__nv_bfloat16)) % 16 == 0 && (kStageElems * 2) % 16 == 0,
                "16-byte aligned rows and stages (cp.async, ldmatrix)");
};

// xb = bf16(x), 4 elements per step (n4 = numel / 4; both 16- and 8-byte aligned).
__global__ void round_to_bf16_kernel(const float4* __restrict__ x, uint2* __restrict__ xb,
                                     int64_t n4) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4;
       i += stride) {
    const float4 v = __ldg(x + i);
    xb[i] = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
  }
}

// First weight row (in the CTA's kN) of a warp's 16-row group p (n8 tiles 2p, 2p + 1).
template <bool kGateUp, int kN>
__device__ __forceinline__ int mma_wrow(int wn, int p) {
  return kGateUp ? (kN / 2) * (p >> 1) + 32 * wn + 16 * (p & 1) : 64 * wn + 16 * p;
}

// kGateUp: act[row, n] = bf16(swiglu(xb[token] . w1_e[n], xb[token] . w3_e[n])) for kM rows x
// kN / 2 columns n of one tile (a = xb [tokens, K = hidden], N = inter).
// Otherwise: y[pair, n] = act[row] . w2_e[n] for kM rows x kN columns (a = act [pairs, K =
// inter], N = hidden). Needs K % 8 == 0, N % 8 == 0 and 16-byte aligned rows. CTA blockIdx.x
// works on tile blockIdx.x / cols, column block blockIdx.x % cols (cols = ceil(N / columns)).
template <bool kGateUp, int kRows>
__global__ void __launch_bounds__(kMmaThreads, 2)
    expert_mma_kernel(const __nv_bfloat16* __restrict__ a, int64_t K, int64_t N, int cols,
                      int top_k, const int32_t* __restrict__ sorted_pair, TileList tiles,
                      const __nv_bfloat16* const* __restrict__ w_lo,
                      const __nv_bfloat16* const* __restrict__ w_hi, float limit,
                      __nv_bfloat16* __restrict__ act, float* __restrict__ y) {
  using T = MmaTile<kRows>;
  constexpr int kM = T::kM;
  constexpr int kN = T::kN;
  constexpr int kStages = T::kStages;
  constexpr int kStageElems = T::kStageElems;
  extern __shared__ int4 mma_smem_raw[];
  __nv_bfloat16* smem = reinterpret_cast<__nv_bfloat16*>(mma_smem_raw);
  const int tile = static_cast<int>(blockIdx.x / static_cast<unsigned>(cols));
  const int col = static_cast<int>(blockIdx.x - static_cast<unsigned>(tile) * cols);
  if (tile >= *tiles.count) return;  // uniform over the CTA: before any barrier
  const int e = tiles.expert[tile];
  const int start = tiles.start[tile];
  const int rows = tiles.rows[tile];
  constexpr int kCols = kGateUp ? kN / 2 : kN;  // output columns per CTA
  const int64_t n0 = static_cast<int64_t>(col) * kCols;
  const int tid = static_cast<int>(threadIdx.x);

  // Copy role: 16-byte chunk cc (k + 8 cc .. + 7 of a stage) of A rows cr + 64 i and of weight
  // rows cr + 64 i; null = outside the operand (zero-filled).
  constexpr int kACopies = kM / 64;
  constexpr int kBCopies = kN / 64;
  const int cr = tid >> 2;
  const int cc = tid & 3;
  const __nv_bfloat16* a_src[kACopies];
#pragma unroll
  for (int i = 0; i < kACopies; ++i) {
    const int r = cr + 64 * i;
    a_src[i] = nullptr;
    if (r < rows) {
      const int64_t arow = kGateUp ? sorted_pair[start + r] / top_k : start + r;
      a_src[i] = a + arow * K + 8 * cc;
    }
  }
  const __nv_bfloat16* b_src[kBCopies];
#pragma unroll
  for (int i = 0; i < kBCopies; ++i) {
    const int b = cr + 64 * i;
    const int64_t n = n0 + (kGateUp ? b % (kN / 2) : b);
    const __nv_bfloat16* base = (kGateUp && b >= kN / 2) ? w_hi[e] : w_lo[e];
    b_src[i] = n < N ? base + n * K + 8 * cc : nullptr;
  }
  auto load_stage = [&](int buf, int kt) {
    __nv_bfloat16* s = smem + buf * kStageElems + cr * kMmaStride + 8 * cc;
    const int64_t k = static_cast<int64_t>(kt) * kMmaK;
    const bool k_in = k + 8 * cc < K;
#pragma unroll
    for (int i = 0; i < kACopies; ++i) {
      __nv_bfloat16* d = s + 64 * i * kMmaStride;
      if (a_src[i] != nullptr && k_in) {
        cp_async_16(d, a_src[i] + k);
      } else {
        *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int i = 0; i < kBCopies; ++i) {
      __nv_bfloat16* d = s + (kM + 64 * i) * kMmaStride;
      if (b_src[i] != nullptr && k_in) {
        cp_async_16(d, b_src[i] + k);
      } else {
        *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
      }
    }
  };

  // Per-lane ldmatrix offsets (as attention_mma_kernel):
  //  - A (row-major 16 x 16): matrix i = lane / 8 is rows + 8 (i % 2), k + 8 (i / 2), giving
  //    a0 .. a3 in mma order.
  //  - B (weight rows = n, k contiguous: the "col" operand): matrix i is n + 8 (i / 2),
  //    k + 8 (i % 2): registers 0, 1 are b0, b1 of n8 tile 0 of a 16-row group, 2, 3 of tile 1.
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int wm = warp % T::kWarpsM;
  const int wn = warp / T::kWarpsM;
  const int lrow = lane & 7;
  const int bit3 = (lane >> 3) & 1;
  const int bit4 = lane >> 4;
  const int a_frag = (32 * wm + lrow + 8 * bit3) * kMmaStride + 8 * bit4;
  const int b_frag = (kM + lrow + 8 * bit4) * kMmaStride + 8 * bit3;
  // Whether any of the warp's 32 rows is one of the tile's pairs (warp-uniform).
  const bool live = 32 * wm < rows;

  float acc[2][8][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[mi][j][0] = acc[mi][j][1] = acc[mi][j][2] = acc[mi][j][3] = 0.f;
  }

  // Stage kt lives in buffer kt % kStages. One group is committed per stage slot (empty past the
  // end), so "at most kStages - 2 pending" means this thread's copies of stage kt landed; the
  // barrier then publishes every thread's copies and zero stores, and orders the refill of
  // buffer (kt - 1) % kStages after every warp's reads of it in iteration kt - 1.
  const int nk = static_cast<int>((K + kMmaK - 1) / kMmaK);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nk) load_stage(s, s);
    cp_async_commit();
  }
#pragma unroll 1
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int next = kt + kStages - 1;
    if (next < nk) load_stage(next % kStages, next);
    cp_async_commit();
    if (!live) continue;
    const __nv_bfloat16* s = smem + (kt % kStages) * kStageElems;
#pragma unroll
    for (int ks = 0; ks < kMmaK / 16; ++ks) {
      uint32_t af[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
        ldmatrix_x4(af[mi], s + a_frag + 16 * mi * kMmaStride + 16 * ks);
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        uint32_t bf[4];
        ldmatrix_x4(bf, s + b_frag + mma_wrow<kGateUp, kN>(wn, p) * kMmaStride + 16 * ks);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          mma_bf16(acc[mi][2 * p], af[mi], bf[0], bf[1]);
          mma_bf16(acc[mi][2 * p + 1], af[mi], bf[2], bf[3]);
        }
      }
    }
  }

  // Epilogue from the accumulator layout: c0, c1 in row g, c2, c3 in row g + 8, columns
  // 2 qd, 2 qd + 1 of the n8 tile. N % 8 == 0, so a column pair is wholly inside or outside.
  const int g = lane >> 2;
  const int qd = lane & 3;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int r = 32 * wm + 16 * mi + g + 8 * hr;
      if (r >= rows) continue;
      if constexpr (kGateUp) {
        __nv_bfloat16* dst = act + static_cast<int64_t>(start + r) * N;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t n = n0 + 32 * wn + 8 * j + 2 * qd;
          if (n < N) {
            const float v0 = swiglu(acc[mi][j][2 * hr], acc[mi][j + 4][2 * hr], limit);
            const float v1 = swiglu(acc[mi][j][2 * hr + 1], acc[mi][j + 4][2 * hr + 1], limit);
            *reinterpret_cast<uint32_t*>(dst + n) = pack_bf16(v0, v1);
          }
        }
      } else {
        float* dst = y + static_cast<int64_t>(sorted_pair[start + r]) * N;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int64_t n = n0 + 64 * wn + 8 * j + 2 * qd;
          if (n < N) {
            *reinterpret_cast<float2*>(dst + n) =
                make_float2(acc[mi][j][2 * hr], acc[mi][j][2 * hr + 1]);
          }
        }
      }
    }
  }
}

// The gate/up and down GEMMs of one pass on tensor cores, over a tile list of kRows-row tiles.
template <int kRows>
void launch_expert_mma(const __nv_bfloat16* xb, const __nv_bfloat16* const* w1s,
                       const __nv_bfloat16* const* w3s, const __nv_bfloat16* const* w2s,
                       int64_t hidden, int64_t inter, int top_k, const int32_t* sorted_pair,
                       const TileList& tiles, int64_t max_tiles, float limit, __nv_bfloat16* act,
                       float* y, cudaStream_t stream) {
  using T = MmaTile<kRows>;
  constexpr int smem = static_cast<int>(T::kSmemBytes);
  DEEPINFER_CUDA_CHECK(cudaFuncSetAttribute(expert_mma_kernel<true, kRows>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  DEEPINFER_CUDA_CHECK(cudaFuncSetAttribute(expert_mma_kernel<false, kRows>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  // Grid sizes: checked against gridDim.x's limit by the caller (mma_fits).
  const int cols1 = static_cast<int>(ceil_div(inter, T::kN / 2));
  expert_mma_kernel<true, kRows>
      <<<static_cast<unsigned>(max_tiles * cols1), kMmaThreads, smem, stream>>>(
          xb, hidden, inter, cols1, top_k, sorted_pair, tiles, w1s, w3s, limit, act, nullptr);
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
  const int cols2 = static_cast<int>(ceil_div(hidden, T::kN));
  expert_mma_kernel<false, kRows>
      <<<static_cast<unsigned>(max_tiles * cols2), kMmaThreads, smem, stream>>>(
          act, inter, hidden, cols2, top_k, sorted_pair, tiles, w2s, w2s, limit, nullptr, y);
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
}

// ---- combine -----------------------------------------------------------------------------------

// out[t, h] = sum over slots j in order of weight[t, j] * y[t * k + j, h]; dropped slots add
// nothing. Grid (hidden chunks, tokens): even one token spreads over ceil(H / 512) CTAs. A thread
// owns kCombineVec consecutive h (one float4 when kVec: H % 4 == 0, y and out 16-byte aligned) and
// loads kCombineSlots slots' rows before summing them, so those loads are in flight together; the
// sum itself stays in slot order (deterministic, the same arithmetic as one slot at a time).
template <bool kVec>
__global__ void __launch_bounds__(kCombineThreads)
    combine_kernel(const float* __restrict__ y, const int32_t* __restrict__ ids,
                   const float* __restrict__ weights, int top_k, int64_t hidden, int experts,
                   float* __restrict__ out) {
  const int64_t t = blockIdx.y;
  const int64_t h0 =
      (static_cast<int64_t>(blockIdx.x) * kCombineThreads + threadIdx.x) * kCombineVec;
  if (h0 >= hidden) return;
  float acc[kCombineVec] = {};
  for (int j0 = 0; j0 < top_k; j0 += kCombineSlots) {
    float v[kCombineSlots][kCombineVec] = {};
    float wt[kCombineSlots] = {};
    bool use[kCombineSlots];
#pragma unroll
    for (int s = 0; s < kCombineSlots; ++s) {
      const int64_t p = t * top_k + j0 + s;
      use[s] = false;
      if (j0 + s < top_k) {
        const int e = __ldg(ids + p);
        use[s] = e >= 0 && e < experts;
      }
      if (use[s]) {
        wt[s] = __ldg(weights + p);
        const float* src = y + p * hidden + h0;
        if constexpr (kVec) {
          const float4 q = __ldg(reinterpret_cast<const float4*>(src));
          v[s][0] = q.x;
          v[s][1] = q.y;
          v[s][2] = q.z;
          v[s][3] = q.w;
        } else {
#pragma unroll
          for (int c = 0; c < kCombineVec; ++c) {
            if (h0 + c < hidden) v[s][c] = __ldg(src + c);
          }
        }
      }
    }
#pragma unroll
    for (int s = 0; s < kCombineSlots; ++s) {
      if (use[s]) {
#pragma unroll
        for (int c = 0; c < kCombineVec; ++c) acc[c] += v[s][c] * wt[s];
      }
    }
  }
  float* dst = out + t * hidden + h0;
  if constexpr (kVec) {
    *reinterpret_cast<float4*>(dst) = make_float4(acc[0], acc[1], acc[2], acc[3]);
  } else {
#pragma unroll
    for (int c = 0; c < kCombineVec; ++c) {
      if (h0 + c < hidden) dst[c] = acc[c];
    }
  }
}

// ---- host side ---------------------------------------------------------------------------------

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

template <typename W, int kE, int kR>
void launch_router_gemv(const Tensor& x, const Tensor& gate_w, float* logits, cudaStream_t stream) {
  const int64_t tokens = x.size(0);
  const int64_t hidden = x.size(1);
  const int experts = static_cast<int>(gate_w.size(0));
  const dim3 grid(ceil_div(experts, kE), ceil_div(tokens, kR));
  const W* gate = gate_w.data<W>();
  const bool vec = hidden % Vec16<W>::kN == 0 && aligned16(gate) && aligned16(x.raw_data());
  if (vec) {
    router_gemv_kernel<W, true, kE, kR><<<grid, kRouteThreads, 0, stream>>>(
        x.data<float>(), gate, tokens, hidden, experts, logits);
  } else {
    router_gemv_kernel<W, false, kE, kR><<<grid, kRouteThreads, 0, stream>>>(
        x.data<float>(), gate, tokens, hidden, experts, logits);
  }
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_route");
}

// Decode router logits (tokens < kRouteGemmTokens) into `logits` [T, E].
template <typename W>
void launch_router_logits(const Tensor& x, const Tensor& gate_w, float* logits,
                          cudaStream_t stream) {
  if (x.size(0) <= kRouteSmallTokens) {
    launch_router_gemv<W, kRouteSmallE, kRouteSmallR>(x, gate_w, logits, stream);
  } else {
    launch_router_gemv<W, kRouteWideE, kRouteWideR>(x, gate_w, logits, stream);
  }
}

// One pass of moe_experts over `tokens` rows (<= kMaxPassTokens).
template <typename W>
void run_experts_pass(CudaBackend& be, const float* x, const int32_t* ids, const float* weights,
                      int64_t tokens, int top_k, int64_t hidden, int64_t inter, int experts,
                      const W* const* w1s, const W* const* w3s, const W* const* w2s, bool vec,
                      float limit, float* out) {
  cudaStream_t stream = be.stream();
  const int64_t pairs = tokens * top_k;
  // Decode shape while experts average at most kGemvRows pairs (and the rows allow 16-byte
  // loads); the tiled kernel otherwise.
  const bool gemv = vec && pairs <= static_cast<int64_t>(kGemvRows) * experts;
  // Tensor cores for bf16 weights in the prefill shape, when the rows allow 16-byte copies
  // (vec: H % 8 == 0, I % 8 == 0, aligned bases), the device has the shared memory and the 1-D
  // grid fits; 128-row tiles when experts average more than kMmaWideMinPairs pairs.
  const size_t smem_max = be.max_shared_memory_per_block();
  auto mma_fits = [&](int rows, int weight_rows, size_t smem) {
    const int64_t tiles = (pairs + rows - 1) / rows + std::min<int64_t>(experts, pairs);
    const int64_t cols = std::max<int64_t>((inter + weight_rows / 2 - 1) / (weight_rows / 2),
                                           (hidden + weight_rows - 1) / weight_rows);
    return smem <= smem_max && tiles * cols <= std::numeric_limits<int32_t>::max();
  };
  const bool mma_shape = std::is_same_v<W, __nv_bfloat16> && !gemv && vec;
  const bool wide = mma_shape && pairs > kMmaWideMinPairs * experts &&
                    mma_fits(MmaTile<128>::kM, MmaTile<128>::kN, MmaTile<128>::kSmemBytes);
  const bool mma =
      wide || (mma_shape && mma_fits(MmaTile<64>::kM, MmaTile<64>::kN, MmaTile<64>::kSmemBytes));
  const int tile_rows = gemv ? kGemvRows : wide ? MmaTile<128>::kM : kTileM;
  // sum_e ceil(c_e / rows) <= ceil(P / rows) + (experts with a pair).
  const int64_t max_tiles = (pairs + tile_rows - 1) / tile_rows + std::min<int64_t>(experts, pairs);

  Tensor sorted = be.empty({pairs}, DType::kI32);
  Tensor tile_meta = be.empty({3 * max_tiles + 1}, DType::kI32);
  Tensor act = be.empty({pairs, inter}, mma ? DType::kBF16 : DType::kF32);
  Tensor y = be.empty({pairs, hidden}, DType::kF32);
  int32_t* meta = tile_meta.data<int32_t>();
  const TileList tiles{meta, meta + max_tiles, meta + 2 * max_tiles, meta + 3 * max_tiles};
  int32_t* sorted_pair = sorted.data<int32_t>();

  const size_t group_smem = 2 * static_cast<size_t>(experts) * sizeof(int);
  group_pairs_kernel<<<1, kGroupThreads, group_smem, stream>>>(
      ids, static_cast<int>(pairs), experts, tile_rows, static_cast<int>(max_tiles), sorted_pair,
      meta, meta + max_tiles, meta + 2 * max_tiles, meta + 3 * max_tiles);
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");

  const unsigned grid_tiles = static_cast<unsigned>(max_tiles);
  if (gemv) {
    const dim3 grid1(grid_tiles, ceil_div(inter, kGemvWarps * (kGemvWeightRows / 2)));
    gate_up_gemv_kernel<W><<<grid1, kGemvWarps * 32, 0, stream>>>(
        x, hidden, inter, top_k, sorted_pair, tiles, w1s, w3s, limit, act.data<float>());
    DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
    const dim3 grid2(grid_tiles, ceil_div(hidden, kGemvWarps * kGemvWeightRows));
    down_gemv_kernel<W><<<grid2, kGemvWarps * 32, 0, stream>>>(
        act.data<float>(), hidden, inter, sorted_pair, tiles, w2s, y.data<float>());
    DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
  } else if constexpr (std::is_same_v<W, __nv_bfloat16>) {
    if (mma) {
      // x rounded to bf16 once, so the gate/up A tiles are gathered with cp.async like the rest.
      Tensor xb = be.empty({tokens, hidden}, DType::kBF16);
      const int64_t n4 = tokens * hidden / 4;
      const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n4 + 255) / 256, 8192));
      round_to_bf16_kernel<<<blocks, 256, 0, stream>>>(reinterpret_cast<const float4*>(x),
                                                       static_cast<uint2*>(xb.raw_data()), n4);
      DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
      __nv_bfloat16* act_b = static_cast<__nv_bfloat16*>(act.raw_data());
      const __nv_bfloat16* xbp = static_cast<const __nv_bfloat16*>(xb.raw_data());
      if (wide) {
        launch_expert_mma<128>(xbp, w1s, w3s, w2s, hidden, inter, top_k, sorted_pair, tiles,
                               max_tiles, limit, act_b, y.data<float>(), stream);
      } else {
        launch_expert_mma<64>(xbp, w1s, w3s, w2s, hidden, inter, top_k, sorted_pair, tiles,
                              max_tiles, limit, act_b, y.data<float>(), stream);
      }
    }
  }
  if (!gemv && !mma) {
    const dim3 grid1(grid_tiles, ceil_div(inter, kTileN));
    gate_up_tiled_kernel<W><<<grid1, kTileThreads, 0, stream>>>(
        x, hidden, inter, top_k, sorted_pair, tiles, w1s, w3s, limit, act.data<float>());
    DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
    const dim3 grid2(grid_tiles, ceil_div(hidden, kTileN));
    down_tiled_kernel<W><<<grid2, kTileThreads, 0, stream>>>(
        act.data<float>(), hidden, inter, sorted_pair, tiles, w2s, y.data<float>());
    DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
  }
  // tokens <= kMaxPassTokens: within gridDim.y's limit.
  const dim3 grid3(ceil_div(hidden, kCombineThreads * kCombineVec), static_cast<unsigned>(tokens));
  if (hidden % kCombineVec == 0 && aligned16(out)) {  // y comes from empty(): aligned
    combine_kernel<true><<<grid3, kCombineThreads, 0, stream>>>(y.data<float>(), ids, weights,
                                                                top_k, hidden, experts, out);
  } else {
    combine_kernel<false><<<grid3, kCombineThreads, 0, stream>>>(y.data<float>(), ids, weights,
                                                                 top_k, hidden, experts, out);
  }
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
}

}  // namespace

Routing CudaBackend::moe_route_impl(const Tensor& x, const Tensor& gate_w, const Tensor& bias,
                                    const Tensor& tid2eid, const Tensor& token_ids, int top_k,
                                    float routed_scale) {
  const char* op = "moe_route";
  const int64_t tokens = x.size(0);
  const int64_t hidden = x.size(1);
  const int64_t experts = gate_w.size(0);
  if (experts > kMaxExperts) {  // its choices feed moe_experts, which takes at most this many
    fail(op, "gate_w " + gate_w.describe() + " must have 1 to " + std::to_string(kMaxExperts) +
                 " experts");
  }
  const bool hashed = tid2eid.defined();
  if (tokens > std::numeric_limits<int>::max()) {  // cuBLAS sizes are int
    fail(op, "too many tokens in one call: " + x.describe());
  }
  Routing routing{empty({tokens, top_k}, DType::kI32), empty({tokens, top_k}, DType::kF32)};
  if (tokens == 0) return routing;
  cudaStream_t s = stream();
  Tensor logits;
  if (tokens >= kRouteGemmTokens && hidden > 0) {
    // Prefill: an IEEE f32 SGEMM (linear with f32 weights; no TF32), bf16 weights widened
    // exactly into a temporary first. Same values as the GEMV up to summation order. (H = 0
    // takes the GEMV, which writes zeros; cuBLAS rejects a zero leading dimension.)
    if (gate_w.dtype() == DType::kBF16) {
      Tensor wide = empty({experts, hidden}, DType::kF32);
      const int64_t n = experts * hidden;
      const __nv_bfloat16* src = gate_w.data<__nv_bfloat16>();
      if (n % 8 == 0 && aligned16(src)) {
        const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n / 8 + 255) / 256, 4096));
        widen_bf16_kernel<true><<<blocks, 256, 0, s>>>(src, wide.data<float>(), n);
      } else {
        const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 4096));
        widen_bf16_kernel<false><<<blocks, 256, 0, s>>>(src, wide.data<float>(), n);
      }
      DEEPINFER_CUDA_LAUNCH_CHECK(op);
      logits = linear(x, wide);
    } else {
      logits = linear(x, gate_w);
    }
  } else {
    logits = empty({tokens, experts}, DType::kF32);
    if (gate_w.dtype() == DType::kBF16) {
      launch_router_logits<__nv_bfloat16>(x, gate_w, logits.data<float>(), s);
    } else {
      launch_router_logits<float>(x, gate_w, logits.data<float>(), s);
    }
  }
  const float* lg = logits.data<float>();
  const float* bias_p = !hashed && bias.defined() ? bias.data<float>() : nullptr;
  const int32_t* table = hashed ? tid2eid.data<int32_t>() : nullptr;
  const int32_t* tok = hashed ? token_ids.data<int32_t>() : nullptr;
  const int64_t vocab = hashed ? tid2eid.size(0) : 0;
  const int e = static_cast<int>(experts);
  int32_t* ids = routing.expert_ids.data<int32_t>();
  float* wts = routing.weights.data<float>();
  const unsigned blocks = ceil_div(tokens, kSelectWarps);
  if (top_k <= kSelectMaxK && (hashed || experts <= 32 * kSelectSlots)) {
    route_select_warp_kernel<kSelectSlots><<<blocks, kSelectWarps * 32, 0, s>>>(
        lg, bias_p, table, tok, tokens, e, top_k, vocab, routed_scale, ids, wts);
  } else {
    route_select_kernel<<<blocks, kSelectWarps * 32, 0, s>>>(lg, bias_p, table, tok, tokens, e,
                                                             top_k, vocab, routed_scale, ids, wts);
  }
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return routing;
}

Tensor CudaBackend::moe_experts_impl(const Tensor& x, const Routing& routing,
                                     const ExpertWeights& experts, float swiglu_limit) {
  const char* op = "moe_experts";
  const int64_t tokens = x.size(0);
  const int64_t hidden = x.size(1);
  const int64_t k = routing.expert_ids.size(1);
  const size_t num = experts.w1.size();
  if (num > static_cast<size_t>(kMaxExperts)) {  // group_pairs keeps two ints per expert in smem
    fail(op, "at most " + std::to_string(kMaxExperts) + " experts, got " + std::to_string(num));
  }
  const DType wdtype = experts.w1[0].dtype();
  const int64_t inter = experts.w1[0].size(0);
  const int num_experts = static_cast<int>(num);

  // Per-expert pointer table [w1 | w3 | w2]: uploaded on first use, then cached by the backend.
  std::vector<int64_t> ptrs(3 * num);
  bool vec = aligned16(x.raw_data()) && hidden % 8 == 0 && inter % 8 == 0;
  for (size_t e = 0; e < num; ++e) {
    const Tensor* mats[3] = {&experts.w1[e], &experts.w3[e], &experts.w2[e]};
    for (int m = 0; m < 3; ++m) {
      const void* p = mats[m]->raw_data();
      vec = vec && aligned16(p);
      ptrs[static_cast<size_t>(m) * num + e] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(p));
    }
  }
  Tensor out = empty({tokens, hidden}, DType::kF32);
  if (tokens == 0 || hidden == 0) return out;
  if (k == 0 || inter == 0) {
    DEEPINFER_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, out.nbytes(), stream()));
    return out;
  }
  const Tensor& dev_table = pointer_table(ptrs);
  const void* const* base = static_cast<const void* const*>(dev_table.raw_data());
  for (int64_t t0 = 0; t0 < tokens; t0 += kMaxPassTokens) {
    const int64_t n = std::min(kMaxPassTokens, tokens - t0);
    const float* xp = x.data<float>() + t0 * hidden;
    const int32_t* ids = routing.expert_ids.data<int32_t>() + t0 * k;
    const float* wts = routing.weights.data<float>() + t0 * k;
    float* dst = out.data<float>() + t0 * hidden;
    if (wdtype == DType::kBF16) {
      using W = __nv_bfloat16;
      const W* const* tab = reinterpret_cast<const W* const*>(base);
      run_experts_pass<W>(*this, xp, ids, wts, n, static_cast<int>(k), hidden, inter, num_experts,
                          tab, tab + num, tab + 2 * num, vec, swiglu_limit, dst);
    } else {
      const float* const* tab = reinterpret_cast<const float* const*>(base);
      run_experts_pass<float>(*this, xp, ids, wts, n, static_cast<int>(k), hidden, inter,
                              num_experts, tab, tab + num, tab + 2 * num, vec, swiglu_limit, dst);
    }
  }
  return out;
}

}  // namespace deepinfer::cuda
