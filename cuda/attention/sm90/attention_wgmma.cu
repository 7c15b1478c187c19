// Hopper attention for AttentionSpec::bf16_math at V4's MQA shape (64 heads or a multiple, D = 512,
// bf16 rows or the fp8 record as keys): the op of sm80/attention_mma.cu (same key list, masks,
// sinks and split format, same numerics: q, the keys and the probabilities rounded to bf16, f32
// accumulation, f32 online softmax) on warpgroup MMAs (wgmma, sm_90a only). Opt-in:
// DEEPINFER_ATTENTION_KERNEL=wgmma (attention.cu); other shapes and f32 KV stay on mma.sync.
//
// Why. At B >= 64 the mma.sync kernel runs at 84-140 TFLOP/s: each warp feeds 16 rows through
// ldmatrix, and the fp8 -> bf16 conversion is paid per 32-key tile. wgmma reads both operands
// straight from shared memory for 64 rows at a time, so the products of a 64-key tile are 36
// instructions per warpgroup instead of ~1000 mma.sync + ldmatrix per warp.
//
// Block (token, group of 64 heads, key split), 256 threads = two warpgroups; wg = tid / 128.
// Per tile of 64 keys (all in shared memory, wgmma's no-swizzle core-matrix layout,
// attention_wgmma_config.h; 226 KB in all):
//  - issue_scores: warpgroup wg computes S = q K^T for all 64 heads and ITS 32 keys (32wg ..
//    32wg + 31) over all 512 channels: 32 x wgmma.m64n32k16, A = q, B = the keys' rows
//    (K-major). 16 f32 accumulators per thread.
//  - softmax_tile: masked keys -inf, the row maxima of the two halves exchanged through shared
//    memory (max is exact, so both warpgroups hold the identical running max), p = exp(s - max)
//    rounded to bf16 into the shared probability tile. Each warpgroup keeps the denominator of
//    ITS keys (d = d * alpha + sum: alpha is common, so the halves add up at the end).
//  - issue_values: O = O * alpha + P V for the warpgroup's 256 channels (256 wg ..):
//    4 x wgmma.m64n256k16, A = P, B = the same key tile read N-major (imm-trans-b: MQA, V = K).
//    128 f32 accumulators per thread.
// Two key buffers: tile i is multiplied from kb[i % 2] while tile i + 1 fills kb[(i + 1) % 2].
//  - bf16 rows (copy role: thread tid owns key tid / 4, 16-byte chunks tid % 4 + 4j): cp.async
//    straight into the other buffer, issued right after the barrier that starts a tile, so the
//    next tile's bytes fly during this tile's products.
//  - fp8 records (copy role: thread tid owns key tid / 8 of a half tile, pieces tid % 8 + 8j):
//    staged half a tile at a time (shared memory has room for two bf16 buffers plus half a tile
//    of records) and decoded into the other buffer while the tensor cores run: the first half of
//    tile i + 1 is decoded while tile i's scores run, the second half staged and then decoded
//    while its values run, and the first half of tile i + 2 staged. The decode is exact (e4m3 x
//    power of two, bf16 RoPE channels). A key's threads are one warp, so __syncwarp orders
//    their accesses to its stage row. Tile 0's records are staged whole in buffer 1 (free
//    until then), so that a block's first tile waits for one round trip, not two.
// Synchronisation: every wgmma group is waited for before the thread reaches the next block
// barrier, so a barrier orders all reads of a buffer before its rewrite; plain and cp.async
// stores are made visible to wgmma by fence.proxy.async before the barrier that publishes them.
// Three block barriers per tile: tile ready, maxima, probabilities.
//
// Output: as the mma.sync kernel's store_output: with one split out = O / (d e^(m-M) +
// e^(sink-M)), else the unnormalised O and (max, denominator) per head in part_acc / part_md,
// merged by attention_combine.cu (no fused combine here).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <string>

#include "cuda/attention/attention_keys.cuh"
#include "cuda/attention/attention_launch.h"
#include "cuda/attention/sm90/attention_wgmma_config.h"
#include "cuda/attention/sm90/attention_wgmma_mma.cuh"
#include "cuda/cache/kv_record.cuh"
#include "cuda/common/fp8.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/common/smem_limits.h"
#include "cuda/common/vec.cuh"

