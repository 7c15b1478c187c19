#include "testing/scripted_executor.h"

#include <algorithm>
#include <thread>

#include "deepinfer/error.h"
#include "kv/cache_geometry.h"

namespace deepinfer::testing {

class ScriptedExecutor::ScriptedStep final : public InflightStep {
 public:
  StepPlan plan;  // owned copy: the scheduler's spans are only valid until launch returns
  std::vector<std::vector<int32_t>> tokens;  // per row
  std::vector<std::vector<int32_t>> tables;  // per row
  // Per sampling row, written by the worker. Shared: the next step's worker task reads it even
  // after the engine has committed and dropped this step.
  std::shared_ptr<std::vector<int32_t>> sampled = std::make_shared<std::vector<int32_t>>();
  // (sequence, epoch) of each sampling row: a carried row of the next step must name its own.
  std::vector<std::pair<RequestId, uint32_t>> sampling_keys;
  std::shared_ptr<const std::vector<int32_t>> previous_sampled;
  std::unique_ptr<Event> done;
};

ScriptedExecutor::ScriptedExecutor(const ScriptedExecutorOptions& options)
    : options_(options),
      slots_(static_cast<size_t>(options.num_state_slots + options.num_snapshot_slots)) {
  if (options.model.vocab_size < 2 || options.model.eos_token_ids.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                "scripted executor needs vocab_size >= 2 and an EOS id");
  }
}

ScriptedExecutor::~ScriptedExecutor() {
  try {
    stream_.synchronize();
  } catch (...) {  // a failed step was never waited for; nothing left to report it to
  }
}

std::unique_ptr<InflightStep> ScriptedExecutor::launch(const StepPlan& plan,
                                                       InflightStep* previous) {
  auto step = std::make_unique<ScriptedStep>();
  step->step_id = plan.step_id;
  step->plan = plan;
  for (const sched::StepRow& row : step->plan.rows) {
    step->tokens.emplace_back(row.forward.tokens.begin(), row.forward.tokens.end());
    step->tables.emplace_back(row.forward.block_table.begin(), row.forward.block_table.end());
    if (row.samples()) step->sampling_keys.emplace_back(row.seq_id, row.epoch);
  }
  for (size_t i = 0; i < step->plan.rows.size(); ++i) {
    step->plan.rows[i].forward.tokens = step->tokens[i];
    step->plan.rows[i].forward.block_table = step->tables[i];
  }
  const auto* prev = dynamic_cast<const ScriptedStep*>(previous);
  if (previous != nullptr && prev == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                "scripted executor: previous step is from another executor");
  }
  // A carried row must name its own sequence's sampling row of the previous step: checked by key,
  // independently of how the scheduler found the index.
  for (const sched::StepRow& row : step->plan.rows) {
    if (!row.carried()) continue;
    const auto index = static_cast<size_t>(row.forward.token_from_previous);
    if (prev == nullptr || index >= prev->sampling_keys.size() ||
        prev->sampling_keys[index] != std::make_pair(row.seq_id, row.epoch)) {
      throw Error(ErrorCode::kInternal, "scripted executor: carried row of sequence " +
                                            std::to_string(row.seq_id) +
                                            " does not name its row of the previous step");
    }
  }
  if (prev != nullptr) step->previous_sampled = prev->sampled;
  ScriptedStep* raw = step.get();  // alive until wait() returned, which the engine always calls
  stream_.enqueue([this, raw] { run(*raw); });
  step->done = stream_.record_event();
  return step;
}

void ScriptedExecutor::run(ScriptedStep& step) {
  StepTiming timing;
  timing.start = std::chrono::steady_clock::now();
  if (options_.model.step_latency.count() > 0)
    std::this_thread::sleep_for(options_.model.step_latency);
  for (const auto& [src, dst] : step.plan.copies_before)
    slots_.at(static_cast<size_t>(dst)) = slots_.at(static_cast<size_t>(src));

  for (const sched::StepRow& row : step.plan.rows) {
    const ForwardRow& f = row.forward;
    if (f.slot <= 0 || f.slot >= options_.num_state_slots) {
      throw Error(ErrorCode::kInternal,
                  "scripted executor: row uses state slot " + std::to_string(f.slot));
    }
    SlotState& slot = slots_[static_cast<size_t>(f.slot)];
    if (f.start_pos == 0) slot = SlotState{};  // a fresh (or recomputed) sequence
    // Positions below start_pos must already be in the slot: in order, none skipped or repeated.
    if (f.start_pos != slot.length) {
      throw Error(ErrorCode::kInternal,
                  "scripted executor: sequence " + std::to_string(row.seq_id) +
                      " row starts at position " + std::to_string(f.start_pos) +
                      " but its state slot holds " + std::to_string(slot.length));
    }
    if (static_cast<int64_t>(f.block_table.size()) !=
        kv::blocks_for_tokens(f.start_pos + f.num_tokens)) {
      throw Error(ErrorCode::kInternal,
                  "scripted executor: sequence " + std::to_string(row.seq_id) + " has " +
                      std::to_string(f.block_table.size()) + " blocks for positions up to " +
                      std::to_string(f.start_pos + f.num_tokens - 1));
    }
    for (int32_t b : f.block_table) {
      if (b <= 0 || b >= options_.num_kv_blocks) {
        throw Error(ErrorCode::kInternal,
                    "scripted executor: block id " + std::to_string(b) + " handed out");
      }
    }
    for (int k = 0; k < f.num_tokens; ++k) {
      int32_t token = f.tokens[static_cast<size_t>(k)];
      if (k == 0 && row.carried()) {
        token = step.previous_sampled->at(static_cast<size_t>(f.token_from_previous));
      }
      slot.hash = ScriptedModel::feed(slot.hash, token);
      ++slot.length;
    }
    if (row.samples()) {
      step.sampled->push_back(row.forced_token >= 0 ? row.forced_token
                                                    : options_.model.token_after(slot.hash));
    }
  }
  for (const auto& [src, dst] : step.plan.copies_after)
    slots_.at(static_cast<size_t>(dst)) = slots_.at(static_cast<size_t>(src));
  timing.end = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(timing_mu_);
  timings_.push_back(timing);
}

StepResult ScriptedExecutor::wait(InflightStep& step) {
  auto& s = dynamic_cast<ScriptedStep&>(step);
  s.done->wait();
  StepResult result;
  result.tokens = *s.sampled;
  return result;
}

std::vector<StepTiming> ScriptedExecutor::timings() {
  stream_.synchronize();
  std::lock_guard<std::mutex> lock(timing_mu_);
  return timings_;
}

}  // namespace deepinfer::testing
