// The scheduler's speculative-decoding part: which sequences draft, how many drafts the
// confidence budget gives each, and asking the drafter (scheduler.h).
#include <algorithm>
#include <cstddef>
#include <exception>
#include <utility>
#include <vector>

#include "sched/scheduler.h"

namespace deepinfer::sched {

// The confidence budget: drafts per running sequence for this decode step (draft_budget);
// -1 everywhere with the fixed budget or without a drafter. A sequence whose row will be carried
// on the device (device_carries) takes part too: its drafts are being made by the step in flight,
// so their probabilities are not known yet, and its estimate is its acceptance history.
void Scheduler::plan_draft_budget() {
  std::vector<Sequence*> eligible;
  const bool on = drafting() && config_.speculative_budget == "confidence";
  auto carried = [this](const Sequence& s) { return s.inflight.steps > 0 && device_carries(); };
  for (Sequence* s : running_) {
    s->draft_budget = -1;
    if (!on || s->state != SeqState::kRunning) continue;
    if ((carried(*s) ? drafts_allowed(*s) : draft_limit(*s)) <= 0) continue;
    eligible.push_back(s);
  }
  if (eligible.empty()) return;
  // MTP drafts' own probabilities where the sequence has them (draft_budget.h); reserved first,
  // so the pointers into `owned` stay valid.
  std::vector<DraftEstimate> owned;
  owned.reserve(eligible.size());
  std::vector<const DraftEstimate*> estimates;
  for (Sequence* s : eligible) {
    const DraftEstimate* e = &s->draft_estimate;  // the history (a carried row's, always)
    if (executor_drafts_ && !carried(*s)) {
      if (has_draft_probs(*s)) {
        owned.push_back(DraftEstimate::of_probabilities(s->model_draft_probs));
        e = &owned.back();
      } else if (s->model_drafts_at != s->num_tokens()) {
        owned.push_back(DraftEstimate::of_probabilities({}));  // no drafts for this step
        e = &owned.back();
      }
    }
    estimates.push_back(e);
  }
  const std::vector<int> drafts = budget_.allocate(estimates, max_drafts_);
  for (size_t i = 0; i < eligible.size(); ++i) {
    eligible[i]->draft_budget = drafts[i];
    if (drafts[i] == 0) eligible[i]->draft_estimate.relax();
  }
}

void Scheduler::set_drafter(std::shared_ptr<Drafter> drafter, int max_drafts, int vocab_size) {
  drafter_ = std::move(drafter);
  executor_drafts_ = false;
  max_drafts_ = max_drafts;
  vocab_size_ = vocab_size;
}

void Scheduler::use_executor_drafts(int max_drafts) {
  drafter_ = nullptr;
  executor_drafts_ = true;
  max_drafts_ = max_drafts;
}

// The most drafts `s` may verify in the next decode step; 0 when it cannot draft: no drafter, a
// step in flight (the context is not known yet), or drafts_allowed says none.
int Scheduler::draft_limit(const Sequence& s) const {
  return s.inflight.steps > 0 ? 0 : drafts_allowed(s);
}

// The drafts `s` may verify once its context is known: none for penalties or forced tokens, a
// constraint that cannot roll back, or no token budget left.
int Scheduler::drafts_allowed(const Sequence& s) const {
  if (!drafting()) return 0;
  // Penalties would need each draft row's own history: not yet. A constraint drafts when it can
  // roll back (the executor masks each verify row by accepting the drafts before it).
  const SamplingParams& p = s.params;
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f || !p.forced_tokens.empty())
    return 0;
  if (p.constraint != nullptr) {
    try {
      if (!p.constraint->can_rollback()) return 0;
    } catch (const std::exception&) {
      return 0;  // the commit's accept reports a broken constraint
    }
  }
  // Every committed token of a verify row counts against max_tokens and max_model_len.
  return std::max(0, std::min(max_drafts_, s.remaining_budget(config_.max_model_len) - 1));
}

