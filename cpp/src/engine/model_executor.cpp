#include "engine/model_executor.h"

#include <algorithm>
#include <limits>

#include "deepinfer/error.h"
#include "model/batch_plan.h"

namespace deepinfer::engine {

class ModelExecutor::ModelStep final : public InflightStep {
 public:
  Tensor sampled;       // device [S] i32: read by the next step's carried rows
  Tensor host_tokens;   // host [S] i32, filled by the stream
  Tensor host_logprob;  // host [S] f32
  Tensor host_top_ids;  // host [S, N] i32 (N = max logprobs asked), undefined if none
  Tensor host_top_lp;   // host [S, N] f32
  std::unique_ptr<Event> done;
};

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

}  // namespace

ModelExecutor::ModelExecutor(const ModelExecutorOptions& options)
    : options_(options),
      model_(ModelInstance::load(options.checkpoint_dir, options.model_config, cache_shape(options),
                                 options.placement.device, options.placement.num_threads,
                                 options.placement.decode_graph_max_batch)) {}

int ModelExecutor::max_position() const {
  return static_cast<int>(std::min<int64_t>(model_->config.max_position_embeddings,
                                            std::numeric_limits<int32_t>::max()));
}

std::unique_ptr<InflightStep> ModelExecutor::launch(const StepPlan& plan, InflightStep* previous) {
  ModelInstance& m = *model_;
  Backend& be = *m.backend;
  auto step = std::make_unique<ModelStep>();
  step->step_id = plan.step_id;
  HostSyncForbidden no_sync(be);  // launching must never wait for the device

  chunks_.resize(plan.rows.size());
  std::vector<RowKey> carried_keys;
  bool any_carried = false;
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const PlannedRow& row = plan.rows[i];
    SequenceChunk& c = chunks_[i];
    c.slot = row.slot;
    c.start_pos = row.start_pos;
    c.tokens.assign(row.tokens.begin(), row.tokens.end());
    const size_t blocks = static_cast<size_t>((row.start_pos + row.q + 127) / 128);
    c.block_table.assign(
        row.block_table.begin(),
        row.block_table.begin() + static_cast<ptrdiff_t>(std::min(blocks, row.block_table.size())));
    if (row.samples) step->sampling_rows.emplace_back(row.seq_id, row.epoch);
    carried_keys.emplace_back(row.seq_id, row.epoch);
    any_carried = any_carried || row.carried;
  }
  const bool use_graph = m.graphs != nullptr && m.graphs->accepts(chunks_);
  BatchPlan bp;
  if (!use_graph) bp = build_batch_plan(chunks_, m.config, m.caches->shape(), be);

  // Carried rows read their token from the previous step's device output.
  Tensor token_ids;
  if (any_carried) {
    auto* prev = dynamic_cast<ModelStep*>(previous);
    if (prev == nullptr)
      throw Error(ErrorCode::kInternal, "carried rows without a previous model step");
    std::vector<int32_t> row_remap;
    remapper_.remap(prev->sampling_rows, carried_keys, row_remap);
    std::vector<int32_t> host_tokens;
    std::vector<int32_t> token_remap;
    for (size_t i = 0; i < plan.rows.size(); ++i) {
      const PlannedRow& row = plan.rows[i];
      if (row.carried && row_remap[i] < 0) {
        throw Error(ErrorCode::kInternal, "carried row of sequence " + std::to_string(row.seq_id) +
                                              " is not in the previous step");
      }
      for (int j = 0; j < row.q; ++j) {
        // The eager plan already holds the host tokens on the device; a graph step has no plan.
        if (use_graph) host_tokens.push_back(row.tokens[static_cast<size_t>(j)]);
        token_remap.push_back(j == 0 && row.carried ? row_remap[i] : -1);
      }
    }
    const Tensor host_ids = use_graph ? upload_vector(be, host_tokens) : bp.layout.token_ids;
    token_ids = be.select_tokens(host_ids, upload_vector(be, token_remap), prev->sampled);
    if (!use_graph) bp.layout.token_ids = token_ids;
  }

  m.caches->copy_state_slots(be, plan.copies_before);
  // One row per sequence either way.
  Tensor logits = use_graph ? m.graphs->forward(chunks_, token_ids)
                            : m.model->forward(bp, *m.caches, LogitsMode::kLast);

  std::vector<int32_t> sample_rows;
  std::vector<float> temperature, top_p;
  std::vector<int32_t> top_k, num_logprobs;
  std::vector<int64_t> seed, position;
  int max_logprobs = 0;
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const PlannedRow& row = plan.rows[i];
    if (!row.samples) continue;
    sample_rows.push_back(static_cast<int32_t>(i));
    temperature.push_back(row.temperature);
    top_k.push_back(row.top_k);
    top_p.push_back(row.top_p);
    seed.push_back(static_cast<int64_t>(row.seed));
    position.push_back(row.start_pos + row.q);  // the position of the token being generated
    num_logprobs.push_back(row.num_logprobs);
    max_logprobs = std::max(max_logprobs, row.num_logprobs);
  }
  if (!sample_rows.empty()) {
    if (sample_rows.size() != plan.rows.size())
      logits = be.gather_rows(logits, upload_vector(be, sample_rows));
    SamplingBatch sb;
    sb.num_rows = static_cast<int>(sample_rows.size());
    sb.max_logprobs = max_logprobs;
    sb.temperature = upload_vector(be, temperature);
    sb.top_k = upload_vector(be, top_k);
    sb.top_p = upload_vector(be, top_p);
    sb.seed = upload_vector(be, seed);
    sb.position = upload_vector(be, position);
    sb.num_logprobs = upload_vector(be, num_logprobs);
    SampleResult sr = be.sample(logits, sb);
    step->sampled = sr.tokens;
    // Forced tokens (test hook) replace sampled ones on the device, so carried rows of the next
    // step read them like any sampled token.
    std::vector<int32_t> forced, keep;
    bool any_forced = false;
    for (size_t r = 0; r < sample_rows.size(); ++r) {
      const int32_t f = plan.rows[static_cast<size_t>(sample_rows[r])].forced_token;
      any_forced = any_forced || f >= 0;
      forced.push_back(f >= 0 ? f : 0);
      keep.push_back(f >= 0 ? -1 : static_cast<int32_t>(r));
    }
    if (any_forced) {
      step->sampled =
          be.select_tokens(upload_vector(be, forced), upload_vector(be, keep), sr.tokens);
    }
    const int64_t n = sb.num_rows;
    step->host_tokens = Tensor::zeros({n}, DType::kI32);
    be.copy_to_host(step->sampled, step->host_tokens);
    if (max_logprobs > 0) {
      step->host_logprob = Tensor::zeros({n}, DType::kF32);
      step->host_top_ids = Tensor::zeros({n, max_logprobs}, DType::kI32);
      step->host_top_lp = Tensor::zeros({n, max_logprobs}, DType::kF32);
      be.copy_to_host(sr.logprobs, step->host_logprob);
      be.copy_to_host(sr.top_ids, step->host_top_ids);
      be.copy_to_host(sr.top_logprobs, step->host_top_lp);
    }
  }
  m.caches->copy_state_slots(be, plan.copies_after);
  step->done = be.record_event();
  return step;
}

StepResult ModelExecutor::wait(InflightStep& step) {
  auto& s = dynamic_cast<ModelStep&>(step);
  s.done->wait();
  StepResult result;
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

}  // namespace deepinfer::engine
