// The indexer's scores over V4 fp8 index keys on Hopper's warpgroup MMA (wgmma, sm_90a only):
// the scores of indexer_score.cu (same scratch rows, same -inf / +0 rules) for 64 heads of
// kMmaDim channels, each key converted to f16 once for all heads.
//
// Why. On mma.sync (indexer_score_mma.cu) a warp scores 16 heads, so every key is converted from
// e4m3 four times and the tensor pipe runs at mma.sync's rate; both bound the fp8 path on the H200
// (0.13 of copy bandwidth at B = 64, 128K). Here one warpgroup scores a tile of kMmaKeys keys
// against all 64 heads with wgmma.m64n128k16: A (64 keys x 16 channels) from registers, where each
// thread converts the codes of its two keys once (cvt e4m3x2 -> f16x2, exact), and B (16 channels
// x 128 columns: q's hi parts of the 64 heads, then their lo parts) from shared memory, written
// once per block. The f32 accumulators hold both parts of every head of the thread's keys, so the
// epilogue (key scale, ReLU, weights, sum over heads) needs only two shuffles.
//
// Precision: as the fp8 keys of indexer_score_mma.cu. Each head of q is scaled by the power of two
// that puts its max |q| in [2^14, 2^15) and split into f16 hi + lo (22 significant bits); e4m3
// codes are exact in f16; products are exact in the f32 accumulators (Hopper's tensor cores
// truncate their sums a few bits short of IEEE f32); the key's f32 scale, ReLU, the weights (over
// the head's scale) and the sum over heads run in f32.
//
// Layouts. Channels are permuted (a dot product sums them in any order): thread (g, c) of a warp
// (g = lane / 4, c = lane % 4) holds keys 16 w + g and 16 w + g + 8, and for k-step s the 4-byte
// word 8c + s of each key's codes, i.e. stored channels 32c + 4s + {0, 1, 2, 3}: its low two codes
// play k = 2c, 2c + 1 and its high two k = 2c + 8, 2c + 9 (indexer_mma_layout.h). The word index
// 8c + s puts the 32 lanes' loads on distinct banks for records of 33 words. q's B columns take
// the same channels: K-major without swizzle, core matrices of 8 columns x 8 k (128 bytes) laid
// out [column / 8][k / 8] (wgmma_q_offset).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>

#include "cuda/common/launch.cuh"
#include "cuda/common/layout.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/indexer/indexer_fp8_records.cuh"
#include "cuda/indexer/indexer_launch.h"
#include "cuda/indexer/indexer_mma_layout.h"

namespace deepinfer::cuda {

namespace {

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

// d (64 x 128 f32) = a (64 x 16 f16, registers) b (16 x 128 f16, shared, descriptor) + d when
// accumulate, else a b.
__device__ __forceinline__ void wgmma_m64n128k16_f16(float (&d)[64], const uint32_t (&a)[4],
                                                     uint64_t b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)));
#else
  (void)d;
  (void)a;
  (void)b;
  (void)accumulate;
  __trap();
#endif
}

