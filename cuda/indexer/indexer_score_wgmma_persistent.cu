// The pipelined wgmma scores (indexer_score_wgmma_pipelined.cu) for q in fp8, bit for bit, from
// persistent blocks that keep every SM busy and convert the keys for less.
//
// Why. The pipelined kernel at B = 64 ran at 0.41-0.49 of copy bandwidth with its issue slots
// 29% busy and its tensor pipe half idle (session 12's profile): each of its three scoring
// warpgroups converts a tile's 8,192 key codes with cvt e4m3x2 -> f16x2, which Hopper issues at a
// quarter of the integer pipes' rate (32 per thread and tile), then waits for its MMAs and runs
// its epilogue, all in turn; its grid (token, split) of one block per SM left SMs idle (128 of
// 132 at B = 64) and unbalanced rows of different lengths; and q came as f32 values that a
// kernel before it decoded from the codes. Here:
//  - Work: the group's tokens' tiles of kMmaKeys keys, flattened in token order, are cut into one
//    contiguous range per block (indexer_e4m3_bits.h: sizes within one of each other), one block
//    per SM (launch: min(SMs, tiles)). Each block finds its first token with a scan of the tokens'
//    tile counts (locate_block_range).
//  - Keys: one producer warp bulk-copies each tile's runs of a paged block into a ring of
//    Shape::kStages stages (the pipelined kernel's copies, full / empty mbarriers), walking the
//    block's tokens in order. Where each sequence has one query row (decode), every record is
//    read once per call, so the copies mark their lines evict-first in L2: the small tables the
//    next call reads before its first copy (positions, q_start, block tables) stay in L2 instead
//    of behind this call's records (session 33, an H100, one build: B = 64 at 32K 34.0-34.2 ->
//    31.9 us, B = 256 at 32K 111.4-111.9 -> 106.2-107.1 us, 128K unchanged). Prefill's tokens
//    share their keys through L2 and keep the normal policy (evict-first cost it 4%).
//  - Start: as a programmatic dependent launch (pdl.cuh) the block waits for the previous grid
//    only after its prologue (the scan, which reads the layout's positions and q_start), the
//    producer's first block-table entries and an L2 prefetch of its first batch of records. So
//    the layout's tables must not be the previous kernel's output: within a forward no kernel
//    writes them (they are uploaded; shift_rows moves rows between forwards), and in the model
//    quantize_indexer_q comes right before this kernel. The records may be its output: the
//    prefetch only warms L2, and the copies come after the wait. An H100 (session 58), graph
//    replay of the scores at B = 64 over 32K: 32.3 -> 26.1-26.3 us (0.71 -> 0.87-0.88 of copy);
//    the wait after the prologue without the prefetch 30.2-30.3; the first copies into the ring
//    before the wait 28.4. quantize_indexer_q + the op: 62.0-62.3 -> 57.9-58.3 us.
//  - q: kPersistQWarps warps stage each token's f16 B tile from its e4m3 codes (a.q_codes; no
//    decode kernel) into a ring of kPersistQSlots slots with the token's scaled head weights and
//    where its tiles sit (QSlotMeta); consumers take a slot per token and release it.
//  - Scores: Shape::kConsumers warpgroups (3; 4 without conversion) take the block's tiles in
//    turn. The k-steps below kCvtSteps convert codes with cvt; the others with a byte permute, a
//    shift and a mask (common/e4m3_bits.h), which gives each code's value times 2^-8, on the
//    integer pipes.
//
// The same bytes as the pipelined kernel over q in fp8. Its products are q's f16 value (the codes
// times the head's power-of-two scale, as stage_q_tile makes it) times the key's exact f16 value;
// here every product is that times 2^-8 exactly: the integer steps' keys carry the factor, and the
// cvt steps' q columns are written times 2^-8 (exact: |q| >= 2^-4 after the head scale). So each
// accumulator is the pipelined kernel's times 2^-8 (the tensor cores' sums scale with their
// inputs; nothing nears f32's limits), and the epilogue's key scale times 256 makes each d * ks
// the same real number, hence the same f32; the weights, ReLU, sums and their order are those of
// key_scores. (The pipelined kernel adds q's zero lo parts to each d first: that turns -0 into +0
// only, which changes no sum.) Key codes 0x7f / 0xff (NaN, which no encoder here writes) score
// finite values in the integer steps instead of -inf.
//
// The fp8-MMA variant (kFp8Mma: IndexerScoreKernel::kTensorCoreWgmmaPersistentFp8, the default:
// DEEPINFER_INDEXER_FP8_SCORES=wgmma_persistent_fp8 or unset) converts nothing, as DeepSeek's paged
// MQA logits kernels on Hopper: q's B tile holds its codes (wgmma_q8_offset), the key words as
// loaded are the A registers of four wgmma.m64n64k32 e4m3 steps (wgmma_k8_of_channel), and the head
// weight carries only the two op scales. The products are exact, but Hopper's fp8 MMAs keep fewer
// bits of their sums than f32, so its scores differ from the others' in the low bits (within
// 5.4e-4 of a row's largest score on the H200; its GPU test). Needing 90 registers per thread, it
// runs four consumer warpgroups.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <string>

