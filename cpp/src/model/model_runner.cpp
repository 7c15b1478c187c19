#include "deepinfer/model_runner.h"

#include <filesystem>
#include <string>

#include "model/batch_plan.h"
#include "model/model_instance.h"

namespace deepinfer {

namespace {

class CheckpointModelRunner final : public ModelRunner {
 public:
  CheckpointModelRunner(std::unique_ptr<ModelInstance> instance, const RunnerOptions& options)
      : instance_(std::move(instance)), options_(options) {
    options_.device = resolve_device(options.device);  // options() names the device in use
  }

  const ModelConfig& config() const override { return instance_->config; }
  const RunnerOptions& options() const override { return options_; }
  Backend& backend() override { return *instance_->backend; }

  DecodeGraphStats decode_graph_stats() const override {
    return instance_->graphs ? instance_->graphs->stats() : DecodeGraphStats{};
  }

  Tensor forward(const std::vector<SequenceChunk>& batch, LogitsMode mode) override {
    return instance_->backend->to_host(device_logits(batch, mode));
  }

  Tensor greedy(const std::vector<SequenceChunk>& batch) override {
    Backend& be = *instance_->backend;
    const Tensor tokens = be.argmax(device_logits(batch, LogitsMode::kLast));
    return be.to_host(tokens);
  }

 private:
  // Enqueues the forward; the device logits it returns are read before the next call.
  Tensor device_logits(const std::vector<SequenceChunk>& batch, LogitsMode mode) {
    ModelInstance& m = *instance_;
    HostSyncForbidden no_sync(*m.backend);
    rows_.clear();
    for (const SequenceChunk& c : batch) {
      ForwardRow r;
      r.slot = c.slot;
      r.start_pos = static_cast<int32_t>(c.start_pos);
      r.num_tokens = static_cast<int32_t>(c.tokens.size());
      r.tokens = c.tokens;
      r.block_table = c.block_table;
      rows_.push_back(r);
    }
    // The public entry point: every field is checked, token ids included.
    const size_t max_blocks = validate_rows(rows_, m.config, m.caches->shape(),
                                            /*check_tokens=*/true);
    return m.forward(rows_, max_blocks, mode, Tensor()).logits;
  }

  std::unique_ptr<ModelInstance> instance_;
  RunnerOptions options_;
  std::vector<ForwardRow> rows_;  // reused
};

std::string config_path(const std::string& checkpoint_dir) {
  return (std::filesystem::path(checkpoint_dir) / "config.json").string();
}

CacheShape cache_shape(const RunnerOptions& options) {
  CacheShape shape;
  shape.num_blocks = options.num_blocks;
  shape.num_state_slots = options.num_state_slots;
  shape.max_backtrack = options.max_backtrack;
  return shape;
}

}  // namespace

std::unique_ptr<ModelRunner> ModelRunner::load(const std::string& checkpoint_dir,
                                               const RunnerOptions& options) {
  return std::make_unique<CheckpointModelRunner>(
      ModelInstance::load(checkpoint_dir, ModelConfig::from_file(config_path(checkpoint_dir)),
                          cache_shape(options), options.device, options.num_threads,
                          options.decode_graph_max_batch, options.activation_quant,
                          options.kv_cache_dtype),
      options);
}

std::unique_ptr<ModelRunner> ModelRunner::random(const std::string& config_json,
                                                 const RunnerOptions& options, uint64_t seed,
                                                 bool bf16) {
  return std::make_unique<CheckpointModelRunner>(
      ModelInstance::random(ModelConfig::from_file(config_json), cache_shape(options),
                            options.device, options.num_threads, seed,
                            bf16 ? DType::kBF16 : DType::kF32, options.decode_graph_max_batch,
                            options.activation_quant, options.kv_cache_dtype),
      options);
}

}  // namespace deepinfer
