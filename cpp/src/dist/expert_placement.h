// Where each MoE layer's experts live across the expert-parallel ranks, and which replica serves a
// token. One ExpertPlacement describes one layer: `num_ranks * slots_per_rank` physical slots, slot
// s on rank s / slots_per_rank, each holding one logical expert's weights. Every logical expert has
// at least one slot; hot experts may have several (replicas hold identical weights), so routing a
// token to any replica computes the same values and the model's output does not depend on the
// placement, provided the combine adds a token's k expert outputs in a placement-independent
// order ((token, j) order). Note: the CPU moe_experts today adds into a token's row in expert-id
// order, so remapped slot ids change its summation order (equal to rounding, not bit for bit).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace deepinfer::dist {

class ExpertPlacement {
 public:
  // Checks that every slot holds an expert in [0, num_logical) and every expert has a slot.
  ExpertPlacement(int num_logical, int num_ranks, std::vector<int32_t> physical_to_logical);

  // The layout before any statistics: rank r holds experts [r*E/R, (r+1)*E/R) in its first
  // slots, then its redundant slots hold experts (r*redundant + j) mod E, so replicas start
  // spread over the ranks. Needs E % R == 0.
  static ExpertPlacement initial(int num_logical, int num_ranks, int redundant_slots_per_rank);

  int num_logical() const { return num_logical_; }
  int num_ranks() const { return num_ranks_; }
  int slots_per_rank() const { return slots_per_rank_; }
  int num_slots() const { return static_cast<int>(physical_to_logical_.size()); }
  int rank_of_slot(int slot) const { return slot / slots_per_rank_; }
  int logical_of(int slot) const { return physical_to_logical_[static_cast<size_t>(slot)]; }
  const std::vector<int32_t>& physical_to_logical() const { return physical_to_logical_; }

  // The slots holding `logical`, ascending.
  std::span<const int32_t> replicas(int logical) const;
  int num_replicas(int logical) const { return static_cast<int>(replicas(logical).size()); }

  // The slot serving one (token, logical expert) pair: replica token_key mod num_replicas. The
  // caller passes a key that differs between tokens of a step and across ranks (e.g. the row's
  // index in the data-parallel group), so an expert's tokens spread evenly over its replicas.
  int slot_for(int logical, uint64_t token_key) const;
  // expert_ids [T * top_k] (row-major, token t = i / top_k) -> slots, with token_key = first_key +
  // t.
  std::vector<int32_t> map_to_slots(std::span<const int32_t> expert_ids, int top_k,
                                    uint64_t first_key) const;

  friend bool operator==(const ExpertPlacement& a, const ExpertPlacement& b) {
    return a.num_ranks_ == b.num_ranks_ && a.num_logical_ == b.num_logical_ &&
           a.physical_to_logical_ == b.physical_to_logical_;
  }

 private:
  int num_logical_;
  int num_ranks_;
  int slots_per_rank_;
  std::vector<int32_t> physical_to_logical_;
  // logical_to_physical in CSR form: expert e's slots are replica_slots_[offsets_[e],
  // offsets_[e+1]).
  std::vector<int32_t> replica_offsets_;
  std::vector<int32_t> replica_slots_;
};

// Per-rank token totals of one layer: the sum of slot_counts [num_slots] over each rank's slots.
std::vector<int64_t> rank_loads(const ExpertPlacement& placement,
                                std::span<const int64_t> slot_counts);
// max / mean of `loads` (1 when all are zero).
double max_over_mean(std::span<const int64_t> loads);

}  // namespace deepinfer::dist