// d (64 x 64 f32) = a (64 x 16 f16, registers) b (16 x 64 f16, shared) + d when accumulate.
__device__ __forceinline__ void wgmma_m64n64k16_f16(float* d, const uint32_t (&a)[4], uint64_t b,
                                                    bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, "
      "1, 1, 0;\n}\n"
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

// Block (token of the group, split): the split walks tiles first = split, + splits, ... of
// kMmaKeys keys, kWgmmaStages deep in cp.async (records staged whole: indexer_fp8_records.cuh;
// kRuns picks the copy). Shared memory (score_wgmma_smem_bytes): q's B tile, the head weights,
// then per stage the records and mapped flags.
// kLoE4m3 (measurement, IndexerScoreKernel::kTensorCoreWgmmaLoE4m3): q's lo parts times
// kLoE4m3Unit in e4m3 (|lo| <= 8 after the head scale: at most 256 of e4m3's 448), multiplied
// with the codes as they are on wgmma.m64n64k32 (twice the f16 rate, no conversion), the hi parts
// on m64n64k16: 15 significant bits of q instead of 22.
template <bool kRuns, bool kLoE4m3>
__global__ void __launch_bounds__(kWgmmaThreads, kWgmmaBlocksPerSm)
    indexer_score_wgmma_kernel(ScoreArgs a, DeviceLayout l) {
  extern __shared__ float4 smem4[];
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int lane_g = lane >> 2;
  const int lane_c = lane & 3;
  const int t = a.token0 + static_cast<int>(blockIdx.x);
  const int b = seq_of_row(l, t);
  const int64_t visible = visible_entries(l.positions[t], a.ratio, a.bound);
  const int64_t tiles = (visible + kMmaKeys - 1) / kMmaKeys;
  if (static_cast<int64_t>(blockIdx.y) >= tiles) return;  // uniform over the block
  const int64_t my_tiles = (tiles - 1 - blockIdx.y) / gridDim.y + 1;

  uint8_t* q_tile = reinterpret_cast<uint8_t*>(smem4);
  float* head_weights = reinterpret_cast<float*>(q_tile + kWgmmaQBytes);   // [kWgmmaHeads]
  uint8_t* records = q_tile + kWgmmaQBytes + kWgmmaHeads * sizeof(float);  // [stages][keys][132]
  int* mapped = reinterpret_cast<int*>(records + kWgmmaStages * kMmaKeys * kFp8RecordBytes);
  auto tile_first = [&](int64_t i) {
    return (static_cast<int64_t>(blockIdx.y) + i * gridDim.y) * kMmaKeys;
  };
  auto issue = [&](int64_t i) {
    const int st = static_cast<int>(i % kWgmmaStages);
    uint8_t* dst = records + st * kMmaKeys * kFp8RecordBytes;
    if constexpr (kRuns) {
      issue_fp8_record_runs(a, l, b, tile_first(i), visible, dst, mapped + st * kMmaKeys);
    } else {
      issue_fp8_record_keys(a, l, b, tile_first(i), visible, dst, mapped + st * kMmaKeys);
    }
  };
#pragma unroll
  for (int i = 0; i < kWgmmaStages - 1; ++i) {
    if (i < my_tiles) issue(i);
    cp_async_commit();
  }

  // q's B tile while the first tiles are in flight: thread pair (2h, 2h + 1) takes head h, each
  // 64 of its channels.
  {
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
  fence_async_shared();
  __syncthreads();  // q's tile and head weights written
  // The weights of this thread's accumulator columns (heads 8j + 2c + e).
  float wq[kWgmmaHeads / 8][2];
#pragma unroll
  for (int j = 0; j < kWgmmaHeads / 8; ++j) {
    const float2 v = *reinterpret_cast<const float2*>(head_weights + 8 * j + 2 * lane_c);
    wq[j][0] = v.x;
    wq[j][1] = v.y;
  }
  const uint64_t q_desc = wgmma_desc(q_tile, kCoreBytes, kKChunks * kCoreBytes);
  const uint64_t lo_desc =
      wgmma_desc(q_tile + kLoTileOffset, kCoreBytes, kKChunks / 2 * kCoreBytes);  // kLoE4m3
  float* out = a.scores + static_cast<int64_t>(blockIdx.x) * a.row;
  const int key0 = 16 * warp + lane_g;  // this thread's keys: key0 and key0 + 8
  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;

  for (int64_t i = 0; i < my_tiles; ++i) {
    cp_async_wait<kWgmmaStages - 2>();
    __syncthreads();  // tile i (and at i = 0 the q tile) in shared memory; tile i - 1's stage free
    if (i + kWgmmaStages - 1 < my_tiles) issue(i + kWgmmaStages - 1);
    cp_async_commit();
    const int st = static_cast<int>(i % kWgmmaStages);
    const uint8_t* tile = records + st * kMmaKeys * kFp8RecordBytes;
    const uint32_t* k0 = reinterpret_cast<const uint32_t*>(tile + key0 * kFp8RecordBytes);
    const uint32_t* k1 = reinterpret_cast<const uint32_t*>(tile + (key0 + 8) * kFp8RecordBytes);
    // A fragments: registers 0 / 1 rows key0 / key0 + 8 at k 2c, 2c + 1; 2 / 3 at k 2c + 8, 2c + 9.
    uint32_t frag[kSteps][4];
    uint32_t words[kSteps][2];  // the codes as loaded: kLoE4m3's A registers
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const uint32_t w0 = k0[8 * lane_c + s];
      const uint32_t w1 = k1[8 * lane_c + s];
      words[s][0] = w0;
      words[s][1] = w1;
      frag[s][0] = e4m3x2_to_f16x2(w0);
      frag[s][1] = e4m3x2_to_f16x2(w1);
      frag[s][2] = e4m3x2_to_f16x2(w0 >> 16);
      frag[s][3] = e4m3x2_to_f16x2(w1 >> 16);
    }
    const float ks0 = reinterpret_cast<const float*>(k0)[kMmaDim / 4];
    const float ks1 = reinterpret_cast<const float*>(k1)[kMmaDim / 4];
    fence_accumulators(acc);
    wgmma_fence();
    if constexpr (kLoE4m3) {
      // hi parts: acc[0, 32) on f16 steps as below; lo parts: acc[32, 64) on e4m3 steps of 32
      // channels (k rows 32t .. 32t + 31: core matrices 2t, 2t + 1 of the lo tile).
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        wgmma_m64n64k16_f16(acc, frag[s], q_desc + ((2 * s * kCoreBytes) >> 4), s > 0);
      }
#pragma unroll
      for (int t = 0; t < kSteps / 2; ++t) {
        const uint32_t a8[4] = {words[2 * t][0], words[2 * t][1], words[2 * t + 1][0],
                                words[2 * t + 1][1]};
        wgmma_m64n64k32_e4m3(acc + 32, a8, lo_desc + ((2 * t * kCoreBytes) >> 4), t > 0);
      }
    } else {
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        // k-step s: B's k rows 16s .. 16s + 15 are core matrices 2s, 2s + 1 along k.
        wgmma_m64n128k16_f16(acc, frag[s], q_desc + ((2 * s * kCoreBytes) >> 4), s > 0);
      }
    }
    wgmma_commit();
    wgmma_wait_all();
    fence_accumulators(acc);
    // Epilogue: acc[4j + x] is column 8j + 2c + (x & 1) of key key0 (x < 2) or key0 + 8; columns
    // 8j + .. (j < 8) are the hi parts of heads 8j + 2c + e, 8(j + 8) + .. their lo parts (with
    // kLoE4m3: acc[32 + ..] of the 64 columns of lo parts, times kLoE4m3Unit).
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
    if (lane_c < 2) {
      const int n = key0 + 8 * lane_c;
      const int64_t j = tile_first(i) + n;
      float s = lane_c == 0 ? p0 : p1;
      if (!mapped[st * kMmaKeys + n] || isnan(s)) s = -INFINITY;  // unmapped / NaN: last
      if (s == 0.0f) s = 0.0f;  // -0 ties with +0, as in a float compare
      if (j < visible) out[j] = s;
    }
    // The next tile's first barrier orders these reads of the stage before its rewrite.
  }
}

}  // namespace

