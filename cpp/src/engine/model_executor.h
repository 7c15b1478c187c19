// ModelExecutor: runs StepPlans through the DeepSeek-V4 graph on a backend (CPU or CUDA). One
// launch, all enqueued on the backend stream without waiting for it:
//   restore snapshots -> forward (carried rows take their token from the previous step's device
//   output) -> adjust logits (bias, penalties, constraint masks) -> sample (forced tokens applied
//   on the device) -> copy results to the host -> save snapshots -> record the step's event.
// So launching step N+1 never waits for step N. When a carried row's penalties or constraint
// need the token step N is sampling, everything after the forward is deferred to finish_launch,
// which the engine calls once N is committed (the forward of N+1 runs meanwhile).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "deepinfer/engine_config.h"
#include "dist/communicator.h"
#include "dist/expert_placement.h"
#include "dist/load_window.h"
#include "engine/expert_balancer.h"
#include "engine/step_executor.h"
#include "model/checkpoint.h"
#include "model/model_instance.h"

namespace deepinfer::engine {

struct ModelExecutorOptions {
  std::string checkpoint_dir;
  bool dummy_weights = false;  // EngineConfig::load_format "dummy": random weights, seeded by
  uint64_t seed = 0;           // the engine seed
  ModelConfig model_config;    // its config.json, read once by the engine factory
  int num_kv_blocks = 0;       // including block 0; 0: sized from device memory at load (KvSizing)
  double gpu_memory_utilization = 0.9;
  int max_num_batched_tokens = 2048;  // for the activation reserve of that sizing
  int max_num_seqs = 1;
  bool speculative = false;  // num_speculative_tokens > 0: verify steps (their graphs' logits)
  int num_state_slots = 0;   // live slots including slot 0
  int num_snapshot_slots = 0;
  int max_backtrack = 6;
  PlacementConfig placement;            // the engine's, resolved
  std::string kv_cache_dtype = "auto";  // CacheConfig::kv_cache_dtype
  // speculative_method "mtp": the checkpoint's MTP block follows every step and drafts this many
  // tokens past each sampling row (StepResult::drafts); 0: off.
  int num_mtp_drafts = 0;
  // Zero-overhead scheduling with those drafts: the scheduler plans rows carried on the device
  // (Scheduler::device_carries), so each step leaves what they read (ModelStep::carried).
  bool device_carried_rows = false;
  LoadProgress progress;  // Engine::create's, for the weight load
};

// One rank of a parallel group (engine/dp_group.h): its backend, made before the group's
// communicators, and, with expert parallelism, the placement of every MoE layer's experts.
struct ParallelRank {
  std::unique_ptr<Backend> backend;
  dist::Communicator* comm = nullptr;             // this rank's; outlives the executor
  std::vector<dist::ExpertPlacement> placements;  // per layer; empty: every expert local
  // EPLB in the engine (ParallelConfig::enable_eplb; needs placements): window and schedule.
  std::optional<dist::EplbOptions> eplb;
};

class ModelExecutor final : public StepExecutor, private sched::KvTransfer {
 public:
  explicit ModelExecutor(const ModelExecutorOptions& options, ParallelRank rank = {});

  void run_idle_pass() override { model_->model->idle_pass(); }
  void make_current() override { model_->backend->make_current(); }
  void record_group_step() override {
    if (balancer_) balancer_->record_step();
  }
  bool rebalance_due() const override { return balancer_ && balancer_->due(); }
  void rebalance() override {
    if (balancer_) balancer_->rebalance();
  }
  void eplb_stats(EngineStats& stats) const override;

  std::unique_ptr<InflightStep> launch(const StepPlan& plan, InflightStep* previous) override;
  StepResult wait(InflightStep& step) override;
  void finish_launch(InflightStep& step, const StepPlan& plan) override;

  int vocab_size() const override { return model_->config.vocab_size; }
  int max_position() const override;
  int num_kv_blocks() const override { return model_->caches->shape().num_blocks; }
  int64_t kv_bytes_per_block() const override { return model_->caches->bytes_per_block(); }
  int64_t state_slot_bytes() const override { return model_->caches->bytes_per_state_slot(); }
  bool kv_sized_from_memory() const override { return options_.num_kv_blocks == 0; }
  int num_state_slots() const override { return options_.num_state_slots; }
  int num_snapshot_slots() const override { return options_.num_snapshot_slots; }
  const std::vector<int>& eos_token_ids() const override { return model_->config.eos_token_ids; }
  const ModelConfig* model_config() const override { return &model_->config; }
  std::vector<std::string> load_notes() const override { return model_->notes; }
  // The V4 MTP blocks, or V4.1's DSpark blocks (both drafters serve speculative_method "mtp").
  int num_mtp_blocks() const override {
    if (model_->mtp) return model_->mtp->num_blocks();
    return model_->dspark ? static_cast<int>(model_->v41_model->weights().dspark.blocks.size()) : 0;
  }
  uint64_t num_graph_steps() const override {
    return model_->graphs ? model_->graphs->stats().num_calls : 0;
  }
  uint64_t num_graph_verify_steps() const override {
    return model_->graphs ? model_->graphs->stats().num_verify_calls : 0;
  }
  sched::KvTransfer* kv_transfer() override { return this; }
  std::string model_identity() const override;