namespace deepinfer::cuda {

namespace {

using Layout = WgmmaAttnLayout;
constexpr int kDim = kWgmmaAttnDim;
constexpr int kKeys = kWgmmaAttnKeys;
constexpr int kRows = kWgmmaAttnRows;
constexpr int kThreads = kWgmmaAttnThreads;
constexpr int kChunks = kDim / 8;         // 16-byte chunks of a bf16 row (8 channels each)
constexpr int kChunkStride = kKeys * 16;  // bytes between chunk planes of a 64-row tile (1 KB)
constexpr int kHalfKeys = kKeys / 2;      // keys a warpgroup scores
constexpr int kHalfDim = kDim / 2;        // channels of O a warpgroup owns
constexpr int kOAcc = kHalfDim / 2;       // its f32 accumulators per thread (64 x 256 / 128)
static_assert(kRows == kKeys, "q and key tiles share the core-matrix layout");
static_assert(kThreads == 4 * kKeys, "4 copy threads per key");

// Byte offset of 8 channels (chunk `chunk`) of row `row` in a 64-row core-matrix tile: core
// matrix (row / 8, chunk) is 8 rows x 16 bytes; rows adjacent at 16 bytes, chunk planes at 1 KB.
__device__ __forceinline__ int tile_offset(int row, int chunk) {
  return chunk * kChunkStride + row * 16;
}

// Descriptors of the no-swizzle core-matrix tiles. K-major (q, the keys for S, P): the leading
// byte offset is the stride between core matrices along K (channels: 1 KB; for P the keys:
// 1 KB), the stride byte offset along M / N (rows: 128 bytes). N-major (the keys as V): along K
// (keys) 128 bytes, along N (channels) 1 KB.
__device__ __forceinline__ uint64_t kmajor_desc(const void* tile) {
  return wgmma_desc(tile, kChunkStride, 128);
}
__device__ __forceinline__ uint64_t nmajor_desc(const void* tile) {
  return wgmma_desc(tile, 128, kChunkStride);
}

// The tiles' shared-memory layout, a choice of the prefetching kernel (kSw128, opt-in
// DEEPINFER_ATTENTION_KERNEL=wgmma_prefetch_sw128...): the no-swizzle core matrices above, or
// wgmma's 128-byte swizzle: a 64-row tile as blocks of 64 channels (8 KB; P is one block of 64
// keys), each row's 128 bytes holding its 16-byte chunk c at position c ^ (row % 8) (the
// hardware XORs address bits 4-6 with bits 7-9, so every tile starts at a multiple of 1 KB).
// Descriptors (cute's canonical GMMA layouts): K-major, rows 128 bytes apart and 8-row groups
// at the stride byte offset (1 KB), a k16 step 32 bytes along the row (the next block after 4);
// N-major (the keys as V), 8-key groups at the stride byte offset (1 KB) and 64-channel blocks
// at the leading byte offset (8 KB), a k16 step 16 rows (2 KB).
constexpr int kSwBlock = kKeys * 128;  // a 64-channel block of a 64-row tile: 8 KB

template <bool kSw128>
struct Tiles {
  // Byte offset of chunk `chunk` (8 channels; of P, 8 keys) of row `row` in a 64-row tile.
  static __device__ __forceinline__ int offset(int row, int chunk) {
    if constexpr (kSw128) {
      return (chunk >> 3) * kSwBlock + row * 128 + (((chunk ^ row) & 7) << 4);
    } else {
      return tile_offset(row, chunk);
    }
  }
  static __device__ __forceinline__ uint64_t kmajor(const void* tile) {
    if constexpr (kSw128) {
      return wgmma_desc(tile, 16, 1024) | (uint64_t{1} << 62);  // leading offset unused
    } else {
      return kmajor_desc(tile);
    }
  }
  static __device__ __forceinline__ uint64_t nmajor(const void* tile) {
    if constexpr (kSw128) {
      return wgmma_desc(tile, kSwBlock, 1024) | (uint64_t{1} << 62);
    } else {
      return nmajor_desc(tile);
    }
  }
  // Descriptor advance (16-byte units) of K-major k16 step ks, and of the N-major one.
  static constexpr uint64_t kmajor_step(int ks) {
    return static_cast<uint64_t>(kSw128 ? ((ks >> 2) * kSwBlock + (ks & 3) * 32) >> 4
                                        : (2 * ks * kChunkStride) >> 4);
  }
  static constexpr uint64_t nmajor_step(int ks) {
    return static_cast<uint64_t>(kSw128 ? (16 * ks * 128) >> 4 : (16 * ks * 16) >> 4);
  }
  // Where warpgroup wg's operands start in a key tile: its 32 keys (S), its 256 channels (V).
  static constexpr int score_keys(int wg) {
    return kSw128 ? kHalfKeys * wg * 128 : kHalfKeys * wg * 16;
  }
  static constexpr int value_channels(int wg) {
    return kSw128 ? wg * (kHalfDim / 64) * kSwBlock : wg * (kHalfDim / 8) * kChunkStride;
  }
};

// This thread's chunks sub + 4j of one key's bf16 row (null = masked: zero chunks) into the tile,
// and the key's valid flag.
template <bool kSw128 = false>
__device__ __forceinline__ void copy_bf16_key(uint8_t* kb, int* valid, const uint8_t* src, int key,
                                              int sub) {
#pragma unroll
  for (int j = 0; j < kChunks / 4; ++j) {
    const int c = sub + 4 * j;
    uint8_t* dst = kb + Tiles<kSw128>::offset(key, c);
    if (src != nullptr) {
      cp_async_16(dst, src + 16 * c);
    } else {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
  if (sub == 0) valid[key] = src != nullptr ? 1 : 0;
}

// fp8 records move half a tile (kStageKeys keys) at a time, 8 threads per key (one warp holds
// all threads of a key, so __syncwarp orders their accesses to its stage row).
constexpr int kStageKeys = kWgmmaAttnStageKeys;
static_assert(kThreads == 8 * kStageKeys, "8 copy threads per staged key");

// This thread's 8-byte pieces sub8 + 8j of one key's fp8 record into its stage row.
__device__ __forceinline__ void copy_fp8_record(uint8_t* stage_row, const uint8_t* src, int sub8,
                                                int row_bytes) {
  if (src == nullptr) return;
#pragma unroll 4
  for (int c = sub8; c < row_bytes / 8; c += 8) cp_async_8(stage_row + 8 * c, src + 8 * c);
}

// This thread's channel chunks sub8 + 8j of tile row `key`, decoded from the staged record into
// the tile (zero for a masked key), and the key's valid flag. As decode_key_tile of the mma.sync
// kernel: exact, so the tile equals the f32 path's rounding of the decoded key.
__device__ __forceinline__ void decode_fp8_key(uint8_t* kb, int* valid, const uint8_t* rec,
                                               bool real, int key, int sub8, int nope,
                                               int rope_dim) {
#pragma unroll 2
  for (int j = 0; j < kChunks / 8; ++j) {
    const int chunk = sub8 + 8 * j;
    const int c = 8 * chunk;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (real) {
      if (c >= nope) {  // RoPE channels, bf16 (8-byte aligned: nope % 8 == 0)
        const uint2 lo = *reinterpret_cast<const uint2*>(rec + nope + 2 * (c - nope));
        const uint2 hi = *reinterpret_cast<const uint2*>(rec + nope + 2 * (c - nope) + 8);
        v = make_uint4(lo.x, lo.y, hi.x, hi.y);
      } else {
        const uint2 q = *reinterpret_cast<const uint2*>(rec + c);
        const float scale = e8m0_to_float(rec[nope + 2 * rope_dim + c / kv_record::kFp8Group]);
        uint32_t packed[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const uint32_t word = k < 2 ? q.x : q.y;
          const uint32_t pair = (word >> (16 * (k & 1))) & 0xffffu;
          const __half2 h = __half2(
              __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3));
          const float2 f = __half22float2(h);
          packed[k] = pack_bf16(f.x * scale, f.y * scale);
        }
        v = make_uint4(packed[0], packed[1], packed[2], packed[3]);
      }
    }
    *reinterpret_cast<uint4*>(kb + tile_offset(key, chunk)) = v;
  }
  if (sub8 == 0) valid[key] = real ? 1 : 0;
}

// q of the group's 64 heads, rounded to bf16 into the q tile; loads batched so their latencies
// overlap.
__device__ __forceinline__ void load_query_tile(const AttentionArgs& a, uint8_t* qs, int t,
                                                int h_first, int tid) {
  const float4* q4 =
      reinterpret_cast<const float4*>(a.q + (static_cast<int64_t>(t) * a.heads + h_first) * kDim);
  constexpr int kQ4 = kDim / 4;                   // float4 per head
  constexpr int kIters = kRows * kQ4 / kThreads;  // 32
  constexpr int kBatch = 16;
  static_assert(kIters % kBatch == 0, "q batches");
#pragma unroll 1
  for (int i0 = 0; i0 < kIters; i0 += kBatch) {
    float4 v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) v[u] = __ldg(q4 + tid + (i0 + u) * kThreads);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = tid + (i0 + u) * kThreads;
      const int head = i / kQ4;
      const int col4 = i % kQ4;  // channels 4 col4 .. + 3: chunk col4 / 2, half col4 % 2
      *reinterpret_cast<uint2*>(qs + tile_offset(head, col4 / 2) + 8 * (col4 & 1)) =
          make_uint2(pack_bf16(v[u].x, v[u].y), pack_bf16(v[u].z, v[u].w));
    }
  }
}

// load_query_tile in two steps, for the prefetching kernel: all of the thread's loads issued at
// once (before the block resolves its keys, so that their latencies overlap), then the stores.
constexpr int kQueryLoads = kRows * kDim / 4 / kThreads;  // float4 per thread: 32

__device__ __forceinline__ void issue_query_loads(const AttentionArgs& a, int t, int h_first,
                                                  int tid, float4 (&v)[kQueryLoads]) {
  const float4* q4 =
      reinterpret_cast<const float4*>(a.q + (static_cast<int64_t>(t) * a.heads + h_first) * kDim);
#pragma unroll
  for (int u = 0; u < kQueryLoads; ++u) v[u] = __ldg(q4 + tid + u * kThreads);
}

template <bool kSw128>
__device__ __forceinline__ void store_query_tile(uint8_t* qs, int tid,
                                                 const float4 (&v)[kQueryLoads]) {
  constexpr int kQ4 = kDim / 4;  // float4 per head
#pragma unroll
  for (int u = 0; u < kQueryLoads; ++u) {
    const int i = tid + u * kThreads;
    const int head = i / kQ4;
    const int col4 = i % kQ4;  // channels 4 col4 .. + 3: chunk col4 / 2, half col4 % 2
    *reinterpret_cast<uint2*>(qs + Tiles<kSw128>::offset(head, col4 / 2) + 8 * (col4 & 1)) =
        make_uint2(pack_bf16(v[u].x, v[u].y), pack_bf16(v[u].z, v[u].w));
  }
}

// Issues S for all 64 heads x the warpgroup's 32 keys of the tile over the 512 channels (one
// wgmma group; wait_products ends it).
template <bool kSw128 = false>
__device__ __forceinline__ void issue_scores(float (&s)[16], uint64_t q_desc, uint64_t k_desc) {
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kDim / 16; ++ks) {
    // k-step ks: channels 16ks .. 16ks + 15 (no swizzle: chunk planes 2ks and 2ks + 1).
    const uint64_t step = Tiles<kSw128>::kmajor_step(ks);
    wgmma_m64n32k16_bf16_kk(s, q_desc + step, k_desc + step, ks > 0);
  }
  wgmma_commit();
}