// The drafts the device made past `s`'s in-flight row (ModelExecutor::drafts_on_device: V4's MTP
// block, max_drafts_ of them when the row had room for them before the model's last position;
// max_model_len is at most that) verified by its carried row at `pos`: within drafts_allowed and
// the confidence budget, and none for a constraint, whose verify rows are masked from drafts the
// host does not have.
int Scheduler::device_carried_drafts(const Sequence& s, int pos) const {
  if (s.params.constraint != nullptr) return 0;
  if (pos - 1 + max_drafts_ > config_.max_model_len) return 0;
  const int allowed = drafts_allowed(s);
  return s.draft_budget >= 0 ? std::min(allowed, s.draft_budget) : allowed;
}

// Zero-overhead scheduling plans this step while `s`'s previous one runs, so the host has not
// seen that step's tokens: no drafter can draft for `s` now, and after a verify row even the next
// position depends on how many drafts the device accepts. So after a verify row `s` skips this
// step; its next row is planned from committed tokens once that step is committed (the pipeline
// keeps running the other sequences). After a plain row the next row is carried (its token taken
// on the device) unless drafting pays: skipping one step to verify up to n drafts in the next
// yields 1 + sum_j a_j expected tokens per two steps (a_j: draft_budget.h), two carried rows 2,
// so `s` skips when sum_j a_j > 1, or to try its drafter once (the prior alone may not promise
// enough). A sequence that does not skip lets its estimates drift back toward the prior, so one
// whose drafts failed for a while tries again.
bool Scheduler::sits_out(Sequence& s) {
  if (s.inflight.has_drafts()) return true;
  const int n = drafts_allowed(s);
  if (n <= 0) return false;
  if (s.draft_estimate.expected_accepted(n) > 1.0 || !s.drafter_asked) {
    s.skipped_to_draft = true;
    return true;
  }
  s.draft_estimate.relax();
  return false;
}

// Fills drafts_ for a decode row of `s`, within draft_limit and the confidence budget. A drafter
// that throws or proposes a token outside the vocabulary proposes nothing.
void Scheduler::propose_drafts(Sequence& s) {
  drafts_.clear();
  const bool skipped = std::exchange(s.skipped_to_draft, false);
  int budget = draft_limit(s);
  if (s.draft_budget >= 0) budget = std::min(budget, s.draft_budget);
  if (budget <= 0) return;
  s.drafter_asked = true;
  propose_within(s, budget);
  // A step skipped for drafts that did not come: as a rejected first draft (sits_out).
  if (skipped && drafts_.empty()) s.draft_estimate.update(1, 0);
}

void Scheduler::propose_within(Sequence& s, int budget) {
  if (executor_drafts_) {
    // Made for exactly the committed tokens (the executor drafts past every sampling row).
    if (s.model_drafts_at != s.num_tokens()) return;
    const size_t n = std::min(s.model_drafts.size(), static_cast<size_t>(budget));
    drafts_.assign(s.model_drafts.begin(), s.model_drafts.begin() + static_cast<std::ptrdiff_t>(n));
    if (has_draft_probs(s)) {
      DraftEstimate::of_probabilities(s.model_draft_probs)
          .cumulative(static_cast<int>(n), s.verify_estimates);
    } else {
      s.draft_estimate.cumulative(static_cast<int>(n), s.verify_estimates);
    }
    return;
  }
  try {
    drafter_->propose(s.id, s.tokens, budget, drafts_);
  } catch (const std::exception&) {
    drafts_.clear();
    ++stats_.drafter_errors;
    return;
  }
  if (static_cast<int>(drafts_.size()) > budget) drafts_.resize(static_cast<size_t>(budget));
  for (int32_t t : drafts_) {
    if (t < 0 || t >= vocab_size_) {
      drafts_.clear();
      ++stats_.drafter_errors;
      return;
    }
  }
  s.draft_estimate.cumulative(static_cast<int>(drafts_.size()), s.verify_estimates);
}

bool Scheduler::has_draft_probs(const Sequence& s) {
  return s.model_drafts_at == s.num_tokens() && !s.model_drafts.empty() &&
         s.model_draft_probs.size() == s.model_drafts.size();
}

}  // namespace deepinfer::sched
