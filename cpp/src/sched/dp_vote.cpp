#include "sched/dp_vote.h"

#include <algorithm>

#include "deepinfer/error.h"

namespace deepinfer::sched {

Tally Tally::of(std::span<const Ballot> ballots) {
  Tally t;
  for (const Ballot& b : ballots) {
    t.any_want = t.any_want || b.want;
    t.all_want = t.all_want && b.want;
    t.any_decode = t.any_decode || b.decode;
    t.any_unfinished = t.any_unfinished || b.unfinished;
    t.any_produced = t.any_produced || b.produced;
  }
  if (ballots.empty()) t.all_want = false;
  return t;
}

DpVote::DpVote(DpVoteConfig config) : config_(config) {
  DEEPINFER_CHECK(config_.all_interval > 0 && config_.any_interval > 0,
                  "DP vote intervals must be positive");
}

Ballot DpVote::first_ballot(const LocalWish& wish) {
  wish_ = wish;
  produced_ = false;
  Ballot b;
  b.want = wish.wants_prefill;
  b.decode = wish.has_decode;
  b.unfinished = wish.has_unfinished();
  return b;
}

DpVote::Proposal DpVote::after_first(const Tally& tally) {
  any_decode_ = tally.any_decode;
  const bool group_idle = !tally.any_decode && config_.prefill_when_group_idle;
  const bool any_point =
      group_idle || (decode_step_ != 0 && decode_step_ % config_.any_interval == 0);
  const bool all_point = decode_step_ % config_.all_interval == 0;
  any_point_ = any_point;
  const bool vote_prefill = any_point ? tally.any_want : (all_point && tally.all_want);
  if (vote_prefill) return Proposal::kConfirm;
  // Decode. With the idle rule off, unfinished work anywhere keeps the group in (dummy) decode
  // steps until the next point, as DeepSeek's engine does.
  const bool keep_stepping =
      tally.any_decode || (!config_.prefill_when_group_idle && tally.any_unfinished);
  finish(keep_stepping ? GroupStep::kDecode : GroupStep::kIdle);
  return Proposal::kDecided;
}

Ballot DpVote::second_ballot(bool produced) {
  DEEPINFER_CHECK(!produced || wish_.wants_prefill,
                  "only a rank that wants prefill runs its selection");
  produced_ = produced;
  Ballot b;
  b.produced = produced;
  return b;
}

void DpVote::after_second(const Tally& tally) {
  if (tally.any_produced) {
    finish(GroupStep::kPrefill);
    return;
  }
  // Fallback: nobody could admit anything. Decoding advances decode_step, so the next attempt
  // waits for the next point instead of re-voting every step (the livelock an empty prefill
  // step would cause when every rank is full).
  produced_ = false;
  finish(any_decode_ ? GroupStep::kDecode : GroupStep::kIdle);
}

RankAction DpVote::action() const {
  switch (group_) {
    case GroupStep::kIdle:
      return RankAction::kIdle;
    case GroupStep::kPrefill:
      return produced_ ? RankAction::kPrefill : RankAction::kEmptyPrefill;
    case GroupStep::kDecode:
      return wish_.has_decode ? RankAction::kDecode : RankAction::kDummyDecode;
  }
  return RankAction::kIdle;
}

void DpVote::finish(GroupStep step) {
  group_ = step;
  if (step == GroupStep::kPrefill) decode_step_ = 0;
  if (step == GroupStep::kDecode) ++decode_step_;
}

int sweep_dead_waiting(std::deque<Sequence*>& waiting) {
  const auto dead = std::remove_if(waiting.begin(), waiting.end(),
                                   [](const Sequence* s) { return s->finished(); });
  const int n = static_cast<int>(waiting.end() - dead);
  waiting.erase(dead, waiting.end());
  return n;
}

}  // namespace deepinfer::sched
