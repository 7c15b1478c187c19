#include "engine/model_executor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <span>

#include "deepinfer/error.h"
#include "engine/model_executor_internal.h"
#include "kv/cache_geometry.h"
#include "model/batch_plan.h"
#include "model/checkpoint.h"
#include "sched/sequence.h"

namespace deepinfer::engine {

namespace {

CacheShape cache_shape(const ModelExecutorOptions& o) {
  CacheShape s;
  s.num_blocks = o.num_kv_blocks;
  s.num_state_slots = o.num_state_slots + o.num_snapshot_slots;
  s.max_backtrack = o.max_backtrack;
  return s;
}

template <typename T>
Tensor upload_vector(Backend& backend, const std::vector<T>& values) {
  return backend.upload(Tensor::from_vector(values, {static_cast<int64_t>(values.size())}),
                        DTypeOf<T>::value);
}

// Whether a carried row's sampling depends on the token the previous step is still sampling.
bool needs_previous_tokens(const StepPlan& plan) {
  for (const StepRow& r : plan.rows) {
    if (r.samples() && r.carried() && r.params->adjusts_from_history()) return true;
  }
  return false;
}

std::unique_ptr<ModelInstance> load_model(const ModelExecutorOptions& o, ParallelRank& rank) {
  if (o.model_config.v41 != nullptr && rank.comm != nullptr) {
    // The rows other ranks receive carry no token history (Engram), and there is no V4.1 expert
    // parallelism yet.
    throw Error(ErrorCode::kUnsupported,
                o.model_config.source +
                    ": DeepSeek-V4.1 runs on one rank only for now (data_parallel_size 1)");
  }
  const KvSizing sizing{o.gpu_memory_utilization, o.max_num_batched_tokens, o.max_num_seqs,
                        o.speculative};
  const PlacementConfig& p = o.placement;
  ModelInstance::RankTarget target;
  target.backend = std::move(rank.backend);
  if (!rank.placements.empty()) {
    // Every MoE layer starts from the same placement; this rank holds its slots' experts.
    const dist::ExpertPlacement& first = rank.placements.front();
    const int begin = rank.comm->rank() * first.slots_per_rank();
    for (int s = begin; s < begin + first.slots_per_rank(); ++s)
      target.expert_slots.push_back(first.logical_of(s));
  }
  std::unique_ptr<ModelInstance> m;
  if (o.dummy_weights) {
    const DType stored = p.device.starts_with("cuda") ? DType::kBF16 : DType::kF32;
    m = ModelInstance::random(o.model_config, cache_shape(o), p.device, p.num_threads, o.seed,
                              stored, p.decode_graph_max_batch, p.activation_quant,
                              o.kv_cache_dtype, sizing, std::move(target),
                              /*load_mtp=*/o.num_mtp_drafts > 0);
  } else {
    m = ModelInstance::load(o.checkpoint_dir, o.model_config, cache_shape(o), p.device,
                            p.num_threads, p.decode_graph_max_batch, p.activation_quant,
                            o.kv_cache_dtype, o.progress, sizing,
                            /*load_mtp=*/o.num_mtp_drafts > 0, std::move(target));
  }
  if (!rank.placements.empty()) {
    auto ep = std::make_unique<ExpertParallel>();
    ep->comm = rank.comm;
    ep->placements = std::move(rank.placements);
    m->model->set_expert_parallel(std::move(ep));
  }
  return m;
}

// The sampling constants of the plan's sampling rows on the device, one row per sampling row or,
// with `per_logits_row`, one per logits row (1 + d for a verify row); positions are left unset.
SamplingBatch sampling_constants(Backend& be, const StepPlan& plan, bool per_logits_row) {
  std::vector<float> temperature, top_p;
  std::vector<int32_t> top_k, num_logprobs;
  std::vector<int64_t> seed;
  int max_logprobs = 0;
  for (const StepRow& r : plan.rows) {
    if (!r.samples()) continue;
    for (int j = 0; j <= (per_logits_row ? r.num_drafts : 0); ++j) {
      temperature.push_back(r.params->temperature);
      top_k.push_back(r.params->top_k);
      top_p.push_back(r.params->top_p);
      seed.push_back(static_cast<int64_t>(r.seed));
      num_logprobs.push_back(r.params->logprobs);
    }
    max_logprobs = std::max(max_logprobs, r.params->logprobs);
  }
  SamplingBatch batch;
  batch.num_rows = static_cast<int>(temperature.size());
  batch.max_logprobs = max_logprobs;
  batch.temperature = upload_vector(be, temperature);
  batch.top_k = upload_vector(be, top_k);
  batch.top_p = upload_vector(be, top_p);
  batch.seed = upload_vector(be, seed);
  batch.num_logprobs = upload_vector(be, num_logprobs);
  return batch;
}

}  // namespace

ModelExecutor::ModelExecutor(const ModelExecutorOptions& options, ParallelRank rank)
    : options_(options), model_(load_model(options, rank)) {
  options_.progress = {};  // used while loading only; the caller's callback is not kept
  if (rank.eplb && rank.comm != nullptr && model_->model != nullptr &&
      model_->model->expert_parallel() != nullptr) {
    balancer_ =
        std::make_unique<ExpertBalancer>(*model_->model, *rank.comm, *rank.eplb,
                                         [this](int layer, std::span<const int32_t> experts) {
                                           return load_experts(layer, experts);
                                         });
  }
}

ExpertWeights ModelExecutor::load_experts(int layer, std::span<const int32_t> experts) {
  ModelInstance& m = *model_;
  WeightLoadOptions o;
  o.quantize_activations =
      resolve_activation_quant(options_.placement.activation_quant, *m.backend);
  if (options_.dummy_weights) {
    // The random weights are a function of (seed, tensor name): the same values the expert's
    // previous holder drew at load (load_model's stored dtype).
    const DType stored = options_.placement.device.starts_with("cuda") ? DType::kBF16 : DType::kF32;
    return load_layer_experts(nullptr, m.config, *m.backend, layer, experts, o, options_.seed,
                              stored);
  }
  if (!checkpoint_)
    checkpoint_ = std::make_unique<Checkpoint>(Checkpoint::open(options_.checkpoint_dir));
  return load_layer_experts(checkpoint_.get(), m.config, *m.backend, layer, experts, o);
}

void ModelExecutor::eplb_stats(EngineStats& stats) const {
  if (!balancer_) return;
  const EplbCounters& c = balancer_->counters();
  stats.eplb_rebalances = c.rebalances;
  stats.eplb_last_pause_seconds = c.last_pause_seconds;
  stats.eplb_max_over_mean_before = c.max_over_mean_before;
  stats.eplb_max_over_mean_after = c.max_over_mean_after;
}

std::string ModelExecutor::model_identity() const {
  return checkpoint_identity(options_.checkpoint_dir);
}

std::vector<uint64_t> ModelExecutor::block_bytes_per_layer() const {
  const std::vector<int64_t>& bytes = model_->caches->block_bytes_per_layer();
  return {bytes.begin(), bytes.end()};
}

void ModelExecutor::export_block(kv::BlockId block, int32_t slot, std::span<uint8_t> dst,
                                 const std::shared_ptr<const void>& keep_alive) {
  ModelCaches& caches = *model_->caches;
  // Never the case in the engine (a block is exported once a launched step committed it, and
  // every launch waits for the imports before it), but an export must not race the copy stream.
  caches.wait_all_imports(*model_->backend);
  const auto kv = static_cast<size_t>(caches.bytes_per_block());
  caches.export_block(*model_->backend, block, dst.first(kv), keep_alive);
  if (slot >= 0) caches.export_state_slot(*model_->backend, slot, dst.subspan(kv), keep_alive);
}

void ModelExecutor::import_block(kv::BlockId block, std::span<const uint8_t> src) {
  model_->caches->import_block(*model_->backend, block, src);
}

void ModelExecutor::import_state(int32_t slot, std::span<const uint8_t> src) {
  model_->caches->import_state_slot(*model_->backend, slot, src);
}

void ModelExecutor::import_fetched(std::span<const kv::BlockId> blocks,
                                   std::span<const std::span<const uint8_t>> payloads, int32_t slot,
                                   std::span<const uint8_t> state,
                                   const std::shared_ptr<const void>& keep_alive) {
  model_->caches->import_layered(*model_->backend, blocks, payloads, slot, state, nullptr,
                                 keep_alive);
}

int ModelExecutor::max_position() const {
  return static_cast<int>(std::min<int64_t>(model_->config.max_position_embeddings,
                                            std::numeric_limits<int32_t>::max()));
}

std::unique_ptr<InflightStep> ModelExecutor::launch(const StepPlan& plan, InflightStep* previous) {
  ModelInstance& m = *model_;
  Backend& be = *m.backend;
  HostSyncForbidden no_sync(be);  // launching must never wait for the device
  auto step = std::make_unique<ModelStep>();
  step->step_id = plan.step_id;

  // Carried rows name their token's index in the previous step's sampled tokens, or (a carried
  // verify row, V4's MTP drafts) in its samples and drafts per logits row, whose first region is
  // the samples.
  Tensor previous_tokens;
  ModelInstance::PreviousStep previous_step;
  if (previous != nullptr) {
    const auto& p = dynamic_cast<const ModelStep&>(*previous);
    previous_tokens = p.carried.defined() ? p.carried : p.sampled;
    previous_step = {.accepted = p.accepted, .trunk = p.trunk};
    step->previous_accepted = p.accepted;
  }

  m.caches->copy_state_slots(be, plan.copies_before);
  const RowSpan rows = plan.forward_rows();
  // The MTP block follows the main layers in the same launch (eagerly: no decode graph), so its
  // caches are snapshotted with theirs.
  const ModelInstance::Output forward =
      mtp_on() ? m.forward_with_mtp(rows, table_width(rows, m), LogitsMode::kLast, previous_tokens,
                                    &step->at_logits, &previous_step)
               : m.forward(rows, table_width(rows, m), LogitsMode::kLast, previous_tokens);
  // The forward waited for each layer's pending KV tier imports right before that layer; those
  // of layers it did not run (MTP blocks when drafting is off) are waited for now, so nothing
  // enqueued after this step can overtake them.
  m.caches->wait_all_imports(be);
  // DSpark's main keys were written by the forward itself (every V4.1 forward with the drafter).
  if (mtp_on() || dspark_on()) {
    for (const StepRow& r : plan.rows) {
      const ForwardRow& f = r.forward;
      if (!r.samples()) continue;
      step->draft_rows.push_back({f.slot, f.start_pos + f.num_tokens - f.num_logits, f.num_logits,
                                  std::vector<int32_t>(f.block_table.begin(), f.block_table.end()),
                                  f.shift_from, f.max_shift});
    }
  }
  if (forward.logits.defined()) {
    if (previous != nullptr && needs_previous_tokens(plan)) {
      step->sample_deferred = true;
      step->logits = forward.logits;
      step->next_positions = forward.next_positions;
      return step;
    }
    sample(plan, forward.logits, forward.next_positions, *step);
  }
  m.caches->copy_state_slots(be, plan.copies_after);
  // After the snapshots: they hold what the committed tokens give, not the draft positions.
  if (mtp_on()) drafts_on_device(*step);
  step->done = be.record_event();
  return step;
}

void ModelExecutor::finish_launch(InflightStep& inflight, const StepPlan& plan) {
  auto& step = dynamic_cast<ModelStep&>(inflight);
  DEEPINFER_CHECK(step.sample_deferred, "finish_launch of a step that was not deferred");
  Backend& be = *model_->backend;
  HostSyncForbidden no_sync(be);
  sample(plan, step.logits, step.next_positions, step);
  step.logits = Tensor();
  step.next_positions = Tensor();
  model_->caches->copy_state_slots(be, plan.copies_after);
  if (mtp_on()) drafts_on_device(step);
  step.done = be.record_event();
  step.sample_deferred = false;
}

LogitAdjustments ModelExecutor::logit_adjustments(const StepPlan& plan, int64_t vocab,
                                                  ModelStep& step) {
  std::vector<int32_t> rows, tokens;
  std::vector<float> values;
  std::vector<uint32_t> allowed;  // [num_sampling_rows, words] once any row has a constraint
  const int64_t words = (vocab + 31) / 32;
  // Logits rows: one per sampling row, 1 + d for a verify row, so sampling row k's first logits
  // row is its offset here. Rows j > 0 of a verify row see the same bias and a mask built after
  // the drafts before them.
  int num_rows = 0;
  std::vector<int> logit_row;
  for (const StepRow& r : plan.rows) {
    if (!r.samples()) continue;
    logit_row.push_back(num_rows);
    num_rows += 1 + r.num_drafts;
  }
  std::map<int32_t, float> delta;  // ordered: the uploaded entries do not depend on hashing
  std::map<int32_t, int> counts;
  int k = -1;
  for (const StepRow& r : plan.rows) {
    if (!r.samples()) continue;
    ++k;
    const SamplingParams& p = *r.params;
    if (!p.adjusts_logits() || r.forced_token >= 0) continue;
    const sched::Sequence& s = *r.sequence;
    // A sequence that finished or was preempted since this step was planned: its token is
    // dropped at the commit, and its constraint must not see more calls.
    if (s.finished() || s.epoch != r.epoch) continue;
    delta.clear();
    for (const auto& [token, bias] : p.logit_bias) delta[token] += bias;
    if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
      counts.clear();
      for (size_t i = static_cast<size_t>(s.num_prompt_tokens); i < s.tokens.size(); ++i)
        ++counts[s.tokens[i]];
      for (const auto& [token, count] : counts)
        delta[token] -= p.presence_penalty + p.frequency_penalty * static_cast<float>(count);
    }
    // A verify row (logit_bias only: drafting is off for history-dependent adjustments) biases
    // each of its 1 + d rows alike.
    for (int j = 0; j <= r.num_drafts; ++j) {
      for (const auto& [token, value] : delta) {
        if (value == 0.0f) continue;
        rows.push_back(logit_row[static_cast<size_t>(k)] + j);
        tokens.push_back(token);
        values.push_back(value);
      }
    }
    if (p.constraint == nullptr) continue;
    // Its rows are masked from its drafts, which a carried verify row does not have on the host
    // (the scheduler plans none for a constrained request).
    DEEPINFER_CHECK(!(r.verifies() && r.carried()), "a carried verify row with a constraint");
    if (allowed.empty()) allowed.assign(static_cast<size_t>(num_rows * words), ~0u);
    auto row_mask = [&](int j) {
      return std::span<uint32_t>(
          allowed.data() + static_cast<size_t>((logit_row[static_cast<size_t>(k)] + j) * words),
          static_cast<size_t>(words));
    };
    // Row j of a verify row is masked in the state after drafts 0..j-1: accept them one by one
    // and roll them back after. A draft the mask refuses cannot equal row j's sample, so the
    // rows after it are never used and stay unmasked (all ones).
    int accepted = 0;
    try {
      for (int j = 0; j <= r.num_drafts; ++j) {
        std::span<uint32_t> mask = row_mask(j);
        std::fill(mask.begin(), mask.end(), 0u);
        p.constraint->fill_allowed(mask);
        // Bits past the vocabulary are ignored; a mask that allows nothing lets EOS end it.
        if (std::all_of(mask.begin(), mask.end(), [](uint32_t w) { return w == 0; })) {
          for (int eos : model_->config.eos_token_ids)
            mask[static_cast<size_t>(eos / 32)] |= 1u << (eos % 32);
        }
        if (j == r.num_drafts) break;
        if (!p.constraint->accept(r.forward.tokens[static_cast<size_t>(j) + 1])) break;
        ++accepted;
        // Complete after this draft: if it is accepted the commit stops there, so the rows
        // after it are never used (and a finished matcher has no next mask to give).
        if (p.constraint->is_terminated()) break;
      }
      if (accepted > 0) p.constraint->rollback(accepted);
    } catch (const std::exception& e) {
      for (int j = 0; j <= r.num_drafts; ++j) {
        std::span<uint32_t> mask = row_mask(j);
        std::fill(mask.begin(), mask.end(), ~0u);
      }
      step.constraint_errors.emplace_back(k,
                                          std::string("the output constraint failed: ") + e.what());
      continue;
    }
  }
  LogitAdjustments adjustments;
  Backend& be = *model_->backend;
  if (!rows.empty()) {
    adjustments.rows = upload_vector(be, rows);
    adjustments.tokens = upload_vector(be, tokens);
    adjustments.values = upload_vector(be, values);
  }
  if (!allowed.empty()) {
    std::vector<int32_t> words_i32(allowed.size());
    std::memcpy(words_i32.data(), allowed.data(), allowed.size() * sizeof(uint32_t));
    adjustments.allowed = be.upload(
        Tensor::from_vector(words_i32, {static_cast<int64_t>(num_rows), words}), DType::kI32);
  }
  return adjustments;
}

