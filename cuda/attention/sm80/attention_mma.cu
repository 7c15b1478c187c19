// Tensor-core attention for AttentionSpec::bf16_math (docs/model.md#attention): the same op as
// the f32 kernel of attention_f32.cu (same key list, masks, sinks and split format), with q, the
// keys and the probabilities rounded to bf16 and multiplied by mma.sync m16n8k16 (f32
// accumulation, f32 online softmax). sm_80+ instructions (cp.async, ldmatrix, mma.sync), built
// for sm_90a and sm_100a. CudaBackend::attention runs it when bf16_math is set and the shape is
// supported (D in {64, 128, 256, 512}, attention_heuristics.h); otherwise the f32 kernel runs.
//
// Why this shape of kernel: the model is MQA (one K=V vector per key shared by all heads) and its
// decode steps have one or two query tokens per sequence. Putting all heads of a token (up to 64)
// in one block gives the M dimension of the tensor-core products (heads x keys for S = Q K^T,
// heads x channels for O = P V) even for a single query token, and every key tile is read from
// global memory once per token instead of once per head group. Keys are rows of the caches'
// format (kv_record.cuh; the kernel is instantiated per format): f32 (2 KB per key at D = 512),
// bf16 (1 KB) or the fp8 record (584 B), so global traffic bounds the kernel; everything else is
// arranged so that the next tile's copy is in flight while the current one is multiplied.
//
// Block (token t, group of 64 or 16 heads, key split), 8 warps (two warp layouts, kSlices below).
// Shared memory (D = 512: 217 KB):
//   q      [64][D+8] bf16   q of the group's heads, rounded once (rows past the heads are 0)
//   stage  [32][4D]  bytes  the next key tile's f32 rows or fp8 records, copied with cp.async
//   kb     2 x [32][D+8] bf16  the key tiles (double buffered): rounded or decoded from the
//                              stage, or (bf16 caches) the rows copied there directly
//   ss     [slices][rows][40] f32  partial logits of the slices of D (8 x 16 rows of 40 floats)
//   ssum   [16][40] f32     summed logits (the 8-slice layout)
//   valid  2 x [32] int       which keys of a kb buffer are real (masked keys are zero rows)
// The +8 bf16 of padding (16 bytes) puts the 8 rows an ldmatrix reads in 8 different bank groups.
//
// The pipeline, phase by phase (the device functions of attention_mma_tile.cuh, in this order,
// then store_output and combine_if_last_split below):
//  - load_query_tile: q of the group's heads, rounded to bf16, while key tile 0 is in flight.
//  - per tile: round_key_tile (f32) or decode_key_tile (fp8: after a __syncwarp, as a key's
//    scale bytes come from its other threads) from the stage to kb[i%2] (bf16: nothing, the
//    copies landed in kb[i%2]), then one __syncthreads; issue_key_copy (copy_bf16_key into
//    kb[(i+1)%2]) of the next tile, score_key_tile (S partial over the warp's
//    slice of D), row_group_barrier, gather_logits (the slices' sums), online_softmax_update
//    (the running max and denominator, P as A fragments), accumulate_values (O = O * alpha +
//    P V), and the next key's address.
//  - store_output: the sink and out, or the split's partial sums;
//  - combine_if_last_split (the fused combine, a.counters set): the last split block of the
//    (token, head group) merges the partial sums into out.
//
// Copy and conversion: thread tid owns key tid/8 of a tile and its float4 columns tid%8 + 8j.
// It issues the cp.async of its own columns, and later converts exactly those columns to bf16,
// so the stage needs no block barrier: cp.async.wait_all makes a thread's own copies visible to
// it. One __syncthreads per tile then publishes kb[i%2] (and orders it after every warp is done
// with tile i-2, the previous user of that buffer, and with ss of tile i-1). bf16 rows need no
// conversion: each thread's copies go to kb[(i+1)%2] once the barrier of tile i shows every warp
// done with tile i-1, and the barrier of tile i+1 (after each thread's cp.async.wait_all)
// publishes them.
//
// Warp layouts (template parameter kSlices): warp w is in row group rg = w % (8 / kSlices) (heads
// 16rg .. 16rg+15) and slice = w / (8 / kSlices) (channels slice*D/kSlices ..).
//  - kSlices 2: 4 row groups x 2 halves of D, 64 heads per block: each key tile feeds all heads
//    of a token, the layout for many tokens.
//  - kSlices 8: 1 row group x 8 slices of D, 16 heads per block: a quarter of the products per
//    tile spread over all 8 warps, so few tokens (B = 1) split over 4x more blocks, with 4x less
//    partial output per block for the fused combine; each key is read once per 16 heads.
//  - S = Q K^T: the warp multiplies its 16 rows by all 32 keys of the tile over ITS slice of D
//    (ldmatrix for both operands: K is stored key-major, i.e. exactly the "col" B operand) and
//    writes the partial sums to ss[slice]. After a named barrier of the row group's warps
//    (bar.sync 1+rg) the partials are added in slice order (gather_logits), so every warp of the
//    group holds bit-identical logits, runs the identical online softmax, and keeps identical
//    (max, sum) registers: no second exchange is needed. Splitting D (rather than the keys) for S
//    divides the q fragments each warp loads per tile.
//  - softmax: per head row in registers (the m16n8 accumulator layout: c0, c1 in row lane/4,
//    c2, c3 in row lane/4 + 8, columns 2*(lane%4) + {0, 1}); masked keys get -inf. The
//    probabilities are rounded to bf16 and, because the C layout of two adjacent n8 tiles is the
//    A layout of one k16 step, become the A fragments of P V without going through shared memory.
//  - O += P V: the warp owns O[16 rows][its slice of D] in registers (D/(2 kSlices) floats per
//    thread; 128 at D = 512 with 2 slices) and reads V = the same kb tile with ldmatrix.trans (kb
//    is [key][channel], i.e. a row-major K x N operand).
// With one split the block applies the sink and writes out; otherwise it writes the unnormalised
// O and (max, denominator) per head in the f32 kernel's part_acc / part_md layout, merged with
// the sink either by the last split block of the (token, head group) (a.counters: its arrival
// counter, reset by that block so a graph replay starts from zero; in split order, so the result
// is deterministic) or by attention_combine.cu.
//
// The start, for a programmatic dependent launch: the block lets the combine launch, reads the
// layout's tables (positions, sequence bounds, the sequence's block-table row into shared memory)
// and AttentionSpec::swa_start, and only then waits for the previous grid, before any read of q,
// the top-k columns or a key record (this call's kv rows and the top-k are the previous kernels'
// outputs). No kernel writes those tables within a forward: they are uploaded (cuda/README.md).
// With the combine's own early trigger (attention_combine.cu), a B = 1 decode call (fp8 KV, top-512
// + 128 window) went 9.69-9.71 -> 9.17-9.19 us on an H100; the reads before the wait alone, behind
// a combine that let nothing launch early, were 0.15 us slower.
//
// Robustness is that of the f32 kernel (see attention.cu): invalid or masked keys are zero rows
// with logit -inf, out-of-range entries are not visible, no host sync, grid and scratch sized
// from host metadata only, so the op can be captured in a CUDA graph.
#include <cuda_bf16.h>