 private:
  // sched::KvTransfer over the model's caches (ModelCaches::export_block and friends).
  int64_t block_bytes() const override { return model_->caches->bytes_per_block(); }
  int64_t state_bytes() const override { return model_->caches->bytes_per_state_export(); }
  std::vector<uint64_t> block_bytes_per_layer() const override;
  void export_block(kv::BlockId block, int32_t slot, std::span<uint8_t> dst,
                    const std::shared_ptr<const void>& keep_alive) override;
  std::unique_ptr<Event> record_event() override { return model_->backend->record_event(); }
  void import_block(kv::BlockId block, std::span<const uint8_t> src) override;
  void import_state(int32_t slot, std::span<const uint8_t> src) override;
  void import_fetched(std::span<const kv::BlockId> blocks,
                      std::span<const std::span<const uint8_t>> payloads, int32_t slot,
                      std::span<const uint8_t> state,
                      const std::shared_ptr<const void>& keep_alive) override;
  HostBuffer allocate_host_arena(size_t bytes) override {
    return model_->backend->allocate_pinned_host(bytes);
  }

  class ModelStep;
  // The sampling parameters of the plan's sampling rows on the device. They are per request, so
  // they are uploaded only when the sampling rows change (a request joins, leaves or moves);
  // the positions come from the forward's metadata.
  SamplingBatch sampling_batch(const StepPlan& plan, const Tensor& next_positions);
  void sample(const StepPlan& plan, const Tensor& logits, const Tensor& next_positions,
              ModelStep& step);
  // logit_bias, penalties and constraint masks of the sampling rows, built on the host from the
  // committed outputs and uploaded; nothing defined when no row asks for any. A constraint that
  // throws leaves its row unmasked and is reported in `step` (the commit ends the request).
  LogitAdjustments logit_adjustments(const StepPlan& plan, int64_t vocab, ModelStep& step);
  // SamplingParams::forced_tokens: the forced ids replace the sampled ones on the device (one
  // per logits row of the sampling rows), so the next step's carried rows read them like any
  // sampled token.
  Tensor apply_forced_tokens(const StepPlan& plan, const Tensor& sampled);
  // A step with verify rows (speculative decoding): every logits row sampled, the drafts
  // accepted on the host while they match (verify_result), 1..1 + d tokens per sampling row. A
  // carried row of the next step follows only a plain row (Scheduler::sits_out) and reads its
  // sample at its logits row.
  void verify(const StepPlan& plan, const Tensor& logits, const Tensor& next_positions,
              ModelStep& step);
  static StepResult verify_result(ModelStep& step, StepResult result);
  static StepResult sampled_result(ModelStep& step);
  // speculative_method "mtp" with V4's MTP block (engine/README.md#mtp-drafts): enqueued right
  // after the step sampled (ModelInstance::mtp_draft_on_device) and copied to the host with its
  // tokens; take_device_drafts picks each sampling row's drafts past the drafts it accepted.
  void drafts_on_device(ModelStep& step);
  void take_device_drafts(const ModelStep& step, StepResult& result) const;
  // V4.1's DSpark drafter: once the step's tokens are on the host, one DSpark draft step per
  // sampling row from the token just sampled.
  void draft_dspark(ModelStep& step, StepResult& result);
  // The drafting rows of draft_dspark (into draft_tokens_, mtp_rows_, draft_tables_): per
  // sampling row that has room for `reach` positions, one token row at its last accepted position
  // + 1, with the token it just sampled. Returns the step rows that draft.
  std::vector<size_t> plan_draft_rows(const ModelStep& step, const StepResult& result, int reach);
  bool mtp_on() const { return options_.num_mtp_drafts > 0 && model_->mtp != nullptr; }
  bool dspark_on() const { return options_.num_mtp_drafts > 0 && model_->dspark != nullptr; }
  void copy_results_to_host(ModelStep& step, const SampleResult& result, int max_logprobs);

  // Loads main layer `layer`'s experts for the EPLB shuffle as the initial load did.
  ExpertWeights load_experts(int layer, std::span<const int32_t> experts);

  ModelExecutorOptions options_;
  std::unique_ptr<ModelInstance> model_;
  std::unique_ptr<Checkpoint> checkpoint_;    // opened at the first EPLB shuffle that needs it
  std::unique_ptr<ExpertBalancer> balancer_;  // EPLB; null when off
  // The sampling constants last uploaded, and the (request, epoch) of each row they describe.
  std::vector<std::pair<RequestId, uint32_t>> sampling_keys_;
  SamplingBatch sampling_;
  // Host buffers of draft_dspark, reused.
  std::vector<int32_t> draft_tokens_;
  std::vector<ForwardRow> mtp_rows_;
  std::vector<std::vector<int32_t>> draft_tables_;
};

}  // namespace deepinfer::engine
