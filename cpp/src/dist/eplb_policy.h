// The EPLB policy: given how many tokens each logical expert of a layer received over a window,
// decide which experts get the redundant slots and which rank holds each replica.
//
// 1. Replicas. Every expert starts with one. Each redundant slot goes to the expert whose extra
//    replica lowers the window's summed per-sample peak, sum_s max_e load[s][e] / replicas[e],
//    the most (ties: the larger per-replica load, then the lower expert id). With one sample this
//    is "replicate the expert with the largest load per replica".
// 2. Packing. Replicas are taken in descending per-replica load (stable); each goes to the rank
//    with a free slot that minimises sum_s max(peak_s, rank_load[s] + replica_load[s]), peak_s
//    being the busiest rank's load at sample s so far (ties: the rank with the smaller total
//    load, then the lower rank). A rank already holding the expert is used only when no other
//    rank has room. Every rank ends with exactly slots_per_rank slots.
// 3. Slots. Within a rank, an expert that held a slot of that rank in `previous` keeps it, so the
//    weight shuffle moves only what changed; the other experts fill the free slots in id order.
//
// All arithmetic is on 64-bit integers (a replica's load is load * 720720 / replicas, floored;
// 720720 = lcm(1..16) keeps it exact up to 16 replicas) and every loop runs in index order, so
// the same inputs give the same placement, byte for byte, on every rank.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dist/expert_placement.h"

namespace deepinfer::dist {

// Tokens routed to each logical expert of one layer: `num_samples` rows (steps or buckets of
// steps of the window, oldest first) of `num_experts` counts, row-major.
struct ExpertLoads {
  int num_samples = 0;
  int num_experts = 0;
  std::vector<int64_t> counts;  // [num_samples * num_experts]

  // One sample: the window's totals.
  static ExpertLoads totals(std::span<const int64_t> per_expert);
  int64_t at(int sample, int expert) const {
    return counts[static_cast<size_t>(sample) * static_cast<size_t>(num_experts) +
                  static_cast<size_t>(expert)];
  }
};

// The placement for one layer with `redundant_slots_per_rank` extra slots on each of `num_ranks`
// ranks (slots per rank = experts / ranks + redundant). `previous` (optional, same shape) only
// decides slot order within a rank. Throws kInvalidArgument on shapes that do not fit.
ExpertPlacement plan_placement(const ExpertLoads& loads, int num_ranks,
                               int redundant_slots_per_rank,
                               const ExpertPlacement* previous = nullptr);
ExpertPlacement plan_placement(std::span<const int64_t> loads_per_expert, int num_ranks,
                               int redundant_slots_per_rank,
                               const ExpertPlacement* previous = nullptr);

// Replica counts alone (step 1 above), `extra` redundant slots in all: [num_experts], each >= 1.
std::vector<int32_t> plan_replica_counts(const ExpertLoads& loads, int extra);

}  // namespace deepinfer::dist