SamplingBatch ModelExecutor::sampling_batch(const StepPlan& plan, const Tensor& next_positions) {
  Backend& be = *model_->backend;
  bool same = sampling_keys_.size() == static_cast<size_t>(plan.num_sampling_rows());
  size_t k = 0;
  for (size_t i = 0; same && i < plan.rows.size(); ++i) {
    const StepRow& r = plan.rows[i];
    if (!r.samples()) continue;
    same = sampling_keys_[k++] == std::make_pair(r.seq_id, r.epoch);
  }
  if (!same) {
    sampling_keys_.clear();
    for (const StepRow& r : plan.rows)
      if (r.samples()) sampling_keys_.emplace_back(r.seq_id, r.epoch);
    sampling_ = sampling_constants(be, plan, /*per_logits_row=*/false);
  }
  SamplingBatch batch = sampling_;
  batch.position = next_positions;
  return batch;
}

void ModelExecutor::sample(const StepPlan& plan, const Tensor& logits, const Tensor& next_positions,
                           ModelStep& step) {
  Backend& be = *model_->backend;
  // The forward returned the logits of the sampling rows only, in row order.
  const LogitAdjustments adjustments = logit_adjustments(plan, logits.size(1), step);
  if (adjustments.rows.defined() || adjustments.allowed.defined())
    be.adjust_logits(logits, adjustments);
  const bool verifies = std::any_of(plan.rows.begin(), plan.rows.end(),
                                    [](const StepRow& r) { return r.verifies(); });
  if (verifies) {
    verify(plan, logits, next_positions, step);
    return;
  }
  const SamplingBatch batch = sampling_batch(plan, next_positions);
  const SampleResult result = be.sample(logits, batch);
  step.sampled = apply_forced_tokens(plan, result.tokens);
  copy_results_to_host(step, result, batch.max_logprobs);
}