// Waits for this thread's wgmma groups (the scores or the values in flight).
template <int kCount>
__device__ __forceinline__ void wait_products(float (&acc)[kCount]) {
  wgmma_wait_all();
  fence_accumulators(acc);
}

// The online softmax of the thread's rows (heads row0 and row0 + 8) over the tile's 64 keys, of
// which this warpgroup scored 32 (s: columns 8j + 2qd + {0, 1} of its half). Returns alpha (the
// rescale of the old O) per row; P, rounded to bf16, goes to the shared probability tile.
// Contains the maxima's block barrier; the caller publishes P with the next one.
template <bool kSw128 = false>
__device__ __forceinline__ void softmax_tile(float (&s)[16], const int* valid, float* xchg,
                                             uint8_t* ps, float scale, int wg, int row0, int qd,
                                             float (&m_run)[2], float (&d_run)[2],
                                             float (&alpha)[2]) {
  const int key0 = kHalfKeys * wg + 2 * qd;  // the tile's key of column 2qd of n8 tile 0
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const bool real = valid[key0 + 8 * j + e] != 0;
      s[4 * j + e] = real ? s[4 * j + e] * scale : -INFINITY;
      s[4 * j + 2 + e] = real ? s[4 * j + 2 + e] * scale : -INFINITY;
    }
  }
  float mx[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < 4; ++j) m = fmaxf(m, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
    m = fmaxf(m, __shfl_xor_sync(kFullMask, m, 1));  // the 4 lanes of a row
    m = fmaxf(m, __shfl_xor_sync(kFullMask, m, 2));
    mx[r] = m;
    if (qd == 0) xchg[wg * kRows + row0 + 8 * r] = m;
  }
  __syncthreads();  // both halves' maxima
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float m_new = fmaxf(m_run[r], fmaxf(mx[r], xchg[(1 - wg) * kRows + row0 + 8 * r]));
    float sum = 0.0f;
    if (m_new == -INFINITY) {  // no real key yet: nothing to add, nothing to rescale
      alpha[r] = 1.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) s[4 * j + 2 * r] = s[4 * j + 2 * r + 1] = 0.0f;
    } else {
      alpha[r] = __expf(m_run[r] - m_new);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s[4 * j + 2 * r] = __expf(s[4 * j + 2 * r] - m_new);
        s[4 * j + 2 * r + 1] = __expf(s[4 * j + 2 * r + 1] - m_new);
        sum += s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];
      }
    }
    sum += __shfl_xor_sync(kFullMask, sum, 1);
    sum += __shfl_xor_sync(kFullMask, sum, 2);
    d_run[r] = d_run[r] * alpha[r] + sum;
    m_run[r] = m_new;
  }
  // P[head][key] in the K-major tile of wgmma's A: keys 8j + 2qd .. of this half are chunk
  // 4wg + j, bytes 4qd of the head's 16.
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      *reinterpret_cast<uint32_t*>(ps + Tiles<kSw128>::offset(row0 + 8 * r, 4 * wg + j) + 4 * qd) =
          pack_bf16(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]);
    }
  }
}