#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/e4m3_bits.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/layout.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/ptx_cluster.cuh"
#include "cuda/common/ptx_mbarrier.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/indexer/indexer_e4m3_bits.h"
#include "cuda/indexer/indexer_fp8_records.cuh"
#include "cuda/indexer/indexer_launch.h"
#include "cuda/indexer/indexer_mma_layout.h"
#include "cuda/indexer/indexer_persistent_walk.cuh"
#include "cuda/indexer/indexer_wgmma_tile.cuh"

namespace deepinfer::cuda {

namespace {

using namespace indexer_wgmma;  // NOLINT: the shared steps
using indexer_persistent::BlockRange;
using indexer_persistent::BlockSchedule;
using indexer_persistent::locate_block_range;
using indexer_persistent::SpanToken;
using indexer_persistent::SpanWalker;
namespace im = indexer_mma;

constexpr int kQSlots = kPersistQSlots;
constexpr int kStageBytes = kMmaKeys * kFp8RecordBytes;
static_assert(kStageBytes % 16 == 0, "stages start 16-byte aligned for the bulk copies");
constexpr int kQThreads = kPersistQWarps * 32;
constexpr float kTwoToMinus8 = 1.0f / 256.0f;
constexpr float kTwoTo8 = 256.0f;

// The block's shape: kConsumers warpgroups, then the loader warpgroup (one producer warp and the
// q warps); kStages record stages. The fp8-MMA variant's consumers need fewer registers (90
// against the conversion paths' 128), so it runs four (persistent_shape, indexer_launch.h).
template <bool kFp8Mma>
struct Shape {
  static constexpr PersistentShape kShape = persistent_shape(kFp8Mma);
  static constexpr int kConsumers = kShape.consumers;
  static constexpr int kStages = kShape.stages;
  static constexpr int kConsumerThreads = kConsumers * kWgmmaThreads;
  static constexpr int kThreads = kShape.threads();
  static constexpr int kWarps = kThreads / 32;
  static_assert(kThreads == kConsumerThreads + 32 + kQThreads);
};

// A q slot's token, after its weights.
struct QSlotMeta {
  int64_t visible;     // the token's visible entries
  int64_t first_tile;  // its first tile in the block's range
  int64_t tiles;       // its tiles in the range
  int32_t g;           // its index in the group (its scores row)
  int32_t pad;
};
static_assert(kWgmmaHeads * sizeof(float) + sizeof(QSlotMeta) <= kPersistQMetaBytes);

// The block's shared memory (score_wgmma_persistent_smem_bytes).
struct PersistSmem {
  uint8_t* q_tiles;   // [kQSlots][kPersistQTileBytes]: q's B tiles (wgmma_q_offset)
  uint8_t* q_meta;    // [kQSlots][kPersistQMetaBytes]: the head weights, then QSlotMeta
  uint8_t* records;   // [kStages][kStageBytes] (Shape::kStages)
  uint64_t* masks;    // [kStages]: bit n, key n of the stage's tile was copied
  uint64_t* full;     // [kStages]: the producer's arrival + the copies' bytes
  uint64_t* empty;    // [kStages]: the consuming warpgroup's 128 arrivals
  uint64_t* q_full;   // [kQSlots]: the kQThreads q threads' arrivals
  uint64_t* q_empty;  // [kQSlots]: every consumer thread's arrival
  int64_t* scan;      // [kWarps + 2]: the prologue's warp sums, then the first token and tile
  // The prologue's tables (BlockSchedule::tables), token g at g:
  int32_t* tok_visible;  // [kThreads]: token g's visible entries
  int32_t* q_start;      // [num_seqs + 1 <= kThreads]: l.q_start