void ModelExecutor::verify(const StepPlan& plan, const Tensor& logits, const Tensor& next_positions,
                           ModelStep& step) {
  // Every logits row is sampled with its request's parameters at the position it predicts; the
  // host then accepts each request's drafts while they equal the row samples (sample/verify.h:
  // with point-mass drafts this is exact rejection sampling, and greedy rows accept by match).
  Backend& be = *model_->backend;
  for (const StepRow& r : plan.rows) {
    if (!r.samples()) continue;
    step.verify_drafts.emplace_back();
    for (int j = 0; j < r.num_drafts; ++j)
      step.verify_drafts.back().push_back(r.forward.tokens[static_cast<size_t>(j) + 1]);
    step.forced.push_back(r.forced_token);
    // A carried verify row's drafts are still on the device (its tokens are placeholders here):
    // the device counts what it accepted (drafts_on_device).
    const bool on_device = r.verifies() && r.carried();
    DEEPINFER_CHECK(!on_device || (mtp_on() && options_.device_carried_rows),
                    "a carried verify row without device drafting");
    step.verify_on_device.push_back(on_device ? 1 : 0);
  }
  SamplingBatch batch = sampling_constants(be, plan, /*per_logits_row=*/true);
  const int max_logprobs = batch.max_logprobs;
  batch.position = next_positions;
  sampling_keys_.clear();  // the cached per-request constants no longer match the device's
  const SampleResult result = be.sample(logits, batch);
  step.sampled = apply_forced_tokens(plan, result.tokens);
  copy_results_to_host(step, result, max_logprobs);
}

