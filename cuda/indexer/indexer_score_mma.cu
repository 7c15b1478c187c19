// The indexer's scoring kernel on tensor cores: the scores of indexer_score.cu (same scratch
// rows, same -inf / +0 rules) for bf16, V4 fp8 and V4.1 FP4 index keys, with q . k on mma.sync
// m16n8k16 and f32 accumulation.
//
// Precision. The keys are exact in the MMA's input type: fp8 keys as e4m3 codes in f16 (their
// f32 row scale applied to the product), FP4 keys as e2m1 codes in f16 (each 32-channel group's
// UE8M0 scale applied to that group's product: score_fp4_tile), bf16 keys as they are. q is
// split into two parts, q = hi + lo, and both are multiplied (two MMAs): in bf16 for bf16 keys
// (q to 16 significant bits: relative error <= 2^-16 per channel), in f16 for fp8 and FP4 keys
// after a power-of-two scale per head that puts max |q_h| in [2^14, 2^15) (22 bits: <= 2^-22
// per channel, channels below 2^-28 max |q_h| to an absolute 2^-39 max |q_h|). Products are exact
// in the f32 accumulators, whose sums on Hopper's tensor cores are a few bits short of IEEE f32
// (they truncate). ReLU, the head weights and the sum over heads run in f32 in the epilogue.
// Integer-valued q and keys (the op table's exact rows) are thus scored exactly.
//
// Block (token of the group, split): the split walks tiles of kMmaKeys entries first = split,
// + splits, ... Warp w scores heads 16 (w % hg) .. + 15 (hg = heads / 16 head groups) against
// keys 32 (w / hg) .. + 31 of each tile, its q fragments in registers for the whole block. Key
// tiles are copied with cp.async kMmaStages deep, gathered through the block table, as the
// cache stores them; fp8 codes become f16 in registers (cvt e4m3x2 -> f16x2). fp8 records (132
// bytes, 4-byte aligned) are copied key by key with 4-byte copies, or, when asked
// (IndexerScoreKernel::kTensorCoreKeyRuns; slower on the H200), in runs of a paged block with
// 16-byte copies where the block's entries allow it (score_mma_key_runs). Lanes read the
// key channels of their fragments directly (indexer_mma_layout.h): no ldmatrix, no decode pass.
// FP4 records (68 bytes) are copied whole, key by key with 4-byte copies, into rows of 80 bytes;
// they take the bf16 keys' channel order, so that the 16 channels of an mma step lie in one
// 32-channel scale group (steps 2i, 2i + 1: group i, the 4-byte words i*4 .. i*4 + 3 of codes).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>

#include "cuda/common/launch.cuh"
#include "cuda/common/layout.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/common/vec.cuh"
#include "cuda/indexer/indexer_fp8_records.cuh"
#include "cuda/indexer/indexer_launch.h"
#include "cuda/indexer/indexer_mma_layout.h"

