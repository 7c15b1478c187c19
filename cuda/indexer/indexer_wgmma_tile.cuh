// The steps of the wgmma scores over V4 fp8 index keys that both wgmma kernels share
// (indexer_score_wgmma.cu, indexer_score_wgmma_pipelined.cu), written once so that their scores
// are bit-identical: q's B tile (f16 hi + lo after the head's power-of-two scale), the A
// fragments of a tile's keys (e4m3 -> f16 in registers), the m64n128k16 MMA and the epilogue
// (key scale, ReLU, weights, sum over heads, the -inf / +0 rules). indexer_score_wgmma.cu's
// header says why and how (layouts, precision). sm_90a only: elsewhere the MMA traps.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>

#include "cuda/common/layout.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/common/wgmma_f16.cuh"
#include "cuda/indexer/indexer_fp8_records.cuh"
#include "cuda/indexer/indexer_launch.h"
#include "cuda/indexer/indexer_mma_layout.h"

namespace deepinfer::cuda::indexer_wgmma {

namespace im = indexer_mma;

constexpr int kSteps = kMmaDim / 16;    // k-steps of 16 channels
constexpr int kCols = 2 * kWgmmaHeads;  // B columns: hi parts, then lo parts
constexpr int kCoreBytes = im::kWgmmaCoreBytes;
constexpr int kKChunks = im::kWgmmaKChunks;
static_assert(kKChunks * 8 == kMmaDim);
static_assert(kWgmmaThreads == 128 && kMmaKeys == 64, "one warpgroup, one m64 tile of keys");
static_assert(kWgmmaQBytes == kCols * kMmaDim * 2);
// kLoE4m3's tiles: the hi parts (f16) in columns 0 .. 63 of the q tile, the lo parts (e4m3)
// after them.
constexpr int kLoTileOffset = kWgmmaHeads * kMmaDim * 2;
static_assert(kLoTileOffset + kWgmmaHeads * kMmaDim <= kWgmmaQBytes);
constexpr float kLoE4m3Unit = 32.0f;

// d (64 x 64 f32) = a (64 x 32 e4m3, registers) b (32 x 64 e4m3, shared) + d when accumulate.
__device__ __forceinline__ void wgmma_m64n64k32_e4m3(float* d, const uint32_t (&a)[4], uint64_t b,
                                                     bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, "
      "1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)));
#else
  (void)d;
  (void)a;
  (void)b;
  (void)accumulate;
  __trap();
#endif
}

// An f16x2 register of two e4m3 codes (the low code in the low half): exact.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t codes) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes & 0xffffu), __NV_E4M3);
  uint32_t r;
  memcpy(&r, &h, sizeof(r));
  return r;
}

// The power of two that puts amax in [2^14, 2^15) (f16 keeps the head at full precision without
// overflow); 1 for a zero or non-finite amax. As indexer_score_mma.cu's.
__device__ __forceinline__ float f16_head_scale(float amax) {
  if (!(amax > 0.0f) || !isfinite(amax)) return 1.0f;
  int e = 0;
  frexpf(amax, &e);  // amax in [2^(e-1), 2^e)
  return ldexpf(1.0f, min(15 - e, 126));
}

// q's B tile of token t and its head weights (with both scales, over the head's q scale), by the
// 128 threads tid = 0 .. 127: thread pair (2h, 2h + 1) takes head h, each 64 of its channels.
// kLoE4m3: the lo parts in e4m3 times kLoE4m3Unit after the hi tile (indexer_score_wgmma.cu).
template <bool kLoE4m3>
__device__ __forceinline__ void stage_q_tile(const ScoreArgs& a, int t, int tid, uint8_t* q_tile,
                                             float* head_weights) {
  const int h = tid >> 1;
  const int ch0 = (tid & 1) * (kMmaDim / 2);
  const float* q_h = a.q + (static_cast<int64_t>(t) * kWgmmaHeads + h) * kMmaDim + ch0;
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kMmaDim / 2; i += 4) {
    const float4 v = *reinterpret_cast<const float4*>(q_h + i);
    amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  }
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  const float scale = f16_head_scale(amax);
#pragma unroll 4
  for (int i = 0; i < kMmaDim / 2; i += 2) {
    const float2 v = *reinterpret_cast<const float2*>(q_h + i);
    const float x0 = v.x * scale, x1 = v.y * scale;
    const __half2 hi = __floats2half2_rn(x0, x1);
    const float2 hf = __half22float2(hi);
    const __half2 lo = __floats2half2_rn(x0 - hf.x, x1 - hf.y);  // x - hi is exact in f32
    const int k = im::wgmma_k_of_channel(ch0 + i);  // even: k + 1 plays channel ch0 + i + 1
    *reinterpret_cast<__half2*>(q_tile + im::wgmma_q_offset(k, h)) = hi;
    if constexpr (kLoE4m3) {
      const __nv_fp8x2_storage_t lo8 = __nv_cvt_float2_to_fp8x2(
          make_float2((x0 - hf.x) * kLoE4m3Unit, (x1 - hf.y) * kLoE4m3Unit), __NV_SATFINITE,
          __NV_E4M3);
      const int k8 = im::wgmma_k8_of_channel(ch0 + i);  // even, as k
      *reinterpret_cast<__nv_fp8x2_storage_t*>(q_tile + kLoTileOffset +
                                               im::wgmma_q8_offset(k8, h)) = lo8;
    } else {
      *reinterpret_cast<__half2*>(q_tile + im::wgmma_q_offset(k, kWgmmaHeads + h)) = lo;
    }
  }
  // The head's weight with both scales, over its q scale (a power of two: exact).
  if (ch0 == 0) {
    head_weights[h] = a.weights[static_cast<int64_t>(t) * kWgmmaHeads + h] * a.weight_scale *
                      a.score_scale / scale;
  }
}

