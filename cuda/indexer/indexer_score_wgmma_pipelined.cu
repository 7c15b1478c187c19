// The wgmma scores of indexer_score_wgmma.cu over V4 fp8 index keys, bit for bit (the same
// fragments, MMAs and epilogue: indexer_wgmma_tile.cuh), with the loads of the records taken off
// the warps that multiply. With q in fp8 (ScoreArgs::q_fp8: DeepSeek's indexer q,
// quantize_indexer_q) q's lo parts are zero and each tile takes one MMA (the hi columns, n = 64)
// instead of two parts' (n = 128): the same scores.
//
// Why. In indexer_score_wgmma.cu each block is one warpgroup that, per tile, waits for its
// cp.async group, looks up the block table of the tile three ahead (a dependent global load),
// issues that tile's copies, converts, multiplies, waits for its MMAs and runs the epilogue, all
// in turn; the overlap comes only from the other two blocks of the SM. Here a block fills an SM:
// one producer warp looks up the block table a batch of runs ahead (the lookups of the next batch
// in flight while it issues the current one) and keeps up to kWgmmaPipeStages tiles of records in
// flight with one bulk copy (cp.async.bulk) per run of a paged block, each stage guarded by a
// full and an empty mbarrier; kWgmmaPipeConsumers warpgroups take the tiles in turn and never
// wait on global memory, so that while one runs its epilogue another's MMAs keep the tensor
// cores busy. A consumer releases a stage as soon as its fragments and scales are in registers.
//
// Which tiles. Block (token of the group, split) scores tiles split, split + splits, ... of
// kMmaKeys keys (as indexer_score_wgmma.cu); its i-th tile sits in stage i % kWgmmaPipeStages
// and is scored by consumer warpgroup i % kWgmmaPipeConsumers (so a stage always by the same
// warpgroup, in order: kWgmmaPipeStages is a multiple of kWgmmaPipeConsumers). The runs are those
// of issue_fp8_record_runs (score_mma_key_runs must hold: the launch's caller checks): a run's
// visible, mapped prefix of records is contiguous in the cache and starts 16-byte aligned, and
// its copy, rounded up to 16 bytes, stays inside the cache and inside the run's slots. A tile's
// mask has bit n set when key n was copied (visible and mapped); other keys score -inf, as the
// other kernel's unmapped keys.
#include <cstdint>

#include "cuda/common/launch.cuh"
#include "cuda/common/layout.cuh"
#include "cuda/common/ptx_mbarrier.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/indexer/indexer_fp8_records.cuh"
#include "cuda/indexer/indexer_launch.h"
#include "cuda/indexer/indexer_wgmma_tile.cuh"

