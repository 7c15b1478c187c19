// The tiles and per-tile steps the Hopper attention kernels share (sm90/attention_wgmma.cu and
// its prefetching variant sm90/attention_wgmma_prefetch.cu): the block's constants, the shared-
// memory tile layouts (no swizzle, or wgmma's 128-byte swizzle), the key copies and fp8 decode,
// q's tile, the score and value products, the online softmax of a tile and the output.
// attention_wgmma.cu's head comment describes the algorithm they make up.
#pragma once

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

namespace deepinfer::cuda::attention_wgmma {

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

// A thread's scores of a 64-key tile as wgmma leaves them (s: rows row0 and row0 + 8, columns
// 8j + 2qd and + 1): each masked key's (its valid flag 0) set to -inf, each real one's times
// `factor`. A key pair's flags come in one 8-byte load (2qd is even, the flags 8-byte aligned).
__device__ __forceinline__ void mask_tile64(float (&s)[32], const int* valid, int qd,
                                            float factor) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int2 flags = *reinterpret_cast<const int2*>(valid + 8 * j + 2 * qd);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const bool real = (e == 0 ? flags.x : flags.y) != 0;
      s[4 * j + e] = real ? s[4 * j + e] * factor : -INFINITY;
      s[4 * j + 2 + e] = real ? s[4 * j + 2 + e] * factor : -INFINITY;
    }
  }
}

// Row r's probabilities of the tile in place, 2^(s scale_log2 - m_log2) (e^(scale s - m) with
// scale_log2 = scale log2(e), m_log2 = m log2(e)): one FFMA and one MUFU per score, -inf giving 0.
// Returns their sum over this thread's 16.
__device__ __forceinline__ float exp2_row_tile64(float (&s)[32], int r, float scale_log2,
                                                 float m_log2) {
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    s[4 * j + 2 * r] = exp2_approx(fmaf(s[4 * j + 2 * r], scale_log2, -m_log2));
    s[4 * j + 2 * r + 1] = exp2_approx(fmaf(s[4 * j + 2 * r + 1], scale_log2, -m_log2));
    sum += s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];
  }
  return sum;
}

// Row r's (0: row0, 1: row0 + 8) maximum over the tile, then across its 4 lanes (every lane gets
// it). A maximum is exact in any order.
__device__ __forceinline__ float row_max_tile64(const float (&s)[32], int r) {
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < 8; ++j) m = fmaxf(m, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
  m = fmaxf(m, __shfl_xor_sync(kFullMask, m, 1));
  return fmaxf(m, __shfl_xor_sync(kFullMask, m, 2));
}
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
      v = fp8_record_chunk_bf16(rec, c, nope, rope_dim);
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

// bf16 q (AttentionArgs::q_bf16) into the 128-byte swizzled q tile: chunks chunk_first ..
// chunk_first + kHeadChunks - 1 (8 channels each) of each of the block's heads, copied by
// cp.async as they are, thread `thread` of kCopyThreads taking every kCopyThreads-th chunk
// (consecutive threads: consecutive chunks of a head). q_bf16 is f32 q rounded to nearest even,
// as pack_bf16 rounds, so the tile holds the bytes store_query_tile writes from f32 q, at half
// the bytes read and no registers. The caller waits for its copies and fences them for wgmma.
template <int kCopyThreads, int kHeadChunks>
__device__ __forceinline__ void copy_query_bf16(const AttentionArgs& a, int64_t t, int64_t h_first,
                                                int chunk_first, int thread, uint8_t* qs) {
  static_assert(kRows * kHeadChunks % kCopyThreads == 0, "whole rounds of copies");
  const __nv_bfloat16* q = a.q_bf16 + (t * a.heads + h_first) * kDim;
#pragma unroll
  for (int u = 0; u < kRows * kHeadChunks / kCopyThreads; ++u) {
    const int i = thread + u * kCopyThreads;
    const int head = i / kHeadChunks;
    const int chunk = chunk_first + i % kHeadChunks;
    cp_async_16(qs + Tiles<true>::offset(head, chunk), q + head * kDim + 8 * chunk);
  }
}

// Has L2 fetch the start of the block of token t, heads h_first..: its q rows (kRows x kDim: 128
// KB of f32, 64 KB of bf16) and its top-k row. Thread `thread` of `threads` issues its share of
// the lines.
__device__ __forceinline__ void prefetch_unit_start(const AttentionArgs& a, int64_t t,
                                                    int64_t h_first, int thread, int threads) {
  const int64_t first = (t * a.heads + h_first) * kDim;
  const bool bf16 = a.q_bf16 != nullptr;
  const char* q = bf16 ? reinterpret_cast<const char*>(a.q_bf16 + first)
                       : reinterpret_cast<const char*>(a.q + first);
  const int query_bytes = kRows * kDim * (bf16 ? 2 : 4);
  for (int off = 128 * thread; off < query_bytes; off += 128 * threads) prefetch_l2(q + off);
  if (a.topk != nullptr) {
    const char* row = reinterpret_cast<const char*>(a.topk + t * a.topk_cols);
    for (int off = 128 * thread; off < 4 * a.topk_cols; off += 128 * threads) {
      prefetch_l2(row + off);
    }
  }
}

// prefetch_unit_start of the block likely to start next on some SM: the one a.sms linear block
// ids after this one (one block per SM; blocks start in the order of their linear ids as earlier
// ones end). A wave's blocks each read their q from DRAM at once, which took ~15,000 cycles of a
// block's prologue. Nothing past the grid's last block.
__device__ __forceinline__ void prefetch_next_block_start(const AttentionArgs& a, int thread,
                                                          int threads) {
  const uint32_t linear = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const uint32_t next = linear + static_cast<uint32_t>(a.sms);
  if (a.sms <= 0 || next >= gridDim.x * gridDim.y * gridDim.z) return;
  prefetch_unit_start(a, next % gridDim.x,
                      static_cast<int64_t>((next / gridDim.x) % gridDim.y) * kRows, thread,
                      threads);
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
// Split `split` of `splits` (the block's unless a persistent launch walks other units).
__device__ __forceinline__ void store_output(const AttentionArgs& a, const DeviceLayout& l,
                                             const float (&o)[kOAcc], const float (&m_run)[2],
                                             const float (&d)[2], int t, int h_first, int wg,
                                             int row0, int qd, int split, int splits) {
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
  store_output(a, l, o, m_run, d, t, h_first, wg, row0, qd, static_cast<int>(blockIdx.z),
               static_cast<int>(gridDim.z));
}

}  // namespace deepinfer::cuda::attention_wgmma