namespace deepinfer::cuda {

namespace {

namespace im = indexer_mma;

constexpr int kSteps = kMmaDim / 16;                 // mma k-steps over a head
constexpr int kWarpKeys = kMmaKeys / kMmaKeyGroups;  // keys of one warp per tile
constexpr int kWarpTiles = kWarpKeys / 8;            // n-tiles of 8 keys

// What differs between the key formats.
template <KvFormat F>
struct MmaKeys {
  static constexpr bool kFp4 = F == KvFormat::kV41Fp4Index;
  // The channel order (indexer_mma_layout.h) by element size: FP4 keys take bf16's.
  static constexpr int kElemBytes = F == KvFormat::kFp8 ? 1 : 2;
  // fp8 and FP4 keys go into f16 MMAs (e4m3 and e2m1 codes are exact there), bf16 keys into
  // bf16 ones.
  static constexpr bool kF16 = F != KvFormat::kBf16;
  static constexpr int kRowBytes = score_mma_key_bytes(F);  // shared memory of one key
  // Bytes per cp.async: fp8 records are 132 bytes and FP4 records 68, so only 4-byte aligned.
  static constexpr int kCopyBytes = F == KvFormat::kBf16 ? 16 : 4;
  // Lanes that copy a key's channels (an FP4 record's 64 bytes of codes; one of them also
  // copies its scales).
  static constexpr int kLanesPerKey = (kFp4 ? kMmaDim / 2 : kRowBytes) / kCopyBytes;
  static_assert(kLanesPerKey == 16 || kLanesPerKey == 32, "a key's copies fill a warp or half");
};

// An FP4 record staged in shared memory: the e2m1 pairs of the kMmaDim channels, then one UE8M0
// scale byte per 32 channels.
constexpr int kFp4CodeBytes = kMmaDim / 2;
constexpr int kFp4Groups = kMmaDim / kv_record::kV41Fp4IndexGroup;
static_assert(kFp4CodeBytes + kFp4Groups == 68 &&
              kFp4CodeBytes + kFp4Groups <= score_mma_key_bytes(KvFormat::kV41Fp4Index));

// The f16x2 B register of one byte of e2m1 pairs (the low nibble in the low half), each value
// times 2^-14: the nibble's sign goes to the f16 sign bit and its exponent and mantissa bits
// (e1 e0 m) to the f16 bits 11..9, so that e1 e0 are the exponent's low bits (bias 15 against
// e2m1's 1: the 2^-14) and m its first mantissa bit; code 1 (0.5) becomes the f16 subnormal
// 2^-15. Exact for all 16 codes.
__device__ __forceinline__ uint32_t fp4_pair_f16(uint32_t byte) {
  const uint32_t nibbles = (byte | (byte << 12)) & 0x000f000fu;  // low nibble at 0, high at 16
  return ((nibbles & 0x00080008u) << 12) | ((nibbles & 0x00070007u) << 9);
}

// The 2^14 that fp4_pair_f16 takes out of every FP4 key, given back with the head weights.
constexpr float kFp4KeyUnit = 16384.0f;

// fp8 keys staged in runs (score_mma_key_runs): a tile's records as the cache stores them, 132
// bytes each (channels, then the f32 scale), so that whole runs of a paged block copy in 16-byte
// pieces. A stage of records takes the bytes of a stage of swizzled rows and their scales.
constexpr int kRecordBytes = kFp8RecordBytes;
static_assert(kRecordBytes == MmaKeys<KvFormat::kFp8>::kRowBytes + sizeof(float));

// Two floats as f16x2 (round to nearest even), the first in the low half.
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  uint32_t r;
  memcpy(&r, &v, sizeof(r));
  return r;
}

// x rounded to the MMA input type of F (f16 for fp8 and FP4 keys, bf16 for bf16), back in f32.
template <KvFormat F>
__device__ __forceinline__ float round_input(float x) {
  if constexpr (MmaKeys<F>::kF16) {
    return __half2float(__float2half_rn(x));
  } else {
    return __bfloat162float(__float2bfloat16_rn(x));
  }
}

template <KvFormat F>
__device__ __forceinline__ uint32_t pack_input(float lo, float hi) {
  if constexpr (MmaKeys<F>::kF16) {
    return pack_f16(lo, hi);
  } else {
    return pack_bf16(lo, hi);
  }
}

// The power of two that puts amax in [2^14, 2^15), so that f16 keeps q's head at full
// precision without overflow; 1 for a zero or non-finite amax.
__device__ __forceinline__ float f16_head_scale(float amax) {
  if (!(amax > 0.0f) || !isfinite(amax)) return 1.0f;
  int e = 0;
  frexpf(amax, &e);  // amax in [2^(e-1), 2^e)
  return ldexpf(1.0f, min(15 - e, 126));
}

// q's A fragments of this lane, split into hi and lo parts: row g of the m16 tile in registers
// 0 and 2 (k = 2c + e and 2c + 8 + e), row g + 8 in registers 1 and 3.
struct QueryFragments {
  uint32_t hi[kSteps][4];
  uint32_t lo[kSteps][4];
};

// Fills fragment row `row8` (0: row g, 1: row g + 8) from the head's q (kMmaDim floats) and
// returns the power of two the head was scaled by (1 for bf16 keys).
template <KvFormat F>
__device__ __forceinline__ float load_query_row(const float* __restrict__ q_head, int lane_c,
                                                int row8, QueryFragments& f) {
  constexpr int kElem = MmaKeys<F>::kElemBytes;
  float scale = 1.0f;
  if constexpr (MmaKeys<F>::kF16) {
    float amax = 0.0f;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float2 v =
            *reinterpret_cast<const float2*>(q_head + im::mma_channel(s, lane_c, r, 0, kElem));
        amax = fmaxf(amax, fmaxf(fabsf(v.x), fabsf(v.y)));
      }
    }
    // The quad's 4 lanes hold the whole head.
    amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, 2));
    scale = f16_head_scale(amax);
  }
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float2 v =
          *reinterpret_cast<const float2*>(q_head + im::mma_channel(s, lane_c, r, 0, kElem));
      const float x0 = v.x * scale, x1 = v.y * scale;
      const float h0 = round_input<F>(x0), h1 = round_input<F>(x1);
      f.hi[s][2 * r + row8] = pack_input<F>(h0, h1);
      f.lo[s][2 * r + row8] = pack_input<F>(x0 - h0, x1 - h1);  // x - hi is exact in f32
    }
  }
  return scale;
}