#include <cstdint>
#include <string>

#include "cuda/attention/attention_keys.cuh"
#include "cuda/attention/attention_launch.h"
#include "cuda/attention/sm80/attention_mma_config.h"
#include "cuda/attention/sm80/attention_mma_tile.cuh"
#include "cuda/attention/sm80/attention_mma_trace.cuh"
#include "cuda/cache/kv_record.cuh"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/fp8.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/common/vec.cuh"

namespace deepinfer::cuda {

namespace {

using namespace attention_mma;  // NOLINT: the per-tile steps

// Rows g and g + 8 of the warp's O: with one split out = O / (d e^(m-M) + e^(sink-M)), else the
// unnormalised O and (max, denominator) of the split for attention_combine.
template <int kDim, int kSlices>
__device__ __forceinline__ void store_output(const AttentionArgs& a, const DeviceLayout& l,
                                             const float (&o)[kDim / kSlices / 8][4],
                                             const float (&m_run)[2], const float (&d_run)[2],
                                             int t, int h_first, int nhb, int rg, int slice, int g,
                                             int qd) {
  constexpr int kSliceDim = kDim / kSlices;
  constexpr int kNTiles = kSliceDim / 8;
  const int split = blockIdx.z;
  const int splits = gridDim.z;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = 16 * rg + g + 8 * r;
    if (row >= nhb) continue;
    const int64_t head = h_first + row;
    const float m = m_run[r];
    const float d = d_run[r];
    const int64_t idx = static_cast<int64_t>(t) * a.heads + head;
    if (splits == 1) {
      // softmax(logits ++ sink) without the sink column: divide by d e^(m-M) + e^(sink-M).
      const float sink = a.sinks[head];
      const float mx = fmaxf(m, sink);
      const float em = m == -INFINITY ? 0.0f : expf(m - mx);
      const float f = em / (d * em + expf(sink - mx));
      float* dst = a.out + idx * kDim + slice * kSliceDim + 2 * qd;
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[j][2 * r] * f, o[j][2 * r + 1] * f);
      }
    } else {
      const int64_t pidx = static_cast<int64_t>(split) * l.num_tokens * a.heads + idx;
      float* dst = a.part_acc + pidx * kDim + slice * kSliceDim + 2 * qd;
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[j][2 * r], o[j][2 * r + 1]);
      }
      if (slice == 0 && qd == 0) {
        a.part_md[2 * pidx] = m;
        a.part_md[2 * pidx + 1] = d;
      }
    }
  }
}

