#include "dist/eplb_policy.h"

#include <algorithm>
#include <string>
#include <utility>

#include "deepinfer/error.h"

namespace deepinfer::dist {

namespace {

// Per-replica loads are scaled by lcm(1..16) so that splitting over up to 16 replicas is exact.
constexpr int64_t kScale = 720720;

size_t idx(int64_t v) {
  return static_cast<size_t>(v);
}

int64_t share(int64_t load, int64_t replicas) {
  return load * kScale / replicas;
}

void check_loads(const ExpertLoads& loads) {
  if (loads.num_samples < 1 || loads.num_experts < 1 ||
      loads.counts.size() != idx(loads.num_samples) * idx(loads.num_experts)) {
    throw Error(ErrorCode::kInvalidArgument,
                "ExpertLoads: need samples >= 1, experts >= 1 and samples*experts counts, got " +
                    std::to_string(loads.num_samples) + "x" + std::to_string(loads.num_experts) +
                    " with " + std::to_string(loads.counts.size()) + " counts");
  }
  // Bounded so that the window's total times kScale (every score is at most that) fits int64.
  int64_t sum = 0;
  for (int64_t c : loads.counts) {
    if (c < 0 || c > (int64_t{1} << 40) - sum) {
      throw Error(ErrorCode::kInvalidArgument,
                  "ExpertLoads: counts must be >= 0 and sum to at most 2^40, got " +
                      std::to_string(c) + " after " + std::to_string(sum));
    }
    sum += c;
  }
}

struct Replica {
  int32_t expert;
  int64_t total;  // per-replica load summed over samples
};

}  // namespace

ExpertLoads ExpertLoads::totals(std::span<const int64_t> per_expert) {
  ExpertLoads l;
  l.num_samples = 1;
  l.num_experts = static_cast<int>(per_expert.size());
  l.counts.assign(per_expert.begin(), per_expert.end());
  return l;
}

std::vector<int32_t> plan_replica_counts(const ExpertLoads& loads, int extra) {
  check_loads(loads);
  const int S = loads.num_samples, E = loads.num_experts;
  std::vector<int32_t> count(idx(E), 1);
  std::vector<int64_t> top1(idx(S)), top2(idx(S));
  std::vector<int32_t> arg(idx(S));
  std::vector<int64_t> gain(idx(E)), total(idx(E));
  for (int slot = 0; slot < extra; ++slot) {
    std::fill(total.begin(), total.end(), 0);
    for (int s = 0; s < S; ++s) {
      int64_t a = -1, b = -1;
      int32_t at = 0;
      for (int e = 0; e < E; ++e) {
        const int64_t v = share(loads.at(s, e), count[idx(e)]);
        total[idx(e)] += v;
        if (v > a) {
          b = a;
          a = v;
          at = e;
        } else if (v > b) {
          b = v;
        }
      }
      top1[idx(s)] = a;
      top2[idx(s)] = std::max<int64_t>(b, 0);
      arg[idx(s)] = at;
    }
    // Only the sample's argmax expert can lower that sample's peak.
    std::fill(gain.begin(), gain.end(), 0);
    for (int s = 0; s < S; ++s) {
      const int32_t e = arg[idx(s)];
      const int64_t after = std::max(top2[idx(s)], share(loads.at(s, e), count[idx(e)] + 1));
      gain[idx(e)] += top1[idx(s)] - after;
    }
    int best = 0;
    for (int e = 1; e < E; ++e) {
      if (gain[idx(e)] > gain[idx(best)] ||
          (gain[idx(e)] == gain[idx(best)] && total[idx(e)] > total[idx(best)])) {
        best = e;
      }
    }
    ++count[idx(best)];
  }
  return count;
}

ExpertPlacement plan_placement(const ExpertLoads& loads, int num_ranks,
                               int redundant_slots_per_rank, const ExpertPlacement* previous) {
  check_loads(loads);
  const int S = loads.num_samples, E = loads.num_experts, R = num_ranks;
  if (R < 1 || E % R != 0 || redundant_slots_per_rank < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "plan_placement: experts must divide over ranks and redundant >= 0, got " +
                    std::to_string(E) + " experts, " + std::to_string(R) + " ranks, " +
                    std::to_string(redundant_slots_per_rank) + " redundant");
  }
  const int per_rank = E / R + redundant_slots_per_rank;
  if (previous != nullptr && (previous->num_logical() != E || previous->num_ranks() != R ||
                              previous->slots_per_rank() != per_rank)) {
    throw Error(ErrorCode::kInvalidArgument, "plan_placement: `previous` has another shape");
  }
  const std::vector<int32_t> count = plan_replica_counts(loads, R * redundant_slots_per_rank);

