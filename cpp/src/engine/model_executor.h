// ModelExecutor: runs StepPlans through the DeepSeek-V4 graph on a backend (the CPU backend
// today): restores snapshots, forwards the batch, samples on the device, saves snapshots and
// copies the sampled tokens to the host, all enqueued on the backend stream. Carried rows take
// their input token from the previous step's device output (select_tokens), so launching step
// N+1 never waits for step N.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "deepinfer/engine_config.h"
#include "engine/remap.h"
#include "engine/step_executor.h"
#include "model/model_instance.h"

namespace deepinfer::engine {

struct ModelExecutorOptions {
  std::string checkpoint_dir;
  ModelConfig model_config;  // its config.json, read once by the engine factory
  int num_kv_blocks = 0;     // including block 0
  int num_state_slots = 0;   // live slots including slot 0
  int num_snapshot_slots = 0;
  int max_backtrack = 6;
  PlacementConfig placement;  // the engine's, resolved
};

class ModelExecutor final : public StepExecutor {
 public:
  explicit ModelExecutor(const ModelExecutorOptions& options);

  std::unique_ptr<InflightStep> launch(const StepPlan& plan, InflightStep* previous) override;
  StepResult wait(InflightStep& step) override;

  int vocab_size() const override { return model_->config.vocab_size; }
  int max_position() const override;
  int num_kv_blocks() const override { return options_.num_kv_blocks; }
  int num_state_slots() const override { return options_.num_state_slots; }
  int num_snapshot_slots() const override { return options_.num_snapshot_slots; }
  const std::vector<int>& eos_token_ids() const override { return model_->config.eos_token_ids; }
  const ModelConfig* model_config() const override { return &model_->config; }
  uint64_t num_graph_steps() const override {
    return model_->graphs ? model_->graphs->stats().num_calls : 0;
  }

 private:
  class ModelStep;
  ModelExecutorOptions options_;
  std::unique_ptr<ModelInstance> model_;
  BatchRemapper remapper_;
  std::vector<SequenceChunk> chunks_;  // reused
};

}  // namespace deepinfer::engine
