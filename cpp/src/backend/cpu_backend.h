// The CPU reference backend: every Backend op in fp32 on host memory, executed in order on one
// worker thread (CpuStream) that splits heavy loops over a ThreadPool.
//
// Each op (called by the Backend front once the arguments' metadata is checked) allocates its
// outputs on the calling thread, then enqueues the computation. It never reads tensor contents on
// the calling thread: work enqueued earlier may not have produced them yet. Content errors (an id
// out of range, a bad block table) are raised on the worker and surface at the next
// synchronize() / Event::wait().
//
// The op implementations are split by family: cpu_backend.cpp (memory, sync), cpu_ops_dense.cpp,
// cpu_ops_hc.cpp, cpu_ops_engram.cpp (V4.1), cpu_ops_moe.cpp, cpu_ops_cache.cpp,
// cpu_ops_attention.cpp and cpu_ops_sample.cpp (sampling and the small token/state-slot ops around
// it).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "backend/cpu_stream.h"
#include "common/thread_pool.h"
#include "deepinfer/backend.h"
#include "tensor/kv_record.h"

namespace deepinfer {

class CpuBackend final : public Backend {
 public:
  // `num_threads` compute threads (the stream worker plus num_threads - 1 pool workers); 0 picks
  // the hardware concurrency.
  explicit CpuBackend(int num_threads);
  // Drains the stream before the pool goes away (member order).
  ~CpuBackend() override = default;

  DeviceKind device_kind() const override { return DeviceKind::kCpu; }
  std::string name() const override;
  DType weight_dtype(DType) const override { return DType::kF32; }
  // Host memory is device memory: a mapped weight is the host tensor itself.
  bool supports_mapped_host_weights() const override { return true; }
  // f32, bf16, V4's fp8 records (kU8) and V4.1's FP8 / FP4 records (kF8E4M3, kE2M1x2): the
  // reference of every KV format.
  bool supports_kv_cache_dtype(DType dtype) const override {
    return kv_record::is_kv_cache_dtype(dtype);
  }

  Tensor empty(const Shape& shape, DType dtype) override;
  Tensor zeros(const Shape& shape, DType dtype) override;
  std::unique_ptr<Event> record_event() override;

 private:
  Tensor upload_impl(const Tensor& host, DType dtype) override;
  Tensor upload_weight_mapped_impl(const Tensor& host) override;
  Tensor upload_weight_impl(const Tensor& host, DType dtype) override;
  MatrixWeight upload_matrix_weight_impl(const MatrixWeight& host) override;
  Tensor to_host_impl(const Tensor& device) override;
  void copy_to_host_impl(const Tensor& device, const Tensor& host) override;
  void synchronize_impl() override;
  void upload_into_impl(const Tensor& dst, const Tensor& host) override;
  void copy_into_impl(const Tensor& dst, const Tensor& src) override;

  Tensor embedding_impl(const Tensor& table, const Tensor& ids) override;
  Tensor rms_norm_impl(const Tensor& x, const Tensor& weight, float eps) override;
  Tensor linear_impl(const Tensor& x, const MatrixWeight& w, const RowNorm& x_norm) override;
  Tensor grouped_linear_impl(const Tensor& x, const MatrixWeight& w, int groups) override;
  Tensor quantize_activations_impl(const Tensor& x, int group) override;
  Tensor scale_impl(const Tensor& x, float factor) override;
  Tensor add_impl(const Tensor& a, const Tensor& b) override;
  Tensor gather_rows_impl(const Tensor& x, const Tensor& rows) override;
  Tensor rms_norm_rope_kv_impl(const Tensor& x, const Tensor& weight, float eps,
                               const Tensor& positions, const Tensor& inv_freq, DType kv_dtype,
                               int rope_dim) override;
  Tensor rope_impl(const Tensor& x, const Tensor& positions, const Tensor& inv_freq,
                   bool inverse) override;
  Tensor argmax_impl(const Tensor& x) override;
  SampleResult sample_impl(const Tensor& logits, const SamplingBatch& batch) override;
  void adjust_logits_impl(const Tensor& logits, const LogitAdjustments& adjustments) override;
  void select_tokens_impl(const Tensor& tokens, const Tensor& remap,
                          const Tensor& previous) override;
  void shift_rows_impl(const RowShift& shift) override;
  Tensor accept_drafts_impl(const Tensor& samples, const Tensor& tokens,
                            const Tensor& row_start) override;
  void copy_rows_impl(const Tensor& t, const Tensor& src, const Tensor& dst) override;
  void fill_random_normal_impl(const Tensor& t, uint64_t seed, float mean, float std) override;

