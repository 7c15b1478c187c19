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

#include "cuda/common/launch.cuh"
#include "cuda/common/layout.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/indexer/indexer_fp8_records.cuh"
#include "cuda/indexer/indexer_launch.h"
#include "cuda/indexer/indexer_mma_layout.h"
#include "cuda/indexer/indexer_wgmma_tile.cuh"

namespace deepinfer::cuda {

namespace {

namespace im = indexer_mma;
using namespace indexer_wgmma;  // the steps both wgmma kernels share (indexer_wgmma_tile.cuh)

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

  // q's B tile while the first tiles are in flight.
  stage_q_tile<kLoE4m3>(a, t, tid, q_tile, head_weights);
  fence_async_shared();
  __syncthreads();  // q's tile and head weights written
  float wq[kWgmmaHeads / 8][2];
  load_column_weights(head_weights, lane_c, wq);
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
    KeyFragments f;
    load_key_fragments(tile, key0, lane_c, f);
    fence_accumulators(acc);
    wgmma_fence();
    if constexpr (kLoE4m3) {
      // hi parts: acc[0, 32) on f16 steps as below; lo parts: acc[32, 64) on e4m3 steps of 32
      // channels (k rows 32t .. 32t + 31: core matrices 2t, 2t + 1 of the lo tile).
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        wgmma_m64n64k16_f16(acc, f.frag[s], q_desc + ((2 * s * kCoreBytes) >> 4), s > 0);
      }
#pragma unroll
      for (int t = 0; t < kSteps / 2; ++t) {
        const uint32_t a8[4] = {f.words[2 * t][0], f.words[2 * t][1], f.words[2 * t + 1][0],
                                f.words[2 * t + 1][1]};
        wgmma_m64n64k32_e4m3(acc + 32, a8, lo_desc + ((2 * t * kCoreBytes) >> 4), t > 0);
      }
    } else {
      issue_key_tile_mma(acc, f, q_desc);
    }
    wgmma_commit();
    wgmma_wait_all();
    fence_accumulators(acc);
    const float2 p = key_scores<kLoE4m3>(acc, wq, f.ks0, f.ks1);
    if (lane_c < 2) {
      const int n = key0 + 8 * lane_c;
      const int64_t j = tile_first(i) + n;
      const float s = stored_score(lane_c == 0 ? p.x : p.y, mapped[st * kMmaKeys + n] != 0);
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
