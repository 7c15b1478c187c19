// Sequence: one request's tokens, KV placement and in-flight accounting.
//
// Token-count vocabulary (DESIGN.md section 4), with R = tokens one step may append (1: no drafts):
//   num_tokens()   committed tokens: prompt + accepted outputs
//   num_computed   positions whose KV is materialised and committed
//   inflight       steps dispatched to the device and not yet committed:
//     inflight.steps    0, 1 or 2 (one being executed, one just scheduled)
//     inflight.reserved R per outstanding step: tokens the device may append before we know
//     inflight.kv       query tokens of the outstanding steps: positions being materialised
// Invariants (checked by check_invariants in debug builds and by the tests):
//   inflight.steps <= 2 and inflight.reserved >= inflight.steps (R = 1 per step, 1 + d for a
//   verify row with d drafts);
//   num_computed + inflight.kv <= num_tokens + inflight.reserved   (never compute unknown tokens);
//   num_computed <= num_tokens;
//   a sequence's blocks and state slot are released only when it is finished (or preempted) and
//   inflight.steps == 0.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deepinfer/engine.h"
#include "kv/block_pool.h"
#include "kv/prefix_index.h"
#include "sched/draft_budget.h"

namespace deepinfer::sched {

// Tokens one step can append to a sequence without drafts; a verify row with d drafts reserves
// 1 + d (StepRow::reserved).
inline constexpr int kStepReservation = 1;

enum class SeqState {
  kWaiting,  // queued; may hold resources between prefill chunks
  // Admitted on a KV tier hit: holds its blocks and slot while the tiers read them (tier_fetch);
  // or, holding nothing, waits for another sequence's fetch of the same blocks (fetch_wait).
  kFetching,
  kRunning,   // whole prompt dispatched; decoding
  kFinished,  // terminal; resources released once nothing is in flight
};

struct InflightLedger {
  int steps = 0;
  int reserved = 0;
  int kv = 0;
  // Where the sequence's sampled token lies in the device output of the latest step that samples
  // for it (one token per logits row: 1 + d for a verify row with d drafts): a decode row planned
  // while that step is in flight (carried) takes its input token from there.
  int32_t last_sampling_row = -1;
  // Of that row: its index among the step's sampling rows, the drafts it verifies, and the
  // step's logits rows. A row carried after it on the device (Scheduler::device_carries) takes
  // its tokens at last_sampling_row + last_num_drafts + j * last_step_logit_rows of that step's
  // outputs, moved back by the drafts the device rejected (ForwardRow::shift_from).
  int32_t last_sampling_index = -1;
  int32_t last_num_drafts = 0;
  int32_t last_step_logit_rows = 0;

  // Whether an outstanding row verifies drafts (each reserves 1 + d): then the next position
  // depends on how many the device accepts, which the host learns only at the commit.
  bool has_drafts() const { return reserved > steps; }
};

struct Sequence {
  RequestId id = 0;
  uint64_t arrival = 0;  // admission order key: lower arrived earlier
  SamplingParams params;
  uint64_t seed = 0;
  std::vector<int32_t> tokens;  // prompt followed by committed outputs
  int num_prompt_tokens = 0;
  int num_computed = 0;
  InflightLedger inflight;
  SeqState state = SeqState::kWaiting;
  FinishReason finish = FinishReason::kNone;
  std::string finish_detail;
  // Bumped on preemption: in-flight results of an older epoch are discarded.
  uint32_t epoch = 0;

  std::vector<kv::BlockId> block_table;
  int32_t state_slot = -1;
  std::vector<kv::BlockHash> block_hashes;  // chain hashes of the full blocks of `tokens`
  int num_indexed_blocks = 0;               // leading blocks offered to the prefix index
  int num_written_blocks = 0;  // leading blocks offered to the KV tiers (write-through)
  uint64_t tier_fetch = 0;     // the KvTiers fetch filling this sequence's blocks (0: none)
  bool skip_tiers = false;     // a tier fetch for it failed: admit from the GPU index only
  uint64_t fetch_wait = 0;  // another sequence's fetch of its blocks it waits for, holding nothing
  int prefix_checkpoint = 0;  // a prefill chunk must end here (state snapshot), 0 = none
  // A kv_window_state bounded_replay tier hit of `replay_end` tokens (KvAllocator::
  // complete_fetch): prefill restarts at swa_valid_start with a zeroed state slot; every sliding
  // window of this sequence sees only keys >= swa_valid_start, and compressed entries of windows
  // closing before replay_end are kept from the tiers, not recomputed. 0, 0: no replay.
  int swa_valid_start = 0;
  int replay_end = 0;
  int32_t pending_snapshot = -1;  // snapshot slot being filled by an in-flight chunk
  // A verify row's input (the last committed token, then the drafts): the row's tokens span
  // points here until the step is launched.
  std::vector<int32_t> verify_input;
  // The verify row's estimate a_j for each of its drafts (draft_budget.h), for the calibration
  // its commit records.
  std::vector<double> verify_estimates;
  // Speculative decoding: this request's acceptance history, and the drafts the confidence
  // budget allows it in the step being planned (-1: no budget, the configured maximum).
  DraftEstimate draft_estimate;
  int draft_budget = -1;
  // Drafts the executor made after the step that left `num_tokens() == model_drafts_at`
  // (speculative_method "mtp"), and their MTP probabilities (empty: none known); stale once
  // more tokens are committed or the sequence is preempted.
  std::vector<int32_t> model_drafts;
  std::vector<float> model_draft_probs;
  int model_drafts_at = -1;
  // Zero-overhead scheduling with drafting: the sequence skipped a step so that its next row can
  // draft from committed tokens (Scheduler::sits_out); a drafter that then proposes nothing
  // counts as a rejected first draft, so a sequence without matches stops skipping.
  bool skipped_to_draft = false;
  bool drafter_asked = false;  // drafts were proposed for it at least once (or none found)

  bool ready_emitted = false;
  int prompt_cache_hit_tokens = 0;
  int num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  int num_tokens() const { return static_cast<int>(tokens.size()); }
  bool finished() const { return state == SeqState::kFinished; }
  bool holds_resources() const { return state_slot >= 0 || !block_table.empty(); }
  // Next position to dispatch: positions below are computed or in flight.
  int next_position() const { return num_computed + inflight.kv; }
  // Upper bound on num_tokens once everything in flight is committed.
  int optimistic_tokens() const { return num_tokens() + inflight.reserved; }
  // Tokens this sequence may still generate, counting in-flight reservations.
  int remaining_budget(int max_model_len) const;

  // Throws Error(kInternal) naming the sequence and the broken invariant.
  void check_invariants() const;
};

}  // namespace deepinfer::sched
