// The indexer's scores over bf16 index keys at 64 heads of kMmaDim channels on Hopper's
// warpgroup MMA (sm_90a only), pipelined as indexer_score_wgmma_pipelined.cu: one block per SM,
// a producer warp that keeps kWgmmaBf16Stages tiles of kMmaKeys keys in flight (one bulk copy of
// 256 bytes per key, gathered through the block table: any paged layout) and
// kWgmmaPipeConsumers warpgroups that score the tiles in turn (tile i: stage
// i % kWgmmaBf16Stages, warpgroup i % kWgmmaPipeConsumers).
//
// Why. bf16 keys are 256 bytes, so their scores are bound by the bytes (64 heads x 128 x 2 parts
// x 2 FLOP per 256 bytes is under the tensor cores' ridge); the mma.sync kernel
// (indexer_score_mma.cu) scores each key four times over (16 heads per warp) from a cp.async ring
// its MMA warps also issue. Here each key is read once from shared memory for all 64 heads.
//
// Precision: as the bf16 keys of indexer_score_mma.cu. q is split into bf16 hi + lo (no head
// scale: bf16 has f32's range), the keys are multiplied as they are, products are exact in the
// f32 accumulators; the weights (with both scales), ReLU and the sum over heads run in f32. The
// sums run in another order than the mma.sync kernel's, so scores agree to rounding (exactly on
// integer-valued inputs).
//
// Layouts. Thread (g, c) of warp w holds keys 16w + g and 16w + g + 8 and loads, for t = 0 .. 3,
// the 16-byte chunk 4t + c of each (indexer_mma_layout.h: wgmma_bf16_k_of_channel); a key's row
// takes kWgmmaBf16RowBytes in shared memory, so that the two keys of an 8-lane load phase fall on
// distinct banks. q's B tile (bf16 hi parts in columns 0 .. 63, lo parts after) as the fp8
// kernel's (wgmma_q_offset).
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/common/launch.cuh"
#include "cuda/common/layout.cuh"
#include "cuda/common/ptx_mbarrier.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/indexer/indexer_launch.h"
#include "cuda/indexer/indexer_mma_layout.h"
#include "cuda/indexer/indexer_wgmma_tile.cuh"

