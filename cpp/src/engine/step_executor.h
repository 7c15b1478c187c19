// StepExecutor: runs StepPlans on a device. `launch` only enqueues (inputs, forward, sampling);
// `wait` blocks until that step's results are on the host. The engine keeps at most two steps
// launched and not yet waited for, and waits for them in launch order.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deepinfer/config.h"
#include "deepinfer/engine.h"
#include "sched/kv_transfer.h"
#include "sched/step_plan.h"

namespace deepinfer::engine {

using sched::StepPlan;
using sched::StepResult;
using sched::StepRow;

// A launched step. Executors subclass it to keep device outputs alive for the next launch.
class InflightStep {
 public:
  virtual ~InflightStep() = default;
  uint64_t step_id = 0;
  // Set by `launch` when sampling must wait for the host to commit the step before this one
  // (penalties or constraints over tokens that step is sampling): the engine commits that step,
  // then calls `finish_launch`. The forward is already enqueued, so the device stays busy.
  bool sample_deferred = false;
};

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  // Enqueues `plan`. `previous` is the last launched step (still in flight or just finished),
  // from which carried rows take their first token; null when nothing was launched before.
  virtual std::unique_ptr<InflightStep> launch(const StepPlan& plan, InflightStep* previous) = 0;
  virtual StepResult wait(InflightStep& step) = 0;
  // Enqueues the rest of a step launched with `sample_deferred` (sampling, result copies), once
  // every step launched before it is committed; clears the flag.
  virtual void finish_launch(InflightStep& step, const StepPlan& plan) {
    (void)plan;
    step.sample_deferred = false;
  }

  // A rank of a parallel group with nothing to run in a step its group runs: the collectives its
  // peers' forward needs (every MoE layer's expert exchange with zero rows). Host-synchronous.
  // Nothing for executors outside a group.
  virtual void run_idle_pass() {}
  // Backend::make_current for the calling thread (a group's rank runs on its own thread).
  virtual void make_current() {}
  // EPLB (engine/expert_balancer.h; executors of an expert-parallel rank with enable_eplb, no-ops
  // elsewhere). record_group_step: after every step the group ran, once this rank's forward (or
  // idle pass) is enqueued; its MoE exchanges are host-synchronous, so their counts are known.
  // rebalance_due: the group rebalances before its next step (the same on every rank).
  // rebalance: collective, with no step of this rank in flight. eplb_stats: fills the eplb_*
  // fields.
  virtual void record_group_step() {}
  virtual bool rebalance_due() const { return false; }
  virtual void rebalance() {}
  virtual void eplb_stats(EngineStats& stats) const { (void)stats; }

  virtual int vocab_size() const = 0;
  virtual int max_position() const = 0;        // positions must stay below this
  virtual int num_kv_blocks() const = 0;       // including the reserved block 0
  virtual int num_state_slots() const = 0;     // live slots, including the reserved slot 0
  virtual int num_snapshot_slots() const = 0;  // slots [num_state_slots, + this)
  virtual const std::vector<int>& eos_token_ids() const = 0;
  // The checkpoint's config; null for executors without a model (test doubles).
  virtual const ModelConfig* model_config() const { return nullptr; }
  // Paged KV bytes per block and state bytes per slot, all layers (0: not known, test doubles),
  // and whether the block count came from device memory (KvSizing) rather than the config.
  virtual int64_t kv_bytes_per_block() const { return 0; }
  virtual int64_t state_slot_bytes() const { return 0; }
  virtual bool kv_sized_from_memory() const { return false; }
  // MTP blocks the checkpoint shipped and the executor loaded (speculative_method "mtp").
  virtual int num_mtp_blocks() const { return 0; }
  // Engine::load_notes; none for executors without a checkpoint.
  virtual std::vector<std::string> load_notes() const { return {}; }
  // Decode steps run through recorded graphs so far (callable from any thread).
  virtual uint64_t num_graph_steps() const { return 0; }
  // Those of them with a speculative verify row.
  virtual uint64_t num_graph_verify_steps() const { return 0; }
  // Block and state copies to and from host bytes, for the host and store tiers; null when the
  // executor has no caches (test doubles).
  virtual sched::KvTransfer* kv_transfer() { return nullptr; }
  // What names the model's weights and config for the store's fingerprint ("" when none).
  virtual std::string model_identity() const { return ""; }
};

}  // namespace deepinfer::engine
