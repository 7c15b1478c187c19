// The Backend front of the cache and attention ops (contract in deepinfer/backend.h; the other
// ops' fronts are backend.cpp's): ring and entry writes, compression, the indexer and attention
// check their arguments' metadata here, once for all backends, then call the implementation.
#include <cstdint>
#include <string>

#include "backend/op_checks.h"
#include "deepinfer/backend.h"
#include "deepinfer/error.h"
#include "tensor/kv_record.h"

namespace deepinfer {

using checks::DTypeSet;
using checks::OpChecks;

void Backend::ring_write(const Tensor& ring, const Tensor& rows, const BatchLayout& layout,
                         int rope_dim) {
  const OpChecks c("ring_write", device_kind());
  c.layout(layout, /*need_block_table=*/false);
  if (rows.defined() && ring.defined() && rows.dtype() != DType::kF32 &&
      rows.dtype() == ring.dtype() && kv_record::is_kv_cache_dtype(ring.dtype())) {
    // Rows already in the ring's format (rms_norm_rope_kv's): one record per row.
    c.dense("ring", ring, DTypeSet(ring.dtype()), 3);
    c.tensor("rows", rows, ring.dtype(), {layout.num_tokens, ring.size(2)});
    c.kv_cache_supported("ring", ring, supports_kv_cache_dtype(ring.dtype()));
  } else {
    c.tensor("rows", rows, DType::kF32, {layout.num_tokens, -1});
    c.kv_cache("ring", ring, {-1, -1, -1}, rows.size(1), rope_dim,
               supports_kv_cache_dtype(ring.dtype()));
  }
  if (ring.size(1) == 0) c.fail("ring " + ring.describe() + " has no slots per sequence");
  ring_write_impl(ring, rows, layout, rope_dim);
}

Tensor Backend::compress_pool(const Tensor& proj, const Tensor& ring, const Tensor& ape,
                              const BatchLayout& layout, const EntryBatch& entries,
                              const CompressSpec& spec) {
  const OpChecks c("compress_pool", device_kind());
  if (spec.ratio < 1 || spec.head_dim < 1) {
    c.fail("spec needs ratio >= 1 and head_dim >= 1, got ratio " + std::to_string(spec.ratio) +
           ", head_dim " + std::to_string(spec.head_dim));
  }
  const int64_t width = spec.overlap ? 2 * spec.head_dim : spec.head_dim;  // C
  c.layout(layout, /*need_block_table=*/false);
  c.tensor("proj", proj, DType::kF32, {layout.num_tokens, 2 * width});
  c.tensor("ring", ring, DType::kF32, {-1, -1, 2 * width});
  if (ring.size(1) == 0) c.fail("ring " + ring.describe() + " has no slots per sequence");
  c.tensor("ape", ape, DType::kF32, {spec.ratio, width});
  const int64_t num_entries = entries.num_entries;
  if (num_entries < 0) c.fail("entries.num_entries is negative: " + std::to_string(num_entries));
  c.tensor("entries.seq", entries.seq, DType::kI32, {num_entries});
  c.tensor("entries.window", entries.window, DType::kI32, {num_entries});
  return compress_pool_impl(proj, ring, ape, layout, entries, spec);
}

void Backend::scatter_rows(const Tensor& cache, const Tensor& rows, const Tensor& dest,
                           int rope_dim) {
  const OpChecks c("scatter_rows", device_kind());
  c.tensor("rows", rows, DType::kF32, {-1, -1});
  c.kv_cache("cache", cache, {-1, -1}, rows.size(1), rope_dim,
             supports_kv_cache_dtype(cache.dtype()));
  c.tensor("dest", dest, DType::kI32, {rows.size(0)});
  scatter_rows_impl(cache, rows, dest, rope_dim);
}

namespace {

// The arguments indexer_topk, indexer_candidates and indexer_topk_in_candidates share.
void check_indexer_inputs(const OpChecks& c, const Backend& backend, const Tensor& q,
                          const Tensor& weights, const Tensor& index_cache,
                          const BatchLayout& layout, int ratio) {
  c.layout(layout, /*need_block_table=*/true);
  c.ratio(ratio, layout);
  c.tensor("q", q, {DType::kF32, DType::kF8E4M3}, {layout.num_tokens, -1, -1});
  c.tensor("weights", weights, DType::kF32, {layout.num_tokens, q.size(1)});
  c.kv_cache("index_cache", index_cache, {-1, -1}, q.size(2), /*rope_dim=*/0,
             backend.supports_index_cache_dtype(index_cache.dtype()));
}

}  // namespace

Tensor Backend::indexer_topk(const Tensor& q, const Tensor& weights, const Tensor& index_cache,
                             const BatchLayout& layout, int ratio, int top_k, float score_scale,
                             float weight_scale) {
  const OpChecks c("indexer_topk", device_kind());
  check_indexer_inputs(c, *this, q, weights, index_cache, layout, ratio);
  if (top_k < 0) c.fail("top_k must be >= 0, got " + std::to_string(top_k));
  return indexer_topk_impl(q, weights, index_cache, layout, ratio, top_k, score_scale,
                           weight_scale);
}

IndexerQFp8 Backend::quantize_indexer_q(const Tensor& q, const Tensor& weights) {
  const OpChecks c("quantize_indexer_q", device_kind());
  c.tensor("q", q, DType::kF32, {-1, -1, -1});
  c.tensor("weights", weights, DType::kF32, {q.size(0), q.size(1)});
  return quantize_indexer_q_impl(q, weights);
}

Tensor Backend::indexer_candidates(const Tensor& q, const Tensor& weights,
                                   const Tensor& index_cache, const BatchLayout& layout, int ratio,
                                   int block_entries, int top_blocks, float score_scale,
                                   float weight_scale) {
  const OpChecks c("indexer_candidates", device_kind());
  check_indexer_inputs(c, *this, q, weights, index_cache, layout, ratio);
  if (block_entries < 1) c.fail("block_entries must be >= 1, got " + std::to_string(block_entries));
  if (top_blocks < 0) c.fail("top_blocks must be >= 0, got " + std::to_string(top_blocks));
  return indexer_candidates_impl(q, weights, index_cache, layout, ratio, block_entries, top_blocks,
                                 score_scale, weight_scale);
}

Tensor Backend::indexer_topk_in_candidates(const Tensor& q, const Tensor& weights,
                                           const Tensor& index_cache, const BatchLayout& layout,
                                           int ratio, const Tensor& candidates, int block_entries,
                                           int top_k, float score_scale, float weight_scale) {
  const OpChecks c("indexer_topk_in_candidates", device_kind());
  check_indexer_inputs(c, *this, q, weights, index_cache, layout, ratio);
  c.tensor("candidates", candidates, DType::kI32, {layout.num_tokens, -1});
  if (block_entries < 1) c.fail("block_entries must be >= 1, got " + std::to_string(block_entries));
  if (top_k < 0) c.fail("top_k must be >= 0, got " + std::to_string(top_k));
  return indexer_topk_in_candidates_impl(q, weights, index_cache, layout, ratio, candidates,
                                         block_entries, top_k, score_scale, weight_scale);
}

Tensor Backend::attention(const Tensor& q, const Tensor& kv, const Tensor& swa_ring,
                          const Tensor& entries, const Tensor& topk, const Tensor& sinks,
                          const BatchLayout& layout, const AttentionSpec& spec) {
  const OpChecks c("attention", device_kind());
  const bool compressed = spec.ratio > 0;
  c.layout(layout, /*need_block_table=*/compressed);
  if (spec.window < 1) c.fail("spec.window must be >= 1, got " + std::to_string(spec.window));
  const int64_t tokens = layout.num_tokens;
  // bf16 q: rms_norm_rope's under bf16_output (see rms_norm_rope).
  c.tensor("q", q, {DType::kF32, DType::kBF16}, {tokens, -1, -1});
  const int64_t dim = q.size(2);
  c.kv_cache("swa_ring", swa_ring, {-1, -1, -1}, dim, spec.rope_dim,
             supports_kv_cache_dtype(swa_ring.dtype()));
  if (kv.defined() && kv.dtype() != DType::kF32) {
    // This call's keys already in the ring's format (rms_norm_rope_kv's rows).
    if (kv.dtype() != swa_ring.dtype()) {
      c.fail("argument kv " + kv.describe() +
             " must be f32 rows, or rows in the format of swa_ring " + swa_ring.describe());
    }
    c.tensor("kv", kv, swa_ring.dtype(), {tokens, swa_ring.size(2)});
  } else {
    c.tensor("kv", kv, DType::kF32, {tokens, dim});
  }
  c.tensor("sinks", sinks, DType::kF32, {q.size(1)});
  if (compressed) {
    c.ratio(spec.ratio, layout);
    c.kv_cache("entries", entries, {-1, -1}, dim, spec.rope_dim,
               supports_kv_cache_dtype(entries.dtype()));
    // One dtype, or V4.1's pair: FP8 SWA keys with FP4 compressed entries.
    const bool v41_pair = swa_ring.dtype() == DType::kF8E4M3 && entries.dtype() == DType::kE2M1x2;
    if (entries.dtype() != swa_ring.dtype() && !v41_pair) {
      c.fail("arguments swa_ring " + swa_ring.describe() + " and entries " + entries.describe() +
             " must be KV caches of one dtype, or f8_e4m3 and e2m1x2 (DeepSeek-V4.1's formats)");
    }
    if (spec.sparse) c.tensor("topk", topk, DType::kI32, {tokens, -1});
  }
  c.optional("spec.swa_start", spec.swa_start, DType::kI32, {layout.num_seqs});
  c.optional("spec.output_rope_inv_freq", spec.output_rope_inv_freq, DType::kF32, {-1});
  if (spec.output_rope_inv_freq.defined() && 2 * spec.output_rope_inv_freq.size(0) > dim) {
    c.fail("spec.output_rope_inv_freq " + spec.output_rope_inv_freq.describe() +
           " rotates more than the head dim " + std::to_string(dim) + " channels");
  }
  return attention_impl(q, kv, swa_ring, entries, topk, sinks, layout, spec);
}

}  // namespace deepinfer
