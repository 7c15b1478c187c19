// ScriptedExecutor: a StepExecutor without a model, for engine tests and benchmarks.
//
// It runs each step on its own in-order worker (a CpuStream, like the CPU backend's device
// stream), optionally sleeping `step_latency` to stand in for device time, and emulates what the
// caches do: each state slot keeps a rolling hash of the tokens fed at positions 0..n-1, and the
// token sampled after position p is a function of that hash. A request's output therefore depends
// on its own tokens only, exactly as with a real model, and any scheduling mistake (a skipped or
// repeated position, a carried token taken from the wrong row, a wrong snapshot restored, a
// stale slot) changes the outputs or trips a check.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/cpu_stream.h"
#include "exec/remap.h"
#include "exec/step_executor.h"

namespace deepinfer::exec {

struct ScriptedExecutorOptions {
  int vocab_size = 1000;
  std::vector<int> eos_token_ids = {1};
  double eos_probability = 0.0;  // chance that a sampled token is eos_token_ids[0]
  int num_kv_blocks = 1024;      // including block 0
  int num_state_slots = 64;      // including slot 0
  int num_snapshot_slots = 16;
  int max_position = 1 << 20;
  std::chrono::microseconds step_latency{0};
};

// Worker-side timestamps of one step, for the idle-gap benchmark.
struct StepTiming {
  std::chrono::steady_clock::time_point start, end;
};

class ScriptedExecutor final : public StepExecutor {
 public:
  explicit ScriptedExecutor(const ScriptedExecutorOptions& options);
  ~ScriptedExecutor() override;

  std::unique_ptr<InflightStep> launch(const StepPlan& plan, InflightStep* previous) override;
  StepResult wait(InflightStep& step) override;

  int vocab_size() const override { return options_.vocab_size; }
  int max_position() const override { return options_.max_position; }
  int num_kv_blocks() const override { return options_.num_kv_blocks; }
  int num_state_slots() const override { return options_.num_state_slots; }
  int num_snapshot_slots() const override { return options_.num_snapshot_slots; }
  const std::vector<int>& eos_token_ids() const override { return options_.eos_token_ids; }

  // The token the model emulation samples after a context whose rolling hash is `state`.
  int32_t token_for(uint64_t state) const;
  static uint64_t feed(uint64_t state, int32_t token);
  // The token a request with `tokens` as its whole context samples next.
  int32_t next_token(const std::vector<int32_t>& tokens) const;

  // Timestamps of every step run so far, in order (waits for the worker).
  std::vector<StepTiming> timings();

 private:
  struct SlotState {
    int length = 0;     // positions fed
    uint64_t hash = 0;  // rolling hash of those tokens
  };
  class ScriptedStep;
  void run(ScriptedStep& step);

  ScriptedExecutorOptions options_;
  std::vector<SlotState> slots_;  // live slots then snapshot slots; touched by the worker only
  BatchRemapper remapper_;
  std::mutex timing_mu_;
  std::vector<StepTiming> timings_;
  CpuStream stream_;  // last member: drained and joined before the rest is destroyed
};

}  // namespace deepinfer::exec