  __device__ float* weights(int slot) const {
    return reinterpret_cast<float*>(q_meta + slot * kPersistQMetaBytes);
  }
  __device__ QSlotMeta* meta(int slot) const {
    return reinterpret_cast<QSlotMeta*>(q_meta + slot * kPersistQMetaBytes +
                                        kWgmmaHeads * sizeof(float));
  }
  __device__ uint8_t* q_tile(int slot) const { return q_tiles + slot * kPersistQTileBytes; }
};

template <int kStages, int kThreads>
__device__ __forceinline__ PersistSmem persist_smem(uint8_t* base) {
  PersistSmem s;
  s.q_tiles = base;
  s.q_meta = base + kQSlots * kPersistQTileBytes;
  s.records = s.q_meta + kQSlots * kPersistQMetaBytes;
  s.masks = reinterpret_cast<uint64_t*>(s.records + kStages * kStageBytes);
  s.full = s.masks + kStages;
  s.empty = s.full + kStages;
  s.q_full = s.empty + kStages;
  s.q_empty = s.q_full + kQSlots;
  s.scan = reinterpret_cast<int64_t*>(s.q_empty + kQSlots);
  s.tok_visible = reinterpret_cast<int32_t*>(s.scan + kThreads / 32 + 4);
  s.q_start = s.tok_visible + kThreads;
  return s;
}

// The producer warp: the records of the block's tiles, token by token, into the stage ring. Lane
// m owns run m % runs of tile m / runs of each batch of 32 runs (runs: a power of two,
// score_mma_key_runs) and looks up its block-table entry a batch ahead (within a token). A tile's
// bytes and mask of copied keys are summed over its runs' lanes once per batch; per tile, once the
// stage is free, the tile's first lane stores the mask and arms the stage's full barrier with the
// bytes, and each of its lanes with keys copies its run. The stream's rate is this warp's rate
// per tile (session 29's profile: its chain of dependent instructions, not its waits), so the
// chain is kept short: shared addresses formed once, no warp reductions per tile.
template <int kStages>
__device__ void produce_records(const ScoreArgs& a, const DeviceLayout& l, int n,
                                const BlockSchedule& sc, const PersistSmem& sm,
                                bool records_read_once) {
  bool waited = false;  // for the previous kernel (enter_dependent_grid)
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const uint64_t evict_first = l2_evict_first_policy();
  const int run_keys = min(a.epb, kMmaKeys);
  const int runs = kMmaKeys / run_keys;
  const int batch_tiles = 32 / runs;
  const int my_u = lane / runs;
  const int my_run = lane % runs;
  const uint32_t my_records = smem_addr(sm.records) + my_run * run_keys * kFp8RecordBytes;
  const uint32_t full = smem_addr(sm.full);
  const uint32_t empty = smem_addr(sm.empty);
  SpanWalker walk(a, l, n, sc.range, sc.tables ? sm.tok_visible : nullptr);
  SpanToken tok;
  uint32_t f0 = 0;  // the block's index of the token's first tile in the range
  const int32_t* q_start = sc.tables ? sm.q_start : l.q_start;
  while (walk.next(tok)) {
    const int b = seq_of_row_warp(q_start, l.num_seqs, a.token0 + tok.g);
    const int32_t* table = l.block_table + static_cast<int64_t>(b) * l.max_blocks;
    const int tiles = static_cast<int>(tok.tiles);
    auto run_entry = [&](int i) { return (tok.first_tile + i) * kMmaKeys + my_run * run_keys; };
    // The block-table entry of this lane's run of the token's i-th tile in range, -1 where none.
    auto table_block = [&](int i) -> int64_t {
      const int64_t j = run_entry(i);
      if (i >= tiles || j >= tok.visible) return -1;
      const int64_t logical = j / a.epb;
      return logical < l.max_blocks ? table[logical] : -1;
    };
    int64_t next_block = table_block(my_u);
    for (int i0 = 0; i0 < tiles; i0 += batch_tiles) {
      const int64_t j = run_entry(i0 + my_u);
      const int64_t block = next_block;
      next_block = table_block(i0 + batch_tiles + my_u);  // in flight while this batch is issued
      const int64_t row0 = block < 0 ? -1 : block * a.epb + j % a.epb;
      const int keys =
          row0 < 0 || row0 >= a.cache_rows
              ? 0
              : static_cast<int>(
                    min(min(tok.visible - j, static_cast<int64_t>(run_keys)), a.cache_rows - row0));
      const uint32_t bytes = (static_cast<uint32_t>(keys) * kFp8RecordBytes + 15u) & ~15u;
      const uint64_t bits =
          keys == 0 ? 0 : (keys == 64 ? ~0ull : (1ull << keys) - 1) << (my_run * run_keys);
      // The tile's totals in each of its lanes (its runs' lanes are aligned groups of `runs`).
      uint32_t tile_bytes = bytes;
      uint32_t mask_lo = static_cast<uint32_t>(bits), mask_hi = static_cast<uint32_t>(bits >> 32);
      for (int o = 1; o < runs; o <<= 1) {
        tile_bytes += __shfl_xor_sync(0xffffffffu, tile_bytes, o);
        mask_lo |= __shfl_xor_sync(0xffffffffu, mask_lo, o);
        mask_hi |= __shfl_xor_sync(0xffffffffu, mask_hi, o);
      }
      const uint8_t* src = a.cache + row0 * kFp8RecordBytes;
      const int batch = min(batch_tiles, tiles - i0);
      if (!waited) {
        // The first batch's records start for L2 while the previous grid drains (a hint: the
        // copies below read whatever that grid wrote).
        if (keys > 0) bulk_prefetch_l2(src, bytes);
        enter_dependent_grid();
        waited = true;
      }
      for (int u = 0; u < batch; ++u) {
        const uint32_t f = f0 + static_cast<uint32_t>(i0 + u);
        const uint32_t st = f % kStages;
        // The consumer of tile f - kStages released the stage (that barrier's use f / kStages - 1).
        if (f >= kStages) mbarrier_wait_at(empty + 8 * st, (f / kStages - 1) & 1);
        const bool mine = my_u == u;
        if (mine && my_run == 0) {
          sm.masks[st] = static_cast<uint64_t>(mask_hi) << 32 | mask_lo;
          mbarrier_arrive_expect_tx_at(full + 8 * st, tile_bytes);  // releases the mask
        }
        __syncwarp();  // the barrier armed before any of the tile's copies can complete it
        if (mine && keys > 0) {
          if (records_read_once) {
            bulk_copy_to_shared_hinted_at(my_records + st * kStageBytes, src, bytes, full + 8 * st,
                                          evict_first);
          } else {
            bulk_copy_to_shared_at(my_records + st * kStageBytes, src, bytes, full + 8 * st);
          }
        }
      }
    }
    f0 += static_cast<uint32_t>(tiles);
  }
  if (!waited) enter_dependent_grid();  // not reached: a range's first token has tiles
}

// The f16x2 of q values v0, v1 at k-step `step` of the B tile: v times the head scale (exact in
// f16, as stage_q_tile writes it), times 2^-8 in the steps whose keys go through cvt.
template <int kCvtSteps>
__device__ __forceinline__ __half2 q_pair(float2 v, float scale, int step) {
  float x0 = v.x * scale, x1 = v.y * scale;
  if (step < kCvtSteps) {
    x0 *= kTwoToMinus8;
    x1 *= kTwoToMinus8;
  }
  return __floats2half2_rn(x0, x1);
}

// q's B tile of token t, half `item & 1` of head item / 2 (64 channels), from the e4m3 codes:
// the values stage_q_tile reads after indexer_q_values decodes them, the same head scale and
// weight; the pair of halves of a head sits in adjacent lanes (the amax shuffle).
// kFp8Mma: the codes themselves, 4 channels per 32-bit store at their k of the e4m3 k32 steps
// (wgmma_q8_offset), and the head's weight with both scales only (no head scale).
template <int kCvtSteps, bool kFp8Mma>
__device__ __forceinline__ void stage_q_half(const ScoreArgs& a, int t, int item, uint8_t* q_tile,
                                             float* head_weights) {
  const int h = item >> 1;
  const int ch0 = (item & 1) * (kMmaDim / 2);
  const uint4* src = reinterpret_cast<const uint4*>(
      a.q_codes + (static_cast<int64_t>(t) * kWgmmaHeads + h) * kMmaDim + ch0);
  uint32_t words[kMmaDim / 8];
#pragma unroll
  for (int i = 0; i < kMmaDim / 32; ++i) {
    const uint4 v = src[i];
    words[4 * i] = v.x;
    words[4 * i + 1] = v.y;
    words[4 * i + 2] = v.z;
    words[4 * i + 3] = v.w;
  }
  if constexpr (kFp8Mma) {
#pragma unroll
    for (int i = 0; i < kMmaDim / 8; ++i) {
      // Channels ch0 + 4i .. + 3 play k8 .. k8 + 3 of one core-matrix row.
      const int k8 = im::wgmma_k8_of_channel(ch0 + 4 * i);
      *reinterpret_cast<uint32_t*>(q_tile + im::wgmma_q8_offset(k8, h)) = words[i];
    }
    if (ch0 == 0) {
      head_weights[h] =
          a.weights[static_cast<int64_t>(t) * kWgmmaHeads + h] * a.weight_scale * a.score_scale;
    }
    return;
  }
  // Codes ch0 + i, ch0 + i + 1 (even i) as f32: exact, as decode_e4m3_kernel gives them.
  auto values = [&](int i) {
    const uint32_t pair = (words[i / 4] >> (8 * (i % 4))) & 0xffffu;
    const __half2_raw r =
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
    return __half22float2(__half2(r));
  };
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kMmaDim / 2; i += 2) {
    const float2 v = values(i);
    amax = fmaxf(amax, fmaxf(fabsf(v.x), fabsf(v.y)));
  }
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  const float scale = f16_head_scale(amax);
#pragma unroll
  for (int i = 0; i < kMmaDim / 2; i += 2) {
    const int k = im::wgmma_k_of_channel(ch0 + i);  // even: k + 1 plays channel ch0 + i + 1
    *reinterpret_cast<__half2*>(q_tile + im::wgmma_q_offset(k, h)) =
        q_pair<kCvtSteps>(values(i), scale, k / 16);
  }
  if (ch0 == 0) {
    head_weights[h] = a.weights[static_cast<int64_t>(t) * kWgmmaHeads + h] * a.weight_scale *
                      a.score_scale / scale;
  }
}

// The q warps (thread qtid of kQThreads): each token of the block's range into the next q slot,
// once every consumer released the slot's previous token.
template <int kCvtSteps, bool kFp8Mma>
__device__ void stage_q_slots(const ScoreArgs& a, const DeviceLayout& l, int n,
                              const BlockSchedule& sc, const PersistSmem& sm, int qtid) {
  SpanWalker walk(a, l, n, sc.range, sc.tables ? sm.tok_visible : nullptr);
  SpanToken tok;
  for (int64_t u = 0; walk.next(tok); ++u) {
    const int slot = static_cast<int>(u % kQSlots);
    if (u >= kQSlots)
      mbarrier_wait(&sm.q_empty[slot], static_cast<uint32_t>((u / kQSlots - 1) & 1));
    const int t = a.token0 + tok.g;
    // Items 0 .. 95 in the first round, 96 .. 127 by the first q warp in the second: a head's
    // two halves stay in one warp.
    for (int item = qtid; item < 2 * kWgmmaHeads; item += kQThreads) {
      stage_q_half<kCvtSteps, kFp8Mma>(a, t, item, sm.q_tile(slot), sm.weights(slot));
    }
    if (qtid == 0) *sm.meta(slot) = QSlotMeta{tok.visible, tok.first_tile, tok.tiles, tok.g, 0};
    fence_async_shared();               // the tile, for wgmma's reads
    mbarrier_arrive(&sm.q_full[slot]);  // releases the tile, weights and meta
  }
}

// What the epilogue of a tile issued by issue_tile needs besides its accumulators: its keys'
// scales (times 256 on the conversion paths) and its stage's mask of copied keys.
struct TileTail {
  float ks0, ks1;
  uint64_t mask;
};

// The MMAs of one tile of a consumer warpgroup (thread (g, c) of warp w: keys key0 = 16 w + g and
// key0 + 8), issued and committed, not waited for: the pipelined kernel's consume step with the
// conversion split at kCvtSteps and the key scales times 256 (the header says why the scores are
// its bytes). kFp8Mma: no conversion; the codes as loaded are the A registers of four e4m3 k32
// MMAs. kSlot: the token's q slot, a constant so that the MMAs' descriptors stay in uniform
// registers.
template <int kCvtSteps, bool kFp8Mma, int kSlot>
__device__ __forceinline__ TileTail issue_tile(const PersistSmem& sm, int f, int key0, int lane_c,
                                               float (&acc)[32]) {
  const uint64_t q_desc = kFp8Mma
                              ? wgmma_desc(sm.q_tile(kSlot), kCoreBytes, kKChunks / 2 * kCoreBytes)
                              : wgmma_desc(sm.q_tile(kSlot), kCoreBytes, kKChunks * kCoreBytes);
  constexpr int kStages = Shape<kFp8Mma>::kStages;
  const int st = f % kStages;
  mbarrier_wait(&sm.full[st], static_cast<uint32_t>((f / kStages) & 1));
  const uint8_t* tile = sm.records + st * kStageBytes;
  const uint32_t* k0 = reinterpret_cast<const uint32_t*>(tile + key0 * kFp8RecordBytes);
  const uint32_t* k1 = reinterpret_cast<const uint32_t*>(tile + (key0 + 8) * kFp8RecordBytes);
  uint32_t w0[kSteps], w1[kSteps];
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    w0[s] = k0[8 * lane_c + s];
    w1[s] = k1[8 * lane_c + s];
  }
  constexpr float kKeyScale = kFp8Mma ? 1.0f : kTwoTo8;
  const TileTail tail{reinterpret_cast<const float*>(k0)[kMmaDim / 4] * kKeyScale,
                      reinterpret_cast<const float*>(k1)[kMmaDim / 4] * kKeyScale, sm.masks[st]};
  mbarrier_arrive(&sm.empty[st]);  // the stage's bytes this thread needs are in registers
  if constexpr (kFp8Mma) {
    // k-step t takes words 8c + 2t (registers 0 / 1) and 8c + 2t + 1 (2 / 3): wgmma_k8_of_channel.
    uint32_t frag8[kSteps / 2][4];
#pragma unroll
    for (int t = 0; t < kSteps / 2; ++t) {
      frag8[t][0] = w0[2 * t];
      frag8[t][1] = w1[2 * t];
      frag8[t][2] = w0[2 * t + 1];
      frag8[t][3] = w1[2 * t + 1];
    }
    fence_accumulators(acc);
    wgmma_fence();
#pragma unroll
    for (int t = 0; t < kSteps / 2; ++t) {
      wgmma_m64n64k32_e4m3(acc, frag8[t], q_desc + ((2 * t * kCoreBytes) >> 4), t > 0);
    }
  } else {
    uint32_t frag[kSteps][4];
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      if (s < kCvtSteps) {
        frag[s][0] = e4m3x2_to_f16x2(w0[s]);
        frag[s][1] = e4m3x2_to_f16x2(w1[s]);
        frag[s][2] = e4m3x2_to_f16x2(w0[s] >> 16);
        frag[s][3] = e4m3x2_to_f16x2(w1[s] >> 16);
      } else {
        frag[s][0] = e4m3_bits::e4m3x2_to_f16x2_times_2m8<false>(w0[s]);
        frag[s][1] = e4m3_bits::e4m3x2_to_f16x2_times_2m8<false>(w1[s]);
        frag[s][2] = e4m3_bits::e4m3x2_to_f16x2_times_2m8<true>(w0[s]);
        frag[s][3] = e4m3_bits::e4m3x2_to_f16x2_times_2m8<true>(w1[s]);
      }
    }
    fence_accumulators(acc);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      wgmma_m64n64k16_f16(acc, frag[s], q_desc + ((2 * s * kCoreBytes) >> 4), s > 0);
    }
  }
  wgmma_commit();
  return tail;
}

