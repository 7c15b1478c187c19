// The producer's key shares of the warp-specialised Hopper attention kernel
// (sm90/attention_wgmma_overlap.cu): unpaired, two producer threads per key, each holding half of
// its record (or copying half of its bf16 row) for all 64 keys of a tile; in the cluster-pair mode
// (DEEPINFER_ATTENTION_KERNEL=wgmma_overlap_pair) each of a token's two 64-head blocks loads and
// decodes 32 keys of every 64-key tile, 4 producer threads per key, and stores the bf16 rows into
// its own key buffer and through distributed shared memory into its peer's. Also the L2 prefetch
// of a key's row that both modes issue a tile ahead of its loads.
#pragma once

#include <cstdint>

#include "cuda/attention/sm90/attention_wgmma_tiles.cuh"
#include "cuda/cache/kv_record.cuh"
#include "cuda/common/ptx_cluster.cuh"

namespace deepinfer::cuda::attention_wgmma {

// Has L2 fetch this thread's share of the lines of a key's row (`bytes` long at `src`; null:
// masked, nothing): part p of kParts takes the 128-byte steps p, p + kParts, ... and the last
// part the row's last byte, so together they touch every line whatever the row's alignment.
template <int kParts>
__device__ __forceinline__ void prefetch_row_l2(const uint8_t* src, int bytes, int part) {
  if (src == nullptr) return;
  for (int off = 128 * part; off < bytes; off += 128 * kParts) prefetch_l2(src + off);
  if (part == kParts - 1) prefetch_l2(src + bytes - 1);
}

// V4's fp8 main record (kv_record.h): 448 e4m3 channels, 64 bf16 RoPE channels, 7 e8m0 scales
// and a pad byte; 8-byte aligned. A producer thread holds half of a record: the tile chunks
// (8 channels) 2i + part.
constexpr int kNopeChunks = kWgmmaPrefetchNope / 8;       // 56
constexpr int kRopeChunks = 2 * kWgmmaPrefetchRope / 16;  // 8 (16 bytes of bf16 each)
constexpr int kHalfNope = kNopeChunks / 2;                // 28
constexpr int kHalfRope = kRopeChunks / 2;                // 4
constexpr int kScalesPiece = (kWgmmaPrefetchNope + 2 * kWgmmaPrefetchRope) / 8;  // 72
static_assert(kNopeChunks + kRopeChunks == kChunks, "the record's channels are the tile's");
static_assert(8 * kScalesPiece + 8 == kWgmmaPrefetchRecordBytes, "scales in the last 8 bytes");

struct Fp8Half {
  uint2 nope[kHalfNope];      // e4m3 bytes of tile chunk 2i + part
  uint2 rope[2 * kHalfRope];  // bf16 bytes of RoPE chunk 2i + part: pieces 2i, 2i + 1
  uint2 scales;
};

__device__ __forceinline__ void load_fp8_half(Fp8Half& h, const uint8_t* rec, int part) {
  if (rec == nullptr) return;
  const uint2* p = reinterpret_cast<const uint2*>(rec);
#pragma unroll
  for (int i = 0; i < kHalfNope; ++i) h.nope[i] = __ldg(p + 2 * i + part);
#pragma unroll
  for (int i = 0; i < kHalfRope; ++i) {
    const int piece = kNopeChunks + 2 * (2 * i + part);  // 8-byte pieces of the RoPE chunk
    h.rope[2 * i] = __ldg(p + piece);
    h.rope[2 * i + 1] = __ldg(p + piece + 1);
  }
  h.scales = __ldg(p + kScalesPiece);
}

// The XOR of an fp8 share's words (Fp8Half, PairQuarter<kFp8>): a value that depends on every
// load into it (the trace's "records landed" stamp waits for it).
template <class Share>
__device__ __forceinline__ uint32_t fp8_share_digest(const Share& h) {
  uint32_t x = h.scales.x ^ h.scales.y;
#pragma unroll
  for (const uint2& v : h.nope) x ^= v.x ^ v.y;
#pragma unroll
  for (const uint2& v : h.rope) x ^= v.x ^ v.y;
  return x;
}

// Tile row `key`'s chunks 2i + part decoded from the half record (zeros for a masked key); the
// key's valid flag. kIntegerDecode (the wgmma_overlap_ilp variant): decode_e4m3_chunk
// (cache/kv_record.cuh), every chunk decoded and a masked key's zeros selected at the end, so the
// 28 chunks form one block that ptxas interleaves (a masked key's registers hold an earlier key's
// bytes, or the zeros the caller started with: decoded and dropped); otherwise the conversion units
// (e4m3_chunk_to_bf16, cache/kv_record.cuh: e4m3 -> f16 -> f32, times the f32 scale, rounded to
// bf16), the plain wgmma_overlap kernel's decode (its pdl, merged and traced launches too), whose
// three conversions per pair at a quarter of the integer rate took its whole decode time. The
// same bits.
template <bool kIntegerDecode = false>
__device__ __forceinline__ void decode_fp8_half(uint8_t* kb, int* valid, const Fp8Half& h,
                                                bool real, int key, int part) {
  const uint64_t scales = (static_cast<uint64_t>(h.scales.y) << 32) | h.scales.x;
  // Channels 8 chunk .. + 7: scale group 8 chunk / 64, the same for 2i and 2i + 1 (so known at
  // compile time).
  static_assert(kv_record::kFp8Group == 64, "scale groups of 64 channels (8 chunks)");
  if constexpr (kIntegerDecode) {
    constexpr int kGroups = (kHalfNope + 3) / 4;  // 7: chunks 2i + part with i / 4 = g
    uint32_t scale[kGroups];
#pragma unroll
    for (int g = 0; g < kGroups; ++g) scale[g] = e8m0_to_bf16x2((scales >> (8 * g)) & 0xffu);
#pragma unroll
    for (int i = 0; i < kHalfNope; ++i) {
      const uint4 v = decode_e4m3_chunk(h.nope[i], scale[i / 4]);
      *reinterpret_cast<uint4*>(kb + Tiles<true>::offset(key, 2 * i + part)) =
          real ? v : make_uint4(0u, 0u, 0u, 0u);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kHalfNope; ++i) {
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (real) {
        v = e4m3_chunk_to_bf16(h.nope[i],
                               e8m0_to_float(static_cast<uint8_t>(scales >> (8 * (i / 4)))));
      }
      *reinterpret_cast<uint4*>(kb + Tiles<true>::offset(key, 2 * i + part)) = v;
    }
  }
#pragma unroll
  for (int i = 0; i < kHalfRope; ++i) {
    const int chunk = kNopeChunks + 2 * i + part;
    const uint4 v = real ? make_uint4(h.rope[2 * i].x, h.rope[2 * i].y, h.rope[2 * i + 1].x,
                                      h.rope[2 * i + 1].y)
                         : make_uint4(0u, 0u, 0u, 0u);
    *reinterpret_cast<uint4*>(kb + Tiles<true>::offset(key, chunk)) = v;
  }
  if (part == 0) valid[key] = real ? 1 : 0;
}

// bf16 rows: tile row `key`'s chunks 2i + part by cp.async (zeros for a masked key).
__device__ __forceinline__ void copy_bf16_half(uint8_t* kb, int* valid, const uint8_t* src, int key,
                                               int part) {
#pragma unroll
  for (int i = 0; i < kChunks / 2; ++i) {
    const int chunk = 2 * i + part;
    uint8_t* dst = kb + Tiles<true>::offset(key, chunk);
    if (src != nullptr) {
      cp_async_16(dst, src + 16 * chunk);
    } else {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
  if (part == 0) valid[key] = src != nullptr ? 1 : 0;
}

constexpr int kPairKeys = kKeys / 2;  // keys of a tile one block of the pair loads: 32
constexpr int kQuarterParts = 4;      // producer threads per loaded key
constexpr int kQuarterNope = kWgmmaPrefetchNope / 8 / kQuarterParts;       // 14 e4m3 chunks
constexpr int kQuarterRope = 2 * kWgmmaPrefetchRope / 16 / kQuarterParts;  // 2 RoPE chunks
constexpr int kQuarterBf16 = kChunks / kQuarterParts;                      // 16 bf16 chunks
static_assert(kQuarterNope * kQuarterParts * 8 == kWgmmaPrefetchNope &&
                  (kWgmmaPrefetchNope / 8 + kQuarterRope * kQuarterParts) == kChunks,
              "V4's record cut into 4 equal shares of tile chunks");

// A producer thread's share of its key: tile chunks kQuarterParts i + part. fp8: the e4m3
// bytes of those chunks (one 8-byte piece each), the RoPE chunks' bf16 bytes (two pieces each)
// and the record's 8 scale bytes; bf16: the chunks themselves. A warp's load reads 32 (fp8) or
// 64 (bf16) contiguous bytes of each of its 8 keys.
template <KvFormat kFmt>
struct PairQuarter;
template <>
struct PairQuarter<KvFormat::kFp8> {
  uint2 nope[kQuarterNope];
  uint2 rope[2 * kQuarterRope];
  uint2 scales;
};
template <>
struct PairQuarter<KvFormat::kBf16> {
  uint4 chunk[kQuarterBf16];
};

__device__ __forceinline__ void load_quarter(PairQuarter<KvFormat::kFp8>& q, const uint8_t* rec,
                                             int part) {
  if (rec == nullptr) return;
  const uint2* p = reinterpret_cast<const uint2*>(rec);
  constexpr int kNopePieces = kWgmmaPrefetchNope / 8;  // the RoPE bytes start at piece 56
#pragma unroll
  for (int i = 0; i < kQuarterNope; ++i) q.nope[i] = __ldg(p + kQuarterParts * i + part);
#pragma unroll
  for (int j = 0; j < kQuarterRope; ++j) {
    const int piece = kNopePieces + 2 * (kQuarterParts * j + part);
    q.rope[2 * j] = __ldg(p + piece);
    q.rope[2 * j + 1] = __ldg(p + piece + 1);
  }
  q.scales = __ldg(p + (kWgmmaPrefetchRecordBytes - 8) / 8);
}

__device__ __forceinline__ void load_quarter(PairQuarter<KvFormat::kBf16>& q, const uint8_t* row,
                                             int part) {
  if (row == nullptr) return;
  const uint4* p = reinterpret_cast<const uint4*>(row);
#pragma unroll
  for (int i = 0; i < kQuarterBf16; ++i) q.chunk[i] = __ldg(p + kQuarterParts * i + part);
}

// A key buffer in both blocks of the pair: this block's tile and valid flags, and the peer's
// (shared::cluster addresses of the same offsets) with the peer's full mbarrier of the buffer.
// Every value goes to both: a plain store here, an asynchronous one (st.async) there that
// completes its bytes on the peer's mbarrier, so neither a fence nor a remote arrival waits for
// the peer (the peer's producer arms that phase with kPairPeerBytes).
struct PairKeyBuffer {
  uint8_t* kb;
  int* valid;
  uint32_t kb_peer;
  uint32_t valid_peer;
  uint32_t full_peer;

  __device__ __forceinline__ void put16(int offset, uint4 v) const {
    *reinterpret_cast<uint4*>(kb + offset) = v;
    st_async_16(kb_peer + static_cast<uint32_t>(offset), v, full_peer);
  }
  __device__ __forceinline__ void put_valid(int key, bool real) const {
    valid[key] = real ? 1 : 0;
    st_async_4(valid_peer + 4u * static_cast<uint32_t>(key), real ? 1u : 0u, full_peer);
  }
};

// The bytes one block's producers store into the peer per tile: their 32 keys' rows (every
// chunk, zeros for masked keys) and valid flags.
constexpr uint32_t kPairPeerBytes =
    static_cast<uint32_t>(kPairKeys * (kChunks * 16 + static_cast<int>(sizeof(int))));

// Tile row `key`'s chunks kQuarterParts i + part from the share (zeros for a masked key) into
// both blocks, and the key's valid flag. The pair mode runs the wgmma_overlap_ilp variant:
// decode_fp8_half's integer form (every chunk decoded, a masked key's zeros selected at the
// end), the same bits.
__device__ __forceinline__ void store_quarter(const PairKeyBuffer& buf,
                                              const PairQuarter<KvFormat::kFp8>& q, bool real,
                                              int key, int part) {
  using T = Tiles<true>;
  const uint64_t scales = (static_cast<uint64_t>(q.scales.y) << 32) | q.scales.x;
  static_assert(kv_record::kFp8Group == 64 && kQuarterParts == 4,
                "chunk 4i + part lies in scale group i / 2 (groups of 8 chunks)");
  constexpr int kGroups = (kQuarterNope + 1) / 2;  // 7: chunks 4i + part with i / 2 = g
  uint32_t scale[kGroups];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) scale[g] = e8m0_to_bf16x2((scales >> (8 * g)) & 0xffu);
#pragma unroll
  for (int i = 0; i < kQuarterNope; ++i) {
    const uint4 v = decode_e4m3_chunk(q.nope[i], scale[i / 2]);
    buf.put16(T::offset(key, kQuarterParts * i + part), real ? v : make_uint4(0u, 0u, 0u, 0u));
  }
#pragma unroll
  for (int j = 0; j < kQuarterRope; ++j) {
    const int chunk = kWgmmaPrefetchNope / 8 + kQuarterParts * j + part;
    const uint4 v = real ? make_uint4(q.rope[2 * j].x, q.rope[2 * j].y, q.rope[2 * j + 1].x,
                                      q.rope[2 * j + 1].y)
                         : make_uint4(0u, 0u, 0u, 0u);
    buf.put16(T::offset(key, chunk), v);
  }
  if (part == 0) buf.put_valid(key, real);
}

// The bf16 rows (pair mode): copied.
__device__ __forceinline__ void store_quarter(const PairKeyBuffer& buf,
                                              const PairQuarter<KvFormat::kBf16>& q, bool real,
                                              int key, int part) {
  using T = Tiles<true>;
#pragma unroll
  for (int i = 0; i < kQuarterBf16; ++i) {
    buf.put16(T::offset(key, kQuarterParts * i + part),
              real ? q.chunk[i] : make_uint4(0u, 0u, 0u, 0u));
  }
  if (part == 0) buf.put_valid(key, real);
}

}  // namespace deepinfer::cuda::attention_wgmma