  Tensor hc_expand_impl(const Tensor& x, int hc_mult) override;
  HcMix hc_pre_impl(const Tensor& X, const Tensor& fn, const Tensor& base, const Tensor& scale,
                    const HcParams& params, const RowNorm& y_norm) override;
  Tensor hc_post_impl(const Tensor& X, const Tensor& out, const Tensor& post,
                      const Tensor& comb) override;
  Tensor hc_head_impl(const Tensor& X, const Tensor& fn, const Tensor& base, const Tensor& scale,
                      const HcParams& params, const RowNorm& y_norm) override;
  HcShiftedMix hc_pre_shifted_impl(const Tensor& X, const Tensor& fn, const Tensor& base,
                                   const Tensor& scale, const Tensor& prev_pre,
                                   const HcParams& params) override;
  Tensor hc_collapse_impl(const Tensor& X, const Tensor& pre) override;
  Tensor engram_hash_impl(const Tensor& ngram, const Tensor& token_map,
                          const EngramHashParams& params) override;
  Tensor embedding_fp8_impl(const Tensor& values, const Tensor& scales, const Tensor& ids) override;
  Tensor engram_gate_impl(const Tensor& X, const Tensor& kv, const Tensor& q_weight,
                          const Tensor& k_weight, float eps) override;

  Routing moe_route_impl(const Tensor& x, const Tensor& gate_w, const Tensor& bias,
                         const Tensor& tid2eid, const Tensor& token_ids, int top_k,
                         float routed_scale) override;
  Tensor moe_experts_impl(const Tensor& x, const Routing& routing, const ExpertWeights& experts,
                          float swiglu_limit) override;
  Tensor swiglu_impl(const Tensor& gate, const Tensor& up, float swiglu_limit) override;

  void ring_write_impl(const Tensor& ring, const Tensor& rows, const BatchLayout& layout,
                       int rope_dim) override;
  Tensor compress_pool_impl(const Tensor& proj, const Tensor& ring, const Tensor& ape,
                            const BatchLayout& layout, const EntryBatch& entries,
                            const CompressSpec& spec) override;
  void scatter_rows_impl(const Tensor& cache, const Tensor& rows, const Tensor& dest,
                         int rope_dim) override;
  Tensor indexer_topk_impl(const Tensor& q, const Tensor& weights, const Tensor& index_cache,
                           const BatchLayout& layout, int ratio, int top_k, float score_scale,
                           float weight_scale) override;
  IndexerQFp8 quantize_indexer_q_impl(const Tensor& q, const Tensor& weights) override;
  Tensor indexer_candidates_impl(const Tensor& q, const Tensor& weights, const Tensor& index_cache,
                                 const BatchLayout& layout, int ratio, int block_entries,
                                 int top_blocks, float score_scale, float weight_scale) override;
  Tensor indexer_topk_in_candidates_impl(const Tensor& q, const Tensor& weights,
                                         const Tensor& index_cache, const BatchLayout& layout,
                                         int ratio, const Tensor& candidates, int block_entries,
                                         int top_k, float score_scale, float weight_scale) override;
  Tensor attention_impl(const Tensor& q, const Tensor& kv, const Tensor& swa_ring,
                        const Tensor& entries, const Tensor& topk, const Tensor& sinks,
                        const BatchLayout& layout, const AttentionSpec& spec) override;

  // Enqueues `task(pool)` on the stream. Tasks capture their tensors by value, which keeps the
  // storage alive until the task has run.
  void enqueue(std::function<void(ThreadPool&)> task);

  // Declared before stream_ so it is destroyed after the stream's worker has drained and joined.
  ThreadPool pool_;
  CpuStream stream_;
};

}  // namespace deepinfer