  // Replicas by descending per-replica load; stable, so equal loads stay in expert order.
  std::vector<Replica> reps;
  for (int e = 0; e < E; ++e) {
    int64_t t = 0;
    for (int s = 0; s < S; ++s) t += share(loads.at(s, e), count[idx(e)]);
    for (int c = 0; c < count[idx(e)]; ++c) reps.push_back({e, t});
  }
  std::stable_sort(reps.begin(), reps.end(),
                   [](const Replica& a, const Replica& b) { return a.total > b.total; });

  std::vector<int64_t> rank_load(idx(R) * idx(S), 0), rank_total(idx(R), 0), peak(idx(S), 0);
  std::vector<std::vector<int32_t>> held(idx(R));
  for (const Replica& rep : reps) {
    const int e = rep.expert;
    int best = -1;
    bool best_dup = true;
    int64_t best_score = 0;
    for (int r = 0; r < R; ++r) {
      const auto& h = held[idx(r)];
      if (static_cast<int>(h.size()) == per_rank) continue;
      const bool dup = std::find(h.begin(), h.end(), e) != h.end();
      int64_t score = 0;
      for (int s = 0; s < S; ++s) {
        const int64_t v = share(loads.at(s, e), count[idx(e)]);
        score += std::max(peak[idx(s)], rank_load[idx(r) * idx(S) + idx(s)] + v);
      }
      const bool better =
          best < 0 || (!dup && best_dup) ||
          (dup == best_dup && (score < best_score || (score == best_score &&
                                                      rank_total[idx(r)] < rank_total[idx(best)])));
      if (better) {
        best = r;
        best_dup = dup;
        best_score = score;
      }
    }
    DEEPINFER_CHECK(best >= 0, "a replica found no rank with a free slot");
    held[idx(best)].push_back(e);
    rank_total[idx(best)] += rep.total;
    for (int s = 0; s < S; ++s) {
      int64_t& l = rank_load[idx(best) * idx(S) + idx(s)];
      l += share(loads.at(s, e), count[idx(e)]);
      peak[idx(s)] = std::max(peak[idx(s)], l);
    }
  }

  // Slot order within each rank: keep experts where `previous` had them.
  std::vector<int32_t> p2l(idx(R) * idx(per_rank), -1);
  for (int r = 0; r < R; ++r) {
    std::vector<int32_t> todo = held[idx(r)];
    std::sort(todo.begin(), todo.end());
    const size_t base = idx(r) * idx(per_rank);
    if (previous != nullptr) {
      for (int j = 0; j < per_rank; ++j) {
        const int32_t e = previous->logical_of(r * per_rank + j);
        auto it = std::find(todo.begin(), todo.end(), e);
        if (it != todo.end()) {
          p2l[base + idx(j)] = e;
          todo.erase(it);
        }
      }
    }
    size_t next = 0;
    for (int j = 0; j < per_rank; ++j) {
      if (p2l[base + idx(j)] < 0) p2l[base + idx(j)] = todo[next++];
    }
  }
  return ExpertPlacement(E, R, std::move(p2l));
}

ExpertPlacement plan_placement(std::span<const int64_t> loads_per_expert, int num_ranks,
                               int redundant_slots_per_rank, const ExpertPlacement* previous) {
  return plan_placement(ExpertLoads::totals(loads_per_expert), num_ranks, redundant_slots_per_rank,
                        previous);
}

}  // namespace deepinfer::dist
