#include "testing/eplb_sim.h"

#include <algorithm>
#include <cmath>
#include <deque>

#include "dist/eplb_policy.h"
#include "dist/expert_placement.h"

namespace deepinfer::testing {

namespace {

size_t idx(int64_t v) {
  return static_cast<size_t>(v);
}

double uniform01(std::mt19937_64& gen) {
  return static_cast<double>(gen() >> 11) * 0x1.0p-53;
}

}  // namespace

SkewedTraffic::SkewedTraffic(const SkewedTrafficOptions& options)
    : opt_(options), gen_(options.seed) {
  double sum = 0;
  for (int k = 0; k < opt_.num_experts; ++k) {
    sum += std::pow(static_cast<double>(k + 1), -opt_.zipf_s);
    cdf_.push_back(sum);
  }
  for (double& c : cdf_) c /= sum;
  perm_.resize(idx(opt_.num_experts));
  for (int e = 0; e < opt_.num_experts; ++e) perm_[idx(e)] = e;
  std::shuffle(perm_.begin(), perm_.end(), gen_);
  ids_.resize(idx(opt_.tokens_per_step) * idx(opt_.top_k));
}

void SkewedTraffic::shift_hot_set() {
  // Each hot rank trades its expert with a random colder one.
  for (int i = 0; i < opt_.hot_set; ++i) {
    const auto j =
        static_cast<size_t>(opt_.hot_set) +
        static_cast<size_t>(gen_() % static_cast<uint64_t>(opt_.num_experts - opt_.hot_set));
    std::swap(perm_[idx(i)], perm_[j]);
  }
}

int SkewedTraffic::draw_rank() {
  const double u = uniform01(gen_);
  const auto it = std::upper_bound(cdf_.begin(), cdf_.end(), u);
  return static_cast<int>(std::min<std::ptrdiff_t>(it - cdf_.begin(), opt_.num_experts - 1));
}

const std::vector<int32_t>& SkewedTraffic::next_step() {
  if (opt_.shift_every_steps > 0 && step_ > 0 && step_ % opt_.shift_every_steps == 0) {
    shift_hot_set();
  }
  ++step_;
  const auto k = idx(opt_.top_k);
  for (size_t t = 0; t < idx(opt_.tokens_per_step); ++t) {
    int32_t* row = ids_.data() + t * k;
    for (size_t j = 0; j < k; ++j) {
      int32_t e;
      do {
        e = perm_[idx(draw_rank())];
      } while (std::find(row, row + j, e) != row + j);
      row[j] = e;
    }
  }
  return ids_;
}

std::vector<RebalanceRecord> simulate_eplb(const EplbSimOptions& o) {
  const int E = o.traffic.num_experts, k = o.traffic.top_k;
  SkewedTraffic traffic(o.traffic);
  std::vector<dist::ExpertPlacement> placement{
      dist::ExpertPlacement::initial(E, o.num_ranks, o.eplb.redundant_slots_per_rank)};
  dist::LoadWindow window(1, E, o.eplb.window_steps, o.eplb.bucket_steps);
  const dist::RebalanceSchedule schedule(o.eplb.rebalance_interval);
  const auto slots = idx(placement[0].num_slots());
  // Per-step slot counts of the last window_steps steps, for the measured rank loads.
  std::deque<std::vector<int64_t>> recent;
  std::vector<int64_t> recent_sum(slots, 0);
  std::vector<RebalanceRecord> records;
  int64_t next_key = 0;
  int64_t after_due = -1;  // the step at which the last record's `after` is measured

  for (int64_t step = 1; step <= o.num_steps; ++step) {
    const std::vector<int32_t>& ids = traffic.next_step();
    const std::vector<int32_t> slot_of = placement[0].map_to_slots(ids, k, idx(next_key));
    next_key += o.traffic.tokens_per_step;
    std::vector<std::vector<int64_t>> counts(1, std::vector<int64_t>(slots, 0));
    for (int32_t s : slot_of) ++counts[0][idx(s)];
    window.record_step(counts, placement);
    for (size_t s = 0; s < slots; ++s) recent_sum[s] += counts[0][s];
    recent.push_back(std::move(counts[0]));
    if (recent.size() > idx(o.eplb.window_steps)) {
      for (size_t s = 0; s < slots; ++s) recent_sum[s] -= recent.front()[s];
      recent.pop_front();
    }
    const double measured = dist::max_over_mean(dist::rank_loads(placement[0], recent_sum));
    if (step == after_due) records.back().after = measured;
    if (!schedule.due(step)) continue;

    RebalanceRecord rec;
    rec.step = step;
    rec.before = measured;
    dist::ExpertPlacement next = dist::plan_placement(
        window.loads(0), o.num_ranks, o.eplb.redundant_slots_per_rank, &placement[0]);
    const std::vector<int64_t> totals = window.totals(0);
    std::vector<double> planned(idx(o.num_ranks), 0);
    for (int s = 0; s < next.num_slots(); ++s) {
      const int e = next.logical_of(s);
      planned[idx(next.rank_of_slot(s))] +=
          static_cast<double>(totals[idx(e)]) / next.num_replicas(e);
    }
    double sum = 0, peak = 0;
    for (double v : planned) {
      sum += v;
      peak = std::max(peak, v);
    }
    rec.planned = sum > 0 ? peak * static_cast<double>(planned.size()) / sum : 1.0;
    placement[0] = std::move(next);
    records.push_back(rec);
    after_due = step + o.eplb.window_steps;
  }
  return records;
}

}  // namespace deepinfer::testing