// Copies tile keys j0 .. j0 + kMmaKeys - 1 of sequence b (those visible and mapped) into one
// stage: channels into `keys` (chunks swizzled, indexer_mma_layout.h; FP4 records as they are),
// fp8 row scales into `scales`, and mapped[n] = whether key n was copied. Warp w copies its keys m
// = 0, 1, ... (key n = w k + (m / k) warps k + m % k, k keys per pass: one for fp8, two for bf16
// and FP4); lane m looks up key m's row first, so that the block-table reads are in flight together
// (the copies, asm with a memory clobber, would otherwise serialize them).
template <KvFormat F>
__device__ __forceinline__ void issue_key_tile(const ScoreArgs& a, const DeviceLayout& l, int b,
                                               int64_t j0, int64_t visible, uint8_t* keys,
                                               float* scales, int* mapped) {
  using K = MmaKeys<F>;
  constexpr int kKeysPerPass = 32 / K::kLanesPerKey;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  const int warp_keys = kMmaKeys / warps;  // <= 32: at least two warps
  auto key_of = [&](int m) {
    return warp * kKeysPerPass + (m / kKeysPerPass) * warps * kKeysPerPass + m % kKeysPerPass;
  };
  int64_t my_row = -1;
  if (lane < warp_keys) {
    const int n = key_of(lane);
    const int64_t j = j0 + n;
    my_row = j < visible ? entry_row(l, b, j, a.epb, a.cache_rows) : -1;
    mapped[n] = my_row >= 0;
  }
  const int u = lane % K::kLanesPerKey;
  for (int m0 = 0; m0 < warp_keys; m0 += kKeysPerPass) {
    const int m = m0 + lane / K::kLanesPerKey;
    const int64_t row = __shfl_sync(kFullMask, my_row, m);
    if (row < 0) continue;
    const int n = key_of(m);
    const uint8_t* src = a.cache + row * a.key.row_bytes;
    uint8_t* dst = keys + n * K::kRowBytes;
    if constexpr (F == KvFormat::kFp8) {
      cp_async_4(dst + im::kChunkBytes * im::smem_chunk(n, u / 4) + 4 * (u % 4), src + 4 * u);
      if (u == 0) cp_async_4(scales + n, src + kMmaDim);  // the record's f32 scale
    } else if constexpr (K::kFp4) {
      cp_async_4(dst + 4 * u, src + 4 * u);
      if (u == 0) cp_async_4(dst + kFp4CodeBytes, src + kFp4CodeBytes);  // the 4 scale bytes
    } else {
      cp_async_16(dst + im::kChunkBytes * im::smem_chunk(n, u), src + im::kChunkBytes * u);
    }
  }
}

