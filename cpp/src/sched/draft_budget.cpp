#include "sched/draft_budget.h"

#include <algorithm>
#include <cmath>

namespace deepinfer::sched {

void DraftEstimate::update(int drafts, int accepted) {
  for (int j = 0; j < std::min(drafts, kMaxDrafts); ++j) {
    if (j > accepted) break;  // never reached: a draft before it was rejected
    const double outcome = j < accepted ? 1.0 : 0.0;
    double& c = conditional[static_cast<size_t>(j)];
    c = (1.0 - kRate) * c + kRate * outcome;
  }
}

void DraftEstimate::relax() {
  constexpr double kDrift = 0.02;
  for (double& c : conditional) c += kDrift * (kPrior - c);
}

DraftEstimate DraftEstimate::of_probabilities(std::span<const float> probs) {
  DraftEstimate e;
  for (size_t j = 0; j < e.conditional.size(); ++j)
    e.conditional[j] = j < probs.size() ? std::clamp(static_cast<double>(probs[j]), 0.0, 1.0) : 0.0;
  return e;
}

void DraftEstimate::cumulative(int n, std::vector<double>& out) const {
  out.clear();
  double a = 1.0;
  for (int j = 0; j < std::min(n, kMaxDrafts); ++j) {
    a *= conditional[static_cast<size_t>(j)];
    out.push_back(a);
  }
}

double DraftEstimate::expected_accepted(int n) const {
  double a = 1.0;
  double sum = 0.0;
  for (int j = 0; j < std::min(n, kMaxDrafts); ++j) {
    a *= conditional[static_cast<size_t>(j)];
    sum += a;
  }
  return sum;
}

void record_calibration(DraftCalibration& c, double estimate, bool accepted) {
  const double p = std::isnan(estimate) ? 0.0 : std::clamp(estimate, 0.0, 1.0);
  const auto bin = static_cast<size_t>(
      std::min(static_cast<int>(p * DraftCalibration::kBins), DraftCalibration::kBins - 1));
  c.drafts[bin] += 1;
  c.accepted[bin] += accepted ? 1 : 0;
  c.estimate_sum[bin] += p;
}

double calibration_error(const DraftCalibration& c) {
  double total = 0;
  double gap = 0;
  for (size_t b = 0; b < c.drafts.size(); ++b) {
    total += static_cast<double>(c.drafts[b]);
    gap += std::abs(c.estimate_sum[b] - static_cast<double>(c.accepted[b]));
  }
  return total > 0 ? gap / total : 0.0;
}

void DraftBudget::observe_step(int num_tokens, double seconds) {
  if (num_tokens <= 0 || !(seconds > 0.0)) return;
  samples_.emplace_back(num_tokens, seconds);
  if (samples_.size() > kWindow) samples_.pop_front();
}

bool DraftBudget::cost_model(double& base, double& slope) const {
  if (samples_.size() < kMinSamples) return false;
  // Steps of one size only say nothing about what another token costs: no model (fixed k),
  // which then varies the step sizes and lets one be fitted.
  const int first = samples_.front().first;
  if (std::all_of(samples_.begin(), samples_.end(),
                  [&](const auto& x) { return x.first == first; }))
    return false;
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [t, s] : samples_) {
    n += 1;
    sx += t;
    sy += s;
    sxx += static_cast<double>(t) * t;
    sxy += t * s;
  }
  const double var = n * sxx - sx * sx;
  slope = std::max(0.0, (n * sxy - sx * sy) / var);
  base = std::max(0.0, (sy - slope * sx) / n);
  return base + slope > 0;
}

std::vector<int> DraftBudget::allocate(const std::vector<const DraftEstimate*>& estimates,
                                       int max_drafts) const {
  const int n = static_cast<int>(estimates.size());
  max_drafts = std::clamp(max_drafts, 0, kMaxDrafts);
  std::vector<int> drafts(static_cast<size_t>(n), max_drafts);
  double base = 0, slope = 0;
  if (n == 0 || max_drafts == 0 || !cost_model(base, slope)) return drafts;
  // Candidate draft rows: (a_{r,j}, r), by a descending, then request order.
  struct Entry {
    double a;
    int request;
  };
  std::vector<Entry> entries;
  for (int r = 0; r < n; ++r) {
    double a = 1.0;
    for (int j = 0; j < max_drafts; ++j) {
      a *= estimates[static_cast<size_t>(r)]->conditional[static_cast<size_t>(j)];
      entries.push_back({a, r});
    }
  }
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& x, const Entry& y) { return x.a > y.a; });
  double expected = n;
  double best = expected / (base + slope * n);
  size_t taken = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    expected += entries[i].a;
    const double rate = expected / (base + slope * static_cast<double>(n + i + 1));
    if (rate > best) {
      best = rate;
      taken = i + 1;
    }
  }
  std::fill(drafts.begin(), drafts.end(), 0);
  for (size_t i = 0; i < taken; ++i) ++drafts[static_cast<size_t>(entries[i].request)];
  return drafts;
}

}  // namespace deepinfer::sched
