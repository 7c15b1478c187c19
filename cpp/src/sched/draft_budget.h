// Confidence-scheduled verification (the budget of the reference engine's speculative decoding,
// ../shared/reference/engine.md §5.5): how many drafts each request verifies in a decode step.
//
// Every request has c_j, an estimate of P(draft j accepted | drafts 0..j-1 accepted):
//  - MTP drafts (speculative_method "mtp"), StepResult::draft_probs, known before the step, per
//    draft: on DeepSeek-V4.1 the DSpark confidence head's c_j = sigmoid(proj . [h_j ; markov_j]),
//    trained for this very estimate (engine.md 5.5); on V4, whose checkpoint has no confidence
//    head, the draft's own probability under the MTP block's softmax at temperature 1 (the block
//    is trained to predict that very token, so it is the closest per-draft signal).
//  - host drafters (ngram, external), MTP drafts without probabilities, and rows carried on the
//    device under zero-overhead scheduling (their drafts are made by the step still in flight, so
//    their probabilities arrive after the plan): the request's own acceptance history
//    (DraftEstimate: an exponential average of its verify outcomes per position, starting at the
//    prior); such drafters have no probability of their own.
// a_j = c_0 ... c_j is then the chance that draft j is accepted, non-increasing in j. A step with
// T tokens costs time(T) = base + slope * T, least squares over recent decode steps. With n
// requests, start at T = n (one token each, E = n expected tokens) and add candidate drafts in
// descending a, T += 1 and E += a each; the T with the most E / time(T) (the first maximum) is
// the budget, and each request verifies its drafts among the entries taken (always a prefix: a
// is non-increasing). Until the cost model has enough samples, every request gets the maximum
// (fixed k). Each verified draft's a_j is also the estimate whose calibration the engine reports
// (DraftCalibration, with the fixed budget too).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <utility>
#include <vector>

#include "deepinfer/engine.h"

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
  // c_j = probs[j] (the drafts' own probabilities); 0 past them (no draft there).
  static DraftEstimate of_probabilities(std::span<const float> probs);
  // a_j = c_0 ... c_j for j < n (n <= kMaxDrafts) into `out`.
  void cumulative(int n, std::vector<double>& out) const;
  // sum_j a_j for j < n: the expected accepted drafts of a verify row with n drafts.
  double expected_accepted(int n) const;
};

// Records a verified draft's estimate (clamped to [0, 1]) and outcome.
void record_calibration(DraftCalibration& c, double estimate, bool accepted);
// The expected calibration error over the bins: sum_b |estimate_sum_b - accepted_b| / drafts
// (0 without drafts).
double calibration_error(const DraftCalibration& c);

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
