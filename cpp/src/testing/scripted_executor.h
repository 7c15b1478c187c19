// ScriptedExecutor: a StepExecutor without a model, for engine tests and benchmarks (the test
// double behind deepinfer/testing/scripted_engine.h).
//
// It runs each step on its own in-order worker (a CpuStream, like the CPU backend's device
// stream), optionally sleeping `step_latency` to stand in for device time, and emulates what the
// caches do: each state slot keeps a rolling hash of the tokens fed at positions 0..n-1, and the
// token sampled after position p is a function of that hash (ScriptedModel). A KV block holds the
// hash after its last position, and a row that resumes at a block boundary checks that the block
// before it agrees with its slot. Blocks and slots copy to and from host bytes (sched::KvTransfer,
// on the same worker), so the KV tiers run over it: a wrongly imported block or snapshot changes
// the outputs or trips that check. A verify row samples after each of its tokens and keeps its
// accepted drafts only, as the model executor's acceptance does; a row that starts anywhere but
// where its slot ends (say, at a verify row's optimistic end) trips the position check.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/cpu_stream.h"
#include "deepinfer/testing/scripted_engine.h"
#include "engine/step_executor.h"

namespace deepinfer::testing {

using engine::InflightStep;
using engine::StepExecutor;
using sched::StepPlan;
using sched::StepResult;

struct ScriptedExecutorOptions {
  ScriptedModel model;
  int num_kv_blocks = 1024;  // including block 0
  int num_state_slots = 64;  // including slot 0
  int num_snapshot_slots = 16;
};

// Worker-side timestamps of one step, for the idle-gap benchmark.
struct StepTiming {
  std::chrono::steady_clock::time_point start, end;
};

class ScriptedExecutor final : public StepExecutor, private sched::KvTransfer {
 public:
  explicit ScriptedExecutor(const ScriptedExecutorOptions& options);
  ~ScriptedExecutor() override;

  std::unique_ptr<InflightStep> launch(const StepPlan& plan, InflightStep* previous) override;
  StepResult wait(InflightStep& step) override;

  int vocab_size() const override { return options_.model.vocab_size; }
  int max_position() const override { return options_.model.max_position; }
  int num_kv_blocks() const override { return options_.num_kv_blocks; }
  int num_state_slots() const override { return options_.num_state_slots; }
  int num_snapshot_slots() const override { return options_.num_snapshot_slots; }
  const std::vector<int>& eos_token_ids() const override { return options_.model.eos_token_ids; }
  sched::KvTransfer* kv_transfer() override { return this; }
  std::string model_identity() const override;

  // Timestamps of every step run so far, in order (waits for the worker).
  std::vector<StepTiming> timings();

 private:
  struct SlotState {
    int length = 0;     // positions fed
    uint64_t hash = 0;  // rolling hash of those tokens
  };
  class ScriptedStep;
  void run(ScriptedStep& step);
  // Samples after each token of verify row `row` over a slot holding `hash` into `step`, and
  // returns how many of its drafts are accepted.
  int accepted_drafts(const sched::StepRow& row, uint64_t hash, ScriptedStep& step) const;

  // sched::KvTransfer: a block is its hash (8 bytes), a slot its length and hash (16 bytes).
  int64_t block_bytes() const override { return 8; }
  int64_t state_bytes() const override { return 16; }
  std::vector<uint64_t> block_bytes_per_layer() const override { return {8}; }
  void export_block(kv::BlockId block, int32_t slot, std::span<uint8_t> dst,
                    const std::shared_ptr<const void>& keep_alive) override;
  std::unique_ptr<Event> record_event() override { return stream_.record_event(); }
  void import_block(kv::BlockId block, std::span<const uint8_t> src) override;
  void import_state(int32_t slot, std::span<const uint8_t> src) override;

  ScriptedExecutorOptions options_;
  std::vector<SlotState> slots_;  // live slots then snapshot slots; touched by the worker only
  std::vector<uint64_t> blocks_;  // per KV block, the hash after its last position; likewise
  int failed_imports_ = 0;        // planted import faults so far (engine thread)
  std::mutex timing_mu_;
  std::vector<StepTiming> timings_;
  CpuStream stream_;  // last member: drained and joined before the rest is destroyed
};

}  // namespace deepinfer::testing