// acc[nt] += q . k over the warp's n-tiles of fp8 records staged by issue_fp8_record_runs: lane c
// reads words u of chunks c, 4 + c, ... of its key's channels (the channel order of the swizzled
// rows, indexer_mma_layout.h) with 4-byte loads, the records being only 4-byte aligned.
template <int kQParts>
__device__ __forceinline__ void score_record_tile(const uint8_t* records, int key0, int lane_g,
                                                  int lane_c, const QueryFragments& q,
                                                  float (&acc)[kWarpTiles][4]) {
  constexpr int kLaneChunks = kMmaDim / im::kChunkBytes / im::kQuad;
#pragma unroll
  for (int nt = 0; nt < kWarpTiles; ++nt) {
    const int n = key0 + 8 * nt + lane_g;
    const uint32_t* rec = reinterpret_cast<const uint32_t*>(records + n * kRecordBytes);
#pragma unroll
    for (int i = 0; i < kLaneChunks; ++i) {
      const int chunk = im::kQuad * i + lane_c;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const uint32_t w = rec[chunk * (im::kChunkBytes / 4) + u];
        // Word u: step 4i + u; its low two codes are register 0, its high two register 1.
        const __half2_raw b0 =
            __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3);
        const __half2_raw b1 =
            __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
        uint32_t r0, r1;
        memcpy(&r0, &b0, sizeof(r0));
        memcpy(&r1, &b1, sizeof(r1));
        mma_f16(acc[nt], q.hi[4 * i + u], r0, r1);
        if constexpr (kQParts == 2) mma_f16(acc[nt], q.lo[4 * i + u], r0, r1);
      }
    }
  }
}

// acc[nt] += q . k over the warp's n-tiles of one staged tile (keys `key0` + 8 nt + g), from
// q's hi part, and its lo part when kQParts is 2.
template <KvFormat F, int kQParts>
__device__ __forceinline__ void score_key_tile(const uint8_t* keys, int key0, int lane_g,
                                               int lane_c, const QueryFragments& q,
                                               float (&acc)[kWarpTiles][4]) {
  using K = MmaKeys<F>;
  constexpr int kLaneChunks = K::kRowBytes / im::kChunkBytes / im::kQuad;
#pragma unroll
  for (int nt = 0; nt < kWarpTiles; ++nt) {
    const int n = key0 + 8 * nt + lane_g;
    const uint8_t* row = keys + n * K::kRowBytes;
#pragma unroll
    for (int i = 0; i < kLaneChunks; ++i) {
      const uint4 v = *reinterpret_cast<const uint4*>(
          row + im::kChunkBytes * im::smem_chunk(n, im::kQuad * i + lane_c));
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      if constexpr (F == KvFormat::kFp8) {
        // Word u: step 4i + u; its low two codes are register 0, its high two register 1.
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const __half2_raw b0 = __nv_cvt_fp8x2_to_halfraw2(
              static_cast<__nv_fp8x2_storage_t>(w[u] & 0xffffu), __NV_E4M3);
          const __half2_raw b1 =
              __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w[u] >> 16), __NV_E4M3);
          uint32_t r0, r1;
          memcpy(&r0, &b0, sizeof(r0));
          memcpy(&r1, &b1, sizeof(r1));
          mma_f16(acc[nt], q.hi[4 * i + u], r0, r1);
          if constexpr (kQParts == 2) mma_f16(acc[nt], q.lo[4 * i + u], r0, r1);
        }
      } else {
        // Words 2u, 2u + 1: registers 0, 1 of step 2i + u.
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          mma_bf16(acc[nt], q.hi[2 * i + u], w[2 * u], w[2 * u + 1]);
          if constexpr (kQParts == 2) mma_bf16(acc[nt], q.lo[2 * i + u], w[2 * u], w[2 * u + 1]);
        }
      }
    }
  }
}

