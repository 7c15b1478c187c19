#include "deepinfer/model_runner.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "deepinfer/error.h"
#include "deepinfer/v41_config.h"
#include "model/batch_plan.h"
#include "model/model_instance.h"
#include "model/yoco_rows.h"

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

  std::vector<std::string> load_notes() const override { return instance_->notes; }

  DecodeGraphStats decode_graph_stats() const override {
    return instance_->graphs ? instance_->graphs->stats() : DecodeGraphStats{};
  }

  Tensor forward(const std::vector<SequenceChunk>& batch, LogitsMode mode) override {
    const Tensor logits = device_logits(batch, mode);
    const std::vector<int32_t> dropped = dropped_logit_rows(mode);
    if (dropped.empty()) return instance_->backend->to_host(logits);
    return with_dropped_rows(logits, dropped, batch, mode);
  }

  Tensor greedy(const std::vector<SequenceChunk>& batch, LogitsMode mode) override {
    ModelInstance& m = *instance_;
    // Checked before anything runs: a refused call leaves the caches and histories as they were.
    const size_t max_blocks = fill_rows(batch);
    if (const std::vector<int32_t> dropped = dropped_logit_rows(mode); !dropped.empty()) {
      throw Error(ErrorCode::kInvalidArgument,
                  "greedy: logits row " + std::to_string(dropped.front()) +
                      " (with logits=\"last\", the sequence) lies before its prompt_end's YOCO "
                      "kept positions (compact truncation drops it): it has no logits");
    }
    if (m.config.v41 != nullptr) take_histories();
    Tensor logits;
    {
      HostSyncForbidden no_sync(*m.backend);
      logits = m.forward(rows_, max_blocks, mode, Tensor()).logits;
    }
    return m.backend->to_host(m.backend->argmax(logits));
  }

  void set_history(int slot, const std::vector<int32_t>& tokens) override {
    const ModelConfig& config = instance_->config;
    if (config.v41 == nullptr) {
      throw Error(ErrorCode::kInvalidArgument,
                  "set_history: a DeepSeek-V4 model has no Engram layers and keeps no token "
                  "history (DeepSeek-V4.1 only)");
    }
    const int num_slots = instance_->caches->shape().num_state_slots;
    if (slot < 0 || slot >= num_slots) {
      throw Error(ErrorCode::kInvalidArgument, "set_history: 'slot' " + std::to_string(slot) +
                                                   " is outside the runner's " +
                                                   std::to_string(num_slots) + " state slots");
    }
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] < 0 || tokens[i] >= config.vocab_size) {
        throw Error(ErrorCode::kInvalidArgument, "set_history: 'tokens'[" + std::to_string(i) +
                                                     "] = " + std::to_string(tokens[i]) +
                                                     " is outside the vocabulary [0, " +
                                                     std::to_string(config.vocab_size) + ")");
      }
    }
    if (histories_.empty()) histories_.resize(static_cast<size_t>(num_slots));
    histories_[static_cast<size_t>(slot)] = tokens;
  }

  int num_mtp_blocks() const override {
    return instance_->mtp != nullptr ? instance_->mtp->num_blocks() : 0;
  }

  HiddenForward forward_hidden(const std::vector<SequenceChunk>& batch, LogitsMode mode) override {
    ModelInstance& m = *instance_;
    Tensor logits, hidden;
    {
      HostSyncForbidden no_sync(*m.backend);
      const size_t max_blocks = set_rows(batch);
      logits = m.forward(rows_, max_blocks, mode, Tensor(), &hidden).logits;
    }
    return {m.backend->to_host(logits), m.backend->to_host(hidden)};
  }

  MtpForward mtp_forward(const std::vector<SequenceChunk>& batch, const Tensor& hidden,
                         LogitsMode mode, int step) override {
    ModelInstance& m = *instance_;
    ModelInstance::MtpStep out;
    {
      HostSyncForbidden no_sync(*m.backend);
      const size_t max_blocks = set_rows(batch);
      out = m.mtp_forward(rows_, max_blocks, mode, Tensor(), upload_hidden("mtp_forward", hidden),
                          step);
    }
    return {m.backend->to_host(out.logits), m.backend->to_host(out.hidden)};
  }

  MtpDraft mtp_draft(const std::vector<SequenceChunk>& batch, const Tensor& hidden,
                     int num_drafts) override {
    if (num_drafts < 1) {
      throw Error(ErrorCode::kInvalidArgument,
                  "mtp_draft: 'num_drafts' must be >= 1, got " + std::to_string(num_drafts));
    }
    ModelInstance& m = *instance_;
    Backend& be = *m.backend;
    std::vector<Tensor> logits, tokens;  // per draft step, on the device
    {
      HostSyncForbidden no_sync(be);
      const size_t max_blocks = set_rows(batch);
      tokens =
          m.mtp_draft(rows_, max_blocks, upload_hidden("mtp_draft", hidden), num_drafts, &logits);
    }
    const int64_t seqs = static_cast<int64_t>(batch.size());
    const int64_t vocab = m.config.vocab_size;
    MtpDraft out;
    out.tokens = Tensor::zeros({seqs, num_drafts}, DType::kI32);
    out.logits = Tensor::zeros({seqs, num_drafts, vocab}, DType::kF32);
    for (int j = 0; j < num_drafts; ++j) {
      const Tensor t = be.to_host(tokens[static_cast<size_t>(j)]);
      const Tensor l = be.to_host(logits[static_cast<size_t>(j)]);
      for (int64_t s = 0; s < seqs; ++s) {
        out.tokens.data<int32_t>()[s * num_drafts + j] = t.data<int32_t>()[s];
        std::memcpy(out.logits.data<float>() + (s * num_drafts + j) * vocab,
                    l.data<float>() + s * vocab, static_cast<size_t>(vocab) * sizeof(float));
      }
    }
    return out;
  }

  int num_dspark_blocks() const override {
    const ModelInstance& m = *instance_;
    return m.dspark != nullptr ? static_cast<int>(m.v41_model->weights().dspark.blocks.size()) : 0;
  }

  DSparkDraft dspark_draft(const std::vector<SequenceChunk>& batch) override {
    ModelInstance& m = *instance_;
    Backend& be = *m.backend;
    DSparkOutput drafts;
    {
      HostSyncForbidden no_sync(be);
      fill_rows(batch);  // the golden token is not fed: the slot histories stay
      drafts = m.dspark_draft(rows_, Tensor());
    }
    const auto seqs = static_cast<int64_t>(batch.size());
    const auto b = static_cast<int64_t>(drafts.tokens.size());
    const int64_t vocab = m.config.vocab_size;
    DSparkDraft out;
    out.tokens = Tensor::zeros({seqs, b}, DType::kI32);
    out.confidences = Tensor::zeros({seqs, b}, DType::kF32);
    out.logits = Tensor::zeros({seqs, b, vocab}, DType::kF32);
    for (int64_t i = 0; i < b; ++i) {
      const Tensor t = be.to_host(drafts.tokens[static_cast<size_t>(i)]);
      const Tensor z = be.to_host(drafts.confidence[static_cast<size_t>(i)]);
      const Tensor l = be.to_host(drafts.logits[static_cast<size_t>(i)]);
      for (int64_t s = 0; s < seqs; ++s) {
        out.tokens.data<int32_t>()[s * b + i] = t.data<int32_t>()[s];
        out.confidences.data<float>()[s * b + i] = dspark_confidence(z.data<float>()[s]);
        std::memcpy(out.logits.data<float>() + (s * b + i) * vocab, l.data<float>() + s * vocab,
                    static_cast<size_t>(vocab) * sizeof(float));
      }
    }
    return out;
  }

 private:
  // The wanted logits rows of rows_ that YOCO compact truncation dropped (V4.1 only).
  std::vector<int32_t> dropped_logit_rows(LogitsMode mode) const {
    const ModelConfig& config = instance_->config;
    if (config.v41 == nullptr) return {};
    return yoco_dropped_logit_rows(rows_, *config.v41, mode);
  }

  // The host logits of every wanted row: the forward's (`kept`, on the device) where kept, NaN
  // where the truncation dropped the row (as v41_reference.py reports them).
  Tensor with_dropped_rows(const Tensor& kept, const std::vector<int32_t>& dropped,
                           const std::vector<SequenceChunk>& batch, LogitsMode mode) {
    int64_t wanted = 0;
    for (const SequenceChunk& c : batch)
      wanted += mode == LogitsMode::kAll ? static_cast<int64_t>(c.tokens.size()) : 1;
    const int64_t vocab = instance_->config.vocab_size;
    Tensor out = Tensor::zeros({wanted, vocab}, DType::kF32);
    std::fill_n(out.data<float>(), wanted * vocab, std::numeric_limits<float>::quiet_NaN());
    if (!kept.defined()) return out;
    const Tensor host = instance_->backend->to_host(kept);
    int64_t from = 0;
    size_t next_dropped = 0;
    for (int64_t row = 0; row < wanted; ++row) {
      if (next_dropped < dropped.size() && dropped[next_dropped] == row) {
        ++next_dropped;
        continue;
      }
      std::memcpy(out.data<float>() + row * vocab, host.data<float>() + from * vocab,
                  static_cast<size_t>(vocab) * sizeof(float));
      ++from;
    }
    return out;
  }

  // Fills rows_ from the public chunks and checks every field, token ids included (the public
  // entry point). Returns the longest block table.
  size_t set_rows(const std::vector<SequenceChunk>& batch) {
    const size_t max_blocks = fill_rows(batch);
    if (instance_->config.v41 != nullptr) take_histories();
    return max_blocks;
  }

  // set_rows without the V4.1 histories (which it advances).
  size_t fill_rows(const std::vector<SequenceChunk>& batch) {
    ModelInstance& m = *instance_;
    rows_.clear();
    for (const SequenceChunk& c : batch) {
      ForwardRow r;
      r.slot = c.slot;
      r.start_pos = static_cast<int32_t>(c.start_pos);
      r.num_tokens = static_cast<int32_t>(c.tokens.size());
      r.tokens = c.tokens;
      r.block_table = c.block_table;
      r.prompt_end = static_cast<int32_t>(c.prompt_end);
      r.swa_valid_start = static_cast<int32_t>(c.swa_valid_start);
      r.replay_end = static_cast<int32_t>(c.replay_end);
      rows_.push_back(r);
    }
    return validate_rows(rows_, m.config, m.caches->shape(), /*check_tokens=*/true);
  }

  // DeepSeek-V4.1's Engram n-grams read the tokens before each chunk. A chunk carries only its
  // own, so the runner keeps each state slot's tokens (those its caches were computed from; a
  // chunk that starts earlier rolls them back, as it does the caches) and points the rows at them.
  void take_histories() {
    if (histories_.empty())
      histories_.resize(static_cast<size_t>(instance_->caches->shape().num_state_slots));
    for (size_t b = 0; b < rows_.size(); ++b) {
      ForwardRow& r = rows_[b];
      std::vector<int32_t>& h = histories_[static_cast<size_t>(r.slot)];
      if (static_cast<int64_t>(h.size()) < r.start_pos) {
        throw Error(ErrorCode::kInvalidArgument,
                    "forward batch: sequence " + std::to_string(b) + ": 'start_pos' " +
                        std::to_string(r.start_pos) + " is past the " + std::to_string(h.size()) +
                        " tokens slot " + std::to_string(r.slot) +
                        " holds (feed the earlier positions first)");
      }
    }
    for (ForwardRow& r : rows_) {
      std::vector<int32_t>& h = histories_[static_cast<size_t>(r.slot)];
      h.resize(static_cast<size_t>(r.start_pos));
      h.insert(h.end(), r.tokens.begin(), r.tokens.end());
      r.history = std::span<const int32_t>(h).first(static_cast<size_t>(r.start_pos));
    }
  }

  // The host trunk `hidden` of rows_ on the device, after checking its shape.
  Tensor upload_hidden(const char* op, const Tensor& hidden) {
    ModelInstance& m = *instance_;
    int64_t tokens = 0;
    for (const ForwardRow& r : rows_) tokens += r.num_tokens;
    const Shape want{tokens, m.config.hc_mult, m.config.hidden_size};
    if (!hidden.defined() || hidden.dtype() != DType::kF32 || hidden.shape() != want) {
      throw Error(ErrorCode::kInvalidArgument,
                  std::string(op) + ": 'hidden' must be f32 " + shape_str(want) +
                      " (the trunk at each of the batch's tokens), got " +
                      (hidden.defined() ? hidden.describe() : std::string("none")));
    }
    return m.backend->upload(hidden, DType::kF32);
  }

  // Enqueues the forward; the device logits it returns are read before the next call.
  Tensor device_logits(const std::vector<SequenceChunk>& batch, LogitsMode mode) {
    ModelInstance& m = *instance_;
    HostSyncForbidden no_sync(*m.backend);
    const size_t max_blocks = set_rows(batch);
    return m.forward(rows_, max_blocks, mode, Tensor()).logits;
  }

  std::unique_ptr<ModelInstance> instance_;
  RunnerOptions options_;
  std::vector<ForwardRow> rows_;  // reused
  // DeepSeek-V4.1 only: per state slot, the tokens its caches hold (take_histories).
  std::vector<std::vector<int32_t>> histories_;
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