// The epilogue of a tile whose MMAs are done: key_scores' sums over the hi columns, in its order,
// stored at entries entry0 + key (below `visible`).
__device__ __forceinline__ void finish_tile(float (&acc)[32], const TileTail& tail,
                                            const float (&wq)[kWgmmaHeads / 8][2], int key0,
                                            int lane_c, float* out, int entry0, int visible) {
  fence_accumulators(acc);
  float p0 = 0.0f, p1 = 0.0f;
#pragma unroll
  for (int j = 0; j < kWgmmaHeads / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      p0 += wq[j][e] * fmaxf(acc[4 * j + e] * tail.ks0, 0.0f);
      p1 += wq[j][e] * fmaxf(acc[4 * j + 2 + e] * tail.ks1, 0.0f);
    }
  }
  p0 += __shfl_xor_sync(0xffffffffu, p0, 1);
  p1 += __shfl_xor_sync(0xffffffffu, p1, 1);
  p0 += __shfl_xor_sync(0xffffffffu, p0, 2);
  p1 += __shfl_xor_sync(0xffffffffu, p1, 2);
  if (lane_c < 2) {
    const int n = key0 + 8 * lane_c;
    const int j = entry0 + n;
    const float s = stored_score(lane_c == 0 ? p0 : p1, ((tail.mask >> n) & 1u) != 0);
    if (j < visible) out[j] = s;
  }
}

