// The expert selection of moe_route (docs/model.md#mixture-of-experts): scores
// sqrt(softplus(logit)), then per token either the top-k of scores + bias (ties: lower expert id)
// or the hash table row tid2eid[token]; the chosen scores are renormalised in slot order and
// scaled. Ids come out in the CPU's order (key descending, then id ascending). One warp per token:
// route_select_warp_kernel holds the token's scores in registers (E <= 256, k <= 32) and takes k
// rounds of a warp-wide argmax; other shapes take the generic route_select_kernel. Both give the
// CPU's ids and bitwise the same weights.
//
// Robustness where the CPU op throws (a device op cannot): in hash routing a token id outside
// [0, V) is clamped into that range and a table entry outside [0, E) is clamped too, so no read is
// ever out of bounds. NaN router scores give an unspecified (but in-range) choice.
#include <cstdint>

#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/moe/moe_launch.h"

namespace deepinfer::cuda {

namespace {

// torch.nn.functional.softplus (beta 1, threshold 20), as cpu::softplus.
__device__ __forceinline__ float softplus(float x) {
  return x > 20.0f ? x : log1pf(expf(x));
}

__device__ __forceinline__ float router_score(float logit) {
  return sqrtf(softplus(logit));
}

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
  enter_dependent_grid();
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

// A key's bits as an unsigned integer of the same order (larger key, larger value), -0 as +0 (they
// compare equal as floats, so the id decides between them, as on the CPU); NaN, never a candidate,
// and a retired expert are 0, below every key (-inf is 0x007FFFFF).
__device__ __forceinline__ uint32_t order_bits(float key) {
  if (key != key) return 0u;
  const uint32_t b = __float_as_uint(key + 0.0f);
  return (b & 0x80000000u) != 0u ? ~b : (b | 0x80000000u);
}

// One warp per token, the selection in registers (E <= 32 * kSlots, top_k <= kSelectMaxK): lane l
// holds the scores and keys of experts l, l + 32, ... (one coalesced read of the logits row), the
// keys as order_bits. Round j: the warp's largest key by one redux.sync max, then the lowest id
// holding it by one redux.sync min (no branches, no shuffle tree: the butterfly argmax this
// replaced took 12 us per token at B = 1 on the H200); the owner lane retires the pick (its key
// becomes 0) and broadcasts its score. This is the CPU's order (key descending, then id
// ascending), the bias steering the choice only. Lane j keeps slot j; the chosen scores are summed
// in slot order, as the CPU, so the weights are bitwise those of the generic kernel. Fewer than
// top_k non-NaN keys: the missing slots get expert 0 (unspecified). Hash routing: lane j reads
// table entry j (clamped, see the file comment).
template <int kSlots>
__global__ void __launch_bounds__(kSelectWarps * 32)
    route_select_warp_kernel(const float* __restrict__ logits, const float* __restrict__ bias,
                             const int32_t* __restrict__ tid2eid,
                             const int32_t* __restrict__ token_ids, int64_t tokens, int experts,
                             int top_k, int64_t vocab, float routed_scale,
                             int32_t* __restrict__ ids_out, float* __restrict__ weights_out) {
  enter_dependent_grid();
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
    uint32_t key[kSlots];
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const int e = lane + 32 * i;
      score[i] = 0.0f;
      key[i] = 0u;  // not an expert
      if (e < experts) {
        score[i] = router_score(row[e]);
        key[i] = order_bits(bias != nullptr ? score[i] + bias[e] : score[i]);
      }
    }
    for (int j = 0; j < top_k; ++j) {  // top_k is warp-uniform: every lane takes each redux
      uint32_t mine = 0u;
#pragma unroll
      for (int i = 0; i < kSlots; ++i) mine = max(mine, key[i]);
      const uint32_t top = __reduce_max_sync(kFullMask, mine);
      uint32_t lowest = 0xFFFFFFFFu;  // the lane's lowest id holding `top` (slots: ids ascending)
#pragma unroll
      for (int i = kSlots - 1; i >= 0; --i) {
        if (key[i] == top) lowest = static_cast<uint32_t>(lane + 32 * i);
      }
      const uint32_t picked = __reduce_min_sync(kFullMask, lowest);
      const int id = top != 0u ? static_cast<int>(picked) : 0;
      float owned = 0.0f;
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        if (lane + 32 * i == id) {
          owned = score[i];
          key[i] = 0u;
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

}  // namespace

void launch_route_select(const RouteSelectArgs& a, bool warp, bool pdl, cudaStream_t stream) {
  const dim3 blocks(ceil_div(a.tokens, kSelectWarps));
  const dim3 threads(kSelectWarps * 32);
  if (warp) {
    launch_programmatic("moe_route", blocks, threads, 0, stream, pdl,
                        route_select_warp_kernel<kSelectSlots>, a.logits, a.bias, a.tid2eid,
                        a.token_ids, a.tokens, a.experts, a.top_k, a.vocab, a.routed_scale, a.ids,
                        a.weights);
  } else {
    launch_programmatic("moe_route", blocks, threads, 0, stream, pdl, route_select_kernel, a.logits,
                        a.bias, a.tid2eid, a.token_ids, a.tokens, a.experts, a.top_k, a.vocab,
                        a.routed_scale, a.ids, a.weights);
  }
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_route");
}

}  // namespace deepinfer::cuda
