// The problem parameters of attention, one struct for both kernels (the f32 kernel of
// attention_f32.cu and the tensor-core kernel of sm80/attention_mma.cu): the same key list, the
// same sinks and the same split-output format. docs/model.md#attention has the op.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/attention/sm80/attention_mma_trace.h"
#include "cuda/cache/kv_record.cuh"
#include "deepinfer/backend.h"

namespace deepinfer::cuda {

// Key splits of one token at most: the split outputs' format, merged by attention_combine.cu.
constexpr int kAttnMaxSplits = 64;

// The keys (this call's kv, the ring; the entries) are rows of kvf.row_bytes (entf.row_bytes)
// bytes in the caches' formats (kv_record.cuh); with a bf16 or fp8 cache, this call's kv rows are
// encoded into that format before the kernels run, so a key reads the same now as from the ring
// later.
struct AttentionArgs {
  // q [T, heads, dim]: f32 in q, or bf16 in q_bf16 (a backend's rms_norm_rope under bf16_output,
  // read by the warp-specialised Hopper kernel, attention_wgmma_overlap.cu, as the bf16 tile it
  // makes of f32 q; the launch widens it into q for the other kernels). The other is null.
  const float* q;
  const __nv_bfloat16* q_bf16;
  const uint8_t* kv;         // [T] rows
  const uint8_t* ring;       // [slots, ring_len] rows
  const uint8_t* entries;    // [entry_rows] rows, or null
  KvRowFormat kvf;           // kv's and the ring's rows
  KvRowFormat entf;          // the entries' rows: kvf's, or V4.1's FP4 main record under FP8 keys
  const int32_t* topk;       // [T, topk_cols] or null
  const float* sinks;        // [heads]
  const int32_t* swa_start;  // [B] first visible sliding position per sequence, or null
  float* out;                // [T, heads, dim] when there is one split
  float* part_acc;           // [splits, T, heads, dim] otherwise
  float* part_md;            // [splits, T, heads, 2]: running max, denominator
  // The output in bf16 instead of `out` (AttentionSpec::bf16_output; out is then null): written
  // by the wgmma_overlap_ilp variant's epilogue with one split, by the combine with several.
  __nv_bfloat16* out_bf16;
  // The tensor-core kernel's fused combine: [T, head groups] arrival counts of the splits, zero
  // between launches (the last block resets its count); null: attention_combine.cu merges.
  int* counters;
  // Where the mma.sync kernel's trace instantiation records (sm80/attention_mma_trace.h); no
  // stamps: the ordinary kernels.
  MmaTraceBuffer mma_trace;
  int64_t slots;
  int64_t ring_len;
  int64_t entry_rows;
  int64_t entry_bound;  // max_blocks_per_seq * epb
  int heads;
  // dim and the head grouping are the f32 kernel's (attention_f32.cu); the tensor-core kernel
  // takes D as a template parameter and 64 heads per block.
  int dim;              // a multiple of 4, at most kAttnMaxDim
  int heads_per_block;  // HB
  int hb_stride;        // HB rounded up to a multiple of 8: row stride of the probability tile
  int window;
  int ratio;  // 0: sliding only
  int epb;
  int topk_cols;
  bool sparse;
  float scale;
  // The device's SMs: the Hopper kernel's guess at which block starts next (its L2 prefetch of
  // that block's q and top-k row); 0: no prefetch.
  int sms;
};

// The arguments of one attention call, except the split outputs (part_acc, part_md) and the f32
// kernel's head grouping, which the launch fills from its config. `kv_rows` holds this call's
// keys in the caches' format (kv itself for f32 caches).
inline AttentionArgs attention_args(const Tensor& q, const void* kv_rows, const Tensor& swa_ring,
                                    const Tensor& entries, const Tensor& topk, const Tensor& sinks,
                                    const BatchLayout& layout, const AttentionSpec& spec,
                                    const Tensor& out) {
  const bool compressed = spec.ratio > 0;
  const bool sparse = compressed && spec.sparse;
  const int64_t epb = compressed ? layout.block_size / spec.ratio : 0;
  AttentionArgs a{};
  if (q.dtype() == DType::kBF16) {
    a.q_bf16 = static_cast<const __nv_bfloat16*>(q.raw_data());
  } else {
    a.q = q.data<float>();
  }
  a.kv = static_cast<const uint8_t*>(kv_rows);
  a.ring = static_cast<const uint8_t*>(swa_ring.raw_data());
  a.entries = compressed ? static_cast<const uint8_t*>(entries.raw_data()) : nullptr;
  a.kvf = kv_row_format(swa_ring.dtype(), q.size(2), spec.rope_dim);
  a.entf = compressed ? kv_row_format(entries.dtype(), q.size(2), spec.rope_dim) : a.kvf;
  a.topk = sparse ? topk.data<int32_t>() : nullptr;
  a.sinks = sinks.data<float>();
  a.swa_start = spec.swa_start.defined() ? spec.swa_start.data<int32_t>() : nullptr;
  a.out = out.data<float>();
  a.slots = swa_ring.size(0);
  a.ring_len = swa_ring.size(1);
  a.entry_rows = compressed ? entries.size(0) : 0;
  a.entry_bound = static_cast<int64_t>(layout.max_blocks_per_seq) * epb;
  a.heads = static_cast<int>(q.size(1));
  a.window = spec.window;
  a.ratio = compressed ? spec.ratio : 0;
  a.epb = static_cast<int>(epb);
  a.topk_cols = static_cast<int>(sparse ? topk.size(1) : 0);
  a.sparse = sparse;
  a.scale = spec.scale;
  a.dim = static_cast<int>(q.size(2));
  return a;
}

// The host's bound on a token's key list (W sliding keys + the compressed entries it can see),
// from which the launches size their key splits.
inline int64_t max_attention_keys(const AttentionArgs& a) {
  return a.window + (a.ratio > 0 ? (a.sparse ? a.topk_cols : a.entry_bound) : 0);
}

}  // namespace deepinfer::cuda