// Consumer warpgroup `group` (thread tid of it): the block's tiles group, group + kConsumers,
// ... Every token of the range passes through it (its q slot taken and released, tiles or not),
// so that the q warps can reuse the slots.
template <int kCvtSteps, bool kFp8Mma>
__device__ void consume_tiles(const ScoreArgs& a, const BlockRange& range, const PersistSmem& sm,
                              int group, int tid) {
  const int lane = tid & 31;
  const int lane_c = lane & 3;
  const int key0 = 16 * (tid >> 5) + (lane >> 2);
  float wq[kWgmmaHeads / 8][2];
  float acc[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
  // The current token: its q slot's use u, its first tile's index in the range (start), tiles.
  // 32-bit: a range's tiles and a row's entries fit (bound <= 2^31 - 1: indexer_score_args).
  const int count = static_cast<int>(range.count);
  int u = -1, start = 0, tiles = 0, entry0 = 0, visible = 0;
  float* out = nullptr;
  auto take_next_token = [&] {
    if (u >= 0) mbarrier_arrive(&sm.q_empty[u % kQSlots]);  // its MMAs are done
    start += tiles;
    ++u;
    const int slot = u % kQSlots;
    mbarrier_wait(&sm.q_full[slot], static_cast<uint32_t>((u / kQSlots) & 1));
    const QSlotMeta m = *sm.meta(slot);
    tiles = static_cast<int>(m.tiles);
    // The entry of the range's first tile of the token, less its index in the range.
    entry0 = static_cast<int>(m.first_tile - start) * kMmaKeys;
    visible = static_cast<int>(m.visible);
    out = a.scores + static_cast<int64_t>(m.g) * a.row;
    load_column_weights(sm.weights(slot), lane_c, wq);
  };
  static_assert(kQSlots == 2, "a tile's q slot picks one of two instances of issue_tile");
  for (int f = group; f < count; f += Shape<kFp8Mma>::kConsumers) {
    while (f >= start + tiles) take_next_token();
    if (u % kQSlots == 0) {
      const TileTail tail = issue_tile<kCvtSteps, kFp8Mma, 0>(sm, f, key0, lane_c, acc);
      wgmma_wait_all();
      finish_tile(acc, tail, wq, key0, lane_c, out, entry0 + f * kMmaKeys, visible);
    } else {
      const TileTail tail = issue_tile<kCvtSteps, kFp8Mma, 1>(sm, f, key0, lane_c, acc);
      wgmma_wait_all();
      finish_tile(acc, tail, wq, key0, lane_c, out, entry0 + f * kMmaKeys, visible);
    }
  }
  while (start + tiles < count) take_next_token();
  if (u >= 0) mbarrier_arrive(&sm.q_empty[u % kQSlots]);
}

template <int kCvtSteps, bool kFp8Mma>
__global__ void __launch_bounds__(Shape<kFp8Mma>::kThreads, 1)
    indexer_score_wgmma_persistent_kernel(ScoreArgs a, DeviceLayout l, int n,
                                          bool records_read_once) {
  using S = Shape<kFp8Mma>;
  extern __shared__ float4 smem4[];
  const int tid = static_cast<int>(threadIdx.x);
  const PersistSmem sm = persist_smem<S::kStages, S::kThreads>(reinterpret_cast<uint8_t*>(smem4));
  if (tid == 0) {
    for (int st = 0; st < S::kStages; ++st) {
      mbarrier_init(&sm.full[st], 1);
      mbarrier_init(&sm.empty[st], kWgmmaThreads);
    }
    for (int slot = 0; slot < kQSlots; ++slot) {
      mbarrier_init(&sm.q_full[slot], kQThreads);
      mbarrier_init(&sm.q_empty[slot], S::kConsumerThreads);
    }
    mbarrier_init_fence();
  }
  // Syncs: the barriers are initialised after it.
  const BlockSchedule sc =
      locate_block_range<S::kThreads>(a, l, n, sm.scan, sm.tok_visible, sm.q_start);
  if (sc.range.count == 0) {  // uniform over the block
    enter_dependent_grid();
    return;
  }
  if (tid >= S::kConsumerThreads) {
    if (tid < S::kConsumerThreads + 32) {
      produce_records<S::kStages>(a, l, n, sc, sm, records_read_once);
    } else {
      enter_dependent_grid();  // q's codes and weights: the previous kernel's output
      stage_q_slots<kCvtSteps, kFp8Mma>(a, l, n, sc, sm, tid - S::kConsumerThreads - 32);
    }
    return;
  }
  enter_dependent_grid();  // the scores buffer: the previous kernel may still read it
  consume_tiles<kCvtSteps, kFp8Mma>(a, sc.range, sm, tid / kWgmmaThreads, tid % kWgmmaThreads);
}

}  // namespace