Tensor ModelExecutor::apply_forced_tokens(const StepPlan& plan, const Tensor& sampled) {
  // One sample per logits row (1 + d for a verify row; forced tokens come only on plain rows):
  // a carried row of the next step reads its token here.
  std::vector<int32_t> forced, keep;
  bool any_forced = false;
  for (const StepRow& r : plan.rows) {
    if (!r.samples()) continue;
    const bool force = r.forced_token >= 0 && !r.verifies();
    any_forced = any_forced || force;
    forced.push_back(force ? r.forced_token : 0);
    keep.push_back(force ? -1 : static_cast<int32_t>(keep.size()));
    for (int j = 0; j < r.num_drafts; ++j) {
      forced.push_back(0);
      keep.push_back(static_cast<int32_t>(keep.size()));
    }
  }
  if (!any_forced) return sampled;
  Backend& be = *model_->backend;
  Tensor tokens = upload_vector(be, forced);
  be.select_tokens(tokens, upload_vector(be, keep), sampled);
  return tokens;
}

void ModelExecutor::copy_results_to_host(ModelStep& step, const SampleResult& result,
                                         int max_logprobs) {
  Backend& be = *model_->backend;
  const int64_t n = step.sampled.numel();
  step.host_tokens = Tensor::zeros({n}, DType::kI32);
  be.copy_to_host(step.sampled, step.host_tokens);
  if (max_logprobs > 0) {
    step.host_logprob = Tensor::zeros({n}, DType::kF32);
    step.host_top_ids = Tensor::zeros({n, max_logprobs}, DType::kI32);
    step.host_top_lp = Tensor::zeros({n, max_logprobs}, DType::kF32);
    be.copy_to_host(result.logprobs, step.host_logprob);
    be.copy_to_host(result.top_ids, step.host_top_ids);
    be.copy_to_host(result.top_logprobs, step.host_top_lp);
  }
}

