#include "dist/expert_placement.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>

#include "deepinfer/error.h"

namespace deepinfer::dist {

namespace {

[[noreturn]] void bad(const std::string& msg) {
  throw Error(ErrorCode::kInvalidArgument, "ExpertPlacement: " + msg);
}

}  // namespace

ExpertPlacement::ExpertPlacement(int num_logical, int num_ranks,
                                 std::vector<int32_t> physical_to_logical)
    : num_logical_(num_logical),
      num_ranks_(num_ranks),
      slots_per_rank_(0),
      physical_to_logical_(std::move(physical_to_logical)) {
  if (num_logical < 1 || num_ranks < 1) {
    bad("needs num_logical >= 1 and num_ranks >= 1, got " + std::to_string(num_logical) + ", " +
        std::to_string(num_ranks));
  }
  const auto slots = static_cast<int64_t>(physical_to_logical_.size());
  if (slots < num_logical || slots % num_ranks != 0) {
    bad(std::to_string(slots) + " slots: need >= " + std::to_string(num_logical) +
        " and a multiple of " + std::to_string(num_ranks) + " ranks");
  }
  slots_per_rank_ = static_cast<int>(slots / num_ranks);
  const auto E = static_cast<size_t>(num_logical);
  replica_offsets_.assign(E + 1, 0);
  for (int32_t e : physical_to_logical_) {
    if (e < 0 || e >= num_logical) {
      bad("slot holds expert " + std::to_string(e) + ", outside [0, " +
          std::to_string(num_logical) + ")");
    }
    ++replica_offsets_[static_cast<size_t>(e) + 1];
  }
  for (size_t e = 0; e < E; ++e) {
    if (replica_offsets_[e + 1] == 0) bad("expert " + std::to_string(e) + " has no slot");
    replica_offsets_[e + 1] += replica_offsets_[e];
  }
  replica_slots_.resize(physical_to_logical_.size());
  std::vector<int32_t> fill(replica_offsets_.begin(), replica_offsets_.end() - 1);
  for (size_t s = 0; s < physical_to_logical_.size(); ++s) {
    const auto e = static_cast<size_t>(physical_to_logical_[s]);
    replica_slots_[static_cast<size_t>(fill[e]++)] = static_cast<int32_t>(s);
  }
}

ExpertPlacement ExpertPlacement::initial(int num_logical, int num_ranks,
                                         int redundant_slots_per_rank) {
  if (num_ranks < 1 || num_logical < 1 || num_logical % num_ranks != 0 ||
      redundant_slots_per_rank < 0) {
    bad("initial layout needs experts divisible by ranks and redundant >= 0, got " +
        std::to_string(num_logical) + " experts, " + std::to_string(num_ranks) + " ranks, " +
        std::to_string(redundant_slots_per_rank) + " redundant");
  }
  const int local = num_logical / num_ranks;
  std::vector<int32_t> p2l;
  p2l.reserve(static_cast<size_t>(num_ranks * (local + redundant_slots_per_rank)));
  for (int r = 0; r < num_ranks; ++r) {
    for (int j = 0; j < local; ++j) p2l.push_back(r * local + j);
    for (int j = 0; j < redundant_slots_per_rank; ++j) {
      p2l.push_back((r * redundant_slots_per_rank + j) % num_logical);
    }
  }
  return ExpertPlacement(num_logical, num_ranks, std::move(p2l));
}

std::span<const int32_t> ExpertPlacement::replicas(int logical) const {
  const auto e = static_cast<size_t>(logical);
  const auto begin = static_cast<size_t>(replica_offsets_[e]);
  const auto end = static_cast<size_t>(replica_offsets_[e + 1]);
  return std::span<const int32_t>(replica_slots_).subspan(begin, end - begin);
}

int ExpertPlacement::slot_for(int logical, uint64_t token_key) const {
  const auto reps = replicas(logical);
  return reps[static_cast<size_t>(token_key % reps.size())];
}

std::vector<int32_t> ExpertPlacement::map_to_slots(std::span<const int32_t> expert_ids, int top_k,
                                                   uint64_t first_key) const {
  DEEPINFER_CHECK(top_k > 0 && expert_ids.size() % static_cast<size_t>(top_k) == 0,
                  "expert_ids must hold whole tokens");
  std::vector<int32_t> slots(expert_ids.size());
  for (size_t i = 0; i < expert_ids.size(); ++i) {
    const uint64_t key = first_key + i / static_cast<size_t>(top_k);
    slots[i] = slot_for(expert_ids[i], key);
  }
  return slots;
}

std::vector<int64_t> rank_loads(const ExpertPlacement& placement,
                                std::span<const int64_t> slot_counts) {
  DEEPINFER_CHECK(slot_counts.size() == static_cast<size_t>(placement.num_slots()),
                  "one count per slot");
  std::vector<int64_t> loads(static_cast<size_t>(placement.num_ranks()), 0);
  for (size_t s = 0; s < slot_counts.size(); ++s) {
    loads[static_cast<size_t>(placement.rank_of_slot(static_cast<int>(s)))] += slot_counts[s];
  }
  return loads;
}

double max_over_mean(std::span<const int64_t> loads) {
  if (loads.empty()) return 1.0;
  const int64_t total = std::accumulate(loads.begin(), loads.end(), int64_t{0});
  if (total == 0) return 1.0;
  const int64_t peak = *std::max_element(loads.begin(), loads.end());
  return static_cast<double>(peak) * static_cast<double>(loads.size()) / static_cast<double>(total);
}

}  // namespace deepinfer::dist
