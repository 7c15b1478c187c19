#include "model/v41_runner.h"

#include <filesystem>
#include <string>
#include <vector>

#include "deepinfer/error.h"
#include "deepinfer/v41_config.h"
#include "model/batch_plan.h"
#include "model/checkpoint.h"
#include "model/deepseek_v41.h"
#include "model/model_instance.h"
#include "model/v41_caches.h"

namespace deepinfer {

namespace {

class V41ModelRunner final : public ModelRunner {
 public:
  V41ModelRunner(const std::string& dir, const RunnerOptions& options)
      : config_(V41TextConfig::from_file((std::filesystem::path(dir) / "config.json").string())),
        shared_(config_.model_config()),
        options_(options) {
    options_.device = resolve_device(options.device);
    backend_ = make_backend(options_.device, options.num_threads);
    CacheShape shape;
    shape.num_blocks = options.num_blocks;
    shape.num_state_slots = options.num_state_slots;
    shape.max_backtrack = options.max_backtrack;
    shape.kv_dtype = resolve_kv_cache_dtype(options.kv_cache_dtype, backend_->device_kind(),
                                            config_.quantization.fp8);
    caches_ = std::make_unique<V41Caches>(config_, shape, *backend_);
    WeightLoadOptions load;
    load.quantize_activations = resolve_activation_quant(options.activation_quant, *backend_);
    const Checkpoint checkpoint = Checkpoint::open(dir);
    V41Weights weights = load_v41_weights(checkpoint, config_, shared_, *backend_, load);
    notes_ = weights.notes;
    model_ = std::make_unique<DeepseekV41Model>(config_, std::move(weights), *backend_);
    history_.resize(static_cast<size_t>(options.num_state_slots));
  }

  const ModelConfig& config() const override { return shared_; }
  const RunnerOptions& options() const override { return options_; }
  Backend& backend() override { return *backend_; }
  DecodeGraphStats decode_graph_stats() const override { return {}; }
  std::vector<std::string> load_notes() const override { return notes_; }

  Tensor forward(const std::vector<SequenceChunk>& batch, LogitsMode mode) override {
    return backend_->to_host(device_logits(batch, mode));
  }

  Tensor greedy(const std::vector<SequenceChunk>& batch) override {
    const Tensor tokens = backend_->argmax(device_logits(batch, LogitsMode::kLast));
    return backend_->to_host(tokens);
  }

  int num_mtp_blocks() const override { return 0; }
  HiddenForward forward_hidden(const std::vector<SequenceChunk>&, LogitsMode) override {
    no_drafter("forward_hidden");
  }
  MtpForward mtp_forward(const std::vector<SequenceChunk>&, const Tensor&, LogitsMode,
                         int) override {
    no_drafter("mtp_forward");
  }
  MtpDraft mtp_draft(const std::vector<SequenceChunk>&, const Tensor&, int) override {
    no_drafter("mtp_draft");
  }

 private:
  [[noreturn]] static void no_drafter(const char* op) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string(op) +
                    ": DeepSeek-V4.1 runs without a drafter (the DSpark blocks mtp.* are not "
                    "implemented yet)");
  }

  Tensor device_logits(const std::vector<SequenceChunk>& batch, LogitsMode mode) {
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
    const size_t max_blocks =
        validate_rows(rows_, shared_, caches_->shape(), /*check_tokens=*/true);
    const Tensor ngram = engram_ngrams();
    HostSyncForbidden no_sync(*backend_);
    const BatchPlan plan =
        build_batch_plan(rows_, shared_, caches_->shape(), *backend_, mode, max_blocks);
    return model_->forward(plan, ngram, *caches_);
  }

  // The Engram n-grams of rows_ ([T, n] i32 on the device: column r is the token at position
  // t - r, -1 before the sequence start), from each slot's history and the chunk; then the
  // histories take the chunks. Undefined without Engram layers.
  Tensor engram_ngrams() {
    for (size_t b = 0; b < rows_.size(); ++b) {
      const ForwardRow& r = rows_[b];
      const std::vector<int32_t>& h = history_[static_cast<size_t>(r.slot)];
      if (static_cast<int64_t>(h.size()) < r.start_pos) {
        throw Error(ErrorCode::kInvalidArgument,
                    "forward batch: sequence " + std::to_string(b) + ": 'start_pos' " +
                        std::to_string(r.start_pos) + " is past the " + std::to_string(h.size()) +
                        " tokens slot " + std::to_string(r.slot) +
                        " holds (feed the earlier positions first)");
      }
    }
    Tensor ngram;
    if (!config_.engram_layer_ids.empty()) {
      const int64_t n = config_.engram_max_ngram_size;
      int64_t total = 0;
      for (const ForwardRow& r : rows_) total += r.num_tokens;
      Tensor host = Tensor::zeros({total, n}, DType::kI32);
      int32_t* out = host.data<int32_t>();
      for (const ForwardRow& r : rows_) {
        const std::vector<int32_t>& h = history_[static_cast<size_t>(r.slot)];
        for (int32_t i = 0; i < r.num_tokens; ++i, out += n) {
          for (int64_t back = 0; back < n; ++back) {
            const int64_t chunk_index = i - back;
            const int64_t pos = r.start_pos + chunk_index;
            out[back] = pos < 0            ? -1
                        : chunk_index >= 0 ? r.tokens[static_cast<size_t>(chunk_index)]
                                           : h[static_cast<size_t>(pos)];
          }
        }
      }
      ngram = backend_->upload(host, DType::kI32);
    }
    for (const ForwardRow& r : rows_) {
      std::vector<int32_t>& h = history_[static_cast<size_t>(r.slot)];
      h.resize(static_cast<size_t>(r.start_pos));
      h.insert(h.end(), r.tokens.begin(), r.tokens.end());
    }
    return ngram;
  }

  V41TextConfig config_;
  ModelConfig shared_;
  RunnerOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<V41Caches> caches_;
  std::unique_ptr<DeepseekV41Model> model_;
  std::vector<std::string> notes_;
  std::vector<std::vector<int32_t>> history_;  // per state slot: the tokens its caches hold
  std::vector<ForwardRow> rows_;               // reused
};

}  // namespace

std::unique_ptr<ModelRunner> load_v41_runner(const std::string& checkpoint_dir,
                                             const RunnerOptions& options) {
  return std::make_unique<V41ModelRunner>(checkpoint_dir, options);
}

}  // namespace deepinfer