// Issues O = O * alpha + P V over the warpgroup's 256 channels (V: the key tile, N-major) as one
// wgmma group; wait_products(o) ends it. The previous group must be done (O is rescaled here).
template <bool kSw128 = false>
__device__ __forceinline__ void issue_values(float (&o)[kOAcc], const float (&alpha)[2],
                                             uint64_t p_desc, uint64_t v_desc) {
  // Once the maxima settle most tiles leave alpha at 1: the warp then skips the rescale.
  if (__any_sync(kFullMask, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
    for (int j = 0; j < kOAcc / 4; ++j) {
      o[4 * j] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
  }
  fence_accumulators(o);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kKeys / 16; ++ks) {
    // k-step ks: keys 16ks .. 16ks + 15 = P's chunk planes 2ks, 2ks + 1 and V's rows 16ks ..
    wgmma_m64n256k16_bf16_kn(o, p_desc + Tiles<kSw128>::kmajor_step(ks),
                             v_desc + Tiles<kSw128>::nmajor_step(ks), true);
  }
  wgmma_commit();
}

// The thread's rows of O (channels 256wg + 8j + 2qd + {0, 1}): with one split out = O / (d
// e^(m-M) + e^(sink-M)), else the unnormalised O and (max, denominator) for attention_combine.
__device__ __forceinline__ void store_output(const AttentionArgs& a, const DeviceLayout& l,
                                             const float (&o)[kOAcc], const float (&m_run)[2],
                                             const float (&d)[2], int t, int h_first, int wg,
                                             int row0, int qd) {
  const int split = blockIdx.z;
  const int splits = gridDim.z;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t head = h_first + row0 + 8 * r;
    const int64_t idx = static_cast<int64_t>(t) * a.heads + head;
    const float m = m_run[r];
    const int col = kHalfDim * wg + 2 * qd;
    if (splits == 1) {
      const float sink = a.sinks[head];
      const float mx = fmaxf(m, sink);
      const float em = m == -INFINITY ? 0.0f : expf(m - mx);
      const float f = em / (d[r] * em + expf(sink - mx));
      float* dst = a.out + idx * kDim + col;
#pragma unroll
      for (int j = 0; j < kOAcc / 4; ++j) {
        *reinterpret_cast<float2*>(dst + 8 * j) =
            make_float2(o[4 * j + 2 * r] * f, o[4 * j + 2 * r + 1] * f);
      }
    } else {
      const int64_t pidx = static_cast<int64_t>(split) * l.num_tokens * a.heads + idx;
      float* dst = a.part_acc + pidx * kDim + col;
#pragma unroll
      for (int j = 0; j < kOAcc / 4; ++j) {
        *reinterpret_cast<float2*>(dst + 8 * j) =
            make_float2(o[4 * j + 2 * r], o[4 * j + 2 * r + 1]);
      }
      if (wg == 0 && qd == 0) {
        a.part_md[2 * pidx] = m;
        a.part_md[2 * pidx + 1] = d[r];
      }
    }
  }
}

// After the last tile: each warpgroup's rows summed only its half of the keys, so the
// denominator is both halves' sums, added in the same order by both warpgroups; then the output.
__device__ __forceinline__ void finish_rows(const AttentionArgs& a, const DeviceLayout& l,
                                            const float (&o)[kOAcc], const float (&m_run)[2],
                                            const float (&d_run)[2], float* xchg, int t,
                                            int h_first, int wg, int row0, int qd) {
  __syncthreads();  // every thread past the last tile's reads of xchg
  if (qd == 0) {
    xchg[wg * kRows + row0] = d_run[0];
    xchg[wg * kRows + row0 + 8] = d_run[1];
  }
  __syncthreads();
  const float d[2] = {xchg[row0] + xchg[kRows + row0], xchg[row0 + 8] + xchg[kRows + row0 + 8]};
  store_output(a, l, o, m_run, d, t, h_first, wg, row0, qd);
}

