// The CUDA backend: every Backend op as CUDA kernels or cuBLAS calls on one compute stream. This
// class is the backend's plumbing (backend/cuda_backend.cu, backend/cuda_context.h); each op's
// <op>_impl lives in the kernel family that computes it (cuda/README.md has the map).
//
// Memory comes from the device's stream-ordered pool (cudaMallocAsync / cudaFreeAsync on the
// compute stream, with a release threshold so freed blocks are cached for reuse). A tensor's
// deleter frees it on the stream, so memory is reused only after the work that read it.
// Host -> device uploads go through pinned staging buffers and device -> host copies into pinned
// buffers finished by a host callback, so neither blocks the host: launching a step never waits
// for the device. Activations are f32 (as in the CPU reference); matrix weights keep bf16 when the
// checkpoint is bf16 and feed cuBLAS bf16 GEMMs with f32 accumulation; block-scaled FP8 weights
// keep their e4m3 bytes and f32 scales (gemm/gemm_fp8_heuristics.h).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/attention/attention_plan.h"
#include "cuda/attention/sm80/attention_mma_trace.h"
#include "cuda/attention/sm90/attention_wgmma_trace.h"
#include "cuda/common/smem_limits.h"
#include "cuda/gemm/fp8_linear_choice.h"
#include "cuda/hc/hc_fused_trace.h"
#include "cuda/hc/hc_heuristics.h"
#include "cuda/indexer/indexer_options.h"
#include "cuda/moe/moe_heuristics.h"
#include "deepinfer/backend.h"

namespace deepinfer::cuda {

// Stream, cuBLAS handle and pinned staging of one backend; shared with tensor deleters and
// callbacks, which may outlive the backend object.
struct CudaContext;

// cuBLASLt's algorithm descriptor under a name: nvcc 13's front end fails (an internal error) on
// standard containers of the anonymous struct cublasLtMatmulAlgo_t.
struct LtAlgo {
  cublasLtMatmulAlgo_t algo;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device_index);
  ~CudaBackend() override;

  DeviceKind device_kind() const override { return DeviceKind::kCuda; }
  std::string name() const override;
  DType weight_dtype(DType stored) const override;
  // f32, bf16, V4's fp8 (kU8 records) and V4.1's FP8 / FP4 (kF8E4M3, kE2M1x2 records) caches:
  // docs/model.md#kv-cache-dtypes.
  // Pinned host memory mapped into the device (cudaHostAllocMapped; UVA).
  bool supports_mapped_host_weights() const override { return true; }
  bool supports_kv_cache_dtype(DType dtype) const override {
    return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kU8 ||
           dtype == DType::kF8E4M3 || dtype == DType::kE2M1x2;
  }
  // Under bf16_math, caches of one of the tensor-core kernels' formats (f32, bf16, V4's fp8) and a
  // head dim they take (64, 128, 256, 512): every kernel but the f32 one rounds q to bf16
  // (cuda/attention/attention.cu).
  bool attention_rounds_query(int64_t head_dim, DType kv_dtype,
                              const AttentionSpec& spec) const override;
  // The indexer kernels (cuda/indexer/) read f32, bf16, V4's fp8 (kU8) and V4.1's FP4 (kE2M1x2)
  // index keys.
  bool supports_index_cache_dtype(DType dtype) const override {
    return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kU8 ||
           dtype == DType::kE2M1x2;
  }

  Tensor empty(const Shape& shape, DType dtype) override;
  Tensor zeros(const Shape& shape, DType dtype) override;
  std::unique_ptr<Event> record_event() override;
  DeviceMemory memory_info() override;
  void make_current() override;
  // Captures a CUDA graph of the stream work `body` enqueues (relaxed capture mode; allocations
  // inside become graph memory nodes, freed inside the graph).
  std::unique_ptr<Graph> capture(std::function<void()> body) override;