void launch_indexer_score_wgmma(const ScoreArgs& a, const DeviceLayout& l, int64_t n,
                                int64_t splits, bool key_runs, bool lo_e4m3,
                                KernelSmemLimits& smem_limits, cudaStream_t stream) {
  if (a.heads != kWgmmaHeads || a.dim != kMmaDim || a.key.format != KvFormat::kFp8 ||
      a.key.row_bytes != kFp8RecordBytes) {
    throw Error(ErrorCode::kUnsupported,
                "indexer_topk: the wgmma scores take 64 heads of 128 channels over fp8 index keys");
  }
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(splits));
  const size_t smem = score_wgmma_smem_bytes();
  auto launch = [&](auto kernel) {
    smem_limits.allow(kernel, smem);
    kernel<<<grid, kWgmmaThreads, smem, stream>>>(a, l);
  };
  if (lo_e4m3) {
    if (key_runs) {
      launch(indexer_score_wgmma_kernel<true, true>);
    } else {
      launch(indexer_score_wgmma_kernel<false, true>);
    }
  } else if (key_runs) {
    launch(indexer_score_wgmma_kernel<true, false>);
  } else {
    launch(indexer_score_wgmma_kernel<false, false>);
  }
  DEEPINFER_CUDA_LAUNCH_CHECK("indexer_topk");
}

}  // namespace deepinfer::cuda
