#include "testing/scripted_executor.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>

#include "deepinfer/error.h"
#include "kv/cache_geometry.h"

namespace deepinfer::testing {

class ScriptedExecutor::ScriptedStep final : public InflightStep {
 public:
  StepPlan plan;  // owned copy: the scheduler's spans are only valid until launch returns
  std::vector<std::vector<int32_t>> tokens;  // per row
  std::vector<std::vector<int32_t>> tables;  // per row
  // One sample per logits row (1 + d for a verify row), written by the worker. Shared: the next
  // step's worker task reads it even after the engine has committed and dropped this step.
  std::shared_ptr<std::vector<int32_t>> sampled = std::make_shared<std::vector<int32_t>>();
  // What the commit reads, written by the worker: per sampling row its tokens (a verify row's
  // accepted drafts and final token) and their count.
  std::vector<int32_t> committed;
  std::vector<int> counts;
  // (sequence, epoch) of each sample: a carried row of the next step must name its own.
  std::vector<std::pair<RequestId, uint32_t>> sampling_keys;
  std::shared_ptr<const std::vector<int32_t>> previous_sampled;
  std::unique_ptr<Event> done;
};

ScriptedExecutor::ScriptedExecutor(const ScriptedExecutorOptions& options)
    : options_(options),
      slots_(static_cast<size_t>(options.num_state_slots + options.num_snapshot_slots)),
      blocks_(static_cast<size_t>(std::max(options.num_kv_blocks, 0))) {
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
    if (row.samples())
      step->sampling_keys.insert(step->sampling_keys.end(), static_cast<size_t>(1 + row.num_drafts),
                                 {row.seq_id, row.epoch});
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
    // A bounded-replay hit (kv_window_state bounded_replay) starts at swa_valid_start over a
    // zeroed slot. The scripted model's outputs do not depend on the window, so the replay
    // rebuilds the state exactly: from the tag of the block before the replay.
    if (f.swa_valid_start > 0 && f.start_pos == f.swa_valid_start && slot.length == 0 &&
        slot.hash == 0 && f.start_pos % kv::kBlockSize == 0) {
      slot.hash = blocks_.at(static_cast<size_t>(
          f.block_table[static_cast<size_t>(f.start_pos / kv::kBlockSize - 1)]));
      slot.length = f.start_pos;
    }
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
    const int bs = kv::kBlockSize;
    // Resuming at a block boundary (a prefix hit, a fetched prefix, a chunk): the block before
    // must hold the prefix the slot says was fed.
    if (f.start_pos > 0 && f.start_pos % bs == 0 &&
        blocks_[static_cast<size_t>(f.block_table[static_cast<size_t>(f.start_pos / bs - 1)])] !=
            slot.hash) {
      throw Error(ErrorCode::kInternal, "scripted executor: sequence " +
                                            std::to_string(row.seq_id) + " resumes at position " +
                                            std::to_string(f.start_pos) +
                                            " over a block holding another prefix");
    }
    // A verify row (input token, then d drafts) samples after each of its tokens; draft j is
    // accepted while it equals the sample before it, and only the input token and the accepted
    // drafts stay in the slot and its blocks (the rest is overwritten later, as on the device).
    const int kept = row.verifies() ? 1 + accepted_drafts(row, slot.hash, step) : f.num_tokens;
    for (int k = 0; k < kept; ++k) {
      int32_t token = f.tokens[static_cast<size_t>(k)];
      if (k == 0 && row.carried()) {
        token = step.previous_sampled->at(static_cast<size_t>(f.token_from_previous));
      }
      slot.hash = ScriptedModel::feed(slot.hash, token);
      ++slot.length;
      if (slot.length % bs == 0) {
        const auto b = static_cast<size_t>(slot.length / bs - 1);
        uint64_t& tag = blocks_[static_cast<size_t>(f.block_table[b])];
        // A replayed block keeps what the tiers supplied (the replay stores no entry of it).
        if (slot.length <= f.replay_end && tag != slot.hash) {
          throw Error(ErrorCode::kInternal, "scripted executor: sequence " +
                                                std::to_string(row.seq_id) + " replays block " +
                                                std::to_string(b) + " over another prefix");
        }
        tag = slot.hash;
      }
    }
    if (row.samples() && !row.verifies()) {
      const int32_t token =
          row.forced_token >= 0 ? row.forced_token : options_.model.token_after(slot.hash);
      step.sampled->push_back(token);
      step.committed.push_back(token);
      step.counts.push_back(1);
    }
  }
  for (const auto& [src, dst] : step.plan.copies_after)
    slots_.at(static_cast<size_t>(dst)) = slots_.at(static_cast<size_t>(src));
  timing.end = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(timing_mu_);
  timings_.push_back(timing);
}