namespace deepinfer::cuda {

namespace {

using namespace indexer_wgmma;  // NOLINT: the shared steps

constexpr int kStages = kWgmmaPipeStages;
constexpr int kStageBytes = kMmaKeys * kFp8RecordBytes;
static_assert(kStageBytes % 16 == 0, "stages start 16-byte aligned for the bulk copies");
constexpr int kConsumerThreads = kWgmmaPipeConsumers * kWgmmaThreads;
static_assert(kWgmmaPipeThreads == kConsumerThreads + 32, "the consumers, then one producer warp");
constexpr int kQReadyBarrier = 1;  // named barrier of the consumer warpgroups

// The block's shared memory (score_wgmma_pipelined_smem_bytes).
struct PipeSmem {
  uint8_t* q_tile;      // q's B tile (indexer_wgmma_tile.cuh)
  float* head_weights;  // [kWgmmaHeads]
  uint8_t* records;     // [kStages][kMmaKeys][kFp8RecordBytes]
  uint64_t* masks;      // [kStages]: bit n, key n of the stage's tile was copied
  uint64_t* full;       // [kStages]: the stage's records landed (the producer's arrival + bytes)
  uint64_t* empty;      // [kStages]: a consumer warpgroup took the stage (its 128 arrivals)
};

__device__ __forceinline__ PipeSmem pipe_smem(uint8_t* base) {
  PipeSmem s;
  s.q_tile = base;
  s.head_weights = reinterpret_cast<float*>(base + kWgmmaQBytes);
  s.records = base + kWgmmaQBytes + kWgmmaHeads * sizeof(float);
  s.masks = reinterpret_cast<uint64_t*>(s.records + kStages * kStageBytes);
  s.full = s.masks + kStages;
  s.empty = s.full + kStages;
  return s;
}

// The tiles of this block: the i-th starts at entry tile_first(i).
struct BlockTiles {
  int64_t visible;  // the token's visible entries
  int64_t count;    // tiles of this block
  __device__ int64_t tile_first(int64_t i) const {
    return (static_cast<int64_t>(blockIdx.y) + i * gridDim.y) * kMmaKeys;
  }
};

// The producer warp: lane m owns run m % runs of tile m / runs of each batch of 32 runs (runs per
// tile: kMmaKeys / min(epb, kMmaKeys), 1 .. 16, a divisor of 32). Per tile it waits until the
// stage is free, then lane 0 stores the tile's mask and arms the full barrier with the tile's
// bytes, and each lane of the tile copies its run.
__device__ __forceinline__ void produce_tiles(const ScoreArgs& a, const DeviceLayout& l, int b,
                                              const BlockTiles& tiles, const PipeSmem& sm) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int run_keys = min(a.epb, kMmaKeys);
  const int runs = kMmaKeys / run_keys;
  const int batch_tiles = 32 / runs;
  const int my_u = lane / runs;  // this lane's tile within a batch
  const int my_run = lane % runs;
  auto run_entry = [&](int64_t tile) { return tiles.tile_first(tile) + my_run * run_keys; };
  // The block-table entry of this lane's run of `tile` (as entry_row reads it), -1 where none.
  auto table_block = [&](int64_t tile) -> int64_t {
    const int64_t j = run_entry(tile);
    if (tile >= tiles.count || j >= tiles.visible) return -1;
    const int64_t logical = j / a.epb;
    if (logical >= l.max_blocks) return -1;
    return l.block_table[static_cast<int64_t>(b) * l.max_blocks + logical];
  };
  int64_t next_block = table_block(my_u);
  for (int64_t tile0 = 0; tile0 < tiles.count; tile0 += batch_tiles) {
    const int64_t my_tile = tile0 + my_u;
    const int64_t j = run_entry(my_tile);
    const int64_t block = next_block;
    next_block = table_block(my_tile + batch_tiles);  // in flight while this batch is issued
    // The run's visible keys inside the cache (issue_fp8_record_runs' count).
    const int64_t row0 = block < 0 ? -1 : block * a.epb + j % a.epb;
    const int keys =
        row0 < 0 || row0 >= a.cache_rows
            ? 0
            : static_cast<int>(
                  min(min(tiles.visible - j, static_cast<int64_t>(run_keys)), a.cache_rows - row0));
    const uint32_t bytes = (static_cast<uint32_t>(keys) * kFp8RecordBytes + 15u) & ~15u;
    const uint64_t bits =
        keys == 0 ? 0 : (keys == 64 ? ~0ull : (1ull << keys) - 1) << (my_run * run_keys);
    for (int u = 0; u < batch_tiles; ++u) {
      const int64_t i = tile0 + u;
      if (i >= tiles.count) break;  // uniform over the warp
      const int st = static_cast<int>(i % kStages);
      // The consumer of tile i - kStages released the stage (that barrier's use i / kStages - 1).
      if (i >= kStages) mbarrier_wait(&sm.empty[st], static_cast<uint32_t>((i / kStages - 1) & 1));
      const bool mine = my_u == u;
      const uint32_t tile_bytes = __reduce_add_sync(0xffffffffu, mine ? bytes : 0u);
      const uint32_t mask_lo =
          __reduce_or_sync(0xffffffffu, mine ? static_cast<uint32_t>(bits) : 0u);
      const uint32_t mask_hi =
          __reduce_or_sync(0xffffffffu, mine ? static_cast<uint32_t>(bits >> 32) : 0u);
      if (lane == 0) {
        sm.masks[st] = static_cast<uint64_t>(mask_hi) << 32 | mask_lo;
        mbarrier_arrive_expect_tx(&sm.full[st], tile_bytes);  // releases the mask
      }
      __syncwarp();
      if (mine && keys > 0) {
        bulk_copy_to_shared(sm.records + st * kStageBytes + my_run * run_keys * kFp8RecordBytes,
                            a.cache + row0 * kFp8RecordBytes, bytes, &sm.full[st]);
      }
    }
  }
}

// Consumer warpgroup `group` (thread tid of it): its tiles group, group + kWgmmaPipeConsumers,
// ... as indexer_score_wgmma.cu scores a tile. kQFp8: q holds e4m3 values (ScoreArgs::q_fp8), so
// its lo parts are zero and only the hi columns are multiplied; the lo accumulators stay zero and
// the epilogue's sums are the two-part kernel's, bit for bit.
template <bool kQFp8>
__device__ __forceinline__ void consume_tiles(const ScoreArgs& a, const BlockTiles& tiles,
                                              const PipeSmem& sm, int group, int tid) {
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
    KeyFragments f;
    load_key_fragments(sm.records + st * kStageBytes, key0, lane_c, f);
    const uint64_t mask = sm.masks[st];
    mbarrier_arrive(&sm.empty[st]);  // the stage's bytes this thread needs are in registers
    fence_accumulators(acc);
    wgmma_fence();
    issue_key_tile_mma<kQFp8>(acc, f, q_desc);
    wgmma_commit();
    wgmma_wait_all();
    fence_accumulators(acc);
    const float2 p = key_scores<false>(acc, wq, f.ks0, f.ks1);
    if (lane_c < 2) {
      const int n = key0 + 8 * lane_c;
      const int64_t j = tiles.tile_first(i) + n;
      const float s = stored_score(lane_c == 0 ? p.x : p.y, ((mask >> n) & 1u) != 0);
      if (j < tiles.visible) out[j] = s;
    }
  }
}