StepResult ModelExecutor::wait(InflightStep& step) {
  auto& s = dynamic_cast<ModelStep&>(step);
  DEEPINFER_CHECK(!s.sample_deferred, "waiting for a step whose sampling was never launched");
  s.done->wait();
  StepResult result = sampled_result(s);
  if (mtp_on()) {
    take_device_drafts(s, result);
  } else if (dspark_on() && !s.draft_rows.empty()) {
    draft_dspark(s, result);
  }
  return result;
}

StepResult ModelExecutor::sampled_result(ModelStep& s) {
  StepResult result;
  result.constraint_errors = std::move(s.constraint_errors);
  if (!s.verify_drafts.empty()) return verify_result(s, std::move(result));
  if (!s.host_tokens.defined()) return result;
  const int64_t n = s.host_tokens.numel();
  const int32_t* tokens = s.host_tokens.data<int32_t>();
  result.tokens.assign(tokens, tokens + n);
  if (s.host_top_ids.defined()) {
    const int64_t k = s.host_top_ids.size(1);
    for (int64_t i = 0; i < n; ++i) {
      TokenLogprobs lp;
      lp.logprob = s.host_logprob.data<float>()[i];
      for (int64_t j = 0; j < k; ++j) {
        int32_t id = s.host_top_ids.data<int32_t>()[i * k + j];
        if (id >= 0) lp.top.emplace_back(id, s.host_top_lp.data<float>()[i * k + j]);
      }
      result.logprobs.push_back(std::move(lp));
    }
  }
  return result;
}

