// DpVote: how the ranks of a data-parallel attention group agree on each step's kind.
//
// Every DP rank owns its own scheduler, but all ranks share the expert-parallel MoE collectives,
// so they must run the same kind of step in lock-step (a prefill step is eager with ragged shapes,
// a decode step replays graphs; the all-to-all shapes must match). Each rank runs an identical
// DpVote; the only inputs that differ are its local wish and its own prefill selection, and the
// only exchange is a tiny ballot reduced over the group (AND/OR of a few bits). The reduction goes
// over the host-side channel, never the device, so zero-overhead scheduling is kept.
//
// One step, on every rank:
//   1. ballot = vote.first_ballot(wish)      wish: this rank's state after the dead-entry sweep
//   2. tally  = all-reduce(ballots)           (Tally::of models it; one round every step: it also
//                                              answers "does any rank still have work?")
//   3. p = vote.after_first(tally)
//      p == kConfirm: a rank whose wish wants prefill runs its prefill selection, then
//        ballot2 = vote.second_ballot(produced); tally2 = all-reduce; vote.after_second(tally2)
//   4. vote.action() says what this rank runs; vote.group_step() what the group runs.
//
// The rules (decode_step counts decode steps, dummy ones included, since the last prefill step; it
// is identical on every rank because every rank runs the same kinds):
//   - ALL point (decode_step % all_interval == 0, which includes 0: right after a prefill): switch
//     to prefill only if every rank wants it. Back-to-back prefill continues only while all want.
//   - ANY point (decode_step != 0 and decode_step % any_interval == 0; wins when both coincide):
//     switch if at least one rank wants: the starvation guard for a rank alone with new work.
//   - Idle group (no rank has decode work; config prefill_when_group_idle, default on): every step
//     is an ANY point. Our decision for a request that reaches an idle engine mid-cycle: prefill
//     at the next step. DeepSeek's engine instead runs dummy decode steps until the next point (up
//     to 100 steps of nothing); the intervals exist to protect decode inter-token latency, and
//     with nobody decoding there is none to protect. Off reproduces DeepSeek's behaviour.
//   - Confirmation: after a "prefill" vote, ranks that want run their selection; a second round
//     asks whether any produced work. Nobody did (every head blocked on blocks/slots/max_num_seqs,
//     or the state changed between rounds) → fall back to a decode step, which advances
//     decode_step instead of resetting it, so the next attempt is at the next point: no livelock
//     when every rank is full. Otherwise ranks with work run a real prefill and the rest an empty
//     prefill (a placeholder forward so the collectives line up).
//   - Dummy decode: in a decode step a rank without decode work runs a dummy decode. When no rank
//     decodes and no prefill is confirmed the group is idle (no forward) — except with
//     prefill_when_group_idle off, where, as in DeepSeek's engine, ranks with unfinished work keep
//     the group in dummy decode steps until the next point.
//   - Dead waiting entries: requests that finished (aborted) while queued are swept from the whole
//     waiting queue before the wish is formed (sweep_dead_waiting), so they never vote for prefill
//     nor keep the group awake.
//
// Guarantee (tested): if a rank's head stays admissible it prefills within any_interval decode
// steps of wanting it (at once when the group is idle); a group where every rank is full keeps
// decoding and never runs a prefill step that nobody fills.
#pragma once

#include <cstdint>
#include <deque>
#include <span>

#include "sched/sequence.h"

namespace deepinfer::sched {

struct DpVoteConfig {
  int all_interval = 70;   // DeepSeek's DEEPINFER_PREFILL_ATTEMPT_INTERVAL
  int any_interval = 100;  // DeepSeek's DEEPINFER_PREFILL_ANY_ATTEMPT_INTERVAL
  bool prefill_when_group_idle = true;
};

// One rank's view before the vote, formed after sweep_dead_waiting.
struct LocalWish {
  bool wants_prefill = false;  // live waiting head admissible (KV usage under the watermark)
  bool has_decode = false;     // running sequences that decode this step
  bool has_unfinished() const { return wants_prefill || has_decode; }
};

// What a rank contributes to one all-reduce round. In a real group these are bits of one integer
// reduced with MIN/MAX; Tally::of is the same function over the vector of per-rank ballots.
struct Ballot {
  bool want = false;
  bool decode = false;
  bool unfinished = false;
  bool produced = false;  // second round only
};

struct Tally {
  bool any_want = false;
  bool all_want = true;
  bool any_decode = false;
  bool any_unfinished = false;
  bool any_produced = false;
  static Tally of(std::span<const Ballot> ballots);
};

enum class GroupStep { kIdle, kPrefill, kDecode };
enum class RankAction { kIdle, kPrefill, kEmptyPrefill, kDecode, kDummyDecode };

class DpVote {
 public:
  enum class Proposal { kDecided, kConfirm };

  explicit DpVote(DpVoteConfig config = {});

  Ballot first_ballot(const LocalWish& wish);
  // kDecided: group_step()/action() are final for this step. kConfirm: run the prefill selection
  // if runs_prefill_selection(), then a second round.
  Proposal after_first(const Tally& tally);
  bool runs_prefill_selection() const { return wish_.wants_prefill; }
  Ballot second_ballot(bool produced);
  void after_second(const Tally& tally);

  GroupStep group_step() const { return group_; }
  RankAction action() const;
  uint32_t decode_step() const { return decode_step_; }
  const DpVoteConfig& config() const { return config_; }

 private:
  void finish(GroupStep step);

  DpVoteConfig config_;
  uint32_t decode_step_ = 0;
  LocalWish wish_;
  bool produced_ = false;
  bool any_point_ = false;  // the round-1 rule in force this step: ANY (else ALL)
  bool any_decode_ = false;
  GroupStep group_ = GroupStep::kIdle;
};

// Removes finished entries (aborted while queued) from the whole waiting queue, keeping order.
// Returns how many were removed.
int sweep_dead_waiting(std::deque<Sequence*>& waiting);

}  // namespace deepinfer::sched