template <bool kQFp8>
__global__ void __launch_bounds__(kWgmmaPipeThreads, 1)
    indexer_score_wgmma_pipelined_kernel(ScoreArgs a, DeviceLayout l) {
  extern __shared__ float4 smem4[];
  const int tid = static_cast<int>(threadIdx.x);
  const int t = a.token0 + static_cast<int>(blockIdx.x);
  const int b = seq_of_row(l, t);
  BlockTiles tiles;
  tiles.visible = visible_entries(l.positions[t], a.ratio, a.bound);
  const int64_t all_tiles = (tiles.visible + kMmaKeys - 1) / kMmaKeys;
  if (static_cast<int64_t>(blockIdx.y) >= all_tiles) return;  // uniform over the block
  tiles.count = (all_tiles - 1 - blockIdx.y) / gridDim.y + 1;
  const PipeSmem sm = pipe_smem(reinterpret_cast<uint8_t*>(smem4));
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
  // q's B tile by the first warpgroup while the producer's first tiles are in flight.
  if (tid < kWgmmaThreads) stage_q_tile<false>(a, t, tid, sm.q_tile, sm.head_weights);
  fence_async_shared();
  named_barrier<kConsumerThreads>(kQReadyBarrier);  // q's tile and head weights written
  consume_tiles<kQFp8>(a, tiles, sm, tid / kWgmmaThreads, tid % kWgmmaThreads);
}

}  // namespace

void launch_indexer_score_wgmma_pipelined(const ScoreArgs& a, const DeviceLayout& l, int64_t n,
                                          int64_t splits, KernelSmemLimits& smem_limits,
                                          cudaStream_t stream) {
  if (a.heads != kWgmmaHeads || a.dim != kMmaDim || a.key.format != KvFormat::kFp8 ||
      a.key.row_bytes != kFp8RecordBytes) {
    throw Error(ErrorCode::kUnsupported,
                "indexer_topk: the pipelined wgmma scores take 64 heads of 128 channels over fp8 "
                "index keys");
  }
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(splits));
  const size_t smem = score_wgmma_pipelined_smem_bytes();
  const auto kernel = a.q_fp8 ? indexer_score_wgmma_pipelined_kernel<true>
                              : indexer_score_wgmma_pipelined_kernel<false>;
  smem_limits.allow(kernel, smem);
  kernel<<<grid, kWgmmaPipeThreads, smem, stream>>>(a, l);
  DEEPINFER_CUDA_LAUNCH_CHECK("indexer_topk");
}

}  // namespace deepinfer::cuda