template <KvFormat kFmt>
__global__ void __launch_bounds__(kThreads, 1)
    attention_wgmma_kernel(AttentionArgs a, DeviceLayout l) {
  static_assert(kFmt == KvFormat::kBf16 || kFmt == KvFormat::kFp8, "bf16 rows or fp8 records");
  constexpr bool kFp8 = kFmt == KvFormat::kFp8;
  extern __shared__ int4 smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_raw);
  uint8_t* qs = smem + Layout::kQOff;
  uint8_t* kb_base = smem + Layout::kKbOff;  // buffer b at kb_base + b * kKbBytes
  uint8_t* ps = smem + Layout::kPOff;
  float* xchg = reinterpret_cast<float*>(smem + Layout::kXchgOff);
  int* valid_base = reinterpret_cast<int*>(smem + Layout::kValidOff);

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int wg = tid >> 7;                               // warpgroup: keys of S, channels of O
  const int row0 = 16 * ((tid >> 5) & 3) + (lane >> 2);  // the thread's heads: row0, row0 + 8
  const int qd = lane & 3;
  const int t = blockIdx.x;
  const int h_first = blockIdx.y * kRows;

  const AttentionKeys keys(a, l, t);
  const KeyRange range = split_key_range<kKeys>(keys.n_keys, blockIdx.z, gridDim.z);
  auto key_at = [&](int64_t i) -> const uint8_t* {
    return i < range.end ? keys.key(a, l, i) : nullptr;
  };
  auto kb_of = [&](int b) { return kb_base + b * Layout::kKbBytes; };
  auto valid_of = [&](int b) { return valid_base + b * kKeys; };
  const int row_bytes = static_cast<int>(a.kvf.row_bytes);
  const int nope = a.kvf.nope();
  const int rope_dim = a.kvf.rope_dim;
  // bf16 copy role: key `ck` of each tile, chunks `sub` + 4j. fp8 role: key `hk` of each half
  // tile (tile row 32 half + hk), record pieces and channel chunks `sub8` + 8j.
  const int ck = tid >> 2;
  const int sub = tid & 3;
  const int hk = tid >> 3;
  const int sub8 = tid & 7;
  uint8_t* my_stage = smem + Layout::kStageOff + hk * row_bytes;

  float o[kOAcc];
#pragma unroll
  for (int i = 0; i < kOAcc; ++i) o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float d_run[2] = {0.0f, 0.0f};  // over this warpgroup's keys only

  // fp8: the half tile in the stage and the address of the next half to stage. A key's address
  // takes dependent loads (topk, block table), so it is resolved a half tile ahead.
  bool staged_real = false;
  const uint8_t* src_next = nullptr;
  // Stages half `half` of the tile at key i0 (src_next: its key of this thread), and resolves
  // the next half's.
  auto stage_half = [&](int64_t i0, int half) {
    copy_fp8_record(my_stage, src_next, sub8, row_bytes);
    staged_real = src_next != nullptr;
    src_next = key_at(i0 + kStageKeys * (half + 1) + hk);
  };
  // Decodes the staged half `half` into buffer b once this thread's copies and those of its key's
  // other threads (the same warp) have landed; after it the stage row is free again.
  auto decode_half = [&](int b, int half) {
    cp_async_wait_all();
    __syncwarp();
    decode_fp8_key(kb_of(b), valid_of(b), my_stage, staged_real, kStageKeys * half + hk, sub8, nope,
                   rope_dim);
    __syncwarp();
  };

  if (range.begin < range.end) {
    if constexpr (kFp8) {
      // Tile 0's records are staged whole in buffer 1 (free until tile 1 is decoded into it), so
      // both halves fly together with q's loads.
      static_assert(size_t{kKeys} * kWgmmaAttnStageRowBytes <= Layout::kKbBytes, "tile 0 fits");
      const uint8_t* src_lo = key_at(range.begin + hk);
      const uint8_t* src_hi = key_at(range.begin + kStageKeys + hk);
      uint8_t* rec_lo = kb_of(1) + hk * row_bytes;
      uint8_t* rec_hi = kb_of(1) + (kStageKeys + hk) * row_bytes;
      copy_fp8_record(rec_lo, src_lo, sub8, row_bytes);
      copy_fp8_record(rec_hi, src_hi, sub8, row_bytes);
      src_next = key_at(range.begin + kKeys + hk);
      load_query_tile(a, qs, t, h_first, tid);
      cp_async_wait_all();
      __syncwarp();  // the records' pieces copied by the keys' other threads (this warp)
      decode_fp8_key(kb_of(0), valid_of(0), rec_lo, src_lo != nullptr, hk, sub8, nope, rope_dim);
      decode_fp8_key(kb_of(0), valid_of(0), rec_hi, src_hi != nullptr, kStageKeys + hk, sub8, nope,
                     rope_dim);
      if (range.begin + kKeys < range.end) stage_half(range.begin + kKeys, 0);
    } else {
      copy_bf16_key(kb_of(0), valid_of(0), key_at(range.begin + ck), ck, sub);
      src_next = key_at(range.begin + kKeys + ck);
      load_query_tile(a, qs, t, h_first, tid);
    }
  }

  const uint64_t q_desc = kmajor_desc(qs);
  const uint64_t p_desc = kmajor_desc(ps);
  int it = 0;
  for (int64_t i0 = range.begin; i0 < range.end; i0 += kKeys, ++it) {
    const int buf = it & 1;
    uint8_t* kb = kb_of(buf);
    const bool more = i0 + kKeys < range.end;
    if constexpr (!kFp8) cp_async_wait_all();
    fence_async_shared();  // this thread's copies, decodes, zero rows and q, for wgmma
    __syncthreads();       // tile `it` in kb; every thread past tile it - 1 (the other buffer)
    if constexpr (!kFp8) {
      if (more) copy_bf16_key(kb_of(buf ^ 1), valid_of(buf ^ 1), src_next, ck, sub);
    }
    float s[16] = {};
    issue_scores(s, q_desc, kmajor_desc(kb + kHalfKeys * wg * 16));
    if constexpr (kFp8) {
      // The staged first half of the next tile decoded while the scores run; its second half
      // staged to land while the values run.
      if (more) {
        decode_half(buf ^ 1, 0);
        stage_half(i0 + kKeys, 1);
      }
    }
    wait_products(s);
    float alpha[2];
    softmax_tile(s, valid_of(buf), xchg, ps, a.scale, wg, row0, qd, m_run, d_run, alpha);
    fence_async_shared();
    __syncthreads();  // P of both halves
    issue_values(o, alpha, p_desc, nmajor_desc(kb + wg * (kHalfDim / 8) * kChunkStride));
    if constexpr (kFp8) {
      if (more) {
        decode_half(buf ^ 1, 1);
        if (i0 + 2 * kKeys < range.end) stage_half(i0 + 2 * kKeys, 0);
      }
    } else {
      src_next = key_at(i0 + 2 * kKeys + ck);  // null past range.end
    }
    wait_products(o);
  }

  finish_rows(a, l, o, m_run, d_run, xchg, t, h_first, wg, row0, qd);
}