  // For op implementations.
  cudaStream_t stream() const;
  // Whether ops enqueue on the side branch's stream now (begin_branch .. end_branch).
  bool on_side_branch() const;
  cublasHandle_t cublas() const;
  cublasLtHandle_t cublaslt() const;
  // The cuBLAS workspace, which cuBLASLt calls pass as theirs.
  void* cublas_workspace() const;
  size_t cublas_workspace_bytes() const;
  int device_index() const { return device_; }
  int num_sms() const { return num_sms_; }
  size_t max_shared_memory_per_block() const { return max_smem_optin_; }
  // DEEPINFER_MOE_QUANT_DECODE at creation (auto, streaming, streaming_lean, registers, prefill):
  // the kernel quantized experts take in the decode shape (an A/B switch for benchmarks,
  // moe_heuristics.h); benchmarks set it to time the streaming variants in one run.
  QuantDecodeChoice moe_quant_decode() const { return moe_quant_decode_; }
  void set_moe_quant_decode(QuantDecodeChoice choice) { moe_quant_decode_ = choice; }
  // DEEPINFER_MOE_QUANT_PREFILL at creation (wgmma: the default, mma_sync): the kernel quantized
  // experts take in the prefill shape (an A/B switch for benchmarks, moe_heuristics.h); wgmma
  // only where it runs (sm_90a build, sm_90 device), mma_sync elsewhere.
  QuantPrefillChoice moe_quant_prefill() const { return moe_quant_prefill_; }
  void set_moe_quant_prefill(QuantPrefillChoice choice) { moe_quant_prefill_ = choice; }
  // Whether this build and device run wgmma kernels (sm_90a code, compute capability 9.x): the
  // one answer every wgmma path (attention, experts, indexer) asks.
  bool wgmma_device() const { return wgmma_device_; }
  // DEEPINFER_FP8_LINEAR at creation (legacy: the default, stream, stream_pdl, wgmma): the path of
  // FP8 linears at decode sizes (gemm_fp8_heuristics.h); benchmarks set it to time the paths in
  // one run.
  Fp8LinearChoice fp8_linear() const { return fp8_linear_; }
  void set_fp8_linear(Fp8LinearChoice choice) { fp8_linear_ = choice; }
  // DEEPINFER_FP8_WGMMA_MATH at creation (auto: the default, mma_sync, f16): the weight stream's
  // math (fp8_linear_choice.h); benchmarks set it to time both in one run.
  Fp8WgmmaMath fp8_wgmma_math() const { return fp8_wgmma_math_; }
  void set_fp8_wgmma_math(Fp8WgmmaMath math) { fp8_wgmma_math_ = math; }
  // DEEPINFER_FP8_CUBLASLT_TUNE at creation (on: the default, off): whether cuBLASLt's FP8 GEMMs
  // at decode widths take the fastest timed algorithm (fp8_linear_choice.h: kLtTuneMaxRows);
  // benchmarks set it to time both in one run.
  bool cublaslt_tune() const { return cublaslt_tune_; }
  void set_cublaslt_tune(bool on) { cublaslt_tune_ = on; }
  // The algorithm timed fastest for a cuBLASLt problem (gemm_fp8.cu's key: rows, columns, depth,
  // groups, operand alignments), nullptr before it is timed; kept for the backend's lifetime.
  const LtAlgo* tuned_lt_algo(const std::vector<int64_t>& key) const {
    const auto it = tuned_lt_algos_.find(key);
    return it == tuned_lt_algos_.end() ? nullptr : &it->second;
  }
  void keep_tuned_lt_algo(const std::vector<int64_t>& key, const LtAlgo& algo) {
    tuned_lt_algos_[key] = algo;
  }
  // The latest cuBLASLt FP8 GEMM's algorithm as "id I tile T stages S splits K" (read by
  // benchmarks and tests; formatted here, not on each call).
  std::string last_cublaslt_algo() const;
  void set_last_cublaslt_algo(const LtAlgo& algo) { last_cublaslt_algo_ = algo; }
  // DEEPINFER_ATTENTION_COMBINE / _ROWS / _SPLITS at creation: the tensor-core attention's plan
  // choices (attention_plan.h); benchmarks set them per call to compare the paths in one run.
  AttentionMmaChoice attention_mma_choice() const { return attention_mma_choice_; }
  void set_attention_mma_choice(const AttentionMmaChoice& c) { attention_mma_choice_ = c; }
  // DEEPINFER_ATTENTION_KERNEL at creation (auto: the default; mma_sync, wgmma and its variants,
  // attention_plan.h): the tensor-core attention kernel where several take the shape
  // (attention.cu); benchmarks and tests set it per call to compare them in one run.
  AttentionKernelChoice attention_kernel() const { return attention_kernel_; }
  void set_attention_kernel(AttentionKernelChoice c) { attention_kernel_ = c; }
  // DEEPINFER_INDEXER_FP8_SCORES at creation (wgmma_persistent_fp8: the default,
  // wgmma_persistent_cvt, wgmma_pipelined, wgmma, mma_sync, wgmma_persistent):
  // which kernel scores fp8 index keys at 64 heads on sm_90 unless a benchmark forces one
  // (indexer_options.h).
  IndexerFp8Scores indexer_fp8_scores() const { return indexer_fp8_scores_; }
  // Where the overlap attention kernel records its timing trace (attention_wgmma_trace.h; a
  // benchmark's device buffer), or {} (the default): untraced. While set, the overlap kernel
  // runs its traced instantiation (fp8 records, plain or ilp launch; other overlap modes throw).
  OverlapTraceBuffer attention_trace() const { return attention_trace_; }
  void set_attention_trace(const OverlapTraceBuffer& t) { attention_trace_ = t; }
  // Where the fused mHC kernel records its timing trace (hc_fused_trace.h; a benchmark's device
  // buffer), or {} (the default): untraced. While set, hc_fused.cu launches its traced
  // instantiations.
  HcFusedTraceBuffer hc_fused_trace() const { return hc_fused_trace_; }
  void set_hc_fused_trace(const HcFusedTraceBuffer& t) { hc_fused_trace_ = t; }
  // Where the small-batch attention (the mma.sync kernel's 16-head blocks and the combine after
  // them) records its timing trace (sm80/attention_mma_trace.h; a benchmark's device buffer): its
  // trace instantiations run while this holds stamps. Other attention kernels ignore it.
  MmaTraceBuffer attention_mma_trace() const { return attention_mma_trace_; }
  void set_attention_mma_trace(const MmaTraceBuffer& t) { attention_mma_trace_ = t; }
  // The plan the latest tensor-core attention call ran (read by benchmarks).
  AttentionMmaPlan last_attention_plan() const { return last_attention_plan_; }
  // Whether the latest tensor-core attention call ran the wgmma kernel (read by tests, benches).
  bool last_attention_wgmma() const { return last_attention_wgmma_; }
  // The fused combine's arrival counters: kAttentionCounterSlots ints, zero between launches.
  int* attention_counters() const { return attention_counters_.data<int32_t>(); }
  // The GEMM kernel the latest pass of moe_experts on quantized weights was launched with (set by
  // moe_experts, read by benchmarks to print which kernel ran; kQuantPrefill before any).
  ExpertsKernel last_quant_experts_kernel() const { return last_quant_experts_kernel_; }
  void set_last_quant_experts_kernel(ExpertsKernel k) { last_quant_experts_kernel_ = k; }
  // The path the latest FP8 linear took (set by linear.cu / gemm_fp8.cu; read by benchmarks).
  Fp8LinearPath last_fp8_linear_path() const { return last_fp8_linear_path_; }
  void set_last_fp8_linear_path(Fp8LinearPath p) { last_fp8_linear_path_ = p; }
  // DEEPINFER_HC_PRE at creation (auto: the default, fused, split, legacy): where hc_pre, hc_head
  // and hc_post_pre take the one-kernel decode path (cuda/hc/hc_heuristics.h: hc_fused_chosen)
  // instead of the unfused ones (hc_post; the mix split over K (hc_mix_split_chosen) or rms_norm
  // and cuBLAS; a finish kernel).
  HcPreChoice hc_pre_choice() const { return hc_pre_choice_; }
  // The thread-block cluster of the fused hc kernel at T tokens (0 without clusters: then the
  // fused path never applies): DEEPINFER_HC_CLUSTER's choice (hc_fused_cluster_for) over the
  // largest this device schedules and how many of those it keeps active, found at creation.
  int64_t hc_fused_cluster(int64_t tokens) const {
    return hc_fused_cluster_for(hc_cluster_choice_, tokens, hc_fused_clusters_.max_cluster,
                                hc_fused_clusters_.at_once);
  }
  HcClusterChoice hc_cluster_choice() const { return hc_cluster_choice_; }
  void set_hc_cluster_choice(HcClusterChoice choice) { hc_cluster_choice_ = choice; }
  // DEEPINFER_PDL at creation (on: the default, off): whether the kernels that start with
  // enter_dependent_grid (cuda/common/pdl.cuh) are launched as programmatic dependents of the
  // kernel before them; benchmarks set it to time both in one run.
  bool pdl() const { return pdl_; }
  void set_pdl(bool on) { pdl_ = on; }
  // The dynamic shared memory limits this backend raised on its kernels (smem_limits.h): a launch
  // of a kernel that may take more than 48 KiB asks it first.
  KernelSmemLimits& smem_limits() { return smem_limits_; }
  // Device scratch of `nbytes` freed (stream-ordered) when the returned tensor dies.
  Tensor scratch(size_t nbytes);
  // Device copy of a table of device pointers (i64), uploaded once per distinct table and kept
  // for the backend's lifetime: the routed experts' weight tables, so moe_experts uploads nothing
  // per call and can be captured in a graph.
  const Tensor& pointer_table(const std::vector<int64_t>& pointers);
  // Device copy of the tensor maps `encode` builds on the first use of `key` (a tensor copy reads
  // its map from global memory, 64-byte aligned), kept for the backend's lifetime like
  // pointer_table's tables: the routed experts' MXFP4 value maps, the FP8 linears' weight maps.
  // nullptr where `encode` builds none; the kernels then copy without maps.
  const void* tensor_map_table(const std::vector<int64_t>& key,
                               const std::function<std::vector<CUtensorMap>()>& encode);
  // Whether tensor_map_table has been asked for `key` (a graph capture may only read tables).
  bool has_tensor_map_table(const std::vector<int64_t>& key) const {
    return tensor_map_tables_.count(key) != 0;
  }
  // Whether a graph is being captured on the backend's stream.
  bool capturing() const { return capturing_; }

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
  void begin_copies_impl() override;
  void upload_into_on_copy_stream_impl(const Tensor& dst, const Tensor& host) override;
  void upload_pinned_into_on_copy_stream_impl(const Tensor& dst, const Tensor& host) override;
  void upload_pinned_batch_on_copy_stream_impl(std::span<const Tensor> dsts,
                                               std::span<const Tensor> hosts) override;
  HostBuffer allocate_pinned_host_impl(size_t bytes) override;
  std::unique_ptr<Event> record_copy_event_impl() override;
  void wait_event_impl(Event& event) override;
  // The side branch on a second stream (DEEPINFER_BRANCHES, on by default): stream() and the
  // cuBLAS handle switch to it inside the branch; blocks of tensors that die before the join are
  // held until then (CudaContext::held).
  void begin_branch_impl() override;
  void end_branch_impl() noexcept override;
  void join_branches_impl() override;