// The fused combine of a split block, after its store_output: the block counts its arrival in
// a.counters[t, head group]; the last of the token's gridDim.z splits to arrive resets the counter
// (the next launch, a graph replay included, starts from 0) and merges every split's partial
// sums with the sink into out, in split order, so the result does not depend on which block came
// last (it equals attention_combine.cu's). The partials are read from L2 (ld.global.cg): this
// block's L1 may hold none of them, but the loads must not be served from it either.
// `scratch` holds kAttnMaxSplits x kMmaRows split weights and kMmaRows inverse denominators.
template <int kDim>
__device__ __forceinline__ void combine_if_last_split(const AttentionArgs& a, const DeviceLayout& l,
                                                      int t, int h_first, int nhb, float* scratch,
                                                      int* last_flag) {
  const int tid = threadIdx.x;
  const int splits = gridDim.z;
  __threadfence();  // this block's partials before its arrival is counted
  __syncthreads();
  if (tid == 0) {
    int* counter = a.counters + static_cast<int64_t>(t) * gridDim.y + blockIdx.y;
    const bool last = atomicAdd(counter, 1) == splits - 1;
    if (last) atomicExch(counter, 0);
    *last_flag = last ? 1 : 0;
  }
  __syncthreads();
  if (*last_flag == 0) return;
  __threadfence();  // the other splits' partials, after their arrivals were counted
  const int64_t stride = static_cast<int64_t>(l.num_tokens) * a.heads;  // between splits
  const int64_t idx0 = static_cast<int64_t>(t) * a.heads + h_first;
  float* w = scratch;                                // [split][kMmaRows]
  float* inv = scratch + kAttnMaxSplits * kMmaRows;  // [kMmaRows]
  for (int r = tid; r < nhb; r += kMmaThreads) {
    const float sink = a.sinks[h_first + r];
    float mx = sink;
    for (int s = 0; s < splits; ++s)
      mx = fmaxf(mx, __ldcg(a.part_md + 2 * (s * stride + idx0 + r)));
    float den = expf(sink - mx);
    for (int s = 0; s < splits; ++s) {
      const float2 md = __ldcg(reinterpret_cast<const float2*>(a.part_md) + s * stride + idx0 + r);
      const float ws = md.x == -INFINITY ? 0.0f : expf(md.x - mx);  // an empty split weighs 0
      w[s * kMmaRows + r] = ws;
      den += md.y * ws;
    }
    inv[r] = 1.0f / den;
  }
  __syncthreads();
  // The sums: kGroup float4 outputs per thread per pass, splits outermost, so that one block has
  // kGroup x 4 loads per thread in flight (a single block reads every split's partials; one
  // output at a time would wait out an L2 round trip per few loads). Each output still adds its
  // splits in split order.
  constexpr int kQ4 = kDim / 4;
  constexpr int kGroup = 8;
  const float4* acc4 = reinterpret_cast<const float4*>(a.part_acc);
  const int n4 = nhb * kQ4;
  for (int e0 = tid; e0 < n4; e0 += kGroup * kMmaThreads) {
    int row[kGroup];
    int64_t base[kGroup];  // float4 index of the output (split 0's partial: the same index)
    float4 v[kGroup];
#pragma unroll
    for (int k = 0; k < kGroup; ++k) {
      const int e = min(e0 + k * kMmaThreads, n4 - 1);  // past n4: a repeat, not stored
      row[k] = e / kQ4;
      base[k] = (idx0 + row[k]) * kQ4 + (e - row[k] * kQ4);
      v[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll 4
    for (int s = 0; s < splits; ++s) {
      const float4* part = acc4 + s * stride * kQ4;
      const float* ws = w + s * kMmaRows;
#pragma unroll
      for (int k = 0; k < kGroup; ++k) v[k] = fma4(ws[row[k]], __ldcg(part + base[k]), v[k]);
    }
#pragma unroll
    for (int k = 0; k < kGroup; ++k) {
      if (e0 + k * kMmaThreads >= n4) break;
      const float f = inv[row[k]];
      reinterpret_cast<float4*>(a.out)[base[k]] =
          make_float4(v[k].x * f, v[k].y * f, v[k].z * f, v[k].w * f);
    }
  }
}

// kTrace: the trace instantiation, stamping each phase's end (attention_mma_trace.cuh).
template <int kDim, KvFormat kFmt, int kSlices, bool kTrace>
__global__ void __launch_bounds__(kMmaThreads, 1)
    attention_mma_kernel(AttentionArgs a, DeviceLayout l) {
  using L = MmaLayout<kDim>;
  using W = WarpLayout<kSlices>;
  constexpr int kStride = L::kStride;
  constexpr int kRows = W::kRows;
  constexpr int kSliceDim = kDim / kSlices;  // channels of a warp (S partial sums and O)
  constexpr int kNTiles = kSliceDim / 8;     // n8 tiles of a warp's O
  static_assert(kSliceDim % 16 == 0 && kNTiles % 2 == 0, "whole k16 steps and n16 pairs");
  static_assert(
      L::kValidOff - L::kCombineOff >= (size_t{kAttnMaxSplits} + 1) * kMmaRows * sizeof(float),
      "the fused combine's weights fit the regions it overwrites");
  extern __shared__ int4 smem_raw[];
  __shared__ int last_flag;
  __shared__ int32_t table_s[kMmaTableEntries];  // the sequence's block-table row (the start)
  char* smem = reinterpret_cast<char*>(smem_raw);
  __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(smem);
  uint8_t* stage = reinterpret_cast<uint8_t*>(smem + L::kStageOff);
  __nv_bfloat16* kb_base = reinterpret_cast<__nv_bfloat16*>(smem + L::kKbOff);
  float* ss = reinterpret_cast<float*>(smem + L::kSsOff);
  float* ssum = reinterpret_cast<float*>(smem + L::kSumOff);
  int* valid_base = reinterpret_cast<int*>(smem + L::kValidOff);

  // This grid may be a programmatic dependent launch of the kernel before it (the backend's pdl),
  // and the separate combine is one of this grid: its blocks are scheduled while this grid runs
  // and wait for it to complete (griddepcontrol.wait). The combine may launch at once; this grid
  // waits for its predecessor below, after the reads of the layout (the head comment's start).
  const MmaTraceRecorder<kTrace> trace(a.mma_trace);
  trace.start();
  let_dependents_launch();
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int rg = warp % W::kRowGroups;
  const int slice = warp / W::kRowGroups;
  const int g = lane >> 2;  // accumulator row (and row + 8)
  const int qd = lane & 3;  // accumulator columns 2qd, 2qd + 1
  const int t = blockIdx.x;
  const int h_first = blockIdx.y * kRows;
  const int nhb = min(kRows, a.heads - h_first);

  // Copy role: key `cr` of each tile, float4 columns cs + 8j.
  const int cr = tid >> 3;
  const int cs = tid & 7;

  // Before the wait, only the layout's tables, swa_start and the kernel's arguments: no kernel
  // writes them within a forward. This token's key list (the same keys as the f32 kernel), this
  // split's range of it (its integer divisions then stay off the path after the wait), and for a
  // sparse list the sequence's block-table row in shared memory, so that the top-k entries (the
  // previous grid's output in the model) find their rows without another global round trip: a
  // decode block's first tile waits for two global round trips after the wait (top-k, record).
  const AttentionKeys keys(a, l, t);
  const KeyRange range = split_key_range<kMmaKeys>(keys.n_keys, blockIdx.z, gridDim.z);
  const bool table_in_smem = a.sparse && l.max_blocks <= kMmaTableEntries;
  // This thread's first key, and whether it is a top-k entry (of column first - n_sliding).
  const int64_t first = range.begin + cr;
  const bool first_topk = a.sparse && first < range.end && first >= keys.n_sliding;
  const int32_t* first_topk_at =
      first_topk ? a.topk + static_cast<int64_t>(t) * a.topk_cols + (first - keys.n_sliding)
                 : nullptr;
  if (table_in_smem) {
    for (int i = tid; i < l.max_blocks; i += kMmaThreads) {
      table_s[i] = l.block_table[static_cast<int64_t>(keys.b) * l.max_blocks + i];
    }
  }
  __syncthreads();  // table_s
  trace.stamp(kMmaTraceTable);
  wait_for_previous_grid();
  trace.waited();
  const float probe = trace.probe_load(a.sinks + h_first);  // the trace's only: a weight
  const int64_t first_entry = first_topk ? int64_t{*first_topk_at} : int64_t{-1};
  trace.stamp_after(kMmaTraceProbe, probe);
  // keys.entry, by the block table in shared memory where it is there.
  auto entry_at = [&](int64_t j) -> const uint8_t* {
    return table_in_smem ? keys.entry_in(a, table_s, l.max_blocks, j) : keys.entry(a, l, j);
  };
  // Key i of the list, or null when it is masked (keys.key, a top-k entry through entry_at).
  auto key_at = [&](int64_t i) -> const uint8_t* {
    if (i >= range.end) return nullptr;
    if (!a.sparse || i < keys.n_sliding) return keys.key(a, l, i);
    return entry_at(a.topk[static_cast<int64_t>(t) * a.topk_cols + (i - keys.n_sliding)]);
  };
  const int row_bytes = static_cast<int>(a.kvf.row_bytes);

  uint8_t* my_stage = stage + cr * L::kStageRowBytes;

  float o[kNTiles][4];
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};  // rows g, g + 8
  float d_run[2] = {0.0f, 0.0f};
  const bool active = rg * 16 < nhb;  // uniform over a row group: rows past the heads are idle

  // A key's address takes dependent loads (topk, then the block table), so it is resolved one
  // tile ahead, at the end of the previous iteration, where its latency overlaps the wait for
  // the copy in flight instead of delaying the products.
  bool my_valid = false;              // this thread's key of the tile in the stage
  const uint8_t* src_next = nullptr;  // this thread's key of the next tile to issue
  if (range.begin < range.end) {
    const uint8_t* src0 = first_topk ? entry_at(first_entry) : key_at(first);
    trace.stamp_after(kMmaTraceTopk, src0);
    if constexpr (kFmt == KvFormat::kBf16) {  // flies while q is rounded
      copy_bf16_key<kDim>(kb_base, valid_base, src0, cr, cs);
    } else {
      issue_key_copy<kDim, kFmt>(my_stage, src0, cs, row_bytes);
    }
    my_valid = src0 != nullptr;
    trace.stamp(kMmaTraceIssued);
    src_next = key_at(range.begin + kMmaKeys + cr);
    load_query_tile<kDim, kRows>(a, qs, t, h_first, nhb, tid);
    trace.stamp(kMmaTraceQuery);
  }

  // Per-lane ldmatrix row addresses (see the fragment layouts in the header):
  //  - A of S (q rows): matrix i = lane/8 is rows +8*(i%2), columns +8*(i/2).
  //  - B of S (keys, "col"): matrix i is keys +8*(i/2), channels +8*(i%2): registers 0,1 are
  //    the b0b1 / b2b3 of keys 0..7 of a 16-key pair, registers 2,3 those of keys 8..15.
  //  - B of P V (keys x channels, row-major, .trans): matrix i is keys +8*(i%2), channels
  //    +8*(i/2): registers 0,1 for channels 0..7 of a 16-channel pair, 2,3 for channels 8..15.
  const int lrow = lane & 7;
  const int bit3 = (lane >> 3) & 1;
  const int bit4 = lane >> 4;
  const __nv_bfloat16* q_frag =
      qs + (16 * rg + lrow + 8 * bit3) * kStride + slice * kSliceDim + 8 * bit4;
  const int k_frag = (lrow + 8 * bit4) * kStride + slice * kSliceDim + 8 * bit3;
  const int v_frag = (lrow + 8 * bit3) * kStride + slice * kSliceDim + 8 * bit4;
  // ss: [slice][kRows][kMmaSStride]; this row group's rows of slice 0 start at ss_rows.
  const float* ss_rows = ss + 16 * rg * kMmaSStride;
  float* ss_mine = ss + slice * (kRows * kMmaSStride) + 16 * rg * kMmaSStride;

  int it = 0;
  for (int64_t i0 = range.begin; i0 < range.end; i0 += kMmaKeys, ++it) {
    __nv_bfloat16* kb = kb_base + (it & 1) * (kMmaKeys * kStride);
    int* valid = valid_base + (it & 1) * kMmaKeys;
    cp_async_wait_all();
    if constexpr (kFmt == KvFormat::kF32) {
      round_key_tile<kDim>(kb, valid, reinterpret_cast<const float*>(my_stage), my_valid, cr, cs);
    } else if constexpr (kFmt == KvFormat::kFp8) {
      __syncwarp();  // the key's other 7 threads copied its scale bytes
      decode_key_tile<kDim>(kb, valid, my_stage, my_valid, cr, cs, a.kvf.nope(), a.kvf.rope_dim);
    }  // bf16: the copies landed in kb itself
    __syncthreads();
    if (it == 0) trace.stamp(kMmaTraceFirstTile);
    // The next tile's copy overlaps this tile's products. The stage is free: every thread is past
    // its conversion (the barrier above), including the fp8 decoders that read their key's
    // scale and RoPE bytes copied by other threads. So is the other kb buffer (bf16 copies go
    // there): every warp is past tile i - 1, its previous user.
    if (i0 + kMmaKeys < range.end) {
      if constexpr (kFmt == KvFormat::kBf16) {
        const int next = (it + 1) & 1;
        copy_bf16_key<kDim>(kb_base + next * (kMmaKeys * kStride), valid_base + next * kMmaKeys,
                            src_next, cr, cs);
      } else {
        issue_key_copy<kDim, kFmt>(my_stage, src_next, cs, row_bytes);
      }
      my_valid = src_next != nullptr;
    }
    if (active) {
      score_key_tile<kDim, kSlices>(q_frag, kb, k_frag, ss_mine, g, qd);
      row_group_barrier<kSlices>(rg);
      if (it == 0) trace.stamp(kMmaTraceScores);
      float sl[4][4];  // the tile's logits of rows g, g + 8
      gather_logits<kSlices>(ss_rows, ssum, valid, a.scale, slice, rg, lane, sl);
      if (it == 0) trace.stamp_after(kMmaTraceGathered, sl[3][3]);
      float alpha[2];
      uint32_t pa[2][4];  // P as the A fragments of the two k16 steps of P V
      online_softmax_update(sl, m_run, d_run, alpha, pa);
      if (it == 0) trace.stamp_after(kMmaTraceSoftmax, d_run[0]);
      accumulate_values<kDim, kSlices>(o, alpha, pa, kb, v_frag);
      if (it == 0) trace.stamp_after(kMmaTraceValues, o[kNTiles - 1][3]);
    }                                           // active
    src_next = key_at(i0 + 2 * kMmaKeys + cr);  // null past range.end
  }

  trace.stamp(kMmaTraceLoop);
  if (active) store_output<kDim, kSlices>(a, l, o, m_run, d_run, t, h_first, nhb, rg, slice, g, qd);
  trace.finish(it);
  if (a.counters != nullptr && gridDim.z > 1) {
    // Every thread is past the key loop (the barrier inside), so the stage, kb and ss are free.
    combine_if_last_split<kDim>(a, l, t, h_first, nhb,
                                reinterpret_cast<float*>(smem + L::kCombineOff), &last_flag);
  }
}

template <int kDim, KvFormat kFmt, int kSlices, bool kTrace>
void launch_mma_kernel(const AttentionArgs& a, const DeviceLayout& l, const AttentionMmaConfig& c,
                       int64_t tokens, bool pdl, cudaStream_t stream) {
  allow_smem(attention_mma_kernel<kDim, kFmt, kSlices, kTrace>, MmaLayout<kDim>::kBytes);
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(c.plan.head_groups),
                  static_cast<unsigned>(c.plan.splits));
  launch_programmatic("attention", grid, dim3(kMmaThreads), MmaLayout<kDim>::kBytes, stream, pdl,
                      attention_mma_kernel<kDim, kFmt, kSlices, kTrace>, a, l);
}