namespace deepinfer::cuda {

namespace {

using namespace indexer_wgmma;  // NOLINT: the shared steps

constexpr int kStages = kWgmmaBf16Stages;
constexpr int kKeyBytes = 2 * kMmaDim;
constexpr int kRowBytes = kWgmmaBf16RowBytes;
constexpr int kStageBytes = kMmaKeys * kRowBytes;
static_assert(kRowBytes % 16 == 0 && kRowBytes % 128 == 64,
              "16-byte aligned rows; keys n and n + 1 half a bank sweep apart");
constexpr int kConsumerThreads = kWgmmaPipeConsumers * kWgmmaThreads;
constexpr int kQReadyBarrier = 1;  // named barrier of the consumer warpgroups
constexpr int kLookahead = 8;      // tiles whose block-table reads a producer lane has in flight

// d (64 x 128 f32) = a (64 x 16 bf16, registers) b (16 x 128 bf16, shared, descriptor) + d when
// accumulate, else a b.
__device__ __forceinline__ void wgmma_m64n128k16_bf16(float (&d)[64], const uint32_t (&a)[4],
                                                      uint64_t b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
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

// The block's shared memory (score_wgmma_bf16_smem_bytes).
struct Bf16Smem {
  uint8_t* q_tile;      // q's B tile: bf16 hi parts, then lo parts
  float* head_weights;  // [kWgmmaHeads]
  uint8_t* rows;        // [kStages][kMmaKeys][kRowBytes]
  uint64_t* masks;      // [kStages]: bit n, key n of the stage's tile was copied
  uint64_t* full;       // [kStages]
  uint64_t* empty;      // [kStages]
};

__device__ __forceinline__ Bf16Smem bf16_smem(uint8_t* base) {
  Bf16Smem s;
  s.q_tile = base;
  s.head_weights = reinterpret_cast<float*>(base + kWgmmaQBytes);
  s.rows = base + kWgmmaQBytes + kWgmmaHeads * sizeof(float);
  s.masks = reinterpret_cast<uint64_t*>(s.rows + kStages * kStageBytes);
  s.full = s.masks + kStages;
  s.empty = s.full + kStages;
  return s;
}

struct BlockTiles {
  int64_t visible;
  int64_t count;
  __device__ int64_t tile_first(int64_t i) const {
    return (static_cast<int64_t>(blockIdx.y) + i * gridDim.y) * kMmaKeys;
  }
};

// q's B tile of token t in bf16 hi + lo parts and the head weights with both scales, by threads
// tid = 0 .. 127 (pair 2h, 2h + 1: head h, 64 channels each). As indexer_score_mma.cu's
// load_query_row for bf16 keys: hi = bf16(q), lo = bf16(q - hi).
__device__ __forceinline__ void stage_q_tile_bf16(const ScoreArgs& a, int t, int tid,
                                                  uint8_t* q_tile, float* head_weights) {
  const int h = tid >> 1;
  const int ch0 = (tid & 1) * (kMmaDim / 2);
  const float* q_h = a.q + (static_cast<int64_t>(t) * kWgmmaHeads + h) * kMmaDim + ch0;
#pragma unroll 4
  for (int i = 0; i < kMmaDim / 2; i += 2) {
    const float2 v = *reinterpret_cast<const float2*>(q_h + i);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(v.x, v.y);
    const float2 hf = __bfloat1622float2(hi);
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x - hf.x, v.y - hf.y);  // exact in f32
    const int k = indexer_mma::wgmma_bf16_k_of_channel(ch0 + i);  // even: k + 1 is ch0 + i + 1
    *reinterpret_cast<__nv_bfloat162*>(q_tile + indexer_mma::wgmma_q_offset(k, h)) = hi;
    *reinterpret_cast<__nv_bfloat162*>(q_tile + indexer_mma::wgmma_q_offset(k, kWgmmaHeads + h)) =
        lo;
  }
  if (ch0 == 0) {
    head_weights[h] =
        a.weights[static_cast<int64_t>(t) * kWgmmaHeads + h] * a.weight_scale * a.score_scale;
  }
}

// The producer warp: lane m copies keys m and m + 32 of each tile, their block-table entries
// read kLookahead tiles ahead (entry_row's rules: -1 past the visible entries, the table's
// columns, for a negative block or a row past the cache).
__device__ __forceinline__ void produce_tiles(const ScoreArgs& a, const DeviceLayout& l, int b,
                                              const BlockTiles& tiles, const Bf16Smem& sm) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  auto table_block = [&](int64_t i, int n) -> int32_t {
    const int64_t j = tiles.tile_first(i) + n;
    if (i >= tiles.count || j >= tiles.visible) return -1;
    const int64_t logical = j / a.epb;
    if (logical >= l.max_blocks) return -1;
    return l.block_table[static_cast<int64_t>(b) * l.max_blocks + logical];
  };
  int32_t ahead[kLookahead][2];
#pragma unroll
  for (int d = 0; d < kLookahead; ++d) {
    ahead[d][0] = table_block(d, lane);
    ahead[d][1] = table_block(d, lane + 32);
  }
  for (int64_t i = 0; i < tiles.count; ++i) {
    const int32_t block0 = ahead[0][0];
    const int32_t block1 = ahead[0][1];
#pragma unroll
    for (int d = 0; d + 1 < kLookahead; ++d) {
      ahead[d][0] = ahead[d + 1][0];
      ahead[d][1] = ahead[d + 1][1];
    }
    ahead[kLookahead - 1][0] = table_block(i + kLookahead, lane);
    ahead[kLookahead - 1][1] = table_block(i + kLookahead, lane + 32);
    const int64_t j0 = tiles.tile_first(i);
    auto row_of = [&](int32_t block, int n) -> int64_t {
      if (block < 0) return -1;
      const int64_t row = static_cast<int64_t>(block) * a.epb + (j0 + n) % a.epb;
      return row < a.cache_rows ? row : -1;
    };
    const int64_t row0 = row_of(block0, lane);
    const int64_t row1 = row_of(block1, lane + 32);
    const int st = static_cast<int>(i % kStages);
    if (i >= kStages) mbarrier_wait(&sm.empty[st], static_cast<uint32_t>((i / kStages - 1) & 1));
    const uint32_t mapped0 = __ballot_sync(0xffffffffu, row0 >= 0);
    const uint32_t mapped1 = __ballot_sync(0xffffffffu, row1 >= 0);
    if (lane == 0) {
      sm.masks[st] = static_cast<uint64_t>(mapped1) << 32 | mapped0;
      const int keys = __popc(mapped0) + __popc(mapped1);
      mbarrier_arrive_expect_tx(&sm.full[st], static_cast<uint32_t>(keys * kKeyBytes));
    }
    __syncwarp();
    uint8_t* stage = sm.rows + st * kStageBytes;
    if (row0 >= 0) {
      bulk_copy_to_shared(stage + lane * kRowBytes, a.cache + row0 * kKeyBytes, kKeyBytes,
                          &sm.full[st]);
    }
    if (row1 >= 0) {
      bulk_copy_to_shared(stage + (lane + 32) * kRowBytes, a.cache + row1 * kKeyBytes, kKeyBytes,
                          &sm.full[st]);
    }
  }
}

// Consumer warpgroup `group` (thread tid of it): tiles group, group + kWgmmaPipeConsumers, ...
__device__ __forceinline__ void consume_tiles(const ScoreArgs& a, const BlockTiles& tiles,
                                              const Bf16Smem& sm, int group, int tid) {
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int lane_g = lane >> 2;
  const int lane_c = lane & 3;
  float wq[kWgmmaHeads / 8][2];
  load_column_weights(sm.head_weights, lane_c, wq);
  const uint64_t q_desc = wgmma_desc(sm.q_tile, kCoreBytes, kKChunks * kCoreBytes);
  float* out = a.scores + static_cast<int64_t>(blockIdx.x) * a.row;
  const int key0 = 16 * warp + lane_g;  // this thread's keys: key0 and key0 + 8
  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;

  for (int64_t i = group; i < tiles.count; i += kWgmmaPipeConsumers) {
    const int st = static_cast<int>(i % kStages);
    mbarrier_wait(&sm.full[st], static_cast<uint32_t>((i / kStages) & 1));
    const uint8_t* stage = sm.rows + st * kStageBytes;
    const uint8_t* r0 = stage + key0 * kRowBytes;
    const uint8_t* r1 = stage + (key0 + 8) * kRowBytes;
    // Word u of chunk 4t + c: k-step 2t + u / 2, registers 0 / 1 (u even) or 2 / 3 (u odd).
    uint32_t frag[kSteps][4];
#pragma unroll
    for (int t = 0; t < kSteps / 2; ++t) {
      const uint4 v0 = *reinterpret_cast<const uint4*>(r0 + 16 * (4 * t + lane_c));
      const uint4 v1 = *reinterpret_cast<const uint4*>(r1 + 16 * (4 * t + lane_c));
      frag[2 * t][0] = v0.x;
      frag[2 * t][2] = v0.y;
      frag[2 * t + 1][0] = v0.z;
      frag[2 * t + 1][2] = v0.w;
      frag[2 * t][1] = v1.x;
      frag[2 * t][3] = v1.y;
      frag[2 * t + 1][1] = v1.z;
      frag[2 * t + 1][3] = v1.w;
    }
    const uint64_t mask = sm.masks[st];
    mbarrier_arrive(&sm.empty[st]);  // the stage's bytes this thread needs are in registers
    fence_accumulators(acc);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      wgmma_m64n128k16_bf16(acc, frag[s], q_desc + ((2 * s * kCoreBytes) >> 4), s > 0);
    }
    wgmma_commit();
    wgmma_wait_all();
    fence_accumulators(acc);
    const float2 p = key_scores<false>(acc, wq, 1.0f, 1.0f);  // bf16 keys have no scale
    if (lane_c < 2) {
      const int n = key0 + 8 * lane_c;
      const int64_t j = tiles.tile_first(i) + n;
      const float s = stored_score(lane_c == 0 ? p.x : p.y, ((mask >> n) & 1u) != 0);
      if (j < tiles.visible) out[j] = s;
    }
  }
}