// acc[nt] += q . k over the warp's n-tiles of one stage of FP4 records (keys key0 + 8 nt + g),
// times 2^-14 (fp4_pair_f16). Scale group i is mma steps 2i and 2i + 1, from word
// kQuad i + c of the key's codes (lane c's chunk in the bf16 channel order: steps 2i + h take
// its bytes 2h and 2h + 1); its product goes to a partial that takes the group's scale of each of
// the lane's two C columns (keys 2c and 2c + 1 of the n-tile) before it joins acc.
template <int kQParts>
__device__ __forceinline__ void score_fp4_tile(const uint8_t* keys, int key0, int lane_g,
                                               int lane_c, const QueryFragments& q,
                                               float (&acc)[kWarpTiles][4]) {
  constexpr int kRow = score_mma_key_bytes(KvFormat::kV41Fp4Index);
#pragma unroll
  for (int nt = 0; nt < kWarpTiles; ++nt) {
    const uint8_t* row = keys + (key0 + 8 * nt + lane_g) * kRow;  // B: key g of the n-tile
    const uint8_t* col = keys + (key0 + 8 * nt + 2 * lane_c) * kRow + kFp4CodeBytes;
    const uint32_t scales0 = *reinterpret_cast<const uint32_t*>(col);  // C column 2c's scales
    const uint32_t scales1 = *reinterpret_cast<const uint32_t*>(col + kRow);
#pragma unroll
    for (int i = 0; i < kFp4Groups; ++i) {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(row + 4 * (im::kQuad * i + lane_c));
      float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t b0 = fp4_pair_f16((w >> (16 * h)) & 0xffu);
        const uint32_t b1 = fp4_pair_f16((w >> (16 * h + 8)) & 0xffu);
        mma_f16(part, q.hi[2 * i + h], b0, b1);
        if constexpr (kQParts == 2) mma_f16(part, q.lo[2 * i + h], b0, b1);
      }
      const float sc0 = e8m0_to_float(static_cast<uint8_t>(scales0 >> (8 * i)));
      const float sc1 = e8m0_to_float(static_cast<uint8_t>(scales1 >> (8 * i)));
      acc[nt][0] = fmaf(part[0], sc0, acc[nt][0]);
      acc[nt][1] = fmaf(part[1], sc1, acc[nt][1]);
      acc[nt][2] = fmaf(part[2], sc0, acc[nt][2]);
      acc[nt][3] = fmaf(part[3], sc1, acc[nt][3]);
    }
  }
}