// ---------------------------------------------------------------------------------------------
// The prefetching variant (DEEPINFER_ATTENTION_KERNEL=wgmma_prefetch, opt-in): the same tiles,
// products, softmax and output as attention_wgmma_kernel (bit-identical results), with the key
// loads moved off the tile's critical path. The kernel above waits for memory several times per
// tile (the fp8 stage holds half a tile, so each half is copied and then waited for within one
// tile; a key's address, a top-k column and then a block-table entry, is resolved right before
// its copy), and at B >= 64 its tiles took 7-9 us where the products take about 1.5. Here:
//  - fp8 records go to registers, not to a shared stage: thread tid holds a quarter of the
//    record of key tid / 4 (19 8-byte loads, Fp8Share; V4's 584-byte record only), loaded
//    during tile i and decoded while tile i + 1's scores run: each load has a tile to land;
//  - bf16 rows are copied with cp.async a tile ahead, as before;
//  - q's loads are all issued first, before the block resolves its first keys, and the row's
//    sequence is found by a warp-wide search (seq_of_row_warp: 2 dependent loads at B = 256);
//  - a key's address is resolved in two steps a tile before its loads are issued: the top-k
//    column loaded while the scores run, the block-table entry while the values run;
//  - with wgmma_prefetch_pdl (kPdl) it is a programmatic dependent launch of the kv rows'
//    encoding (attention.cu's first grid): a block resolves its first tiles' addresses while that
//    grid runs and waits for it (griddepcontrol.wait) before it reads a key; the split combine
//    after it likewise starts early and waits for this grid. At B = 1 (one tile per block) the
//    chain of dependent loads and the three launches are most of the time.
//  - with wgmma_prefetch_sw128(_pdl) (kSw128) the tiles are in wgmma's 128-byte swizzle
//    (Tiles) instead of the no-swizzle core matrices.
// Numerics and outputs: exactly attention_wgmma_kernel's (the same tile contents, products and
// softmax in the same order), which tests/gpu/cpp/test_attention_wgmma.cpp checks byte for byte.
// ---------------------------------------------------------------------------------------------

// V4's fp8 main record (attention_wgmma_config.h): the register shares are cut for it only.
constexpr int kV4Nope = kWgmmaPrefetchNope;
constexpr int kV4Rope = kWgmmaPrefetchRope;
constexpr int kV4RecordBytes = kWgmmaPrefetchRecordBytes;
constexpr int kPieces = 4;                             // threads (shares) per record
constexpr int kShareNope = kV4Nope / 8 / kPieces;      // 14 8-byte pieces of e4m3 channels
constexpr int kShareRope = 2 * kV4Rope / 8 / kPieces;  // 4 8-byte pieces of bf16 channels
static_assert(kV4Nope + 2 * kV4Rope + (kV4Nope + 63) / 64 <= kV4RecordBytes, "V4's record");
static_assert(kV4Nope + kV4Rope == kDim, "the record's channels are the tile's");
static_assert(kThreads == kPieces * kKeys, "a share per thread");

// One thread's share of an fp8 record (part `part` of key tid / 4): the record's 8-byte pieces
// kPieces i + part of its e4m3 bytes and of its bf16 RoPE bytes, so that the 4 threads of a key
// read 32 contiguous bytes per load, and the scale bytes.
struct Fp8Share {
  uint2 nope[kShareNope];  // channels 8 (4i + part) .. + 7: tile chunk 4i + part
  uint2 rope[kShareRope];  // RoPE channels 4 (4i + part) .. + 3: half a tile chunk
  uint2 scales;            // the 7 e8m0 scales and the pad byte
};

// Loads the thread's share of the record at `rec` (null: nothing, the key is masked), through
// L2 only (each byte is read once per block).
__device__ __forceinline__ void load_fp8_share(Fp8Share& sh, const uint8_t* rec, int part) {
  if (rec == nullptr) return;
  const uint2* nope = reinterpret_cast<const uint2*>(rec) + part;
#pragma unroll
  for (int i = 0; i < kShareNope; ++i) sh.nope[i] = __ldcg(nope + kPieces * i);
  const uint2* rope = reinterpret_cast<const uint2*>(rec + kV4Nope) + part;
#pragma unroll
  for (int i = 0; i < kShareRope; ++i) sh.rope[i] = __ldcg(rope + kPieces * i);
  sh.scales = __ldcg(reinterpret_cast<const uint2*>(rec + kV4Nope + 2 * kV4Rope));
}

// Decodes the share into tile row `key` (zeros for a masked key) and sets the key's valid flag:
// decode_fp8_key's arithmetic on the same bytes, so the tile is the same bits.
template <bool kSw128>
__device__ __forceinline__ void decode_fp8_share(uint8_t* kb, int* valid, const Fp8Share& sh,
                                                 bool real, int key, int part) {
  const uint64_t scales = (static_cast<uint64_t>(sh.scales.y) << 32) | sh.scales.x;
#pragma unroll
  for (int i = 0; i < kShareNope; ++i) {
    const int chunk = kPieces * i + part;  // channels 8 chunk ..: scale group 8 chunk / 64
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (real) {
      const float scale =
          e8m0_to_float(static_cast<uint8_t>(scales >> (8 * (8 * chunk / kv_record::kFp8Group))));
      uint32_t packed[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t word = k < 2 ? sh.nope[i].x : sh.nope[i].y;
        const uint32_t pair = (word >> (16 * (k & 1))) & 0xffffu;
        const __half2 h =
            __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3));
        const float2 f = __half22float2(h);
        packed[k] = pack_bf16(f.x * scale, f.y * scale);
      }
      v = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
    *reinterpret_cast<uint4*>(kb + Tiles<kSw128>::offset(key, chunk)) = v;
  }
