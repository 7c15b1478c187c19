#include "deepinfer/model_runner.h"

#include <filesystem>

#include "deepinfer/error.h"
#include "model/batch_plan.h"
#include "model/cache_tensors.h"
#include "model/checkpoint.h"
#include "model/deepseek_v4.h"
#include "model/weights.h"

namespace deepinfer {

namespace {

class CheckpointModelRunner final : public ModelRunner {
 public:
  CheckpointModelRunner(ModelConfig config, const RunnerOptions& options,
                        std::unique_ptr<Backend> backend, const Checkpoint& checkpoint)
      : config_(std::move(config)),
        options_(options),
        backend_(std::move(backend)),
        caches_(config_, cache_shape(options), *backend_),
        model_(config_, load_model_weights(checkpoint, config_, *backend_), *backend_) {}

  const ModelConfig& config() const override { return config_; }
  const RunnerOptions& options() const override { return options_; }
  Backend& backend() override { return *backend_; }

  Tensor forward(const std::vector<SequenceChunk>& batch, LogitsMode mode) override {
    BatchPlan plan = build_batch_plan(batch, config_, caches_.shape(), *backend_);
    Tensor logits = model_.forward(plan, caches_, mode);
    return backend_->to_host(logits);
  }

 private:
  static CacheShape cache_shape(const RunnerOptions& o) {
    CacheShape s;
    s.num_blocks = o.num_blocks;
    s.num_state_slots = o.num_state_slots;
    s.max_backtrack = o.max_backtrack;
    return s;
  }

  ModelConfig config_;
  RunnerOptions options_;
  std::unique_ptr<Backend> backend_;
  ModelCaches caches_;
  DeepseekV4Model model_;
};

}  // namespace

std::unique_ptr<ModelRunner> ModelRunner::load(const std::string& checkpoint_dir,
                                               const RunnerOptions& options) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(checkpoint_dir)) {
    throw Error(ErrorCode::kNotFound, checkpoint_dir + ": checkpoint directory does not exist");
  }
  ModelConfig config = ModelConfig::from_file((fs::path(checkpoint_dir) / "config.json").string());
  Checkpoint checkpoint = Checkpoint::open(checkpoint_dir);
  return std::make_unique<CheckpointModelRunner>(std::move(config), options,
                                                 make_cpu_backend(options.num_threads), checkpoint);
}

}  // namespace deepinfer