// kQParts 2 is the op's kernel; 1 (q rounded once to the MMA input: 8 significant bits for bf16
// keys, 11 for fp8 and FP4) only measures what the second MMA costs (IndexerScoreKernel).
// kRuns: fp8 records staged in runs (issue_fp8_record_runs), else key by key (issue_key_tile).
template <KvFormat F, int kQParts, bool kRuns>
__global__ void __launch_bounds__(kMmaMaxHeads / kMmaHeadsPerWarp * kMmaKeyGroups * 32, 2)
    indexer_score_mma_kernel(ScoreArgs a, DeviceLayout l) {
  static_assert(!kRuns || F == KvFormat::kFp8, "runs of records are fp8 index keys");
  using K = MmaKeys<F>;
  extern __shared__ float4 smem4[];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int lane_g = lane >> 2;
  const int lane_c = lane & 3;
  const int head_groups = a.heads / kMmaHeadsPerWarp;
  const int head_group = warp % head_groups;
  const int key_group = warp / head_groups;
  const int t = a.token0 + static_cast<int>(blockIdx.x);
  const int b = seq_of_row(l, t);
  const int64_t visible = visible_entries(l.positions[t], a.ratio, a.bound);
  const int64_t tiles = (visible + kMmaKeys - 1) / kMmaKeys;
  if (static_cast<int64_t>(blockIdx.y) >= tiles) return;  // uniform over the block
  const int64_t my_tiles = (tiles - 1 - blockIdx.y) / gridDim.y + 1;

  uint8_t* keys = reinterpret_cast<uint8_t*>(smem4);  // [stages][keys][row bytes]
  float* scales = reinterpret_cast<float*>(keys + kMmaStages * kMmaKeys * K::kRowBytes);
  int* mapped = reinterpret_cast<int*>(scales + kMmaStages * kMmaKeys);   // [stages][keys]
  float* red = reinterpret_cast<float*>(mapped + kMmaStages * kMmaKeys);  // [head groups][keys]
  auto tile_first = [&](int64_t i) {
    return (static_cast<int64_t>(blockIdx.y) + i * gridDim.y) * kMmaKeys;
  };
  // With kRuns, stage st's records take bytes [st, st + 1) * kMmaKeys * kRecordBytes of the
  // rows and scales (their kMmaStages stages, laid out together, have exactly those bytes).
  auto issue = [&](int64_t i) {
    const int st = static_cast<int>(i % kMmaStages);
    if constexpr (kRuns) {
      issue_fp8_record_runs(a, l, b, tile_first(i), visible, keys + st * kMmaKeys * kRecordBytes,
                            mapped + st * kMmaKeys);
    } else {
      issue_key_tile<F>(a, l, b, tile_first(i), visible, keys + st * kMmaKeys * K::kRowBytes,
                        scales + st * kMmaKeys, mapped + st * kMmaKeys);
    }
  };
#pragma unroll
  for (int i = 0; i < kMmaStages - 1; ++i) {
    if (i < my_tiles) issue(i);
    cp_async_commit();
  }

  // q's fragments while the first tiles are in flight: rows g and g + 8 of the head group.
  const int h = head_group * kMmaHeadsPerWarp + lane_g;
  const float* q_t = a.q + static_cast<int64_t>(t) * a.heads * kMmaDim;
  QueryFragments qf;
  const float scale_g = load_query_row<F>(q_t + static_cast<int64_t>(h) * kMmaDim, lane_c, 0, qf);
  const float scale_g8 =
      load_query_row<F>(q_t + static_cast<int64_t>(h + 8) * kMmaDim, lane_c, 1, qf);
  const float* w_t = a.weights + static_cast<int64_t>(t) * a.heads;
  // The head's weight with both scales, divided by its q scale (a power of two: exact); FP4
  // keys' products also get back their 2^14 (kFp4KeyUnit).
  const float unit = K::kFp4 ? kFp4KeyUnit : 1.0f;
  const float wq_g = w_t[h] * a.weight_scale * a.score_scale * unit / scale_g;
  const float wq_g8 = w_t[h + 8] * a.weight_scale * a.score_scale * unit / scale_g8;
  float* out = a.scores + static_cast<int64_t>(blockIdx.x) * a.row;

  for (int64_t i = 0; i < my_tiles; ++i) {
    cp_async_wait<kMmaStages - 2>();
    __syncthreads();  // tile i is in shared memory; the stage of tile i - 1 is free again
    if (i + kMmaStages - 1 < my_tiles) issue(i + kMmaStages - 1);
    cp_async_commit();
    const int st = static_cast<int>(i % kMmaStages);
    float acc[kWarpTiles][4];
#pragma unroll
    for (int nt = 0; nt < kWarpTiles; ++nt) {
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[nt][r] = 0.0f;
    }
    const int key0 = key_group * kWarpKeys;
    const uint8_t* records = keys + st * kMmaKeys * kRecordBytes;  // kRuns only
    if constexpr (kRuns) {
      score_record_tile<kQParts>(records, key0, lane_g, lane_c, qf, acc);
    } else if constexpr (K::kFp4) {
      score_fp4_tile<kQParts>(keys + st * kMmaKeys * K::kRowBytes, key0, lane_g, lane_c, qf, acc);
    } else {
      score_key_tile<F, kQParts>(keys + st * kMmaKeys * K::kRowBytes, key0, lane_g, lane_c, qf,
                                 acc);
    }
    // Epilogue: C holds heads g, g + 8 (registers 0, 1 / 2, 3) of keys 2c, 2c + 1 of each
    // n-tile. ReLU (after the key's scale: fp8's here, FP4's already in acc), the weights, then
    // the sum over the warp's heads.
#pragma unroll
    for (int nt = 0; nt < kWarpTiles; ++nt) {
      const int n = key0 + 8 * nt + 2 * lane_c;
      float2 ks = make_float2(1.0f, 1.0f);
      if constexpr (kRuns) {
        ks.x = *reinterpret_cast<const float*>(records + n * kRecordBytes + kMmaDim);
        ks.y = *reinterpret_cast<const float*>(records + (n + 1) * kRecordBytes + kMmaDim);
      } else if constexpr (F == KvFormat::kFp8) {
        ks = *reinterpret_cast<const float2*>(scales + st * kMmaKeys + n);
      }
      float p0 = wq_g * fmaxf(acc[nt][0] * ks.x, 0.0f) + wq_g8 * fmaxf(acc[nt][2] * ks.x, 0.0f);
      float p1 = wq_g * fmaxf(acc[nt][1] * ks.y, 0.0f) + wq_g8 * fmaxf(acc[nt][3] * ks.y, 0.0f);
#pragma unroll
      for (int m = 4; m < 32; m <<= 1) {
        p0 += __shfl_xor_sync(kFullMask, p0, m);
        p1 += __shfl_xor_sync(kFullMask, p1, m);
      }
      if (lane_g == 0) {
        *reinterpret_cast<float2*>(red + head_group * kMmaKeys + n) = make_float2(p0, p1);
      }
    }
    __syncthreads();  // every head group's partial scores of the tile
    if (tid < kMmaKeys) {
      const int64_t j = tile_first(i) + tid;
      float s = 0.0f;
      for (int g = 0; g < head_groups; ++g) s += red[g * kMmaKeys + tid];
      if (!mapped[st * kMmaKeys + tid] || isnan(s)) s = -INFINITY;  // unmapped / NaN: last
      if (s == 0.0f) s = 0.0f;  // -0 ties with +0, as in a float compare
      if (j < visible) out[j] = s;
    }
    // The next tile's first barrier orders these reads of red and mapped before their rewrite.
  }
}

}  // namespace