int ScriptedExecutor::accepted_drafts(const sched::StepRow& row, uint64_t hash,
                                      ScriptedStep& step) const {
  const ForwardRow& f = row.forward;
  int accepted = -1;  // until a sample differs from the draft after it
  for (int k = 0; k < f.num_tokens; ++k) {
    hash = ScriptedModel::feed(hash, f.tokens[static_cast<size_t>(k)]);
    const int32_t sample = options_.model.token_after(hash);
    step.sampled->push_back(sample);
    const bool last = k + 1 == f.num_tokens;
    if (accepted < 0 && (last || sample != f.tokens[static_cast<size_t>(k) + 1])) {
      accepted = k;
      step.committed.push_back(sample);
      step.counts.push_back(k + 1);
    } else if (accepted < 0) {
      step.committed.push_back(sample);
    }
  }
  return accepted;
}

StepResult ScriptedExecutor::wait(InflightStep& step) {
  auto& s = dynamic_cast<ScriptedStep&>(step);
  s.done->wait();
  StepResult result;
  result.tokens = s.committed;
  const bool verifies = std::any_of(s.plan.rows.begin(), s.plan.rows.end(),
                                    [](const sched::StepRow& r) { return r.verifies(); });
  if (verifies) result.counts = s.counts;
  return result;
}

std::string ScriptedExecutor::model_identity() const {
  return "scripted;vocab=" + std::to_string(options_.model.vocab_size);
}

void ScriptedExecutor::export_block(kv::BlockId block, int32_t slot, std::span<uint8_t> dst,
                                    const std::shared_ptr<const void>& keep_alive) {
  const size_t need = 8 + (slot >= 0 ? 16 : 0);
  if (dst.size() < need) {
    throw Error(ErrorCode::kInvalidArgument, "scripted executor: export of block " +
                                                 std::to_string(block) + " into " +
                                                 std::to_string(dst.size()) + " bytes");
  }
  // Behind the steps launched so far, like a device copy; keep_alive holds dst until it ran.
  stream_.enqueue([this, block, slot, dst, keep_alive] {
    const uint64_t tag = blocks_.at(static_cast<size_t>(block));
    std::memcpy(dst.data(), &tag, 8);
    if (slot < 0) return;
    const SlotState& s = slots_.at(static_cast<size_t>(slot));
    const int64_t length = s.length;
    std::memcpy(dst.data() + 8, &length, 8);
    std::memcpy(dst.data() + 16, &s.hash, 8);
  });
}

void ScriptedExecutor::import_block(kv::BlockId block, std::span<const uint8_t> src) {
  if (src.size() != 8) {
    throw Error(
        ErrorCode::kInvalidArgument,
        "scripted executor: import of " + std::to_string(src.size()) + " bytes into a block of 8");
  }
  if (failed_imports_ < options_.model.failing_imports) {
    ++failed_imports_;
    throw Error(ErrorCode::kInternal,
                "scripted executor: planted fault in the import of block " + std::to_string(block));
  }
  uint64_t tag = 0;
  std::memcpy(&tag, src.data(), 8);
  stream_.enqueue([this, block, tag] { blocks_.at(static_cast<size_t>(block)) = tag; });
}

void ScriptedExecutor::import_state(int32_t slot, std::span<const uint8_t> src) {
  if (src.size() != 16) {
    throw Error(ErrorCode::kInvalidArgument, "scripted executor: import of " +
                                                 std::to_string(src.size()) +
                                                 " bytes into a state slot of 16");
  }
  int64_t length = 0;
  SlotState s;
  std::memcpy(&length, src.data(), 8);
  std::memcpy(&s.hash, src.data() + 8, 8);
  s.length = static_cast<int>(length);
  stream_.enqueue([this, slot, s] { slots_.at(static_cast<size_t>(slot)) = s; });
}

std::vector<StepTiming> ScriptedExecutor::timings() {
  stream_.synchronize();
  std::lock_guard<std::mutex> lock(timing_mu_);
  return timings_;
}

}  // namespace deepinfer::testing