StepResult ModelExecutor::verify_result(ModelStep& s, StepResult result) {
  const int32_t* sampled = s.host_tokens.data<int32_t>();
  const int64_t k = s.host_top_ids.defined() ? s.host_top_ids.size(1) : 0;
  int64_t row = 0;  // first logits row of the request
  for (size_t b = 0; b < s.verify_drafts.size(); ++b) {
    const std::vector<int32_t>& drafts = s.verify_drafts[b];
    size_t accepted = 0;
    if (s.verify_on_device[b] != 0) {
      accepted = static_cast<size_t>(s.host_accepted.data<int32_t>()[b]);
      DEEPINFER_CHECK(accepted <= drafts.size(),
                      "the device accepted more drafts than the row had");
    } else {
      while (accepted < drafts.size() &&
             sampled[row + static_cast<int64_t>(accepted)] == drafts[accepted])
        ++accepted;
    }
    result.counts.push_back(static_cast<int>(accepted) + 1);
    for (size_t j = 0; j <= accepted; ++j) {
      const int64_t at = row + static_cast<int64_t>(j);
      const bool forced = drafts.empty() && s.forced[b] >= 0;
      result.tokens.push_back(forced ? s.forced[b] : sampled[at]);
      if (!s.host_logprob.defined()) continue;
      TokenLogprobs lp;
      lp.logprob = s.host_logprob.data<float>()[at];
      for (int64_t c = 0; c < k; ++c) {
        const int32_t id = s.host_top_ids.data<int32_t>()[at * k + c];
        if (id >= 0) lp.top.emplace_back(id, s.host_top_lp.data<float>()[at * k + c]);
      }
      result.logprobs.push_back(std::move(lp));
    }
    row += static_cast<int64_t>(drafts.size()) + 1;
  }
  return result;
}

}  // namespace deepinfer::engine
