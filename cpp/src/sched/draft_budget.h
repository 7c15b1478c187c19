// Confidence-scheduled verification (the budget of the reference engine's speculative decoding,
// ../shared/reference/engine.md §5.5, with host drafters' acceptance history as the estimate):
// how many drafts each request verifies in a decode step.
//
// Every request keeps c_j, an estimate of P(draft j accepted | drafts 0..j-1 accepted), updated
// from its own verify outcomes (exponential average, starting at the prior). a_j = c_0 ... c_j
// is then the chance that draft j is accepted, non-increasing in j. A step with T tokens costs
// time(T) = base + slope * T, least squares over recent decode steps. With n requests, start at
// T = n (one token each, E = n expected tokens) and add candidate drafts in descending a, T += 1
// and E += a each; the T with the most E / time(T) (the first maximum) is the budget, and each
// request verifies its drafts among the entries taken (always a prefix: a is non-increasing).
// Until the cost model has enough samples, every request gets the maximum (fixed k).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

namespace deepinfer::sched {

inline constexpr int kMaxDrafts = 5;

struct DraftEstimate {
  // c_j for draft positions j (0 = the first draft), starting at kPrior.
  static constexpr double kPrior = 0.6;
  static constexpr double kRate = 0.2;  // weight of a new outcome
  std::array<double, kMaxDrafts> conditional{kPrior, kPrior, kPrior, kPrior, kPrior};

  // A verify row proposed `drafts` and accepted the first `accepted`: positions 0..accepted
  // (those that were reached) get an outcome; the first rejected one a 0.
  void update(int drafts, int accepted);
  // A step in which the budget gave the request no drafts: its estimates drift back toward the
  // prior, so a request whose drafts failed for a while gets to try again.
  void relax();
};

class DraftBudget {
 public:
  // A decode step of `num_tokens` tokens took `seconds` (only steps whose time is the step's).
  void observe_step(int num_tokens, double seconds);
  // Drafts per request, each in [0, max_drafts]. `estimates` has one entry per request.
  std::vector<int> allocate(const std::vector<const DraftEstimate*>& estimates,
                            int max_drafts) const;
  // The fitted cost model, if there are enough samples: (base, slope) in seconds.
  bool cost_model(double& base, double& slope) const;

 private:
  static constexpr size_t kWindow = 512;
  static constexpr size_t kMinSamples = 16;
  std::deque<std::pair<int, double>> samples_;
};

}  // namespace deepinfer::sched
