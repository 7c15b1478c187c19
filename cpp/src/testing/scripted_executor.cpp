#include "testing/scripted_executor.h"

#include <algorithm>
#include <thread>

#include "deepinfer/error.h"
#include "sample/sampler.h"

namespace deepinfer::testing {

class ScriptedExecutor::ScriptedStep final : public InflightStep {
 public:
  StepPlan plan;  // owned copy: the scheduler's spans are only valid until launch returns
  std::vector<std::vector<int32_t>> tokens;      // per row
  std::vector<std::vector<kv::BlockId>> tables;  // per row
  // Per sampling row, written by the worker. Shared: the next step's worker task reads it even
  // after the engine has committed and dropped this step.
  std::shared_ptr<std::vector<int32_t>> sampled = std::make_shared<std::vector<int32_t>>();
  std::vector<int32_t> remap;  // per row: index of its carried token in the previous step's output
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
  for (sched::PlannedRow& row : step->plan.rows) {
    step->tokens.emplace_back(row.tokens.begin(), row.tokens.end());
    step->tables.emplace_back(row.block_table.begin(), row.block_table.end());
    if (row.samples) step->sampling_rows.emplace_back(row.seq_id, row.epoch);
  }
  for (size_t i = 0; i < step->plan.rows.size(); ++i) {
    step->plan.rows[i].tokens = step->tokens[i];
    step->plan.rows[i].block_table = step->tables[i];
  }
  if (previous != nullptr) {
    const auto* prev = dynamic_cast<const ScriptedStep*>(previous);
    if (prev == nullptr) {
      throw Error(ErrorCode::kInvalidArgument,
                  "scripted executor: previous step is from another executor");
    }
    std::vector<engine::RowKey> current;
    for (const sched::PlannedRow& row : step->plan.rows)
      current.emplace_back(row.seq_id, row.epoch);
    remapper_.remap(prev->sampling_rows, current, step->remap);
    step->previous_sampled = prev->sampled;
  }
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

  for (size_t i = 0; i < step.plan.rows.size(); ++i) {
    const sched::PlannedRow& row = step.plan.rows[i];
    if (row.slot <= 0 || row.slot >= options_.num_state_slots) {
      throw Error(ErrorCode::kInternal,
                  "scripted executor: row uses state slot " + std::to_string(row.slot));
    }
    SlotState& slot = slots_[static_cast<size_t>(row.slot)];
    if (row.start_pos == 0) slot = SlotState{};  // a fresh (or recomputed) sequence
    // Positions below start_pos must already be in the slot: in order, none skipped or repeated.
    if (row.start_pos != slot.length) {
      throw Error(ErrorCode::kInternal,
                  "scripted executor: sequence " + std::to_string(row.seq_id) +
                      " row starts at position " + std::to_string(row.start_pos) +
                      " but its state slot holds " + std::to_string(slot.length));
    }
    const int needed_blocks = (row.start_pos + row.q + 127) / 128;
    if (static_cast<int>(row.block_table.size()) < needed_blocks) {
      throw Error(ErrorCode::kInternal, "scripted executor: block table too short for sequence " +
                                            std::to_string(row.seq_id));
    }
    for (kv::BlockId b : row.block_table) {
      if (b <= 0 || b >= options_.num_kv_blocks) {
        throw Error(ErrorCode::kInternal,
                    "scripted executor: block id " + std::to_string(b) + " handed out");
      }
    }
    for (int k = 0; k < row.q; ++k) {
      int32_t token = row.tokens[static_cast<size_t>(k)];
      if (k == 0 && row.carried) {
        if (!step.previous_sampled || i >= step.remap.size() || step.remap[i] < 0) {
          throw Error(ErrorCode::kInternal, "scripted executor: carried row of sequence " +
                                                std::to_string(row.seq_id) +
                                                " has no row in the previous step");
        }
        token = step.previous_sampled->at(static_cast<size_t>(step.remap[i]));
      }
      slot.hash = ScriptedModel::feed(slot.hash, token);
      ++slot.length;
    }
    if (row.samples) {
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