#pragma unroll
  for (int i = 0; i < kShareRope; ++i) {
    const int piece = kPieces * i + part;  // RoPE channels 4 piece ..: half of chunk piece / 2
    *reinterpret_cast<uint2*>(kb + Tiles<kSw128>::offset(key, kV4Nope / 8 + piece / 2) +
                              8 * (piece & 1)) = real ? sh.rope[i] : make_uint2(0u, 0u);
  }
  if (part == 0) valid[key] = real ? 1 : 0;
}

// A key's address in two steps (AttentionKeys::key's keys and masks): pending_key reads what
// needs no dependent load (a sliding key's row, a compressed key's entry index: the top-k
// column), resolve_key the block table. Each step's loads land while the tensor cores run.
struct PendingKey {
  const uint8_t* row;  // the row when entry < 0 (null: masked or past the split)
  int64_t entry;       // >= 0: a visible compressed entry, its row still to look up
};

__device__ __forceinline__ PendingKey pending_key(const AttentionArgs& a, const DeviceLayout& l,
                                                  const AttentionKeys& keys, int64_t i,
                                                  int64_t end) {
  if (i >= end) return {nullptr, -1};
  if (i < keys.n_sliding) return {keys.key(a, l, i), -1};
  const int64_t c = i - keys.n_sliding;
  const int64_t j = a.sparse ? a.topk[static_cast<int64_t>(keys.t) * a.topk_cols + c] : c;
  return {nullptr, j >= 0 && j < keys.visible ? j : -1};
}

__device__ __forceinline__ const uint8_t* resolve_key(const AttentionArgs& a, const DeviceLayout& l,
                                                      const AttentionKeys& keys, PendingKey k) {
  if (k.entry < 0) return k.row;
  const int64_t row = entry_row(l, keys.b, k.entry, a.epb, a.entry_rows);
  return row >= 0 ? a.entries + row * a.entf.row_bytes : nullptr;
}

// kPdl: launched as a programmatic dependent launch (the griddepcontrol instructions are only in
// that instantiation). kSw128: the tiles in wgmma's 128-byte swizzle (Tiles).
template <KvFormat kFmt, bool kPdl, bool kSw128>
__global__ void __launch_bounds__(kThreads, 1)
    attention_wgmma_prefetch_kernel(AttentionArgs a, DeviceLayout l) {
  using T = Tiles<kSw128>;
  static_assert(kFmt == KvFormat::kBf16 || kFmt == KvFormat::kFp8, "bf16 rows or fp8 records");
  constexpr bool kFp8 = kFmt == KvFormat::kFp8;
  extern __shared__ int4 smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_raw);
  uint8_t* qs = smem + Layout::kQOff;
  uint8_t* kb_base = smem + Layout::kKbOff;  // buffer b at kb_base + b * kKbBytes
  uint8_t* ps = smem + Layout::kPOff;
  float* xchg = reinterpret_cast<float*>(smem + Layout::kXchgOff);
  int* valid_base = reinterpret_cast<int*>(smem + Layout::kValidOff);
  if constexpr (kSw128) {
    // The swizzle is of absolute address bits: the tiles must start at multiples of 1 KB.
    static_assert(Layout::kQOff % 1024 == 0 && Layout::kKbOff % 1024 == 0 &&
                      Layout::kKbBytes % 1024 == 0 && Layout::kPOff % 1024 == 0,
                  "1 KB aligned tiles");
    if ((smem_addr(smem) & 1023u) != 0) __trap();
  }

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int wg = tid >> 7;                               // warpgroup: keys of S, channels of O
  const int row0 = 16 * ((tid >> 5) & 3) + (lane >> 2);  // the thread's heads: row0, row0 + 8
  const int qd = lane & 3;
  const int t = blockIdx.x;
  const int h_first = blockIdx.y * kRows;
  // Copy role (both formats): key `ck` of each tile; bf16 chunks `part` + 4j, fp8 share `part`.
  const int ck = tid >> 2;
  const int part = tid & 3;
  // The combine of the splits (a programmatic dependent launch of this grid) may start: it
  // waits for this grid's completion before it reads anything.
  if constexpr (kPdl) let_dependents_launch();
  // q first (the grids before the kv rows' encoding wrote it): it flies while the block resolves
  // its keys.
  float4 q_loads[kQueryLoads];
  issue_query_loads(a, t, h_first, tid, q_loads);

  const AttentionKeys keys(a, l, t, seq_of_row_warp(l, t));
  const KeyRange range = split_key_range<kKeys>(keys.n_keys, blockIdx.z, gridDim.z);
  auto pending_at = [&](int64_t i0) { return pending_key(a, l, keys, i0 + ck, range.end); };
  auto resolve = [&](PendingKey k) { return resolve_key(a, l, keys, k); };
  auto kb_of = [&](int b) { return kb_base + b * Layout::kKbBytes; };
  auto valid_of = [&](int b) { return valid_base + b * kKeys; };

  float o[kOAcc];