void launch_indexer_score_mma(const ScoreArgs& a, const DeviceLayout& l, int64_t n, int64_t splits,
                              size_t smem, bool q_one_part, bool key_runs,
                              KernelSmemLimits& smem_limits, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(splits));
  const int threads = score_mma_threads(a.heads);
  auto launch = [&](auto kernel) {
    smem_limits.allow(kernel, smem);
    kernel<<<grid, threads, smem, stream>>>(a, l);
  };
  switch (a.key.format) {
    case KvFormat::kBf16:
      if (q_one_part) {
        launch(indexer_score_mma_kernel<KvFormat::kBf16, 1, false>);
      } else {
        launch(indexer_score_mma_kernel<KvFormat::kBf16, 2, false>);
      }
      break;
    case KvFormat::kFp8:
      if (key_runs) {
        if (q_one_part) {
          launch(indexer_score_mma_kernel<KvFormat::kFp8, 1, true>);
        } else {
          launch(indexer_score_mma_kernel<KvFormat::kFp8, 2, true>);
        }
      } else if (q_one_part) {
        launch(indexer_score_mma_kernel<KvFormat::kFp8, 1, false>);
      } else {
        launch(indexer_score_mma_kernel<KvFormat::kFp8, 2, false>);
      }
      break;
    case KvFormat::kV41Fp4Index:
      if (q_one_part) {
        launch(indexer_score_mma_kernel<KvFormat::kV41Fp4Index, 1, false>);
      } else {
        launch(indexer_score_mma_kernel<KvFormat::kV41Fp4Index, 2, false>);
      }
      break;
    case KvFormat::kF32:
    case KvFormat::kV41Fp8:
    case KvFormat::kV41Fp4Main:
      throw Error(ErrorCode::kUnsupported,
                  "indexer_topk: the tensor-core scores take bf16, fp8 or FP4 index keys");
  }
  DEEPINFER_CUDA_LAUNCH_CHECK("indexer_topk");
}

}  // namespace deepinfer::cuda