// The trace instantiations exist for the small-batch route's kernel only (D = 512, 16-head
// blocks, bf16 rows or fp8 records); elsewhere a trace buffer is ignored.
template <int kDim, KvFormat kFmt, int kSlices>
void launch_mma(const AttentionArgs& a, const DeviceLayout& l, const AttentionMmaConfig& c,
                int64_t tokens, bool pdl, cudaStream_t stream) {
  if constexpr (kDim == 512 && kSlices == 8 && kFmt != KvFormat::kF32) {
    if (a.mma_trace.stamps != nullptr) {
      return launch_mma_kernel<kDim, kFmt, kSlices, true>(a, l, c, tokens, pdl, stream);
    }
  }
  launch_mma_kernel<kDim, kFmt, kSlices, false>(a, l, c, tokens, pdl, stream);
}

template <int kDim, KvFormat kFmt>
void launch_mma_slices(const AttentionArgs& a, const DeviceLayout& l, const AttentionMmaConfig& c,
                       int64_t tokens, bool pdl, cudaStream_t stream) {
  if (c.plan.slices == 2) return launch_mma<kDim, kFmt, 2>(a, l, c, tokens, pdl, stream);
  if constexpr (mma_rows16_supported(kDim)) {
    if (c.plan.slices == 8) return launch_mma<kDim, kFmt, 8>(a, l, c, tokens, pdl, stream);
  }
  fail("attention", "no tensor-core kernel of " + std::to_string(c.plan.rows) +
                        " heads per block for head dim " + std::to_string(kDim));
}

