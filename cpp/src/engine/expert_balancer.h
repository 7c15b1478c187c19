// ExpertBalancer: EPLB inside the running engine, for one rank of an expert-parallel group
// (docs/architecture.md#eplb-in-the-engine). Owned by the rank's ModelExecutor.
//
// Every group step (a forward or an idle pass; every rank counts the same steps) record_step()
// takes the model's per-layer slot counts of that step (DeepseekV4Model::take_slot_counts) into a
// dist::LoadWindow. When dist::RebalanceSchedule says so, due() turns true; the engine then
// drains its pipeline and calls rebalance() on every rank at the same point of the same step():
//   1. all-reduce the window (every layer's per-bucket expert loads) over the host channel, so
//      every rank plans from the same global loads;
//   2. dist::plan_placement per MoE layer with the current placement as `previous` (integer
//      arithmetic: the same plan on every rank);
//   3. the weight shuffle: each rank loads the experts its new slots hold that none of its old
//      slots held (ExpertLoader: from the checkpoint, only those experts' bytes; or the same
//      random weights for load_format dummy), keeps the ones it still holds, drops the rest;
//   4. installs the new placements and local weights in the model.
// The pause (wall time of rebalance(), including the stream drain) is recorded.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "deepinfer/backend.h"
#include "dist/communicator.h"
#include "dist/load_window.h"
#include "model/deepseek_v4.h"

namespace deepinfer::engine {

// Loads main layer `layer`'s routed experts `experts` (logical ids, slot order) with the values
// the initial load gave them.
using ExpertLoader = std::function<ExpertWeights(int layer, std::span<const int32_t> experts)>;

struct EplbCounters {
  uint64_t rebalances = 0;
  double last_pause_seconds = 0;
  double max_over_mean_before = 0;
  double max_over_mean_after = 0;
  // Experts this rank loaded over all rebalances (what the shuffle cost it in reads).
  uint64_t experts_loaded = 0;
};

class ExpertBalancer {
 public:
  // `model` must be expert-parallel (set_expert_parallel) over `comm`; both outlive this.
  // Reads options' window, bucket and interval; the redundant slots per rank are the current
  // placement's (a rebalance keeps the slot count).
  ExpertBalancer(DeepseekV4Model& model, dist::Communicator& comm, const dist::EplbOptions& options,
                 ExpertLoader loader);

  // After every group step of this rank (forward or idle pass), once its MoE layers ran.
  void record_step();
  // Whether the group rebalances before its next step (the same on every rank).
  bool due() const { return due_; }
  // Collective: every rank of the group calls it at the same point. Synchronizes the backend
  // first (the expert weights must not change under enqueued work).
  void rebalance();

  const EplbCounters& counters() const { return counters_; }

 private:
  DeepseekV4Model& model_;
  dist::Communicator& comm_;
  ExpertLoader loader_;
  dist::LoadWindow window_;
  dist::RebalanceSchedule schedule_;
  std::vector<std::vector<int64_t>> step_counts_;  // reused every step
  bool due_ = false;
  EplbCounters counters_;
};

// A bucket size that divides `window_steps`: about a tenth of it (the policy balances each
// bucket, so a few buckets per window), 1 for windows that ten does not divide.
int eplb_bucket_steps(int window_steps);

}  // namespace deepinfer::engine