  Tensor embedding_impl(const Tensor& table, const Tensor& ids) override;
  Tensor rms_norm_impl(const Tensor& x, const Tensor& weight, float eps) override;
  Tensor linear_impl(const Tensor& x, const MatrixWeight& w, const RowNorm& x_norm) override;
  Tensor grouped_linear_impl(const Tensor& x, const MatrixWeight& w, int groups) override;
  std::pair<Tensor, Tensor> linear_pair_impl(const Tensor& x, const MatrixWeight& a,
                                             const MatrixWeight& b, const RowNorm& x_norm) override;
  Tensor quantize_activations_impl(const Tensor& x, int group) override;
  Tensor scale_impl(const Tensor& x, float factor) override;
  Tensor add_impl(const Tensor& a, const Tensor& b) override;
  Tensor gather_rows_impl(const Tensor& x, const Tensor& rows) override;
  Tensor rope_impl(const Tensor& x, const Tensor& positions, const Tensor& inv_freq,
                   bool inverse) override;
  Tensor rms_norm_rope_impl(const Tensor& x, const Tensor& weight, float eps,
                            const Tensor& positions, const Tensor& inv_freq,
                            bool bf16_output) override;
  Tensor rms_norm_rope_kv_impl(const Tensor& x, const Tensor& weight, float eps,
                               const Tensor& positions, const Tensor& inv_freq, DType kv_dtype,
                               int rope_dim) override;
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
  // The fused kernel at decode sizes (hc_fused_grid), else hc_post_pre_unfused.
  HcPostPre hc_post_pre_impl(const Tensor& X, const Tensor& out, const Tensor& post,
                             const Tensor& comb, const Tensor& fn, const Tensor& base,
                             const Tensor& scale, const HcParams& params,
                             const RowNorm& y_norm) override;
  // The split mix computing the trunk as it mixes it (hc_post_pre_split), else hc_post then
  // hc_pre.
  HcPostPre hc_post_pre_unfused(const Tensor& X, const Tensor& out, const Tensor& post,
                                const Tensor& comb, const Tensor& fn, const Tensor& base,
                                const Tensor& scale, const HcParams& params, const RowNorm& y_norm);
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