template <int kDim>
void launch_mma_dim(const AttentionArgs& a, const DeviceLayout& l, const AttentionMmaConfig& c,
                    int64_t tokens, bool pdl, cudaStream_t stream) {
  switch (a.kvf.format) {
    case KvFormat::kF32:
      return launch_mma_slices<kDim, KvFormat::kF32>(a, l, c, tokens, pdl, stream);
    case KvFormat::kBf16:
      return launch_mma_slices<kDim, KvFormat::kBf16>(a, l, c, tokens, pdl, stream);
    case KvFormat::kFp8:
      return launch_mma_slices<kDim, KvFormat::kFp8>(a, l, c, tokens, pdl, stream);
  }
}

}  // namespace

void launch_attention_mma(const AttentionArgs& a, const DeviceLayout& l,
                          const AttentionMmaConfig& c, int64_t tokens, bool pdl,
                          cudaStream_t stream) {
  switch (a.dim) {  // the dims of mma_smem_bytes: c.supported only for these
    case 64:
      return launch_mma_dim<64>(a, l, c, tokens, pdl, stream);
    case 128:
      return launch_mma_dim<128>(a, l, c, tokens, pdl, stream);
    case 256:
      return launch_mma_dim<256>(a, l, c, tokens, pdl, stream);
    case 512:
      return launch_mma_dim<512>(a, l, c, tokens, pdl, stream);
    default:
      fail("attention", "no tensor-core kernel for head dim " + std::to_string(a.dim));
  }
}

}  // namespace deepinfer::cuda