// The weights of thread (g, c)'s accumulator columns (heads 8j + 2c + e).
__device__ __forceinline__ void load_column_weights(const float* head_weights, int lane_c,
                                                    float (&wq)[kWgmmaHeads / 8][2]) {
#pragma unroll
  for (int j = 0; j < kWgmmaHeads / 8; ++j) {
    const float2 v = *reinterpret_cast<const float2*>(head_weights + 8 * j + 2 * lane_c);
    wq[j][0] = v.x;
    wq[j][1] = v.y;
  }
}

// Thread (g, c)'s A fragments of a staged tile of fp8 records: its keys key0 (= 16 warp + g) and
// key0 + 8, registers 0 / 1 rows key0 / key0 + 8 at k 2c, 2c + 1; 2 / 3 at k 2c + 8, 2c + 9.
// `words`: the codes as loaded (the lo-e4m3 variant's A registers); ks0 / ks1 the keys' scales.
struct KeyFragments {
  uint32_t frag[kSteps][4];
  uint32_t words[kSteps][2];
  float ks0, ks1;
};

__device__ __forceinline__ void load_key_fragments(const uint8_t* tile, int key0, int lane_c,
                                                   KeyFragments& f) {
  const uint32_t* k0 = reinterpret_cast<const uint32_t*>(tile + key0 * kFp8RecordBytes);
  const uint32_t* k1 = reinterpret_cast<const uint32_t*>(tile + (key0 + 8) * kFp8RecordBytes);
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const uint32_t w0 = k0[8 * lane_c + s];
    const uint32_t w1 = k1[8 * lane_c + s];
    f.words[s][0] = w0;
    f.words[s][1] = w1;
    f.frag[s][0] = e4m3x2_to_f16x2(w0);
    f.frag[s][1] = e4m3x2_to_f16x2(w1);
    f.frag[s][2] = e4m3x2_to_f16x2(w0 >> 16);
    f.frag[s][3] = e4m3x2_to_f16x2(w1 >> 16);
  }
  f.ks0 = reinterpret_cast<const float*>(k0)[kMmaDim / 4];
  f.ks1 = reinterpret_cast<const float*>(k1)[kMmaDim / 4];
}

// acc = the tile's dot products with q's hi and lo columns, in k-steps s = 0 .. kSteps - 1 (B's
// k rows 16s .. 16s + 15 are core matrices 2s, 2s + 1 along k); issued, not waited for.
// kHiOnly: with the hi columns only, acc[0, 32) (acc[32, 64), the lo parts, left as they are):
// where q's lo parts are zero (ScoreArgs::q_fp8) the same sums at half the MMA work.
template <bool kHiOnly = false>
__device__ __forceinline__ void issue_key_tile_mma(float (&acc)[64], const KeyFragments& f,
                                                   uint64_t q_desc) {
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    if constexpr (kHiOnly) {
      wgmma_m64n64k16_f16(acc, f.frag[s], q_desc + ((2 * s * kCoreBytes) >> 4), s > 0);
    } else {
      wgmma_m64n128k16_f16(acc, f.frag[s], q_desc + ((2 * s * kCoreBytes) >> 4), s > 0);
    }
  }
}

// Epilogue: acc[4j + x] is column 8j + 2c + (x & 1) of key key0 (x < 2) or key0 + 8; columns
// 8j + .. (j < 8) are the hi parts of heads 8j + 2c + e, 8(j + 8) + .. their lo parts (with
// kLoE4m3: acc[32 + ..] of the 64 columns of lo parts, times kLoE4m3Unit). Returns the scores of
// key0 (p0) and key0 + 8 (p1), summed over the quad's heads.
template <bool kLoE4m3>
__device__ __forceinline__ float2 key_scores(const float (&acc)[64],
                                             const float (&wq)[kWgmmaHeads / 8][2], float ks0,
                                             float ks1) {
  constexpr float kLoWeight = kLoE4m3 ? 1.0f / kLoE4m3Unit : 1.0f;
  float p0 = 0.0f, p1 = 0.0f;
#pragma unroll
  for (int j = 0; j < kWgmmaHeads / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float d0 = acc[4 * j + e] + acc[4 * (j + 8) + e] * kLoWeight;
      const float d1 = acc[4 * j + 2 + e] + acc[4 * (j + 8) + 2 + e] * kLoWeight;
      p0 += wq[j][e] * fmaxf(d0 * ks0, 0.0f);
      p1 += wq[j][e] * fmaxf(d1 * ks1, 0.0f);
    }
  }
  p0 += __shfl_xor_sync(0xffffffffu, p0, 1);
  p1 += __shfl_xor_sync(0xffffffffu, p1, 1);
  p0 += __shfl_xor_sync(0xffffffffu, p0, 2);
  p1 += __shfl_xor_sync(0xffffffffu, p1, 2);
  return make_float2(p0, p1);
}

// The stored score of a key: -inf when it is unmapped or NaN (it ranks last), +0 for -0 (it
// ties with +0, as in a float compare).
__device__ __forceinline__ float stored_score(float s, bool mapped) {
  if (!mapped || isnan(s)) s = -INFINITY;
  if (s == 0.0f) s = 0.0f;
  return s;
}

}  // namespace deepinfer::cuda::indexer_wgmma