// The checkpoint's model config with the runner's model options applied.
ModelConfig model_config(const std::string& config_json, const RunnerOptions& options) {
  ModelConfig config = ModelConfig::from_file(config_json);
  set_yoco_truncation(config, options.yoco_prefill_truncation, options.yoco_keep_tokens,
                      options.max_backtrack);
  set_engram_table_memory(config, options.engram_table_memory);
  return config;
}

std::unique_ptr<ModelRunner> ModelRunner::load(const std::string& checkpoint_dir,
                                               const RunnerOptions& options) {
  return std::make_unique<CheckpointModelRunner>(
      ModelInstance::load(checkpoint_dir, model_config(config_path(checkpoint_dir), options),
                          cache_shape(options), options.device, options.num_threads,
                          options.decode_graph_max_batch, options.activation_quant,
                          options.kv_cache_dtype),
      options);
}

std::unique_ptr<ModelRunner> ModelRunner::random(const std::string& config_json,
                                                 const RunnerOptions& options, uint64_t seed,
                                                 bool bf16) {
  return std::make_unique<CheckpointModelRunner>(
      ModelInstance::random(model_config(config_json, options), cache_shape(options),
                            options.device, options.num_threads, seed,
                            bf16 ? DType::kBF16 : DType::kF32, options.decode_graph_max_batch,
                            options.activation_quant, options.kv_cache_dtype),
      options);
}

}  // namespace deepinfer