__global__ void __launch_bounds__(kWgmmaPipeThreads, 1)
    indexer_score_wgmma_bf16_kernel(ScoreArgs a, DeviceLayout l) {
  extern __shared__ float4 smem4[];
  const int tid = static_cast<int>(threadIdx.x);
  const int t = a.token0 + static_cast<int>(blockIdx.x);
  const int b = seq_of_row(l, t);
  BlockTiles tiles;
  tiles.visible = visible_entries(l.positions[t], a.ratio, a.bound);
  const int64_t all_tiles = (tiles.visible + kMmaKeys - 1) / kMmaKeys;
  if (static_cast<int64_t>(blockIdx.y) >= all_tiles) return;  // uniform over the block
  tiles.count = (all_tiles - 1 - blockIdx.y) / gridDim.y + 1;
  const Bf16Smem sm = bf16_smem(reinterpret_cast<uint8_t*>(smem4));
  if (tid == 0) {
    for (int st = 0; st < kStages; ++st) {
      mbarrier_init(&sm.full[st], 1);
      mbarrier_init(&sm.empty[st], kWgmmaThreads);
    }
    mbarrier_init_fence();
  }
  __syncthreads();  // the barriers initialised
  if (tid >= kConsumerThreads) {
    produce_tiles(a, l, b, tiles, sm);
    return;
  }
  if (tid < kWgmmaThreads) stage_q_tile_bf16(a, t, tid, sm.q_tile, sm.head_weights);
  fence_async_shared();
  named_barrier<kConsumerThreads>(kQReadyBarrier);  // q's tile and head weights written
  consume_tiles(a, tiles, sm, tid / kWgmmaThreads, tid % kWgmmaThreads);
}

}  // namespace

void launch_indexer_score_wgmma_bf16(const ScoreArgs& a, const DeviceLayout& l, int64_t n,
                                     int64_t splits, KernelSmemLimits& smem_limits,
                                     cudaStream_t stream) {
  if (a.heads != kWgmmaHeads || a.dim != kMmaDim || a.key.format != KvFormat::kBf16 ||
      a.key.row_bytes != kKeyBytes) {
    throw Error(ErrorCode::kUnsupported,
                "indexer_topk: the wgmma bf16 scores take 64 heads of 128 channels over bf16 "
                "index keys");
  }
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(splits));
  const size_t smem = score_wgmma_bf16_smem_bytes();
  smem_limits.allow(indexer_score_wgmma_bf16_kernel, smem);
  indexer_score_wgmma_bf16_kernel<<<grid, kWgmmaPipeThreads, smem, stream>>>(a, l);
  DEEPINFER_CUDA_LAUNCH_CHECK("indexer_topk");
}

}  // namespace deepinfer::cuda
