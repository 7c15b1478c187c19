#include "engine/expert_balancer.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "deepinfer/error.h"
#include "dist/eplb_policy.h"

namespace deepinfer::engine {
namespace {

size_t sz(int64_t v) {
  return static_cast<size_t>(v);
}

const ExpertParallel& expert_parallel_of(const DeepseekV4Model& model) {
  const ExpertParallel* ep = model.expert_parallel();
  if (ep == nullptr || ep->placements.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                "EPLB (enable_eplb) needs an expert-parallel model with one placement per layer");
  }
  return *ep;
}

// The slot counts `placement` gives the window's per-expert `totals`: an expert's tokens split
// evenly over its replicas (ExpertPlacement::slot_for picks replica key mod replicas, so this is
// what its traffic does up to one token), the remainder to the first replicas.
std::vector<int64_t> expected_slot_counts(const dist::ExpertPlacement& placement,
                                          std::span<const int64_t> totals) {
  std::vector<int64_t> slots(sz(placement.num_slots()), 0);
  for (int e = 0; e < placement.num_logical(); ++e) {
    const std::span<const int32_t> reps = placement.replicas(e);
    const auto n = static_cast<int64_t>(reps.size());
    const int64_t t = totals[sz(e)];
    for (int64_t i = 0; i < n; ++i) slots[sz(reps[sz(i)])] = t / n + (i < t % n ? 1 : 0);
  }
  return slots;
}

}  // namespace

int eplb_bucket_steps(int window_steps) {
  for (int b = window_steps / 10; b > 1; --b) {
    if (window_steps % b == 0) return b;
  }
  return 1;
}

ExpertBalancer::ExpertBalancer(DeepseekV4Model& model, dist::Communicator& comm,
                               const dist::EplbOptions& options, ExpertLoader loader)
    : model_(model),
      comm_(comm),
      loader_(std::move(loader)),
      window_(static_cast<int>(expert_parallel_of(model).placements.size()),
              expert_parallel_of(model).placements.front().num_logical(), options.window_steps,
              options.bucket_steps),
      schedule_(options.rebalance_interval) {}

void ExpertBalancer::record_step() {
  model_.take_slot_counts(step_counts_);
  window_.record_step(step_counts_, model_.expert_parallel()->placements);
  due_ = schedule_.due(window_.steps_recorded());
}

void ExpertBalancer::rebalance() {
  const auto started = std::chrono::steady_clock::now();
  due_ = false;
  Backend& be = model_.backend();
  // Nothing enqueued may still read the weights about to be replaced.
  be.synchronize();
  const ExpertParallel& ep = expert_parallel_of(model_);
  const auto num_layers = static_cast<int>(ep.placements.size());
  const int num_ranks = comm_.size();
  const int me = comm_.rank();

  // 1. The group's window: every layer's per-bucket loads in one host all-reduce. Every rank
  // recorded the same steps, so the shapes agree.
  std::vector<dist::ExpertLoads> loads;
  std::vector<int64_t> flat;
  for (int l = 0; l < num_layers; ++l) {
    loads.push_back(window_.loads(l));
    flat.insert(flat.end(), loads.back().counts.begin(), loads.back().counts.end());
  }
  flat = comm_.all_reduce_host(flat, dist::HostReduceOp::kSum);
  size_t at = 0;
  for (dist::ExpertLoads& l : loads) {
    std::copy_n(flat.begin() + static_cast<std::ptrdiff_t>(at), l.counts.size(), l.counts.begin());
    at += l.counts.size();
  }

  double before = 0;
  double after = 0;
  for (int l = 0; l < num_layers; ++l) {
    const dist::ExpertLoads& g = loads[sz(l)];
    const dist::ExpertPlacement old = ep.placements[sz(l)];  // a copy: install replaces it
    std::vector<int64_t> totals(sz(g.num_experts), 0);
    for (int s = 0; s < g.num_samples; ++s) {
      for (int e = 0; e < g.num_experts; ++e) totals[sz(e)] += g.at(s, e);
    }
    // 2. The plan: integer arithmetic in index order, so every rank computes the same one.
    const int redundant = old.slots_per_rank() - old.num_logical() / num_ranks;
    dist::ExpertPlacement next = dist::plan_placement(g, num_ranks, redundant, &old);
    before += dist::max_over_mean(dist::rank_loads(old, expected_slot_counts(old, totals)));
    after += dist::max_over_mean(dist::rank_loads(next, expected_slot_counts(next, totals)));
    if (next == old) continue;

    // 3. The shuffle: keep what this rank already holds, load what it gains.
    const int per_rank = next.slots_per_rank();
    const int first = me * per_rank;
    const ExpertWeights& held = model_.weights().layers[sz(l)].ffn.experts;
    ExpertWeights local;
    local.w1.resize(sz(per_rank));
    local.w3.resize(sz(per_rank));
    local.w2.resize(sz(per_rank));
    std::vector<int32_t> gained;
    std::vector<int> gained_at;
    for (int i = 0; i < per_rank; ++i) {
      const int e = next.logical_of(first + i);
      int kept = -1;
      for (int j = 0; j < per_rank && kept < 0; ++j) {
        if (old.logical_of(first + j) == e) kept = j;
      }
      if (kept >= 0) {
        local.w1[sz(i)] = held.w1[sz(kept)];
        local.w3[sz(i)] = held.w3[sz(kept)];
        local.w2[sz(i)] = held.w2[sz(kept)];
      } else {
        gained.push_back(e);
        gained_at.push_back(i);
      }
    }
    if (!gained.empty()) {
      ExpertWeights loaded = loader_(l, gained);
      if (loaded.w1.size() != gained.size() || loaded.w3.size() != gained.size() ||
          loaded.w2.size() != gained.size()) {
        throw Error(ErrorCode::kInternal, "EPLB: the expert loader returned " +
                                              std::to_string(loaded.w1.size()) + " experts for " +
                                              std::to_string(gained.size()) + " asked for");
      }
      for (size_t k = 0; k < gained.size(); ++k) {
        const auto i = sz(gained_at[k]);
        local.w1[i] = std::move(loaded.w1[k]);
        local.w3[i] = std::move(loaded.w3[k]);
        local.w2[i] = std::move(loaded.w2[k]);
      }
      counters_.experts_loaded += gained.size();
    }
    // 4. Install; the dropped experts' weights go with the old ExpertWeights.
    model_.install_experts(l, std::move(next), std::move(local));
  }
  // The uploads of the gained experts finish before the next forward reads them.
  be.synchronize();
  counters_.rebalances += 1;
  counters_.max_over_mean_before = before / num_layers;
  counters_.max_over_mean_after = after / num_layers;
  counters_.last_pause_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

}  // namespace deepinfer::engine