#pragma unroll
  for (int i = 0; i < kOAcc; ++i) o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float d_run[2] = {0.0f, 0.0f};  // over this warpgroup's keys only

  // fp8: the share of the record the thread decodes next (tile it + 1 during tile it) and
  // whether its key is real. Both formats: the address of the key the thread loads next
  // (tile it + 2 during tile it for fp8, tile it + 1 for bf16).
  Fp8Share share;
  bool share_real = false;
  const uint8_t* src_next = nullptr;

  if (range.begin < range.end) {
    // The first tiles' addresses: top-k columns and block-table entries, which the grids before
    // the kv rows' encoding wrote (complete: that grid is an ordinary launch).
    const PendingKey k0 = pending_at(range.begin);
    const PendingKey k1 = pending_at(range.begin + kKeys);
    const PendingKey k2 = pending_at(range.begin + 2 * kKeys);
    const uint8_t* src0 = resolve(k0);
    const uint8_t* src1 = resolve(k1);
    store_query_tile<kSw128>(qs, tid, q_loads);
    // A sliding key may be one of this call's kv rows: the previous grid's output (with a
    // programmatic dependent launch this kernel started while that grid ran).
    if constexpr (kPdl) wait_for_previous_grid();
    if constexpr (kFp8) {
      load_fp8_share(share, src0, part);
      decode_fp8_share<kSw128>(kb_of(0), valid_of(0), share, src0 != nullptr, ck, part);
      fence_async_shared();  // tile 0 and q, for wgmma
      load_fp8_share(share, src1, part);
      share_real = src1 != nullptr;
      src_next = resolve(k2);
    } else {
      copy_bf16_key<kSw128>(kb_of(0), valid_of(0), src0, ck, part);
      src_next = src1;
    }
  }

  const uint64_t q_desc = T::kmajor(qs);
  const uint64_t p_desc = T::kmajor(ps);
  int it = 0;
  for (int64_t i0 = range.begin; i0 < range.end; i0 += kKeys, ++it) {
    const int buf = it & 1;
    uint8_t* kb = kb_of(buf);
    const bool more = i0 + kKeys < range.end;
    if constexpr (!kFp8) {
      cp_async_wait_all();
      fence_async_shared();  // this thread's copies, zero rows and q, for wgmma
    }  // fp8: the decodes are fenced where they end, before the next loads are issued
    __syncthreads();  // tile `it` in kb; every thread past tile it - 1 (the other buffer)
    PendingKey pending;
    if constexpr (!kFp8) {
      if (more) copy_bf16_key<kSw128>(kb_of(buf ^ 1), valid_of(buf ^ 1), src_next, ck, part);
      pending = pending_at(i0 + 2 * kKeys);  // tile it + 2, copied at the next tile
    }
    float s[16] = {};
    issue_scores<kSw128>(s, q_desc, T::kmajor(kb + T::score_keys(wg)));
    if constexpr (kFp8) {
      pending = pending_at(i0 + 3 * kKeys);  // tile it + 3, loaded at the next tile
      // Tile it + 1, loaded during the previous tile, decoded while the scores run; tile it + 2
      // loaded to land during the next one.
      if (more) {
        decode_fp8_share<kSw128>(kb_of(buf ^ 1), valid_of(buf ^ 1), share, share_real, ck, part);
      }
      fence_async_shared();  // the decoded tile, for wgmma after the next tile's barrier
      load_fp8_share(share, src_next, part);
      share_real = src_next != nullptr;
    }
    wait_products(s);
    float alpha[2];
    softmax_tile<kSw128>(s, valid_of(buf), xchg, ps, a.scale, wg, row0, qd, m_run, d_run, alpha);
    fence_async_shared();
    __syncthreads();  // P of both halves
    issue_values<kSw128>(o, alpha, p_desc, T::nmajor(kb + T::value_channels(wg)));
    src_next = resolve(pending);  // the block-table load lands while the values run
    wait_products(o);
  }

  finish_rows(a, l, o, m_run, d_run, xchg, t, h_first, wg, row0, qd);
}

template <KvFormat kFmt>
void launch(const AttentionArgs& a, const DeviceLayout& l, const AttentionMmaPlan& p,
            int64_t tokens, KernelSmemLimits& smem_limits, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(p.head_groups),
                  static_cast<unsigned>(p.splits));
  if (!p.prefetch) {
    allow_smem(attention_wgmma_kernel<kFmt>, Layout::kBytes);
    attention_wgmma_kernel<kFmt><<<grid, kThreads, Layout::kBytes, stream>>>(a, l);
    DEEPINFER_CUDA_LAUNCH_CHECK("attention");
    return;
  }
  // The prefetching kernel; with p.pdl a programmatic dependent launch of the grid before it
  // (the kv rows' encoding): it resolves its first keys' addresses while that grid runs.
  auto* kernel = p.swizzle ? (p.pdl ? attention_wgmma_prefetch_kernel<kFmt, true, true>
                                    : attention_wgmma_prefetch_kernel<kFmt, false, true>)
                           : (p.pdl ? attention_wgmma_prefetch_kernel<kFmt, true, false>
                                    : attention_wgmma_prefetch_kernel<kFmt, false, false>);
  smem_limits.allow(kernel, Layout::kBytes);
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = Layout::kBytes;
  config.stream = stream;
  cudaLaunchAttribute pdl[1] = {};
  pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = pdl;
  config.numAttrs = p.pdl ? 1 : 0;
  DEEPINFER_CUDA_THROW_IF_ERROR(cudaLaunchKernelEx(&config, kernel, a, l),
                                "attention: the prefetching wgmma kernel's launch");
}

}  // namespace

void launch_attention_wgmma(const AttentionArgs& a, const DeviceLayout& l,
                            const AttentionMmaPlan& p, int64_t tokens,
                            KernelSmemLimits& smem_limits, cudaStream_t stream) {
  if (!wgmma_attention_shape(a.heads, a.dim, a.kvf.format == KvFormat::kFp8, a.kvf.row_bytes) ||
      a.entf.format != a.kvf.format || a.entf.row_bytes != a.kvf.row_bytes ||
      (a.kvf.format != KvFormat::kBf16 && a.kvf.format != KvFormat::kFp8)) {
    throw Error(ErrorCode::kUnsupported,
                "attention: the wgmma kernel takes 64 heads (or a multiple) of 512 channels over "
                "bf16 rows or fp8 records, got " +
                    std::to_string(a.heads) + " heads of " + std::to_string(a.dim));
  }
  if (p.prefetch && !wgmma_prefetch_takes(a.kvf.format == KvFormat::kFp8, a.kvf.dim, a.kvf.rope_dim,
                                          a.kvf.row_bytes)) {
    throw Error(ErrorCode::kUnsupported,
                "attention: the prefetching wgmma kernel takes bf16 rows or V4's 584-byte fp8 "
                "record (448 + 64 channels), got a record of " +
                    std::to_string(a.kvf.row_bytes) + " bytes");
  }
  if (a.kvf.format == KvFormat::kBf16) {
    return launch<KvFormat::kBf16>(a, l, p, tokens, smem_limits, stream);
  }
  return launch<KvFormat::kFp8>(a, l, p, tokens, smem_limits, stream);
}

}  // namespace deepinfer::cuda