  // Uploads and host copies cannot be recorded in a graph (their host buffers are per call).
  void check_not_capturing(const char* what) const;
  int device_;
  int num_sms_ = 0;
  size_t max_smem_optin_ = 0;
  QuantDecodeChoice moe_quant_decode_ = QuantDecodeChoice::kAuto;
  QuantPrefillChoice moe_quant_prefill_ = QuantPrefillChoice::kMmaSync;
  bool wgmma_device_ = false;
  // Compute capability 9.0 or later: programmatic dependent launches take effect.
  bool programmatic_launch_device_ = false;
  Fp8LinearChoice fp8_linear_ = Fp8LinearChoice::kAuto;
  Fp8WgmmaMath fp8_wgmma_math_ = Fp8WgmmaMath::kAuto;
  bool cublaslt_tune_ = true;
  std::map<std::vector<int64_t>, LtAlgo> tuned_lt_algos_;
  LtAlgo last_cublaslt_algo_{};
  AttentionMmaChoice attention_mma_choice_;
  IndexerFp8Scores indexer_fp8_scores_ = IndexerFp8Scores::kWgmmaPersistentFp8;
  AttentionMmaPlan last_attention_plan_;
  AttentionKernelChoice attention_kernel_ = AttentionKernelChoice::kMmaSync;
  bool last_attention_wgmma_ = false;
  OverlapTraceBuffer attention_trace_;
  HcFusedTraceBuffer hc_fused_trace_;
  MmaTraceBuffer attention_mma_trace_;
  ExpertsKernel last_quant_experts_kernel_ = ExpertsKernel::kQuantPrefill;
  Fp8LinearPath last_fp8_linear_path_ = Fp8LinearPath::kNone;
  HcPreChoice hc_pre_choice_ = HcPreChoice::kAuto;
  HcFusedClusters hc_fused_clusters_;
  HcClusterChoice hc_cluster_choice_ = HcClusterChoice::kAuto;
  bool pdl_ = true;
  bool branches_ = true;
  std::shared_ptr<CudaContext> ctx_;
  bool capturing_ = false;
  std::map<std::vector<int64_t>, Tensor> pointer_tables_;
  std::map<std::vector<int64_t>, Tensor> tensor_map_tables_;  // undefined: `encode` built none
  Tensor attention_counters_;
  KernelSmemLimits smem_limits_;
};

}  // namespace deepinfer::cuda
