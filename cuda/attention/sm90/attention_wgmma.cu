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
//
// Files: the tiles and per-tile steps are sm90/attention_wgmma_tiles.cuh (shared with the
// prefetching variant, sm90/attention_wgmma_prefetch.cu); this file holds the kernel and the
// launch, which hands p.prefetch to that variant.
#include <cstdint>
#include <string>

#include "cuda/attention/attention_launch.h"
#include "cuda/attention/sm90/attention_wgmma_keysplit.h"
#include "cuda/attention/sm90/attention_wgmma_overlap.h"
#include "cuda/attention/sm90/attention_wgmma_prefetch.h"
#include "cuda/attention/sm90/attention_wgmma_tiles.cuh"
#include "cuda/common/launch.cuh"

namespace deepinfer::cuda {

namespace attention_wgmma {
namespace {

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

template <KvFormat kFmt>
void launch(const AttentionArgs& a, const DeviceLayout& l, const AttentionMmaPlan& p,
            int64_t tokens, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(p.head_groups),
                  static_cast<unsigned>(p.splits));
  allow_smem(attention_wgmma_kernel<kFmt>, Layout::kBytes);
  attention_wgmma_kernel<kFmt><<<grid, kThreads, Layout::kBytes, stream>>>(a, l);
  DEEPINFER_CUDA_LAUNCH_CHECK("attention");
}

}  // namespace
}  // namespace attention_wgmma

void launch_attention_wgmma(const AttentionArgs& a, const DeviceLayout& l,
                            const AttentionMmaPlan& p, int64_t tokens,
                            KernelSmemLimits& smem_limits, cudaStream_t stream,
                            const OverlapTraceBuffer& trace) {
  if (!wgmma_attention_shape(a.heads, a.dim, a.kvf.format == KvFormat::kFp8, a.kvf.row_bytes) ||
      a.entf.format != a.kvf.format || a.entf.row_bytes != a.kvf.row_bytes ||
      (a.kvf.format != KvFormat::kBf16 && a.kvf.format != KvFormat::kFp8)) {
    throw Error(ErrorCode::kUnsupported,
                "attention: the wgmma kernel takes 64 heads (or a multiple) of 512 channels over "
                "bf16 rows or fp8 records, got " +
                    std::to_string(a.heads) + " heads of " + std::to_string(a.dim));
  }
  if ((p.prefetch || p.overlap) && !wgmma_prefetch_takes(a.kvf.format == KvFormat::kFp8, a.kvf.dim,
                                                         a.kvf.rope_dim, a.kvf.row_bytes)) {
    throw Error(ErrorCode::kUnsupported,
                "attention: the prefetching and overlapping wgmma kernels take bf16 rows or V4's "
                "584-byte fp8 "
                "record (448 + 64 channels), got a record of " +
                    std::to_string(a.kvf.row_bytes) + " bytes");
  }
  if (p.keysplit) {
    if (trace.stamps != nullptr) {
      throw Error(ErrorCode::kUnsupported,
                  "attention: only the overlapping wgmma kernel records a timing trace");
    }
    return launch_attention_wgmma_keysplit(a, l, p, tokens, smem_limits, stream);
  }
  if (p.overlap) {
    return launch_attention_wgmma_overlap(a, l, p, tokens, smem_limits, stream, trace);
  }
  if (trace.stamps != nullptr) {
    throw Error(ErrorCode::kUnsupported,
                "attention: only the overlapping wgmma kernel records a timing trace");
  }
  if (a.q == nullptr) {
    throw Error(ErrorCode::kInternal,
                "attention: only the overlapping wgmma kernel reads bf16 q (the op widens it for "
                "the others)");
  }
  if (p.prefetch) return launch_attention_wgmma_prefetch(a, l, p, tokens, smem_limits, stream);
  if (a.kvf.format == KvFormat::kBf16) {
    return attention_wgmma::launch<KvFormat::kBf16>(a, l, p, tokens, stream);
  }
  return attention_wgmma::launch<KvFormat::kFp8>(a, l, p, tokens, stream);
}

}  // namespace deepinfer::cuda