void launch_indexer_score_wgmma_persistent(const ScoreArgs& a, const DeviceLayout& l, int64_t n,
                                           int64_t ctas, int cvt_steps, bool fp8_mma,
                                           KernelSmemLimits& smem_limits, bool pdl,
                                           cudaStream_t stream) {
  if (a.heads != kWgmmaHeads || a.dim != kMmaDim || a.key.format != KvFormat::kFp8 ||
      a.key.row_bytes != kFp8RecordBytes || a.q_codes == nullptr) {
    throw Error(ErrorCode::kUnsupported,
                "indexer_topk: the persistent wgmma scores take q as e4m3 codes, 64 heads of 128 "
                "channels over fp8 index keys");
  }
  if (cvt_steps != kSteps && cvt_steps != kPersistMixedCvtSteps) {
    throw Error(ErrorCode::kInvalidArgument,
                "indexer_topk: the persistent wgmma scores convert " + std::to_string(kSteps) +
                    " or " + std::to_string(kPersistMixedCvtSteps) + " k-steps by cvt, got " +
                    std::to_string(cvt_steps));
  }
  if (n <= 0 || ctas <= 0) return;
  const size_t smem = score_wgmma_persistent_smem_bytes(fp8_mma);
  const auto kernel = fp8_mma ? indexer_score_wgmma_persistent_kernel<0, true>
                      : cvt_steps == kSteps
                          ? indexer_score_wgmma_persistent_kernel<kSteps, false>
                          : indexer_score_wgmma_persistent_kernel<kPersistMixedCvtSteps, false>;
  smem_limits.allow(kernel, smem);
  const int threads = persistent_shape(fp8_mma).threads();
  // No more query rows than sequences: decode, each sequence's records read by one token.
  const bool records_read_once = l.num_tokens <= l.num_seqs;
  launch_programmatic("indexer_topk", dim3(static_cast<unsigned>(ctas)), dim3(threads), smem,
                      stream, pdl, kernel, a, l, static_cast<int>(n), records_read_once);
  DEEPINFER_CUDA_LAUNCH_CHECK("indexer_topk");
}

}  // namespace deepinfer::cuda
