// EPLB statistics over time: the tokens each logical expert received over the last window of
// steps, and when to rebalance.
//
// The MoE forward counts tokens per *physical* slot; record_step scatters a step's counts to
// logical experts right away with the placement that served them, so the window stays valid across
// a rebalance (a slot's meaning changes then, an expert's does not). The window is a ring of
// buckets of `bucket_steps` steps; it covers the last window_steps steps once warm (between
// window - bucket and window steps right after a bucket turns over). The buckets are the
// policy's time samples (eplb_policy.h), so it can balance each part of the window, not only the
// sum.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dist/eplb_policy.h"
#include "dist/expert_placement.h"

namespace deepinfer::dist {

// Defaults from the production deployment: counts over 1000 steps, rebalance every 10000.
struct EplbOptions {
  int window_steps = 1000;
  int bucket_steps = 100;              // must divide window_steps
  int64_t rebalance_interval = 10000;  // 0 = never
  int redundant_slots_per_rank = 1;
};

class LoadWindow {
 public:
  LoadWindow(int num_layers, int num_logical, int window_steps = 1000, int bucket_steps = 100);

  // slot_counts [num_layers][num_slots of that layer's placement], one step's tokens per slot.
  void record_step(std::span<const std::vector<int64_t>> slot_counts,
                   std::span<const ExpertPlacement> placements);
  // The window of `layer` as policy input: one sample per bucket that has seen a step, oldest
  // first.
  ExpertLoads loads(int layer) const;
  // The window's totals per logical expert of `layer`.
  std::vector<int64_t> totals(int layer) const;
  int64_t steps_recorded() const { return steps_; }

 private:
  int num_layers_;
  int num_logical_;
  int bucket_steps_;
  int num_buckets_;
  int current_ = 0;  // bucket being filled
  int steps_in_current_ = 0;
  int64_t steps_ = 0;
  std::vector<int64_t> counts_;  // [buckets][layers][logical]
};

// When to rebalance: first after a quarter of the interval (the initial layout knows nothing of
// the traffic), then every interval after that: steps interval/4, interval/4 + interval, ...
class RebalanceSchedule {
 public:
  // interval 0 = never. A window longer than interval / 4 is allowed: the first plan then sees
  // a partial window.
  explicit RebalanceSchedule(int64_t interval);
  // Whether to rebalance after `steps_done` (>= 1) steps.
  bool due(int64_t steps_done) const;
  int64_t first() const { return first_; }

 private:
  int64_t interval_;
  int64_t first_;
};

}  // namespace deepinfer::dist
